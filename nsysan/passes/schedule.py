"""Run the selected passes of one trace, two at a time where their dependencies allow.

Why: a pass is a chain of polars and numpy calls, and many of them run on one core (numpy
sweeps, sorts of small frames, Python glue between calls). Both release the GIL for the work
itself, so two independent passes in two threads keep both cores of a small machine busy:
attribution and kernels need nothing from steps and run while it does; gaps, overlap and nccl
start as soon as steps is done. Results do not depend on the order: each pass reads only the
trace's frames (built once, under a lock) and the results of the passes it names in
``requires``/``after``, which are finished before it starts.

It pays on big traces only (the measurements: bench/RESULTS.md, "Pass concurrency"): on small
traces (below `CONCURRENT_MIN_OPS` GPU ops) a pass is many short calls, each holding the GIL for
its Python part, and two threads were no faster than one, so they run one at a time. Concurrency
also costs memory (two passes' intermediates alive at once), so traces above
`CONCURRENT_MAX_OPS`, where one pass alone holds gigabytes, run one pass at a time too.

The passes of one analysis share derived products (sorted ops, launch links, state sweeps)
through its `AnalysisContext` (`nsysan.frames.context`), which `analysis_context` opens and
closes: the scheduler owns the context's lifecycle.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any

from nsysan.errors import ConfigError
from nsysan.frames.context import AnalysisContext
from nsysan.frames.heap import trim
from nsysan.frames.trace import Trace
from nsysan.passes.base import PassResult, PassSpec

#: Passes run two at a time on traces with this many kernels or more ...
CONCURRENT_MIN_OPS = 100_000
#: ... and at most this many (bounded peak memory on huge traces).
CONCURRENT_MAX_OPS = 3_000_000
#: Set to 1 to run passes one at a time (debugging, profiling a single pass).
WORKERS_ENV = "NSYSAN_PASS_WORKERS"


def pass_workers(trace: Trace) -> int:
    """How many passes may run at once on ``trace``: ``$NSYSAN_PASS_WORKERS`` when set,
    else 2 on a machine with 2+ cores and a trace of `CONCURRENT_MIN_OPS` to
    `CONCURRENT_MAX_OPS` kernels (counted from the export's table sizes), else 1."""
    asked = _workers_asked()
    if asked is not None:
        return asked
    if (os.cpu_count() or 1) < 2:
        return 1
    ops = trace.meta.tables.get("CUPTI_ACTIVITY_KIND_KERNEL", 0)
    return 2 if CONCURRENT_MIN_OPS <= ops <= CONCURRENT_MAX_OPS else 1


def overlap_outputs(trace: Trace) -> bool:
    """True when the page's timeline may be built while the findings are drawn: on a
    machine with 2+ cores, unless ``$NSYSAN_PASS_WORKERS`` asks for one thing at a time,
    and up to `CONCURRENT_MAX_OPS` kernels (above, the two transients at once would raise
    the peak memory the findings already set)."""
    if _workers_asked() == 1 or (os.cpu_count() or 1) < 2:
        return False
    return trace.meta.tables.at_most("CUPTI_ACTIVITY_KIND_KERNEL") <= CONCURRENT_MAX_OPS


def _workers_asked() -> int | None:
    """``$NSYSAN_PASS_WORKERS`` when it is a positive count, else None."""
    env = os.environ.get(WORKERS_ENV, "").strip()
    return int(env) if env.isdigit() and int(env) > 0 else None


def build_workers(trace: Trace) -> int:
    """How many frames of ``trace`` may be built at once, whatever number of `Trace.prefetch`
    calls asked for them: 4 (two threads for the event frames, two for the host frames),
    but 2 above `CONCURRENT_MAX_OPS` kernels, where each build's transient copies (the
    SQLite read, its sort) are gigabytes and four at once made the peak of a 10M-kernel
    trace depend on how long they happened to overlap."""
    # (a bound known at once: the host frames are queued as soon as the trace is open, and a
    # count(*) of a cold 10M-kernel file takes seconds)
    ops = trace.meta.tables.at_most("CUPTI_ACTIVITY_KIND_KERNEL")
    return 2 if ops > CONCURRENT_MAX_OPS else 4


def passes_wait_for_frames(trace: Trace) -> bool:
    """True when the passes of an analysis of ``trace`` start only once its prefetched
    frames are built: above `CONCURRENT_MAX_OPS` kernels, where the builds are bounded
    (`build_workers`) and take tens of seconds. A pass started earlier waits inside
    ``frame()`` for the frames it reads while holding what it computed from the others: on
    the 10M-kernel copy the steps pass held its device segments for ~28 s beside the last
    builds, and that was the peak of the whole analysis (bench/RESULTS.md)."""
    return trace.meta.tables.at_most("CUPTI_ACTIVITY_KIND_KERNEL") > CONCURRENT_MAX_OPS


@contextlib.contextmanager
def analysis_context(trace: Trace) -> Iterator[AnalysisContext]:
    """One analysis of ``trace``: the `AnalysisContext` its passes, findings and reports share
    products through, closed (every product freed) when the block ends, however it ends.
    Inside an open context (``trace`` is one already) the block joins it: the outermost owner
    closes it."""
    if isinstance(trace, AnalysisContext):
        yield trace
        return
    ctx = AnalysisContext(trace)
    try:
        yield ctx
    finally:
        ctx.close()


def run_passes(
    specs: Sequence[PassSpec],
    trace: Trace,
    params: Mapping[str, Any],
    workers: int = 1,
    *,
    release_frames: bool = False,
) -> tuple[dict[str, PassResult], dict[str, float]]:
    """Run ``specs`` (in dependency order, as `registry.resolve` gives them) on ``trace``.

    Returns the results and each pass's wall time, both keyed and ordered like ``specs``.
    A pass is handed the results of exactly the passes it names in ``requires`` and ``after``
    (those selected), so what it computes never depends on which other passes ran before it.
    Passes start in `run_order`; with ``workers > 1`` a pass starts once every pass it
    depends on has finished, earlier ones in that order first, and the wall times of passes
    that ran together overlap. After a failure no further pass starts; once the running ones
    are done, the error of the earliest failed pass in that order is raised (the same error
    as a serial run, when passes fail alone).
    The passes share products through the `analysis_context` of ``trace`` (the caller's, when
    ``trace`` is one; else one that ends with the passes). With ``release_frames``, the
    frames a pass ``releases`` are released from the trace once the last selected pass
    naming them has ended (`_Releases`): for callers that read nothing but the results and
    the shared products afterwards (``nsysan analyze``, which frees gigabytes of host frames
    of a big trace before the findings and pictures).
    """
    with analysis_context(trace) as ctx:
        releases = _Releases(specs, ctx) if release_frames else None
        results, timings = _run(run_order(specs), ctx, params, workers, releases)
    return ({s.name: results[s.name] for s in specs},
            {s.name: timings[s.name] for s in specs})


def run_order(specs: Sequence[PassSpec]) -> list[PassSpec]:
    """``specs`` in the order they are started: a dependency order where, whenever several
    passes could start, one that frees memory (`PassSpec.releases` frames or
    `PassSpec.frees` products) goes first; among equals, ``specs`` order.

    Why: what a pass frees is memory every later pass runs beside. The overlap pass takes
    over the steps pass's state sweeps (~1 GB on a 10M-kernel trace), and the host pass's
    frames go when it ends (~0.8 GB): started as soon as the passes they need have ended
    (steps; steps and gaps), they free it before the passes that need neither run, instead
    of after them. No result depends on the order (`run_passes`)."""
    needs = _needs(specs)
    order: list[PassSpec] = []
    done: set[str] = set()
    waiting = list(specs)
    while waiting:
        ready = [s for s in waiting if needs[s.name] <= done]
        if not ready:  # a cycle: `_run` reports it (ConfigError); the rest in specs order
            order += waiting
            break
        spec = next((s for s in ready if s.releases or s.frees), ready[0])
        order.append(spec)
        done.add(spec.name)
        waiting.remove(spec)
    return order


def _needs(specs: Sequence[PassSpec]) -> dict[str, set[str]]:
    """Per pass, the passes of ``specs`` it waits for (``requires`` and ``after``)."""
    names = {s.name for s in specs}
    return {s.name: {d for d in (*s.requires, *s.after) if d in names} for s in specs}


class _Releases:
    """Which frames to release from ``trace`` when each pass of ``specs`` ends."""

    def __init__(self, specs: Sequence[PassSpec], trace: Trace):
        self.trace = trace
        self.readers: dict[str, int] = {}
        for spec in specs:
            for frame in spec.releases:
                self.readers[frame] = self.readers.get(frame, 0) + 1

    def ended(self, spec: PassSpec) -> None:
        for frame in spec.releases:
            self.readers[frame] -= 1
            if self.readers[frame] == 0:
                self.trace.release([frame])


def _run(
    specs: Sequence[PassSpec], trace: AnalysisContext, params: Mapping[str, Any], workers: int,
    releases: _Releases | None = None,
) -> tuple[dict[str, PassResult], dict[str, float]]:
    needs = _needs(specs)
    if workers <= 1:
        results: dict[str, PassResult] = {}
        timings: dict[str, float] = {}
        for spec in specs:
            if not needs[spec.name] <= results.keys():  # (`run_order` leaves a cycle last)
                names = ", ".join(s.name for s in specs if s.name not in results)
                raise ConfigError(f"passes {names} wait for each other (dependency cycle)")
            t = time.perf_counter()
            prior = {d: results[d] for d in needs[spec.name]}
            results[spec.name] = _run_pass(spec, trace, params, prior)
            timings[spec.name] = time.perf_counter() - t
            if releases is not None:
                releases.ended(spec)
        return results, timings
    return _concurrent(specs, trace, params, needs, workers, releases)


def _run_pass(spec: PassSpec, trace: Trace, params: Mapping[str, Any],
              prior: dict[str, PassResult]) -> PassResult:
    """Run one pass, then give back the C heap's memory it freed (`nsysan.frames.heap`): the
    numpy arrays of one pass, kept by glibc for reuse, were otherwise resident beside the
    next pass's."""
    result = spec.run(trace, params[spec.name], prior)
    trim()
    return result


def _concurrent(
    specs: Sequence[PassSpec], trace: Trace, params: Mapping[str, Any],
    needs: Mapping[str, set[str]], workers: int, releases: _Releases | None = None,
) -> tuple[dict[str, PassResult], dict[str, float]]:
    done: dict[str, PassResult] = {}
    timings: dict[str, float] = {}
    waiting = list(specs)
    running: dict[Future[tuple[PassResult, float]], PassSpec] = {}
    failed: dict[int, BaseException] = {}  # by spec index: the earliest one is raised

    def timed(spec: PassSpec, prior: dict[str, PassResult]) -> tuple[PassResult, float]:
        t = time.perf_counter()
        return _run_pass(spec, trace, params, prior), time.perf_counter() - t

    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="nsysan-pass")
    try:
        while running or (waiting and not failed):
            if not failed:
                for spec in [s for s in waiting if needs[s.name] <= done.keys()]:
                    if len(running) >= workers:
                        break
                    waiting.remove(spec)
                    prior = {d: done[d] for d in needs[spec.name]}
                    running[pool.submit(timed, spec, prior)] = spec
                if not running:  # `registry.resolve` rejects cycles; a caller's own list may not
                    names = ", ".join(s.name for s in waiting)
                    raise ConfigError(f"passes {names} wait for each other (dependency cycle)")
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in finished:
                spec = running.pop(future)
                try:
                    done[spec.name], timings[spec.name] = future.result()
                except BaseException as exc:  # raised once the running passes are done
                    failed[specs.index(spec)] = exc
                else:
                    if releases is not None:
                        releases.ended(spec)
    finally:
        # Normally every pass is done here; on Ctrl-C, do not wait for those still running.
        pool.shutdown(wait=False, cancel_futures=True)
    if failed:
        raise failed[min(failed)]
    return ({s.name: done[s.name] for s in specs},
            {s.name: timings[s.name] for s in specs})
