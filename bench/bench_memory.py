"""Cost of the memory pass (issue 23): `nsysan analyze` with and without it on a trace with
1M CUDA memory-usage events, runs alternated.

    python bench/bench_memory.py [--base SRC.sqlite] [--kernels 1000000] [--events 1000000]
                                 [--repeat 5] [--work DIR]

The trace: ``SRC`` (default: the shared sc22 4-GPU DDP export) scaled to ``--kernels`` kernels
with bench/scale_trace.py, plus ``--events`` memory-usage events written by SQLite itself: one
per runtime API call in time order (so each joins its call and the NVTX range around it),
alternating allocation and free of the same address (a saw-tooth), device memory, on the
device of the call's process. The two cases are ``nsysan analyze TRACE -o OUT`` (the memory
pass runs: the trace holds events), the same with ``--set memory.sites=false`` (no allocation
sites), and with ``--passes`` = the default passes (no memory pass, memory_events never read);
each run is a new process, the cases alternate so
that machine load drifts hit both alike, and the medians are compared.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sqlite3
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared" / "traces"
DEFAULT_BASE = SHARED / "sc22-ddp-4gpu-nccl" / "4gpu_baseline.nsys-rep.nsys2022.4.2.sqlite"
DEFAULTS = "steps,gaps,overlap,attribution,kernels,nccl"
COLUMNS = (
    "start INTEGER NOT NULL, globalPid INTEGER NOT NULL, deviceId INTEGER NOT NULL, "
    "contextId INTEGER NOT NULL, address INTEGER NOT NULL, pc INTEGER NOT NULL, bytes INTEGER "
    "NOT NULL, memKind INTEGER NOT NULL, memoryOperationType INTEGER NOT NULL, name TEXT, "
    "correlationId INTEGER, localMemoryPoolAddress INTEGER, localMemoryPoolReleaseThreshold "
    "INTEGER, localMemoryPoolSize INTEGER, localMemoryPoolUtilizedSize INTEGER, "
    "importedMemoryPoolAddress INTEGER, importedMemoryPoolProcessId INTEGER"
)


def add_events(path: Path, n: int) -> int:
    con = sqlite3.connect(path, isolation_level=None)
    try:
        con.execute("PRAGMA journal_mode=OFF")
        con.execute("DROP TABLE IF EXISTS CUDA_GPU_MEMORY_USAGE_EVENTS")
        con.execute(f"CREATE TABLE CUDA_GPU_MEMORY_USAGE_EVENTS ({COLUMNS})")
        # the device of each process: that of its first kernel
        con.execute(f"""
            INSERT INTO CUDA_GPU_MEMORY_USAGE_EVENTS
            SELECT r.start + 1, (r.globalTid / 16777216) * 16777216, coalesce(d.dev, 0), 1,
                   4096 * ((r.k / 2) % 100000), 0, 4096 * (1 + (r.k / 2) % 1000), 2, r.k % 2,
                   NULL, r.correlationId, NULL, NULL, NULL, NULL, NULL, NULL
            FROM (SELECT start, globalTid, correlationId,
                         row_number() OVER (PARTITION BY globalTid / 16777216
                                            ORDER BY start, correlationId) - 1 AS k
                  FROM CUPTI_ACTIVITY_KIND_RUNTIME ORDER BY start LIMIT {int(n)}) AS r
            LEFT JOIN (SELECT globalPid / 16777216 AS p, min(deviceId) AS dev
                       FROM CUPTI_ACTIVITY_KIND_KERNEL GROUP BY 1) AS d
              ON d.p = r.globalTid / 16777216""")
        return con.execute("SELECT count(*) FROM CUDA_GPU_MEMORY_USAGE_EVENTS").fetchone()[0]
    finally:
        con.close()


def run(trace: Path, out: Path, passes: str | None) -> tuple[float, float, dict]:
    cmd = [sys.executable, "-m", "nsysan", "analyze", str(trace), "-o", str(out)]
    if passes == "sites":
        cmd += ["--set", "memory.sites=false"]
    elif passes:
        cmd += ["--passes", passes]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    t = time.perf_counter()
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    if p.returncode not in (0, 1):  # 1: findings at the failing severity
        raise SystemExit(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr[-2000:]}")
    manifest = json.loads(next(out.glob("*/manifest.json")).read_text())
    return wall, cpu, manifest.get("timings_s", {})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", type=Path, default=DEFAULT_BASE)
    ap.add_argument("--kernels", type=int, default=1_000_000)
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--work", type=Path, default=Path("/tmp/nsysan-bench-memory"))
    a = ap.parse_args()
    a.work.mkdir(parents=True, exist_ok=True)
    trace = a.work / f"memory_{a.kernels}k_{a.events}e.sqlite"
    if not trace.exists():
        subprocess.run([sys.executable, str(ROOT / "bench" / "scale_trace.py"), str(a.base),
                        "--kernels", str(a.kernels), "-o", str(trace)], check=True)
        print("memory events:", add_events(trace, a.events), flush=True)
    names = ("with memory", "memory, no sites", "without")
    walls: dict[str, list[float]] = {k: [] for k in names}
    cpus: dict[str, list[float]] = {k: [] for k in names}
    passes_s: list[float] = []
    run(trace, a.work / "warmup", None)  # builds the frame cache (memory_events included)
    for i in range(a.repeat):
        cases = (("with memory", None), ("memory, no sites", "sites"), ("without", DEFAULTS))
        for case, passes in cases[:: 1 if i % 2 == 0 else -1]:
            wall, cpu, timings = run(trace, a.work / f"out_{i}", passes)
            walls[case].append(wall)
            cpus[case].append(cpu)
            if passes is None:
                passes_s.append(timings.get("memory", float("nan")))
            print(f"run {i} {case}: wall {wall:.2f} s, cpu {cpu:.2f} s", flush=True)
    for label, d in (("wall", walls), ("cpu", cpus)):
        med = {k: statistics.median(v) for k, v in d.items()}
        print(f"{label}: median " + ", ".join(f"{k} {v:.2f} s" for k, v in med.items())
              + "; ratios to without: " + ", ".join(
                  f"{k} {med[k] / med['without']:.3f}" for k in names[:2]))
    print(f"memory pass alone (manifest timings): median {statistics.median(passes_s):.2f} s")

if __name__ == "__main__":
    main()
