"""What building one canonical frame alone costs: wall and CPU time, peak RSS, frame size.

    python bench/frame_build.py TRACE FRAME [FRAME ...] [--repeat 3] [--base-src DIR]

Each run is a new process that opens TRACE with the frame cache off and builds each FRAME in
turn (a frame the builder needs, as ``sync`` needs ``cuda_api``, is built with it and counted
in it); it prints, per frame, the wall and CPU seconds, the process's peak RSS (``ru_maxrss``,
imports included) and the frame's ``estimated_size``. With ``--base-src DIR`` (a checkout of
another commit, e.g. ``git worktree add /tmp/base COMMIT``) the same runs are made with that
tree's nsysan, alternated with this one's (base, head, base, head, ...), so that machine
load drifts hit both alike; compare the medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent

CHILD = """
import json, os, resource, sys, time
sys.path.insert(0, {src!r})
os.environ["NSYSAN_NO_CACHE"] = "1"
import nsysan
from nsysan.load import open_trace
assert nsysan.__file__.startswith({src!r}), nsysan.__file__
trace = open_trace({trace!r}, frame_cache=False)
out = []
for name in {frames!r}:
    t0, c0 = time.perf_counter(), time.process_time()
    df = trace.frame(name)
    out.append({{"frame": name, "wall_s": time.perf_counter() - t0,
                "cpu_s": time.process_time() - c0,
                "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                "size_mb": df.estimated_size() / 2**20, "rows": df.height}})
print(json.dumps(out))
"""


def run(src: Path, trace: str, frames: list[str]) -> list[dict]:
    code = CHILD.format(src=str(src), trace=trace, frames=frames)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, cwd="/")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("frames", nargs="+")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--base-src", type=Path)
    args = ap.parse_args()
    trees = [("base", args.base_src.resolve())] if args.base_src else []
    trees.append(("head", HERE))
    results: dict[str, list[list[dict]]] = {name: [] for name, _ in trees}
    for i in range(args.repeat):
        for name, src in trees:
            res = run(src, str(Path(args.trace).resolve()), args.frames)
            results[name].append(res)
            print(f"run {i + 1} {name}: " + "; ".join(
                f"{r['frame']} {r['wall_s']:.2f} s, peak {r['peak_mb']:,.0f} MB"
                for r in res), flush=True)
    print(f"\n{'tree':6} {'frame':12} {'rows':>11} {'size MB':>8} {'wall s':>7} {'CPU s':>7} "
          f"{'peak MB':>8}   (medians of {args.repeat})")
    for name, _ in trees:
        for k, frame in enumerate(args.frames):
            rows = [run_[k] for run_ in results[name]]

            def med(key: str, rows: list[dict] = rows) -> float:
                return statistics.median(r[key] for r in rows)

            print(f"{name:6} {frame:12} {rows[0]['rows']:>11,} {med('size_mb'):>8,.0f} "
                  f"{med('wall_s'):>7.2f} {med('cpu_s'):>7.2f} {med('peak_mb'):>8,.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
