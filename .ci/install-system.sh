#!/usr/bin/env bash
# System packages the test suite needs on a fresh Debian bookworm machine (run as root):
#   - Nsight Systems CLI 2022.4.2 from Debian's non-free component (nsys export/stats/analyze; no GPU)
#   - PostgreSQL, for the catalog tests against a real server
#   - Chromium and its WebDriver, for the browser tests of report.html (tests/test_report_browser.py)
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

need=()
command -v nsys >/dev/null 2>&1 || need+=(nsight-systems)
command -v pg_ctlcluster >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1 \
    || need+=(postgresql)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v chromedriver >/dev/null 2>&1 || need+=(chromium-driver)
[ ${#need[@]} -eq 0 ] && exit 0

# nsight-systems lives in non-free: enable contrib + non-free in whichever sources format exists.
if [ -f /etc/apt/sources.list.d/debian.sources ]; then
    sed -i -E '/^Components:/{/non-free( |$)/!s/$/ contrib non-free/}' /etc/apt/sources.list.d/debian.sources
fi
if [ -f /etc/apt/sources.list ]; then
    sed -i -E '/^deb .*debian/{/non-free( |$)/!s/ main( |$)/ main contrib non-free\1/}' /etc/apt/sources.list
fi
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
command -v nsys >/dev/null
