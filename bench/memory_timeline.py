"""Peak memory of one `nsysan analyze`, with a timeline of what was running at each moment.

    python bench/memory_timeline.py TRACE [--passes P,P] [--cache DIR | --no-cache]
                                    [--workers N] [--interval-ms 5] [--json FILE]

Runs the same library call as ``nsysan analyze TRACE -o OUT`` (`nsysan.api.analyze_to_dir`) in
this process while a thread samples the resident set size (``/proc/self/statm``) every
``--interval-ms``. Every phase is timed by wrapping, for this run only, the functions that
do it: each frame build (``frame:gpu_ops``, ...), each pass (``pass:steps``, ...), the
findings, the Parquet tables and the reports. It prints every phase with its start, end, RSS
when it started and ended and the highest RSS while it ran, then the peak and the phases
running at that moment: which frame or pass holds the peak.

RSS is the whole process: imports (polars, numpy) included, as ``/usr/bin/time`` reports it.
Each phase also gets the system CPU time and minor page faults of the process while it ran
(phases that overlap share them): fresh pages the kernel zeroes are most of a big analysis'
system time.
Without ``--cache`` the frame cache is off (a cold SQLite read, the first analysis of a trace).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

PAGE = os.sysconf("SC_PAGE_SIZE")


TICK = os.sysconf("SC_CLK_TCK")


def rss_bytes() -> int:
    with open("/proc/self/statm", "rb") as f:
        return int(f.read().split()[1]) * PAGE


def kernel_work() -> tuple[float, int]:
    """This process's system CPU seconds and minor page faults so far (``/proc/self/stat``):
    what the kernel spent giving it fresh pages, most of a big analysis' system time."""
    with open("/proc/self/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return int(fields[12]) / TICK, int(fields[7])


@dataclass
class Span:
    name: str
    start_s: float
    end_s: float | None = None
    rss_start: int = 0
    rss_end: int = 0
    rss_max: int = 0
    sys_s: float = 0.0
    faults: int = 0


class Recorder:
    """The RSS samples of this process and the phases that ran meanwhile."""

    def __init__(self, interval_s: float):
        self.t0 = time.perf_counter()
        self.interval_s = interval_s
        self.samples: list[tuple[float, int]] = []
        self.spans: list[Span] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.samples.append((self.now(), rss_bytes()))
            self._stop.wait(self.interval_s)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append((self.now(), rss_bytes()))

    def wrap(self, name: str, fn):
        def timed(*args, **kwargs):
            span = Span(name, self.now(), rss_start=rss_bytes())
            sys0, faults0 = kernel_work()
            with self._lock:
                self.spans.append(span)
            try:
                return fn(*args, **kwargs)
            finally:
                span.end_s, span.rss_end = self.now(), rss_bytes()
                sys1, faults1 = kernel_work()
                span.sys_s, span.faults = sys1 - sys0, faults1 - faults0

        timed.__wrapped__ = fn
        return timed

    def finish(self) -> None:
        for span in self.spans:
            inside = [r for t, r in self.samples if span.start_s <= t <= (span.end_s or 1e18)]
            span.rss_max = max([span.rss_start, span.rss_end, *inside])


def instrument(rec: Recorder, trace) -> None:
    """Wrap the frame builds of ``trace``, every registered pass, the findings and the
    writers (attributes looked up at call time by `nsysan.api`)."""
    import nsysan.findings
    import nsysan.report.parquet
    import nsysan.report.write
    from nsysan.passes import registry

    loader = trace._loader
    trace._loader = lambda name: rec.wrap(f"frame:{name}", loader)(name)
    for spec in registry.registry().values():
        object.__setattr__(spec, "run", rec.wrap(f"pass:{spec.name}", spec.run))
    nsysan.findings.diagnose = rec.wrap("findings", nsysan.findings.diagnose)
    nsysan.report.parquet.write_tables = rec.wrap("write_parquet",
                                                  nsysan.report.parquet.write_tables)
    nsysan.report.write.write_report = rec.wrap("write_report",
                                                nsysan.report.write.write_report)


def mb(n: int) -> str:
    return f"{n / 1e6:,.0f}"


def report(rec: Recorder, total_s: float) -> dict:
    rec.finish()
    peak_t, peak = max(rec.samples, key=lambda s: s[1])
    at_peak = [s.name for s in rec.spans if s.start_s <= peak_t <= (s.end_s or 1e18)]
    print(f"{'phase':28s} {'start s':>8s} {'end s':>8s} {'RSS in MB':>10s} {'out MB':>8s} "
          f"{'max MB':>8s} {'sys s':>7s} {'faults':>9s}")
    for s in sorted(rec.spans, key=lambda s: s.start_s):
        print(f"{s.name:28s} {s.start_s:8.2f} {(s.end_s or 0):8.2f} {mb(s.rss_start):>10s} "
              f"{mb(s.rss_end):>8s} {mb(s.rss_max):>8s} {s.sys_s:7.2f} {s.faults:9,d}")
    ru = resource.getrusage(resource.RUSAGE_SELF)
    print(f"\npeak RSS {mb(peak)} MB at {peak_t:.2f} s, during: {', '.join(at_peak) or '-'}")
    print(f"wall {total_s:.2f} s, CPU {ru.ru_utime + ru.ru_stime:.2f} s "
          f"(system {ru.ru_stime:.2f} s, {ru.ru_minflt:,d} minor faults), "
          f"ru_maxrss {ru.ru_maxrss / 1e3:,.0f} MB")
    return {"peak_rss": peak, "peak_s": peak_t, "at_peak": at_peak, "wall_s": total_s,
            "spans": [asdict(s) for s in rec.spans],
            "samples": rec.samples}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace", type=Path)
    ap.add_argument("--passes", default=None)
    cache = ap.add_mutually_exclusive_group()
    cache.add_argument("--cache", type=Path, default=None, help="frame cache directory")
    cache.add_argument("--no-cache", action="store_true", help="(the default)")
    ap.add_argument("--workers", type=int, default=None, help="NSYSAN_PASS_WORKERS")
    ap.add_argument("--interval-ms", type=float, default=5.0)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.workers:
        os.environ["NSYSAN_PASS_WORKERS"] = str(args.workers)
    if args.cache:
        os.environ["NSYSAN_CACHE_DIR"] = str(args.cache)
    # as the ``nsysan`` command does before it runs (`nsysan.frames.heap.share_one_arena`)
    from nsysan.frames.heap import share_one_arena

    share_one_arena()
    rec = Recorder(args.interval_ms / 1e3)
    rec.start()
    import nsysan.api as api
    from nsysan.load import open_trace

    t = time.perf_counter()
    trace = rec.wrap("open", open_trace)(args.trace, frame_cache=bool(args.cache))
    instrument(rec, trace)
    with tempfile.TemporaryDirectory() as out:
        passes = args.passes.split(",") if args.passes else None
        api.analyze_to_dir(trace, out, passes=passes)
        total = time.perf_counter() - t
    rec.stop()
    data = report(rec, total)
    if args.json:
        args.json.write_text(json.dumps(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
