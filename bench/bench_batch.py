"""`nsysan batch` on a Dask cluster of separate scheduler and worker processes: 1 vs N workers.

    python bench/bench_batch.py DIR [--workers 1 2] [--repeat 1] [--worker-env K=V ...]

For each worker count (alternated when ``--repeat`` > 1): a ``dask scheduler`` process, that
many ``dask worker --nthreads 1`` processes (one trace at a time each; each a nanny process
that starts the worker process, as ``dask worker`` does by default), then
``nsysan batch DIR -o OUT --executor dask --scheduler ADDRESS`` timed from outside (a fresh
output folder each run, frame cache off: every trace read from SQLite). Reported per run: wall
time of the batch command, and each worker's peak RSS (``VmHWM`` of its process, read before
it is stopped: the nanny's child). ``DIR`` is e.g. the 16 rank files of
``bench/job_traces.py``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _hwm_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        found += [int(c) for c in text]
    return found


def _worker_hwm_mb(nanny: int) -> float:
    """Peak RSS of the worker process a nanny started (the largest child)."""
    return max((_hwm_mb(c) for c in _children(nanny)), default=_hwm_mb(nanny))


def _wait_port(port: int, timeout: float = 30) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"no scheduler on port {port}")


def one_run(inputs: Path, workers: int, env: dict[str, str]) -> tuple[float, list[float]]:
    port = _free_port()
    address = f"tcp://127.0.0.1:{port}"
    dask = shutil.which("dask") or "dask"
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    sched = subprocess.Popen([dask, "scheduler", "--port", str(port), "--no-dashboard"],
                             **quiet)
    procs: list[subprocess.Popen] = []
    try:
        _wait_port(port)
        for _ in range(workers):
            procs.append(subprocess.Popen(
                [dask, "worker", address, "--nthreads", "1", "--no-dashboard",
                 "--memory-limit", "0"], env={**os.environ, **env}, **quiet))
        with tempfile.TemporaryDirectory() as out:
            probe = [sys.executable, "-c", "import distributed, sys; c = distributed.Client("
                     f"'{address}'); c.wait_for_workers({workers}, timeout=60); c.close()"]
            subprocess.run(probe, check=True, **quiet)
            t = time.perf_counter()
            done = subprocess.run(
                [sys.executable, "-m", "nsysan", "batch", str(inputs), "-o", out,
                 "--executor", "dask", "--scheduler", address, "--progress", "none"],
                env={**os.environ, "NSYSAN_NO_CACHE": "1"}, capture_output=True, text=True)
            wall = time.perf_counter() - t
            if done.returncode != 0:
                raise RuntimeError(f"batch failed: {done.stderr[-2000:]}")
        peaks = [_worker_hwm_mb(p.pid) for p in procs]
        return wall, peaks
    finally:
        for p in [*procs, sched]:
            p.terminate()
        for p in [*procs, sched]:
            p.wait(timeout=30)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("inputs", type=Path)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--worker-env", nargs="*", default=[],
                    help="K=V set in the worker processes' environment")
    args = ap.parse_args(argv)
    env = dict(kv.split("=", 1) for kv in args.worker_env)
    walls: dict[int, list[float]] = {n: [] for n in args.workers}
    peaks: dict[int, list[float]] = {n: [] for n in args.workers}
    for r in range(args.repeat):
        order = args.workers if r % 2 == 0 else list(reversed(args.workers))
        for n in order:
            wall, p = one_run(args.inputs, n, env)
            walls[n].append(wall)
            peaks[n].extend(p)
            print(f"workers={n} wall {wall:.1f} s, worker peak RSS "
                  f"{', '.join(f'{x:,.0f}' for x in p)} MB", flush=True)
    base = statistics.median(walls[args.workers[0]])
    for n in args.workers:
        w = statistics.median(walls[n])
        print(f"workers={n}: median wall {w:.1f} s, speed-up vs {args.workers[0]} worker(s) "
              f"{base / w:.2f}x, max worker peak {max(peaks[n]):,.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
