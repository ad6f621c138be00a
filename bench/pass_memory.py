"""Where one pass holds its memory: the highest RSS at each line of nsysan it runs.

    python bench/pass_memory.py TRACE PASS [--cache DIR] [--interval-ms 3] [--top 20]

Loads the big frames (``gpu_ops``, ``cuda_api``, ``nvtx``, ``sync``; from the frame cache
``DIR`` when given, which makes repeated runs cheap), runs the passes PASS depends on inside
one analysis context (so the products they share are there, as in ``nsysan analyze``), then
runs PASS alone while a thread samples, every ``--interval-ms``, the resident set size
(``/proc/self/statm``) and the innermost nsysan lines of the main thread. It prints the RSS
before PASS, its peak, and the lines where the highest RSS was seen, relative to that
start.

Why beside `memory_timeline.py`: a whole analysis builds frames and runs passes at the same
time, so the phase holding its peak moves between runs by a few hundred MB on a 10M-kernel
trace; a pass alone on loaded frames gives a before/after that repeats. The RSS of the loaded
frames itself varies between runs (allocator state): compare the absolute peaks, and read the
relative figures for where in the pass the memory goes.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

PAGE = os.sysconf("SC_PAGE_SIZE")
FRAMES = ("gpu_ops", "cuda_api", "nvtx", "sync")


def rss_mb() -> float:
    with open("/proc/self/statm", "rb") as f:
        return int(f.read().split()[1]) * PAGE / 1e6


def where(frame, depth: int) -> str:
    """The innermost ``depth`` nsysan lines of a stack, innermost first."""
    lines = []
    while frame is not None and len(lines) < depth:
        path = frame.f_code.co_filename
        if "nsysan" in path and not path.endswith(("schedule.py", "context.py")):
            lines.append(f"{path.rsplit('nsysan/', 1)[-1]}:{frame.f_lineno}")
        frame = frame.f_back
    return " < ".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", type=Path)
    ap.add_argument("pass_name", metavar="PASS")
    ap.add_argument("--cache", type=Path, help="frame cache directory (default: no cache)")
    ap.add_argument("--interval-ms", type=float, default=3.0)
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--depth", type=int, default=3, help="nsysan lines per stack")
    args = ap.parse_args()
    if args.cache is not None:
        os.environ["NSYSAN_CACHE_DIR"] = str(args.cache)
    else:
        os.environ["NSYSAN_NO_CACHE"] = "1"

    from nsysan.load import open_trace
    from nsysan.passes import registry
    from nsysan.passes.schedule import analysis_context, run_passes

    trace = open_trace(args.trace)
    specs = registry.resolve([args.pass_name])
    params = registry.build_params(specs, None)
    for name in FRAMES:
        if trace.has(name):
            trace.frame(name)
    seen: dict[str, float] = defaultdict(float)
    done = threading.Event()
    main_id = threading.main_thread().ident

    def sample() -> None:
        while not done.is_set():
            frame = sys._current_frames().get(main_id)
            rss = rss_mb()
            key = where(frame, args.depth)
            seen[key] = max(seen[key], rss)
            time.sleep(args.interval_ms / 1000)

    with analysis_context(trace) as ctx:
        deps = [s for s in specs if s.name != args.pass_name]
        results = run_passes(deps, ctx, params, 1)[0] if deps else {}
        spec = next(s for s in specs if s.name == args.pass_name)
        before = rss_mb()
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        t0 = time.perf_counter()
        spec.run(ctx, params[spec.name], results)
        wall = time.perf_counter() - t0
        done.set()
        sampler.join()
    peak = max(seen.values(), default=before)
    print(f"{args.pass_name}: {wall:.2f} s; RSS before {before:,.0f} MB, peak {peak:,.0f} MB "
          f"(+{peak - before:,.0f})")
    for key, mb in sorted(seen.items(), key=lambda kv: -kv[1])[:args.top]:
        print(f"{mb - before:+8,.0f} MB  {key or '(outside nsysan)'}")


if __name__ == "__main__":
    main()
