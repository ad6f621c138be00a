"""End-to-end benchmark: `nsysan analyze` vs the peers on the same files (issue 9).

    python bench/bench_analyze.py [TRACE ...] [--repeat N] [--nsysai VENV/bin/nsys-ai] [--write]

Default traces: sc22 (shared) and the scaled copies in bench/data/ (bench/scale_trace.py).
Every case runs as a new process; wall time, CPU time (user + system of the process and its
children) and peak RSS come from ``os.wait4``. *cold* = the trace's pages evicted from the page
cache (posix_fadvise DONTNEED) and, for tools with a cache (nsysan's frame cache, nsys-ai's
DuckDB/Parquet cache), that cache empty; *warm* = the same command again with caches kept.
Cases:

- ``nsysan all``: ``nsysan analyze TRACE -o OUT`` (all default passes, every output written);
- ``nsysan gaps,kernels``: ``--passes gaps,kernels``;
- ``nsys stats gpukernsum + analyze gpu-starv``: two processes, summed (the peer of
  ``--passes gaps,kernels``); ``nsys stats nvtxgpuproj`` alone, once (minutes even on sc22);
- ``nsys-ai 4 skills``: ``nsys-ai skill run`` top_kernels, gpu_idle_gaps, overlap_breakdown,
  nvtx_layer_breakdown (four processes, summed; cold includes building its cache);
- ``sqlite3 floor``: the ``sqlite3`` command-line tool reading the columns nsysan reads.

``--write`` replaces the section "Analyze: last bench_analyze.py --write run" of
bench/RESULTS.md (the hand-written "Analyze (end to end, peers)" section quotes such runs).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SHARED = ROOT.parent / "shared" / "traces"
SC22 = SHARED / "sc22-ddp-4gpu-nccl" / "4gpu_baseline.nsys-rep.nsys2022.4.2.sqlite"
SKILLS = ("top_kernels", "gpu_idle_gaps", "overlap_breakdown", "nvtx_layer_breakdown")
NSYS = shutil.which("nsys") or "/usr/bin/nsys"


@dataclass
class Run:
    wall: float
    cpu: float
    rss_mb: float
    rc: int


def run(cmd: list[str], env: dict[str, str] | None = None, cwd: Path | None = None,
        timeout: float | None = None) -> Run:
    """One child process: wall, CPU (it and its waited-for children) and peak RSS.

    A run past ``timeout`` is killed (its process group) and reported with rc = -9."""
    # peak RSS from /usr/bin/time: a forked child's own ru_maxrss starts at this process's size
    fd, rss_name = tempfile.mkstemp(prefix="nsysan-bench-rss-")
    os.close(fd)
    cmd = ["/usr/bin/time", "-f", "%M", "-o", rss_name, *cmd]
    t = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         env={**os.environ, **(env or {})}, cwd=cwd, start_new_session=True)
    timer = threading.Timer(timeout, os.killpg, (p.pid, signal.SIGKILL)) if timeout else None
    if timer:
        timer.start()
    err = p.stderr.read() if p.stderr else b""
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t
    if timer:
        timer.cancel()
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode:
        print(f"  ! rc={p.returncode}: {' '.join(cmd)[:120]}\n    {err.decode()[-300:]}",
              file=sys.stderr)
    try:
        rss_kb = float(Path(rss_name).read_text().split()[-1])
    except (OSError, ValueError, IndexError):
        rss_kb = float("nan")
    Path(rss_name).unlink(missing_ok=True)
    return Run(wall, ru.ru_utime + ru.ru_stime, rss_kb / 1024, p.returncode)


def total(runs: list[Run]) -> Run:
    return Run(sum(r.wall for r in runs), sum(r.cpu for r in runs),
               max(r.rss_mb for r in runs), max(r.rc for r in runs))


def evict(path: Path) -> None:
    """Drop a file's pages from the page cache (cold read)."""
    for f in ([path] if path.is_file() else list(path.rglob("*"))):
        if f.is_file():
            fd = os.open(f, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


#: tables of the host-evidence frames: outside the floor of issue 21 ("the columns of the
#: canonical frames"), inside the floor of everything `nsysan analyze` reads
HOST_TABLES = ("SCHED_EVENTS", "COMPOSITE_EVENTS", "SAMPLING_CALLCHAINS")


def needed_columns(trace: Path) -> tuple[dict[str, list[str]], list[str]]:
    """The raw columns `nsysan analyze` reads whole, and the filtered queries it sends
    (`SqliteSource.read_where`: the call-chain rows of the host evidence), recorded from an
    in-process run."""
    from nsysan.api import analyze
    from nsysan.load.sqlite import SqliteSource

    seen: dict[str, list[str]] = {}
    filtered: list[str] = []
    orig, orig_query = SqliteSource.read_narrowed, SqliteSource._read_query

    def spy(self, table, columns, narrow):  # a recording double of every whole-table read
        cols = seen.setdefault(table, [])
        cols.extend(c for c in columns if c not in cols)
        return orig(self, table, columns, narrow)

    def spy_query(self, table, sql, columns, *args, **kwargs):
        filtered.append(sql)
        return orig_query(self, table, sql, columns, *args, **kwargs)

    SqliteSource.read_narrowed, SqliteSource._read_query = spy, spy_query  # (read: narrow {})
    try:
        env = os.environ.get("NSYSAN_NO_CACHE")
        os.environ["NSYSAN_NO_CACHE"] = "1"
        analyze(trace)
    finally:
        SqliteSource.read_narrowed, SqliteSource._read_query = orig, orig_query
        if env is None:
            os.environ.pop("NSYSAN_NO_CACHE", None)
    return seen, filtered


def floor_sql(needed: tuple[dict[str, list[str]], list[str]], host: bool = True) -> str:
    """One statement per table read whole (and, with ``host``, the host tables and the
    filtered scan of the call chains): what the ``sqlite3`` floor runs. The key lookups of
    the callers of OS leaves are left out: their ids belong to the trace they were recorded
    on, and they read a few percent of the table."""
    columns, filtered = needed
    whole = "".join(f'SELECT {", ".join(chr(34) + c + chr(34) for c in cols)} FROM "{t}";\n'
                    for t, cols in columns.items() if host or t not in HOST_TABLES)
    scans = [q for q in filtered if " IN (" not in q]
    return whole + ("".join(f"{q};\n" for q in dict.fromkeys(scans)) if host else "")


CASES = ("nsysan", "nsys", "nvtxgpuproj", "nsys-ai", "floor")


def bench_trace(trace: Path, repeat: int, nsysai: str | None, sql: tuple[str, str],
                peer_timeout: float, cases: tuple[str, ...] = CASES) -> dict[str, Run]:
    py = sys.executable
    out: dict[str, list[Run]] = {}
    work = Path(tempfile.mkdtemp(prefix="nsysan-bench-"))
    try:
        for i in range(repeat):
            cache = work / f"cache{i}"
            env = {"NSYSAN_CACHE_DIR": str(cache)}
            evict(trace)
            if "nsysan" in cases:
                out.setdefault("nsysan all, cold", []).append(
                    run([py, "-m", "nsysan", "analyze", str(trace), "-o", str(work / "o")], env))
                out.setdefault("nsysan all, warm (frame cache)", []).append(
                    run([py, "-m", "nsysan", "analyze", str(trace), "-o", str(work / "o")], env))
                shutil.rmtree(cache, ignore_errors=True)
                evict(trace)
                out.setdefault("nsysan gaps,kernels, cold", []).append(
                    run([py, "-m", "nsysan", "analyze", str(trace), "--passes", "gaps,kernels",
                         "-o", str(work / "o2")], env))
                shutil.rmtree(cache, ignore_errors=True)
                evict(trace)
            if "nsys" in cases:
                out.setdefault("nsys stats gpukernsum + analyze gpu-starv", []).append(total([
                    run([NSYS, "stats", "-q", "-f", "csv", "-o", str(work / "st"),
                         "--force-overwrite", "true", "-r", "gpukernsum", str(trace)],
                        timeout=peer_timeout),
                    run([NSYS, "analyze", "-q", "-r", "gpu-starv", "-f", "csv", "-o",
                         str(work / "an"), "--force-overwrite", "true", str(trace)],
                        timeout=peer_timeout),
                ]))
            if i == 0 and "nvtxgpuproj" in cases:  # minutes even on sc22: once
                out.setdefault("nsys stats nvtxgpuproj", []).append(
                    run([NSYS, "stats", "-q", "-f", "csv", "-o", str(work / "st"),
                         "--force-overwrite", "true", "-r", "nvtxgpuproj", str(trace)],
                        timeout=peer_timeout))
            if nsysai and "nsys-ai" in cases:
                link = work / f"nsysai{i}" / trace.name
                link.parent.mkdir()
                link.symlink_to(trace)
                evict(trace)
                for label in ("nsys-ai 4 skills, cold", "nsys-ai 4 skills, warm"):
                    out.setdefault(label, []).append(total([
                        run([nsysai, "skill", "run", s, str(link)], cwd=work,
                            timeout=peer_timeout) for s in SKILLS]))
                shutil.rmtree(link.parent, ignore_errors=True)
            if "floor" in cases:
                for label, statements in (("", sql[0]), (" + host tables", sql[1])):
                    evict(trace)
                    out.setdefault(f"sqlite3 floor{label} (cold)", []).append(
                        run(["sqlite3", f"file:{trace}?mode=ro", statements]))
                    out.setdefault(f"sqlite3 floor{label} (warm)", []).append(
                        run(["sqlite3", f"file:{trace}?mode=ro", statements]))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    # median by wall time: a loaded 2-core machine makes single runs noisy
    return {k: sorted(v, key=lambda r: r.wall)[len(v) // 2] for k, v in out.items()}


def kernels_of(trace: Path) -> int:
    import sqlite3

    con = sqlite3.connect(f"file:{trace}?mode=ro", uri=True)
    try:
        return con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    finally:
        con.close()


def table(trace: Path, res: dict[str, Run]) -> list[str]:
    base = res["nsysan all, cold"].wall if "nsysan all, cold" in res else float("nan")
    floor = res.get("sqlite3 floor (cold)")
    lines = [f"**{trace.name}** ({kernels_of(trace):,} kernels, "
             f"{trace.stat().st_size / 2**20:,.0f} MiB)", "",
             "| case | wall | CPU | peak RSS | wall / nsysan all cold | wall / sqlite3 floor |",
             "|---|---:|---:|---:|---:|---:|"]
    for k, r in res.items():
        bad = " (killed at timeout)" if r.rc == -9 else " (failed)" if r.rc else ""
        vs_floor = r.wall / floor.wall if floor else float("nan")
        lines.append(f"| {k}{bad} | {r.wall:.2f} s | {r.cpu:.2f} s | {r.rss_mb:,.0f} MB | "
                     f"{r.wall / base:.2f} | {vs_floor:.2f} |")
    return [*lines, ""]


def write_section(lines: list[str]) -> None:
    path = HERE / "RESULTS.md"
    text = path.read_text() if path.exists() else "# Benchmark results\n"
    # its own section: the hand-written "Analyze (end to end, peers)" analysis stays as is
    head = "## Analyze: last bench_analyze.py --write run"
    body = "\n".join([head, "", *lines]).rstrip() + "\n"
    if head in text:
        start = text.index(head)
        nxt = text.find("\n## ", start + len(head))
        text = text[:start] + body + (text[nxt:] if nxt >= 0 else "")
    else:
        text = text.rstrip() + "\n\n" + body
    path.write_text(text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("traces", nargs="*", type=Path)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--nsysai", default=shutil.which("nsys-ai") or
                    ("/tmp/nsysai-venv/bin/nsys-ai" if Path("/tmp/nsysai-venv/bin/nsys-ai")
                     .exists() else None))
    ap.add_argument("--no-nsysai", action="store_true")
    ap.add_argument("--cases", default=",".join(CASES),
                    help=f"comma-separated subset of: {', '.join(CASES)}")
    ap.add_argument("--peer-timeout", type=float, default=300,
                    help="kill a peer's process after this many seconds (reported as failed)")
    ap.add_argument("--write", action="store_true", help="update bench/RESULTS.md")
    args = ap.parse_args(argv)
    traces = [t.resolve() for t in args.traces] or [
        SC22, *sorted((HERE / "data").glob("*_x*.sqlite"), key=lambda p: p.stat().st_size)]
    nsysai = None if args.no_nsysai else args.nsysai
    needed = needed_columns(SC22 if SC22.exists() else traces[0])
    # the issue's floor (the canonical event frames' columns), and with the host tables
    sql = (floor_sql(needed, host=False), floor_sql(needed, host=True))
    print(f"floor statements:\n{sql[1]}", file=sys.stderr)
    lines = [f"`python bench/bench_analyze.py {' '.join(argv or sys.argv[1:])}`".replace(
        " `", "`"), "",
        f"Machine: {os.cpu_count()} CPUs, Python {platform.python_version()}, load average "
        f"{os.getloadavg()[0]:.1f} at start; median of {args.repeat} run(s) by wall time. "
        "CPU = user + system time of the process tree; peak RSS = the largest process.", ""]
    for trace in traces:
        print(f"{trace} ...", file=sys.stderr)
        res = bench_trace(trace, args.repeat, nsysai, sql, args.peer_timeout,
                          tuple(args.cases.split(",")))
        lines += table(trace, res)
        print("\n".join(table(trace, res)))
    if args.write:
        write_section(lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
