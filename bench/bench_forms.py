"""Export forms: load time and peak RSS of the same capture as SQLite vs parquetdir.

Every measurement runs in a **new Python process** (so imports, caches and allocator state never
carry over) and, for ``cold`` runs, after evicting the trace's files from the OS page cache with
``posix_fadvise(DONTNEED)`` (no root needed), so the disk read is part of the number. ``warm``
runs read files the previous run left in the page cache: the usual case when a CI job analyses
the profile it just exported.

Levels (what the child process does after ``import nsysan``):

- ``source``: open the raw source and read every column of the event tables nsysan uses
  (kernels, memcpy, memset, runtime API, synchronisation, NVTX, StringIds, profiler overhead);
- ``frames``: ``open_trace(path).load_all()``: every canonical frame, adapters included;
- ``analyze``: ``nsysan.api.analyze(path)``: all default passes and findings, no output files.

Usage (from the repository root)::

    python bench/bench_forms.py                       # all cases, levels, cold+warm, 5 repeats
    python bench/bench_forms.py --level frames --repeats 3
    python bench/bench_forms.py --write               # also update bench/RESULTS.md's section

Also reported: file size on disk and the export time nsys 2023.4.4 recorded itself
(``META_DATA_EXPORT.EXPORT_TIME``) when it wrote each 2023.4.4 export, and (``--export``) the
time of a local ``nsys export --type sqlite`` of the sc22 report with the installed nsys.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TRACES = ROOT.parent / "shared" / "traces"
RESULTS = ROOT / "bench" / "RESULTS.md"
SECTION = "## Export forms"

#: (capture, form label, path relative to the traces directory)
CASES = [
    ("sc22", "sqlite 2022.4.2", "sc22-ddp-4gpu-nccl/4gpu_baseline.nsys-rep.nsys2022.4.2.sqlite"),
    ("sc22", "sqlite 2023.4.4", "sc22-ddp-4gpu-nccl/4gpu_baseline.nsys-rep.nsys2023.4.4.sqlite"),
    ("sc22", "parquetdir 2023.4.4", "sc22-ddp-4gpu-nccl/4gpu_baseline.nsys2023.4.4.parquetdir"),
    ("vit", "sqlite 2023.4.4", "sc23-vit-train-nvtx/4workers.nsys-rep.nsys2023.4.4.sqlite"),
    ("vit", "parquetdir 2023.4.4", "sc23-vit-train-nvtx/4workers.nsys2023.4.4.parquetdir"),
]
LEVELS = ("source", "frames", "analyze")
#: the raw tables the adapters read events from (all columns are read at level ``source``)
EVENT_TABLES = (
    "CUPTI_ACTIVITY_KIND_KERNEL",
    "CUPTI_ACTIVITY_KIND_MEMCPY",
    "CUPTI_ACTIVITY_KIND_MEMSET",
    "CUPTI_ACTIVITY_KIND_RUNTIME",
    "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION",
    "NVTX_EVENTS",
    "StringIds",
    "PROFILER_OVERHEAD",
    "OSRT_API",
)


# --- child: one measurement in a fresh process ----------------------------------------------


def _rss_mib() -> float:
    """Current resident set size (VmRSS) in MiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _peak_rss_mib() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _open_source(path: Path):
    if path.is_dir():
        from nsysan.load.parquetdir import ParquetDirSource

        return ParquetDirSource(path)
    from nsysan.load import sqlite as sqlite_source

    return sqlite_source.SqliteSource(path)


def _child(level: str, path: Path) -> dict:
    t0 = time.perf_counter()
    import polars as pl

    import nsysan

    if level == "analyze":
        import nsysan.api  # noqa: F401
    t_import = time.perf_counter() - t0
    rss_import = _rss_mib()
    t1 = time.perf_counter()
    rows = 0
    if level == "source":
        src = _open_source(path)
        have = src.tables()
        for table in EVENT_TABLES:
            if table in have:
                rows += src.read(table, src.columns(table)).height
        src.close()
    elif level == "frames":
        from nsysan.frames.schemas import CANONICAL
        from nsysan.load import open_trace

        trace = open_trace(path).load_all()
        rows = sum(trace.frame(n).height for n in CANONICAL)
    elif level == "analyze":
        from nsysan.api import analyze

        result = analyze(path)
        rows = sum(df.height for df in result.tables.values())
    else:
        raise SystemExit(f"unknown level {level!r}")
    t_work = time.perf_counter() - t1
    return {
        "import_s": t_import,
        "work_s": t_work,
        "rss_import_mib": rss_import,
        "rss_peak_mib": _peak_rss_mib(),
        "rows": rows,
        "polars": pl.__version__,
    }


# --- parent: orchestration ---------------------------------------------------------------------


def _files(path: Path) -> list[Path]:
    return sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path]


def _size_mib(path: Path) -> float:
    return sum(p.stat().st_size for p in _files(path)) / 2**20


def _evict(path: Path) -> None:
    """Drop ``path``'s pages from the page cache (clean pages of a read-only file)."""
    for p in _files(path):
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _warm(path: Path) -> None:
    for p in _files(path):
        with open(p, "rb") as f:
            while f.read(1 << 22):
                pass


def _run_child(level: str, path: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--child", level, str(path)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return {"error": tail}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _recorded_export_time(path: Path) -> str:
    """``EXPORT_TIME`` as nsys recorded it when it wrote this export (2023.4+), else ''."""
    try:
        if path.is_dir():
            import polars as pl

            df = pl.read_parquet(path / "META_DATA_EXPORT.parquet")
            hit = df.filter(pl.col("name") == "EXPORT_TIME")["value"].to_list()
            return hit[0] if hit else ""
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            row = con.execute(
                "SELECT value FROM META_DATA_EXPORT WHERE name = 'EXPORT_TIME'"
            ).fetchone()
        finally:
            con.close()
        return row[0] if row else ""
    except Exception:  # 2022.4 exports have no META_DATA_EXPORT (and no export time)
        return ""


def _local_export_s(traces: Path, repeats: int) -> list[float]:
    nsys = shutil.which("nsys")
    rep = traces / "sc22-ddp-4gpu-nccl" / "4gpu_baseline.nsys-rep"
    if nsys is None or not rep.exists():
        return []
    times = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(repeats):
            out = Path(tmp) / f"x{i}.sqlite"
            t = time.perf_counter()
            subprocess.run(
                [nsys, "export", "--type", "sqlite", "--quiet", "true", "-o", str(out), str(rep)],
                capture_output=True,
                check=True,
            )
            times.append(time.perf_counter() - t)
    return times


def _fmt(xs: list[float]) -> str:
    """Seconds as ``median (min)``: the median is typical, the min what the code costs when
    nothing else competes for the CPU."""
    if not xs:
        return "n/a"
    return f"{statistics.median(xs):.3f} s (min {min(xs):.3f})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--child", nargs=2, metavar=("LEVEL", "PATH"), help=argparse.SUPPRESS)
    ap.add_argument("--traces", type=Path, default=DEFAULT_TRACES)
    ap.add_argument("--level", choices=LEVELS, action="append")
    ap.add_argument("--cache", choices=("cold", "warm"), action="append")
    ap.add_argument("--capture", choices=sorted({c for c, _, _ in CASES}), action="append")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--export", action="store_true", help="also time a local nsys export")
    ap.add_argument("--write", action="store_true", help=f"update {SECTION!r} in RESULTS.md")
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(_child(args.child[0], Path(args.child[1]))))
        return 0

    levels = args.level or list(LEVELS)
    caches = args.cache or ["cold", "warm"]
    cases = [c for c in CASES if not args.capture or c[0] in args.capture]
    lines = [
        SECTION,
        "",
        f"`python bench/bench_forms.py` on {platform.node() or 'this machine'}: "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"{time.strftime('%Y-%m-%d')}. Median of {args.repeats} runs (min in brackets), each in "
        "a new process; *cold* = the trace's files evicted from the page cache first, *warm* = "
        "left cached. `work` excludes the interpreter and `import nsysan` "
        f"(`import` column); peak RSS includes them. Load average at the start: "
        f"{os.getloadavg()[0]:.1f}.",
        "",
        "| capture | form | size MiB | nsys export time (recorded) | level | cache | work | "
        "import | peak RSS MiB | rows |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for capture, form, rel in cases:
        path = args.traces / rel
        if not path.exists():
            print(f"skip {rel}: not found", file=sys.stderr)
            continue
        size, recorded = _size_mib(path), _recorded_export_time(path) or "n/a"
        for level in levels:
            for cache in caches:
                runs = []
                for _ in range(args.repeats):
                    _evict(path) if cache == "cold" else _warm(path)
                    runs.append(_run_child(level, path))
                ok = [r for r in runs if "error" not in r]
                if not ok:
                    work = imp = rss = rows = f"error: {runs[0]['error'][:60]}"
                else:
                    work = _fmt([r["work_s"] for r in ok])
                    imp = f"{statistics.median(r['import_s'] for r in ok):.3f} s"
                    rss = f"{statistics.median(r['rss_peak_mib'] for r in ok):.0f}"
                    rows = str(ok[0]["rows"])
                row = (
                    f"| {capture} | {form} | {size:.1f} | {recorded} | {level} | {cache} | "
                    f"{work} | {imp} | {rss} | {rows} |"
                )
                print(row, flush=True)
                lines.append(row)
    if args.export:
        times = _local_export_s(args.traces, max(1, min(args.repeats, 3)))
        lines += [
            "",
            f"Local `nsys export --type sqlite` of sc22 `4gpu_baseline.nsys-rep` with the "
            f"installed nsys (2022.4.2, cannot write parquetdir): {_fmt(times)}.",
        ]
    text = "\n".join(lines) + "\n"
    print()
    print(text)
    if args.write:
        _write_section(text)
    return 0


def _write_section(text: str, results: Path = RESULTS) -> None:
    """Replace (or append) this script's section of RESULTS.md, leaving other sections as they
    are. Hand-written conclusions in the section (from `NOTES_MARK` on) are kept below the new
    table."""
    old = results.read_text() if results.exists() else "# Benchmark results\n"
    m = re.search(rf"^{re.escape(SECTION)}\n.*?(?=^## |\Z)", old, re.S | re.M)
    notes = ""
    if m and NOTES_MARK in m.group(0):
        notes = m.group(0)[m.group(0).index(NOTES_MARK) :].rstrip() + "\n"
    body = text.rstrip() + "\n" + ("\n" + notes if notes else "")
    if m:
        new = old[: m.start()] + body + ("\n" if old[m.end() :] else "") + old[m.end() :]
    else:
        new = old.rstrip() + "\n\n" + body
    results.write_text(new)


#: hand-written conclusions below the table start with this line and survive `--write`
NOTES_MARK = "### Which form for which job"


if __name__ == "__main__":
    raise SystemExit(main())
