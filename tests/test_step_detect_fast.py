"""`step_detect._call_steps` (the step of every API call from one linear pass over sorted call
starts) against the binary search `_range_of` it stands for, and `_launched` with and without
it: adjacent and gapped ranges, calls on a range bound, before the first and after the last
range, ties, one call, no call, unsorted or null starts (no fast path)."""

from __future__ import annotations

import itertools

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nsysan.frames.trace import Trace
from nsysan.passes import step_detect


def _cpu(bounds: list[tuple[int, int]]) -> pl.DataFrame:
    """Sorted disjoint CPU step ranges, as `nvtx_steps` gives them."""
    return pl.DataFrame(
        {"step": list(range(len(bounds))), "start_ns": [a for a, _ in bounds],
         "end_ns": [b for _, b in bounds]},
        schema={"step": pl.Int64, "start_ns": pl.Int64, "end_ns": pl.Int64},
    )


def _ranges(cuts: list[int], keep: list[bool]) -> list[tuple[int, int]]:
    pts = sorted(set(cuts))
    pairs = list(itertools.pairwise(pts))
    return [p for p, k in zip(pairs, keep + [True] * len(pairs), strict=False) if k]


def _want(cpu: pl.DataFrame, starts: pl.Series) -> np.ndarray:
    if cpu.is_empty():  # (`nvtx_steps` never gives no range; the binary search needs one)
        return np.full(starts.len(), -1)
    rows, inside = step_detect._range_of(cpu, starts)
    return np.where(inside, rows, -1)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 30), max_size=10), st.lists(st.booleans(), max_size=10),
       st.lists(st.integers(-3, 33), max_size=30))
def test_call_steps_equal_the_binary_search(cuts, keep, calls):
    cpu = _cpu(_ranges(cuts, keep))
    starts = pl.Series(sorted(calls), dtype=pl.Int64)
    got = step_detect._call_steps(cpu, starts)
    assert got is not None
    assert got.tolist() == _want(cpu, starts).tolist()


def test_call_steps_declines_unsorted_or_null_starts():
    cpu = _cpu([(0, 5), (5, 9)])
    assert step_detect._call_steps(cpu, pl.Series([3, 1], dtype=pl.Int64)) is None
    assert step_detect._call_steps(cpu, pl.Series([1, None], dtype=pl.Int64)) is None
    assert step_detect._call_steps(cpu, pl.Series([], dtype=pl.Int64)).tolist() == []
    assert step_detect._call_steps(_cpu([]), pl.Series([4], dtype=pl.Int64)).tolist() == [-1]


class _Frames(Trace):
    """A trace made of given frames (only what `_launched` reads)."""

    def __init__(self, frames: dict[str, pl.DataFrame]) -> None:
        self._given = frames

    def frame(self, name: str) -> pl.DataFrame:
        return self._given[name]

    def has(self, name: str) -> bool:
        return name in self._given


def _trace(api_starts: list[int | None], pids: list[int | None], sorted_api: bool) -> _Frames:
    n = len(api_starts)
    api = pl.DataFrame({
        "start_ns": api_starts, "end_ns": [None if s is None else s + 1 for s in api_starts],
        "global_tid": [10 + i % 3 for i in range(n)], "global_pid": [1] * n, "pid": pids,
        "correlation_id": list(range(n)),
    }, schema={c: pl.Int64 for c in ("start_ns", "end_ns", "global_tid", "global_pid", "pid",
                                      "correlation_id")})
    if sorted_api:
        api = api.sort("start_ns", nulls_last=True)
    # two ops per call (a graph launch), one op without a call, in reverse call order
    corr = [c for c in reversed(range(n)) for _ in (0, 1)] + [n + 5]
    ops = pl.DataFrame({
        "global_pid": [1] * len(corr), "correlation_id": corr,
        "start_ns": [100 + i for i in range(len(corr))],
        "end_ns": [200 + i for i in range(len(corr))],
    }, schema={c: pl.Int64 for c in ("global_pid", "correlation_id", "start_ns", "end_ns")})
    return _Frames({"gpu_ops": ops, "cuda_api": api})


@pytest.mark.parametrize("sorted_api", [True, False])
@pytest.mark.parametrize("nulls", [False, True])
def test_launched_is_the_same_with_and_without_the_call_map(monkeypatch, sorted_api, nulls):
    starts = [0, 2, 4, 5, 5, 7, 9, 12, 15, 3]
    if nulls:
        starts[3] = None
    pids = [7, 7, 8, 7, 7, 7, None, 7, 7, 7]
    trace = _trace(starts, pids, sorted_api)
    cpu = _cpu([(2, 5), (5, 9), (12, 13)])
    got = step_detect._launched(trace, cpu, 7)
    monkeypatch.setattr(step_detect, "_call_steps", lambda *a: None)
    want = step_detect._launched(trace, cpu, 7)
    assert [a.tolist() for a in got] == [a.tolist() for a in want]
    assert got[0].size > 0
    # brute force: the ops whose call is of process 7 and starts inside a range
    api, ops = trace.frame("cuda_api"), trace.frame("gpu_ops")
    brute = []
    for op, (gp, corr) in enumerate(ops.select("global_pid", "correlation_id").rows()):
        calls = api.with_row_index("_call").filter(
            (pl.col("global_pid") == gp) & (pl.col("correlation_id") == corr))
        for call, start, pid in calls.select("_call", "start_ns", "pid").rows():
            inside = [r for r, (a, b) in enumerate(cpu.select("start_ns", "end_ns").rows())
                      if start is not None and a <= start < b]
            if pid == 7 and inside:
                brute.append((inside[0], op, call))
    assert list(zip(*(a.tolist() for a in got), strict=True)) == brute


def test_periodic_steps_find_the_kernels_of_a_process_without_an_id():
    """An export without process ids (docs/data-quality.md: several processes, globalPid
    absent) leaves ``pid`` null: the busiest (pid, device) is then (null, 0), and its kernels
    must still be the sequence the period is found in (a ``==`` with null matched none)."""
    from nsysan.passes.steps import StepsParams

    names = ["load", "fwd", "bwd", "opt"] * 6
    start = np.arange(len(names), dtype=np.int64) * 1_000
    ops = pl.DataFrame({
        "kind": ["kernel"] * len(names), "pid": pl.Series([None] * len(names), dtype=pl.Int64),
        "device_id": [0] * len(names), "name": names, "start_ns": start, "end_ns": start + 500,
    })
    found = step_detect.periodic_steps(ops, StepsParams())
    assert found is not None
    steps, _ = found
    assert steps.height >= 5
