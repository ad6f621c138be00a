"""Loading: ``open_trace`` + ``load_all`` time and peak RSS on every shared trace, and the SQLite
reader comparison behind `nsysan.load.sqlite` (stdlib vs ``pl.read_database`` vs ADBC vs
connectorx).

Each trace is measured in a **new Python process** (imports and caches never carry over), warm
(the file was read once before, as when CI analyses the profile it just exported). Reported:
``open`` (probe tables, read metadata), ``load_all`` (every canonical frame), the best of
``--repeats`` runs, and the child's peak RSS minus its RSS right after ``import nsysan``.

The reader comparison reads the columns nsysan uses from the sc22 event tables with each
reader; readers that are not installed are listed as such (``pip install adbc-driver-sqlite
connectorx`` to include them; nsysan itself needs neither).

Usage (from the repository root)::

    python bench/bench_load.py                 # all shared traces + readers, 3 repeats
    python bench/bench_load.py --write         # also update the "## Loading" section of RESULTS.md
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRACES = ROOT.parent / "shared" / "traces"
RESULTS = ROOT / "bench" / "RESULTS.md"
SECTION = "## Loading"
#: hand-written conclusions below the tables start with this line and survive `--write`
NOTES_MARK = "### Reader choice"
READER_TRACE = "sc22-ddp-4gpu-nccl/4gpu_baseline.nsys-rep.nsys2022.4.2.sqlite"
#: (table, columns) the adapters read from the event tables
READ_SET = {
    "CUPTI_ACTIVITY_KIND_KERNEL": [
        "start", "end", "deviceId", "contextId", "streamId", "correlationId", "globalPid",
        "shortName", "demangledName", "gridX", "gridY", "gridZ", "blockX", "blockY", "blockZ",
        "graphNodeId",
    ],
    "CUPTI_ACTIVITY_KIND_MEMCPY": [
        "start", "end", "deviceId", "contextId", "streamId", "correlationId", "globalPid",
        "bytes", "copyKind", "srcKind", "dstKind", "graphNodeId",
    ],
    "CUPTI_ACTIVITY_KIND_RUNTIME": [
        "start", "end", "globalTid", "correlationId", "nameId", "eventClass", "returnValue",
    ],
    "NVTX_EVENTS": [
        "start", "end", "eventType", "globalTid", "text", "textId", "endGlobalTid", "domainId",
        "category", "jsonText", "jsonTextId",
    ],
    "StringIds": ["id", "value"],
}  # fmt: skip

CHILD = r"""
import json, resource, sys, time
t0 = time.perf_counter()
import nsysan
t1 = time.perf_counter()
rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
c1 = time.process_time()
tr = nsysan.open_trace(sys.argv[1], cache_dir=sys.argv[2])
t2 = time.perf_counter()
tr.load_all()
t3 = time.perf_counter()
c3 = time.process_time()
rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
rows = sum(tr.frame(n).height for n in ("gpu_ops", "cuda_api", "nvtx", "osrt", "sync"))
print(json.dumps({"import_s": t1 - t0, "open_s": t2 - t1, "load_s": t3 - t2, "cpu_s": c3 - c1,
                  "rss_mb": rss1 / 1024, "rss_delta_mb": (rss1 - rss0) / 1024, "rows": rows}))
"""


def traces() -> list[Path]:
    files = sorted(TRACES.glob("*/*.sqlite")) + sorted(TRACES.glob("*/*.parquetdir"))
    return files


def measure(path: Path, repeats: int, cache: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    runs = []
    for _ in range(repeats + 1):  # the first run warms the page cache and is dropped
        out = subprocess.run(
            [sys.executable, "-c", CHILD, str(path), str(cache)],
            capture_output=True, text=True, env=env, check=True,
        )  # fmt: skip
        runs.append(json.loads(out.stdout))
    runs = runs[1:]
    best = min(runs, key=lambda r: r["open_s"] + r["load_s"])
    return {**best, "rss_mb": max(r["rss_mb"] for r in runs)}


def readers(path: Path, repeats: int) -> dict[str, tuple[float, float] | str]:
    """(wall, CPU) seconds to read READ_SET with each reader (best of ``repeats`` each), or why
    the reader was skipped."""
    import sqlite3

    import polars as pl

    sys.path.insert(0, str(ROOT))
    from nsysan.load.sqlite import SqliteSource

    uri = f"file:{path}?mode=ro&immutable=1"

    def sql(table: str, cols: list[str]) -> str:
        return f'SELECT {", ".join(chr(34) + c + chr(34) for c in cols)} FROM "{table}"'

    def nsysan_stdlib() -> None:
        src = SqliteSource(path)
        for t, cols in READ_SET.items():
            src.read(t, cols)
        src.close()

    def read_database() -> None:
        con = sqlite3.connect(uri, uri=True)
        for t, cols in READ_SET.items():
            pl.read_database(sql(t, cols), con, infer_schema_length=None)
        con.close()

    def adbc() -> None:
        import adbc_driver_sqlite.dbapi as dbapi

        con = dbapi.connect(uri)
        for t, cols in READ_SET.items():
            cur = con.cursor()
            cur.execute(sql(t, cols))
            pl.from_arrow(cur.fetch_arrow_table())
            cur.close()
        con.close()

    def connectorx() -> None:
        import connectorx as cx

        for t, cols in READ_SET.items():
            pl.from_arrow(cx.read_sql(f"sqlite://{path}", sql(t, cols), return_type="arrow"))

    out: dict[str, tuple[float, float] | str] = {}
    for name, fn in [
        ("stdlib sqlite3, typed Series (nsysan)", nsysan_stdlib),
        ("pl.read_database (sqlite3 cursor)", read_database),
        ("ADBC (adbc-driver-sqlite)", adbc),
        ("connectorx", connectorx),
    ]:
        try:
            fn()
        except ImportError as exc:
            out[name] = f"not installed ({exc.name})"
            continue
        except Exception as exc:  # a reader that fails on real data is a result too
            out[name] = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:80]}"
            continue
        best, best_cpu = float("inf"), float("inf")
        for _ in range(repeats):
            t0, c0 = time.perf_counter(), time.process_time()
            fn()
            best = min(best, time.perf_counter() - t0)
            best_cpu = min(best_cpu, time.process_time() - c0)
        out[name] = (best, best_cpu)
    return out


def render(rows: list[tuple[str, dict]], reader_times: dict[str, tuple[float, float] | str]) -> str:
    lines = [
        SECTION,
        "",
        "`python bench/bench_load.py --write` — warm page cache, new process per run, best of "
        "the repeats; RSS = the child's peak (its growth after `import nsysan` in brackets). "
        f"Machine: {os.cpu_count()} cores, Python {sys.version.split()[0]}, load average "
        f"{os.getloadavg()[0]:.1f} when written (wall times grow with it; CPU time = the child's "
        "user+system time for open + load_all, all polars threads).",
        "",
        "| trace | event rows | open | load_all | open + load_all | CPU time | peak RSS (growth) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in rows:
        total = r["open_s"] + r["load_s"]
        lines.append(
            f"| {name} | {r['rows']:,} | {r['open_s'] * 1e3:.0f} ms | {r['load_s'] * 1e3:.0f} ms "
            f"| **{total * 1e3:.0f} ms** | {r['cpu_s'] * 1e3:.0f} ms "
            f"| {r['rss_mb']:.0f} MB ({r['rss_delta_mb']:.0f} MB) |"
        )
    lines += [
        "",
        f"Readers: the columns the adapters use from the sc22 event tables ({READER_TRACE}: "
        "kernels, memcpy, runtime API, NVTX, StringIds; 75k rows), best of the repeats:",
        "",
        "| reader | wall | CPU (all threads) |",
        "|---|---:|---:|",
    ]
    for name, value in reader_times.items():
        if isinstance(value, tuple):
            lines.append(f"| {name} | {value[0] * 1e3:.0f} ms | {value[1] * 1e3:.0f} ms |")
        else:
            lines.append(f"| {name} | {value} | |")
    return "\n".join(lines) + "\n"


def write_section(text: str) -> None:
    """Replace (or append) the Loading section of RESULTS.md, leaving other sections and the
    hand-written notes (from NOTES_MARK to the next section) untouched."""
    old = RESULTS.read_text() if RESULTS.exists() else "# Benchmark results\n"
    pattern = re.compile(rf"^{re.escape(SECTION)}\n.*?(?=^## |\Z)", re.S | re.M)
    current = pattern.search(old)
    notes = ""
    if current and NOTES_MARK in current.group(0):
        notes = current.group(0)[current.group(0).index(NOTES_MARK) :].rstrip() + "\n"
    body = text.rstrip() + "\n" + ("\n" + notes if notes else "") + "\n"
    new = pattern.sub(lambda _: body, old) if current else old.rstrip() + "\n\n" + body
    RESULTS.write_text(new.rstrip() + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--write", action="store_true", help=f"update {SECTION!r} in RESULTS.md")
    ap.add_argument("--no-readers", action="store_true", help="skip the reader comparison")
    args = ap.parse_args()
    if not TRACES.is_dir():
        print(f"no shared traces at {TRACES}", file=sys.stderr)
        return 1
    import tempfile

    rows = []
    with tempfile.TemporaryDirectory() as cache:
        for path in traces():
            name = path.relative_to(TRACES).as_posix()
            r = measure(path, args.repeats, Path(cache))
            print(f"{name}: open {r['open_s']:.3f}s load_all {r['load_s']:.3f}s "
                  f"rss {r['rss_mb']:.0f} MB", flush=True)  # fmt: skip
            rows.append((name, r))
    reader_times = {} if args.no_readers else readers(TRACES / READER_TRACE, 2 * args.repeats + 1)
    for name, value in reader_times.items():
        print(f"reader {name}: {value}")
    text = render(rows, reader_times)
    print()
    print(text)
    if args.write:
        write_section(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
