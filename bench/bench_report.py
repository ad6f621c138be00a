"""report.html in headless Chromium: file size, first paint, time until every op is drawable,
and redraw times zoomed in; and the size and build time of trace.pftrace.

    python bench/bench_report.py OUT/<trace_id>/report.html [--repeat 3]
    python bench/bench_report.py --perfetto TRACE       # build trace.pftrace in memory, timed

Needs Debian's chromium + chromedriver and selenium (the test extra). First paint is the page's
own `performance.now()` when its first full draw ends (time since navigation start: parsing
the file included); "ops ready" is measured from the driver's `get` until the raw ops are
inflated and drawn.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def _browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1400,1000"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)
    driver.set_script_timeout(120)
    return driver


def page(path: Path, repeat: int) -> None:
    d = _browser()
    try:
        print(json.dumps({"file": str(path), "bytes": path.stat().st_size}))
        for _ in range(repeat):
            d.get("about:blank")
            t = time.perf_counter()
            d.get(path.resolve().as_uri())
            d.execute_async_script("const done = arguments[arguments.length - 1];"
                                   "window.nsysanReport.ready.then(() => done(1));")
            ready = time.perf_counter() - t
            st = d.execute_script("return window.nsysanReport.state()")
            mid = sum(st["view"]) / 2
            zooms = {}
            for label, span in (("50ms", 50e6), ("2s", 2e9)):
                t = time.perf_counter()
                d.execute_script(f"window.nsysanReport.setView({mid}, {mid + span})")
                zooms[label] = round(time.perf_counter() - t, 3)
            print(json.dumps({"first_paint_ms": round(st["firstPaintMs"]),
                              "ops_ready_s": round(ready, 2), "ops": st["opsLoaded"],
                              "redraw_s": zooms, "errors": st["errors"]}))
    finally:
        d.quit()


def perfetto(trace: Path) -> None:
    from nsysan.api import analyze
    from nsysan.report import perfetto as pf
    from nsysan.report.jsonout import findings_document

    r = analyze(trace)
    tables = {n: df for x in r.results.values() for n, df in x.tables.items()}
    findings = findings_document(r.diagnosis, r.trace)["findings"]
    t = time.perf_counter()
    data = pf.build(r.trace, tables, findings)
    print(json.dumps({"trace": str(trace), "pftrace_bytes": len(data),
                      "build_s": round(time.perf_counter() - t, 2)}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path", type=Path)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--perfetto", action="store_true")
    a = ap.parse_args()
    if not a.path.exists():
        sys.exit(f"Error: {a.path} not found")
    perfetto(a.path) if a.perfetto else page(a.path, a.repeat)


if __name__ == "__main__":
    main()
