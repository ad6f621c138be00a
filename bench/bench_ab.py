"""A/B of ``nsysan analyze`` between two checkouts, runs alternated (issue 17).

    python bench/bench_ab.py BASE_CHECKOUT [TRACE ...] [--repeat N] [--cache]

Each round runs ``python -m nsysan analyze TRACE -o OUT`` once with ``PYTHONPATH`` = the
base checkout and once with this checkout (the order flips every round, so a drift of the
machine's load hits both alike), every run a new process measured by `bench_analyze.run`
(wall, CPU, peak RSS). Without ``--cache`` the frame cache is off (the SQLite read
is part of every run); with it, each side has its own cache directory, filled by a first
unmeasured run. Prints the median and the range of each side.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_analyze import SC22, run  # noqa: E402

HEAD = HERE.parent


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("base", type=Path)
    ap.add_argument("traces", nargs="*", type=Path)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--cache", action="store_true")
    a = ap.parse_args(argv)
    sides = {"base": a.base.resolve(), "head": HEAD}
    for trace in a.traces or [SC22]:
        with tempfile.TemporaryDirectory(prefix="nsysan-ab-") as tmp:
            work = Path(tmp)
            env = {name: {"PYTHONPATH": str(root), "NSYSAN_CACHE_DIR": str(work / f"c-{name}"),
                          **({} if a.cache else {"NSYSAN_NO_CACHE": "1"})}
                   for name, root in sides.items()}
            cmd = [sys.executable, "-m", "nsysan", "analyze", str(trace), "-q"]
            for name in sides:  # warm-up: page cache, imports, the frame cache when on
                run([*cmd, "-o", str(work / f"o-{name}")], env[name])
            got: dict[str, list] = {name: [] for name in sides}
            for i in range(a.repeat):
                order = list(sides) if i % 2 == 0 else list(sides)[::-1]
                for name in order:
                    got[name].append(run([*cmd, "-o", str(work / f"o-{name}")], env[name]))
            print(f"{trace.name} ({'frame cache' if a.cache else 'no cache'}, "
                  f"{a.repeat} alternated runs each)")
            for name, runs in got.items():
                wall = [r.wall for r in runs]
                rss = [r.rss_mb for r in runs]
                cpu = [r.cpu for r in runs]
                print(f"  {name}: wall median {statistics.median(wall):.2f} s "
                      f"[{min(wall):.2f}-{max(wall):.2f}], CPU median "
                      f"{statistics.median(cpu):.2f} s, peak RSS median "
                      f"{statistics.median(rss):.0f} MB [{min(rss):.0f}-{max(rss):.0f}]"
                      + ("" if all(r.rc in (0, 3) for r in runs) else "  (a run failed)"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
