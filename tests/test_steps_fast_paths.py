"""The fast paths of the steps pass against the generic code they stand for:
`window_sums.run_sums` (per-step state times and totals) against `window_sums.window_sums`
over the windows crossed with every group (dense-table path, integer path for huge times,
sparse fallback, empty inputs, null groups), `window_sums.run_lengths` against the reference
`group_lengths` (in test_intervals_sweeps), the narrow-dtype `sweeps.state_instants`, and the
one-device `steps.device_segments`."""

from __future__ import annotations

import itertools

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_intervals_sweeps import group_lengths

from nsysan.frames import sweeps, window_sums
from nsysan.passes import steps

HUGE = 1 << 60  # lengths this long make float sums inexact: the integer path
KEY = ["device_id", "w", "state_code"]
SEG_SCHEMA = {"device_id": pl.Int64, "start_ns": pl.Int64, "end_ns": pl.Int64,
              "state_code": pl.Int64}


def _segments(groups, scale: int = 1) -> pl.DataFrame:
    """Disjoint segments per device, sorted by device (nulls first) then start, as state
    segments come."""
    out = []
    for dev, cuts in sorted(groups, key=lambda g: (g[0] is not None, g[0] or 0)):
        pts = sorted(set(cuts))
        out += [(dev, a * scale, b * scale, (a * 7 + b) % 5) for a, b in itertools.pairwise(pts)]
    return pl.DataFrame(out, schema=SEG_SCHEMA, orient="row")


def _windows(cuts, scale: int = 1) -> pl.DataFrame:
    pts = sorted(set(cuts))
    rows = [(9 - i, a * scale, b * scale) for i, (a, b) in enumerate(itertools.pairwise(pts))]
    return pl.DataFrame(rows, schema={"w": pl.Int64, "start_ns": pl.Int64,
                                      "end_ns": pl.Int64}, orient="row")


def _expected(segs: pl.DataFrame, wins: pl.DataFrame) -> pl.DataFrame:
    per_group = segs.select(pl.col("device_id").unique()).join(wins, how="cross")
    return window_sums.window_sums(segs, per_group, ["device_id"], "w", "state_code", "d")


def _check(segs: pl.DataFrame, wins: pl.DataFrame) -> None:
    got, totals = window_sums.run_sums(segs, wins, "device_id", "w", "state_code", "d")
    want = _expected(segs, wins)
    assert got.schema == want.schema
    assert got.sort(KEY, nulls_last=False).equals(want.sort(KEY, nulls_last=False))
    # ... and the totals over the whole runs, found on the way
    want_totals = group_lengths(segs, ["device_id"], "state_code", "d")
    key = ["device_id", "state_code"]
    assert totals.schema == want_totals.schema
    assert totals.sort(key, nulls_last=False).equals(want_totals.sort(key, nulls_last=False))


groups_st = st.lists(
    st.tuples(st.sampled_from([0, 1, 2, None]), st.lists(st.integers(0, 40), max_size=9)),
    max_size=3, unique_by=lambda g: g[0],
)
cuts_st = st.lists(st.integers(-5, 45), max_size=8)


@settings(max_examples=100, deadline=None)
@given(groups_st, st.sampled_from([1, HUGE >> 6]))
def test_run_lengths_equal_group_lengths(groups, scale):
    segs = _segments(groups, scale)
    got = window_sums.run_lengths(segs, "device_id", "state_code", "d")
    want = group_lengths(segs, ["device_id"], "state_code", "d")
    key = ["device_id", "state_code"]
    assert got.schema == want.schema
    assert got.sort(key, nulls_last=False).equals(want.sort(key, nulls_last=False))


@settings(max_examples=200, deadline=None)
@given(groups_st, cuts_st, st.sampled_from([1, HUGE >> 6]))
def test_run_sums_equal_window_sums(groups, cuts, scale):
    _check(_segments(groups, scale), _windows(cuts, scale))


def test_segments_that_span_several_windows_and_zero_length_windows():
    segs = _segments([(0, [0, 100]), (1, [3, 4, 50, 51])])
    wins = pl.DataFrame({"w": [0, 1, 2, 3], "start_ns": [10, 20, 20, 40],
                         "end_ns": [20, 20, 30, 60]})
    _check(segs, wins)


def test_huge_lengths_take_the_integer_path():
    segs = pl.DataFrame({"device_id": [0, 0], "start_ns": [0, HUGE], "end_ns": [HUGE, 2 * HUGE],
                         "state_code": [1, 2]})
    wins = pl.DataFrame({"w": [5], "start_ns": [HUGE // 2], "end_ns": [HUGE + 3]})
    got, _ = window_sums.run_sums(segs, wins, "device_id", "w", "state_code", "d")
    assert got.sort("state_code")["d"].to_list() == [HUGE - HUGE // 2, 3]


@pytest.mark.parametrize("n_windows", [0, 3, 5000])
def test_empty_segments_and_the_sparse_fallback(n_windows):
    wins = pl.DataFrame({"w": range(n_windows), "start_ns": [2 * k for k in range(n_windows)],
                         "end_ns": [2 * k + 1 for k in range(n_windows)]},
                        schema={"w": pl.Int64, "start_ns": pl.Int64, "end_ns": pl.Int64})
    _check(_segments([]), wins)
    # Few segments, many windows and states: more cells than pieces, the generic path.
    _check(_segments([(0, list(range(0, 10001, 7))), (1, [1, 5000])]), wins)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1), st.integers(0, 5), st.integers(0, 20),
                          st.integers(1, 6)), max_size=12))
def test_state_instants_narrow_and_wide_codes_agree(rows):
    """The int16 running codes (few classes) equal the int64 ones (15 classes or more)."""
    def instants(n_classes: int):
        shift = max(2 * n_classes - 1, 1).bit_length()
        ev = [((g << 8 | s) << shift) + 2 * c + 1 for g, c, s, n in rows]
        ev += [((g << 8 | (s + n)) << shift) + 2 * c for g, c, s, n in rows]
        return sweeps.state_instants(np.sort(np.array(ev, np.int64)), shift, n_classes)

    (k6, c6), (k16, c16) = instants(6), instants(16)
    assert k6.tolist() == k16.tolist() and c6.tolist() == c16.tolist()
    assert (c6.dtype, c16.dtype) == (np.int16, np.int64)  # (a quarter of the memory)
    if rows:
        assert c6[-1] == 0  # everything ends


class _Frames:
    """Just enough of a `Trace` for `steps.device_segments`."""

    def __init__(self, ops: pl.DataFrame) -> None:
        self.ops = ops

    def frame(self, name: str) -> pl.DataFrame:
        return self.ops


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0, 1, None]), st.integers(0, 20), st.integers(-1, 6),
                          st.sampled_from(["compute", "nccl", "memcpy_h2d", "other", None])),
                max_size=10))
def test_device_segments_on_one_device_equal_the_grouped_sweep(rows):
    ops = pl.DataFrame(
        [(d, s, s + n, c) for d, s, n, c in rows],
        schema={"device_id": pl.Int64, "start_ns": pl.Int64, "end_ns": pl.Int64,
                "op_class": pl.String}, orient="row")
    for frame in (ops, ops.with_columns(pl.lit(7, pl.Int64).alias("device_id"))):
        got = steps.device_segments(_Frames(frame))  # type: ignore[arg-type]
        timed = frame.lazy().filter(pl.col("start_ns") > 0)
        want = steps._state_segments(timed, ["device_id"]).collect()
        assert got.schema == want.schema
        assert got.equals(want)
