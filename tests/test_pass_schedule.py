"""Passes run two at a time where dependencies allow (`nsysan.passes.schedule`): same results as
one at a time, dependencies finished first, failures raised as a serial run would."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path

import polars as pl
import pytest

from nsysan.api import analyze
from nsysan.errors import ConfigError
from nsysan.frames.trace import Trace, TraceMeta
from nsysan.load import open_trace
from nsysan.passes import schedule
from nsysan.passes.base import PassResult, PassSpec
from nsysan.passes.registry import resolve
from nsysan.passes.schedule import pass_workers, run_passes
from nsysan.testing.scenarios import build


@dataclass(frozen=True)
class _NoParams:
    pass


def _trace(kernels: int = 10) -> Trace:
    meta = TraceMeta(trace_id="t", path=Path("t"), source_path=Path("t"),
                     source_format="sqlite", tables={"CUPTI_ACTIVITY_KIND_KERNEL": kernels})
    return Trace(meta, lambda name: pl.DataFrame())


def _spec(name: str, run, requires: tuple[str, ...] = (), after: tuple[str, ...] = ()):
    return PassSpec(name=name, description=name, params=_NoParams, tables={}, run=run,
                    requires=requires, after=after)


def _recording(log: list[tuple[str, str, frozenset[str]]], pause: float = 0.0):
    """A pass body that logs (event, its name, the prior results it saw)."""
    def make(name: str):
        def run(trace, params, prior) -> PassResult:
            log.append(("start", name, frozenset(prior)))
            time.sleep(pause)
            log.append(("end", name, frozenset(prior)))
            return PassResult(metrics={"n": len(prior)})
        return run
    return make


def _params(specs) -> dict[str, _NoParams]:
    return {s.name: _NoParams() for s in specs}


def test_dependencies_finish_first_and_results_match_a_serial_run() -> None:
    results = {}
    for workers in (1, 2, 3):
        log: list[tuple[str, str, frozenset[str]]] = []
        make = _recording(log, pause=0.01)
        specs = [_spec("steps", make("steps")), _spec("gaps", make("gaps"), after=("steps",)),
                 _spec("attribution", make("attribution")),
                 _spec("nccl", make("nccl"), requires=("gaps",), after=("steps", "absent"))]
        res, timings = run_passes(specs, _trace(), _params(specs), workers)
        assert list(res) == list(timings) == ["steps", "gaps", "attribution", "nccl"]
        ended = [name for event, name, _ in log if event == "end"]
        for event, name, prior in log:
            if event == "start":  # everything it depends on has ended before it starts
                assert prior <= set(ended[:ended.index(name)])
        seen = {name: prior for event, name, prior in log if event == "start"}
        assert {"steps"} <= seen["gaps"] and {"steps", "gaps"} <= seen["nccl"]
        results[workers] = {k: v.metrics for k, v in res.items() if k != "attribution"}
    # a pass sees exactly the results of the passes it depends on, whatever the concurrency
    assert results[1] == results[2] == results[3] == {
        "steps": {"n": 0}, "gaps": {"n": 1}, "nccl": {"n": 2}}


def test_independent_passes_run_at_the_same_time() -> None:
    both = threading.Barrier(2, timeout=10)

    def meet(trace, params, prior) -> PassResult:
        both.wait()  # returns only when the other pass is running too
        return PassResult()

    specs = [_spec("a", meet), _spec("b", meet)]
    res, _ = run_passes(specs, _trace(), _params(specs), workers=2)
    assert list(res) == ["a", "b"]


def test_earliest_failure_in_spec_order_is_raised_and_nothing_new_starts() -> None:
    log: list[tuple[str, str, frozenset[str]]] = []
    make = _recording(log)
    started = threading.Event()

    def late_failure(trace, params, prior) -> PassResult:
        started.wait(10)
        time.sleep(0.05)  # fails after the later pass below has failed
        raise ConfigError("first in spec order")

    def early_failure(trace, params, prior) -> PassResult:
        started.set()
        raise ValueError("later in spec order")

    specs = [_spec("a", late_failure), _spec("b", early_failure),
             _spec("c", make("c")), _spec("d", make("d"), requires=("a",))]
    with pytest.raises(ConfigError, match="first in spec order"):
        run_passes(specs, _trace(), _params(specs), workers=2)
    assert not log  # neither c (not started once b failed) nor d (its dependency failed) ran


def test_a_dependency_cycle_is_an_error_not_a_hang() -> None:
    make = _recording([])
    specs = [_spec("a", make("a"), requires=("b",)), _spec("b", make("b"), requires=("a",))]
    for workers in (1, 2):  # the same error one at a time (it was a KeyError there)
        with pytest.raises(ConfigError, match="wait for each other"):
            run_passes(specs, _trace(), _params(specs), workers=workers)


def test_pass_workers_bounds_memory_and_honours_the_environment(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(schedule.WORKERS_ENV, raising=False)
    monkeypatch.setattr(schedule.os, "cpu_count", lambda: 2)
    mid = schedule.CONCURRENT_MIN_OPS
    assert pass_workers(_trace(kernels=mid)) == 2
    assert pass_workers(_trace(kernels=schedule.CONCURRENT_MAX_OPS)) == 2
    assert pass_workers(_trace(kernels=mid - 1)) == 1  # small: the GIL, not the cores, limits
    assert pass_workers(_trace(kernels=schedule.CONCURRENT_MAX_OPS + 1)) == 1  # memory
    monkeypatch.setattr(schedule.os, "cpu_count", lambda: 1)
    assert pass_workers(_trace(kernels=mid)) == 1
    monkeypatch.setenv(schedule.WORKERS_ENV, "3")
    assert pass_workers(_trace(kernels=schedule.CONCURRENT_MAX_OPS + 1)) == 3
    monkeypatch.setenv(schedule.WORKERS_ENV, "zero")  # not a count: the default rule
    assert pass_workers(_trace(kernels=mid)) == 1


@pytest.mark.parametrize("scenario", ["exposed_allreduce", "layers"])
def test_concurrent_passes_give_the_serial_tables(
    scenario: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, _ = build(scenario, tmp_path)
    out = {}
    for workers in ("1", "2"):
        monkeypatch.setenv(schedule.WORKERS_ENV, workers)
        result = analyze(open_trace(path, frame_cache=False))
        out[workers] = result
    serial, concurrent = out["1"], out["2"]
    assert serial.tables.keys() == concurrent.tables.keys()
    for name, table in serial.tables.items():
        assert table.equals(concurrent.tables[name]), name
    assert serial.metrics == concurrent.metrics
    assert serial.diagnosis.to_dict() == concurrent.diagnosis.to_dict()


def test_passes_wait_for_the_frames_of_a_big_trace_only() -> None:
    assert not schedule.passes_wait_for_frames(_trace(kernels=schedule.CONCURRENT_MAX_OPS))
    assert schedule.passes_wait_for_frames(_trace(kernels=schedule.CONCURRENT_MAX_OPS + 1))


def test_waiting_for_the_frames_first_gives_the_same_analysis(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the passes held until the prefetched frames are built (a big trace), the first
    pass finds every frame built, the analysis is the same, and the wait is timed."""
    import nsysan.api as api_module

    path, _ = build("exposed_allreduce", tmp_path)
    plain = analyze(open_trace(path, frame_cache=False))
    built_when_passes_start: list[set[str]] = []
    real_run_passes = api_module.run_passes

    def run_passes_spy(specs, trace, *args, **kwargs):
        built_when_passes_start.append(set(trace._frames))
        return real_run_passes(specs, trace, *args, **kwargs)

    waits: list[int] = []
    real_wait = Trace.wait_for_prefetch

    def wait_spy(trace: Trace) -> None:
        real_wait(trace)
        waits.append(len(trace._prefetching.todo))

    monkeypatch.setattr(api_module, "passes_wait_for_frames", lambda trace: True)
    monkeypatch.setattr(api_module, "run_passes", run_passes_spy)
    monkeypatch.setattr(Trace, "wait_for_prefetch", wait_spy)
    waited = analyze(open_trace(path, frame_cache=False))
    assert waits == [0]  # waited once, with nothing left queued, before the passes
    assert {"gpu_ops", "nvtx", "cuda_api", "sync"} <= built_when_passes_start[0]
    assert "frames" in waited.timings_s and "frames" not in plain.timings_s
    assert plain.tables.keys() == waited.tables.keys()
    for name, table in plain.tables.items():
        assert table.equals(waited.tables[name]), name
    assert plain.diagnosis.to_dict() == waited.diagnosis.to_dict()


def test_an_interrupt_inside_a_pass_reaches_the_caller() -> None:
    def interrupted(trace, params, prior) -> PassResult:
        raise KeyboardInterrupt

    make = _recording([])
    specs = [_spec("a", interrupted), _spec("b", make("b"), requires=("a",))]
    for workers in (1, 2):
        with pytest.raises(KeyboardInterrupt):
            run_passes(specs, _trace(), _params(specs), workers)


@pytest.mark.parametrize("workers", [1, 2])
def test_frames_are_released_after_their_last_reader_when_asked(workers: int) -> None:
    built: list[str] = []
    meta = TraceMeta(trace_id="t", path=Path("t"), source_path=Path("t"),
                     source_format="sqlite", tables={"CUPTI_ACTIVITY_KIND_KERNEL": 10})
    trace = Trace(meta, lambda name: built.append(name) or pl.DataFrame())
    seen: dict[str, set[str]] = {}

    def reads(name: str, frames: tuple[str, ...]):
        def run(t, params, prior) -> PassResult:
            for f in frames:
                t.frame(f)
            seen[name] = set(trace._frames)  # what is held when this pass ends
            return PassResult()
        return run

    def spec(name, frames, releases, requires=()):
        return PassSpec(name=name, description=name, params=_NoParams, tables={},
                        run=reads(name, frames), requires=requires, releases=releases)

    specs = [spec("a", ("sched",), ("sched",)),
             spec("b", ("sched", "cpu_samples"), ("sched", "cpu_samples"), requires=("a",)),
             spec("c", ("gpu_ops",), (), requires=("b",))]
    run_passes(specs, trace, _params(specs), workers, release_frames=True)
    assert {"sched", "cpu_samples"} <= seen["b"]  # "a" ended first: b still names sched
    assert seen["c"] == {"gpu_ops"}  # released once b, their last reader, ended
    assert set(trace._frames) == {"gpu_ops"} and built.count("sched") == 1
    run_passes(specs, trace, _params(specs), workers)  # not asked: nothing is released
    assert {"sched", "cpu_samples", "gpu_ops"} <= set(trace._frames)


@pytest.mark.parametrize("workers", [1, 2])
def test_passes_that_release_frames_start_as_early_as_their_dependencies_allow(
    workers: int,
) -> None:
    log: list[tuple[str, str, frozenset[str]]] = []
    make = _recording(log)
    specs = [_spec("steps", make("steps")),
             _spec("gaps", make("gaps"), after=("steps",)),
             _spec("overlap", make("overlap"), after=("steps",)),
             _spec("attribution", make("attribution")),
             PassSpec(name="host", description="host", params=_NoParams, tables={},
                      run=make("host"), requires=("gaps",), after=("steps",),
                      releases=("sched",))]
    assert [s.name for s in schedule.run_order(specs)] == [
        "steps", "gaps", "host", "overlap", "attribution"]
    res, timings = run_passes(specs, _trace(), _params(specs), workers, release_frames=True)
    assert list(res) == list(timings) == [s.name for s in specs]  # listed in spec order
    started = [name for event, name, _ in log if event == "start"]
    if workers == 1:
        assert started == ["steps", "gaps", "host", "overlap", "attribution"]
    else:  # which of the ready passes start together depends on timing
        assert sorted(started) == sorted(s.name for s in specs)


def test_passes_that_free_memory_start_as_soon_as_their_dependencies_end() -> None:
    # overlap takes over the steps pass's sweeps, host releases its frames: each right after
    # what it needs, before the passes that need neither
    order = [s.name for s in schedule.run_order(resolve(None))]
    assert order[:4] == ["steps", "overlap", "gaps", "host"]
    assert set(order[4:]) >= {"attribution", "kernels", "nccl"}


def test_a_pass_that_frees_products_goes_before_one_that_frees_nothing() -> None:
    make = _recording([])
    specs = [_spec("steps", make("steps")),
             _spec("gaps", make("gaps"), after=("steps",)),
             PassSpec(name="overlap", description="overlap", params=_NoParams, tables={},
                      run=make("overlap"), after=("steps",), frees=("steps.segments",)),
             _spec("kernels", make("kernels"))]
    assert [s.name for s in schedule.run_order(specs)] == ["steps", "overlap", "gaps",
                                                           "kernels"]
    # a cycle leaves its passes in spec order (`run_passes` reports it)
    cyc = [_spec("a", make("a"), requires=("b",)), _spec("b", make("b"), requires=("a",))]
    assert [s.name for s in schedule.run_order(cyc)] == ["a", "b"]
