#!/usr/bin/env bash
# Start a throwaway PostgreSQL server for the catalog tests and print, on stdout, the one line
#     export NSYSAN_TEST_PG_URL=postgresql+psycopg://postgres@127.0.0.1:PORT/nsysan_test
# so that CI can do:  eval "$(bash .ci/start-postgres.sh)"
# Everything else goes to stderr. The cluster lives in a temp dir (trust auth, fsync off: test
# data only); it is owned by the `postgres` user because PostgreSQL refuses to run as root.
# Re-running while a server already answers on the port reuses it (idempotent).
# Env: NSYSAN_PG_PORT (default 5432), NSYSAN_PG_DB (default nsysan_test).
# Stop it with:  pg_ctl -D "$(cat /tmp/nsysan-pg.datadir)/data" stop   (as the postgres user)
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

port="${NSYSAN_PG_PORT:-5432}"
db="${NSYSAN_PG_DB:-nsysan_test}"
log() { echo "start-postgres: $*" >&2; }

pgbin=""
find_pgbin() { pgbin="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)"; }
find_pgbin
if [ -z "$pgbin" ] || [ ! -x "$pgbin/pg_ctl" ]; then
    if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
        log "installing postgresql from Debian"
        apt-get update -qq >&2
        apt-get install -y -qq --no-install-recommends postgresql >&2
        find_pgbin
    fi
fi
if [ -z "$pgbin" ] || [ ! -x "$pgbin/pg_ctl" ]; then
    log "PostgreSQL server binaries not found (apt-get install postgresql)"
    exit 1
fi

# Run a command as the postgres user when we are root (initdb/postgres refuse root).
as_pg() {
    if [ "$(id -u)" -eq 0 ]; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}
pguser=postgres
[ "$(id -u)" -eq 0 ] || pguser="$(id -un)"

if "$pgbin/pg_isready" -q -h 127.0.0.1 -p "$port" 2>/dev/null; then
    log "a server already answers on 127.0.0.1:$port; reusing it"
else
    base="$(mktemp -d /tmp/nsysan-pg.XXXXXX)"
    chmod 755 "$base"
    [ "$(id -u)" -eq 0 ] && chown postgres: "$base"
    as_pg "$pgbin/initdb" -D "$base/data" -U "$pguser" -A trust -E UTF8 --no-sync >"$base/initdb.log" 2>&1 \
        || { cat "$base/initdb.log" >&2; exit 1; }
    # Unix socket in the temp dir (not /var/run/postgresql, which may not exist or be shared).
    as_pg "$pgbin/pg_ctl" -D "$base/data" -l "$base/server.log" -w -t 60 \
        -o "-p $port -k $base -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200" \
        start >&2 || { cat "$base/server.log" >&2; exit 1; }
    echo "$base" >/tmp/nsysan-pg.datadir
    log "server started in $base on 127.0.0.1:$port"
fi

if ! "$pgbin/psql" -h 127.0.0.1 -p "$port" -U "$pguser" -d postgres -tAc \
        "SELECT 1 FROM pg_database WHERE datname = '$db'" | grep -q 1; then
    "$pgbin/createdb" -h 127.0.0.1 -p "$port" -U "$pguser" "$db"
fi
echo "export NSYSAN_TEST_PG_URL=postgresql+psycopg://$pguser@127.0.0.1:$port/$db"
