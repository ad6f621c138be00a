"""Scale a real nsys SQLite export: replicate its activity k times along the timeline.

    python bench/scale_trace.py SRC.sqlite --kernels 1000000 [-o bench/data/NAME.sqlite]

The output has the source's own schema (it starts as a byte copy of the source). Copy ``i``
(1..k-1) of every replicated table is the original rows with every timestamp shifted by
``i * shift`` (``shift`` = the session length, at least the last event's end + 1 ns) and every
id that links rows offset by ``i * (max id + 1)``, so correlation ids (API call <-> kernel /
memcpy / memset / sync), NVTX range ids, grid ids and CUDA event ids stay unique and
consistent. ``ANALYSIS_DETAILS`` is stretched to cover the k copies. Copies are made by SQLite
itself (``INSERT ... SELECT``), so 10M kernels take about a minute.

Replicated: CUDA activity (kernels, memcpy, memset, synchronization, CUDA events, runtime API),
NVTX, OS runtime calls, GPU memory usage events and the host evidence (context switches
SCHED_EVENTS, CPU samples COMPOSITE_EVENTS with their SAMPLING_CALLCHAINS, linked by ``id``)
when present: everything nsysan (its host pass included) and the peers in bench_analyze.py
read. String ids, processes, threads and devices are shared by all copies: the same program
running k times longer.
"""

from __future__ import annotations

import argparse
import math
import shutil
import sqlite3
import sys
import time
from pathlib import Path

#: tables copied k times, when present
REPLICATED = (
    "CUPTI_ACTIVITY_KIND_KERNEL",
    "CUPTI_ACTIVITY_KIND_MEMCPY",
    "CUPTI_ACTIVITY_KIND_MEMSET",
    "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION",
    "CUPTI_ACTIVITY_KIND_CUDA_EVENT",
    "CUPTI_ACTIVITY_KIND_RUNTIME",
    "NVTX_EVENTS",
    "OSRT_API",
    "CUDA_GPU_MEMORY_USAGE_EVENTS",
    "SCHED_EVENTS",
    "COMPOSITE_EVENTS",
    "SAMPLING_CALLCHAINS",
)
TIME_COLUMNS = ("start", "end", "timestamp")
#: id columns offset per copy; the offset of an id family is max over its tables + 1
ID_FAMILIES = {
    "correlationId": ("correlationId",),
    "rangeId": ("rangeId",),
    "gridId": ("gridId",),
    "eventId": ("eventId",),
    "id": ("id",),  # COMPOSITE_EVENTS.id <- SAMPLING_CALLCHAINS.id (sample <-> its stack)
}


def _columns(con: sqlite3.Connection, table: str) -> list[str]:
    return [r[1] for r in con.execute(f'PRAGMA table_info("{table}")')]


def _present(con: sqlite3.Connection) -> list[str]:
    names = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    return [t for t in REPLICATED if t in names]


def _max(con: sqlite3.Connection, tables: list[str], column: str) -> int:
    best = 0
    for t in tables:
        if column in _columns(con, t):
            v = con.execute(f'SELECT max("{column}") FROM "{t}"').fetchone()[0]
            if isinstance(v, int):
                best = max(best, v)
    return best


def scale(src: Path, dst: Path, copies: int) -> dict[str, int]:
    """Write ``dst`` = ``src`` with its activity replicated ``copies`` times; returns row counts."""
    if copies < 1:
        raise ValueError("copies must be >= 1")
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(dst.name + ".tmp")
    shutil.copyfile(src, tmp)
    con = sqlite3.connect(tmp, isolation_level=None)
    con.execute("PRAGMA journal_mode=OFF")
    con.execute("PRAGMA synchronous=OFF")
    con.execute("PRAGMA cache_size=-1000000")
    tables = _present(con)
    last_end = max(_max(con, tables, "end"), _max(con, tables, "start"),
                   _max(con, tables, "timestamp"))
    duration = 0
    has_details = bool(con.execute(
        "SELECT 1 FROM sqlite_master WHERE name='ANALYSIS_DETAILS'").fetchone())
    if has_details:
        duration = con.execute("SELECT max(duration) FROM ANALYSIS_DETAILS").fetchone()[0] or 0
    shift = max(int(duration), last_end + 1)
    offsets = {fam: _max(con, tables, fam) + 1 for fam in ID_FAMILIES}
    con.execute("BEGIN")
    for t in tables:
        cols = _columns(con, t)
        n0 = con.execute(f'SELECT max(rowid) FROM "{t}"').fetchone()[0] or 0
        if not n0:
            continue
        for i in range(1, copies):
            exprs = []
            for c in cols:
                if c in TIME_COLUMNS:
                    exprs.append(f'"{c}" + {i * shift}')
                elif c in offsets:
                    exprs.append(f'"{c}" + {i * offsets[c]}')
                else:
                    exprs.append(f'"{c}"')
            col_list = ", ".join(f'"{c}"' for c in cols)
            con.execute(f'INSERT INTO "{t}" ({col_list}) SELECT {", ".join(exprs)} '
                        f'FROM "{t}" WHERE rowid <= {n0} ORDER BY rowid')
    if has_details:
        con.execute(f"UPDATE ANALYSIS_DETAILS SET duration = {copies * shift}, "
                    f"stopTime = startTime + {copies * shift}")
    con.execute("COMMIT")
    counts = {t: con.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0] for t in tables}
    con.close()
    tmp.replace(dst)
    return counts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src", type=Path, help="nsys SQLite export to scale")
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--kernels", type=int, help="at least this many kernels in the output")
    g.add_argument("--copies", type=int, help="number of copies of the activity")
    ap.add_argument("-o", "--out", type=Path, help="output .sqlite (default bench/data/...)")
    args = ap.parse_args(argv)
    copies = args.copies
    if copies is None:
        con = sqlite3.connect(f"file:{args.src}?mode=ro", uri=True)
        n = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
        con.close()
        copies = max(1, math.ceil(args.kernels / n))
    out = args.out or (Path(__file__).parent / "data" /
                       f"{args.src.name.split('.')[0]}_x{copies}.sqlite")
    t = time.perf_counter()
    counts = scale(args.src, out, copies)
    print(f"{out}: {copies} copies in {time.perf_counter() - t:.1f} s; "
          + ", ".join(f"{k} {v:,}" for k, v in counts.items()), file=sys.stderr)
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
