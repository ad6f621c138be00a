"""`nsysan.frames.sweeps` and `nsysan.frames.window_sums` against brute force (per-nanosecond
oracles) and against the polars operations they replace, on both packing paths of
`packed_keys.Keys` (time offsets, and the dense-rank fallback that huge time ranges take)."""

from __future__ import annotations

import itertools

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nsysan.frames import containment as cn
from nsysan.frames import intervals as iv
from nsysan.frames import sweeps, window_sums
from nsysan.frames.packed_keys import GROUP, Keys

HUGE = 1 << 60  # times this far apart force the dense-rank packing of times

rows_st = st.lists(
    st.tuples(st.sampled_from([0, 1, None]), st.integers(0, 2), st.integers(0, 30),
              st.integers(-2, 8)),
    max_size=14,
)


def _frame(rows, scale: int = 1) -> pl.DataFrame:
    return pl.DataFrame(
        {"device_id": [d for d, _, _, _ in rows], "stream_id": [m for _, m, _, _ in rows],
         "start_ns": [s * scale for _, _, s, _ in rows],
         "end_ns": [(s + n) * scale for _, _, s, n in rows]},
        schema={"device_id": pl.Int64, "stream_id": pl.Int64, "start_ns": pl.Int64,
                "end_ns": pl.Int64},
    )


@settings(max_examples=150, deadline=None)
@given(rows_st, st.sampled_from([1, 1 << 57]))
def test_member_concurrency_equals_brute_force(rows, scale):
    got = sweeps.member_concurrency(_frame(rows, scale), ["device_id"], ["stream_id"],
                                    "mx", "mean")
    want = {}
    for dev in (0, 1, None):
        live = [(s, s + n, m) for d, m, s, n in rows if d == dev and n > 0]
        levels = [len({m for s, e, m in live if s <= t < e})
                  for t in range(0, 40)]
        busy = [k for k in levels if k > 0]
        if busy:
            want[dev] = (max(busy), sum(busy) / len(busy))
    have = {d: (mx, mean) for d, mx, mean in got.select("device_id", "mx", "mean").rows()}
    assert have.keys() == want.keys()
    for dev, (mx, mean) in want.items():
        assert have[dev][0] == mx
        assert abs(have[dev][1] - mean) < 1e-9
    assert got.schema["mx"] == pl.Int64 and got.schema["mean"] == pl.Float64


def _disjoint(draw_rows) -> pl.DataFrame:
    """Disjoint segments per device (cut from sorted breakpoints) with a small state value."""
    out = []
    for dev, cuts in draw_rows:
        pts = sorted(set(cuts))
        out += [(dev, a, b, (a * 7 + b) % 4) for a, b in itertools.pairwise(pts)]
    return pl.DataFrame(out, schema={"device_id": pl.Int64, "start_ns": pl.Int64,
                                     "end_ns": pl.Int64, "state_code": pl.Int64}, orient="row")


cuts_st = st.lists(st.tuples(st.sampled_from([0, 1]), st.lists(st.integers(0, 40), max_size=8)),
                   max_size=3)


@settings(max_examples=150, deadline=None)
@given(cuts_st, cuts_st)
def test_window_sums_equal_overlay_then_group_by(seg_cuts, win_cuts):
    segs = _disjoint(seg_cuts)
    wins = _disjoint(win_cuts).with_row_index("w").select(
        "device_id", pl.col("w").cast(pl.Int64), "start_ns", "end_ns")
    got = window_sums.window_sums(segs, wins, ["device_id"], "w", "state_code", "d")
    pieces = iv.overlay(segs, wins, by=["device_id"], window_cols=["w"]).collect()
    want = (pieces.group_by("device_id", "w", "state_code")
            .agg((pl.col("end_ns") - pl.col("start_ns")).sum().alias("d")))
    key = ["device_id", "w", "state_code"]
    assert got.sort(key).equals(want.sort(key).select(got.columns))


def test_window_sums_on_the_dense_time_path():
    segs = pl.DataFrame({"device_id": [0, 0], "start_ns": [0, HUGE], "end_ns": [HUGE, 2 * HUGE],
                         "state_code": [1, 2]})
    wins = pl.DataFrame({"device_id": [0], "w": [5], "start_ns": [HUGE // 2],
                         "end_ns": [HUGE + 3]})
    got = window_sums.window_sums(segs, wins, ["device_id"], "w", "state_code", "d")
    got = got.sort("state_code")
    assert got["d"].to_list() == [HUGE - HUGE // 2, 3]


def group_lengths(df: pl.DataFrame, by: list[str], value: str, name: str) -> pl.DataFrame:
    """Total length of the intervals per (``by``, ``value``): ``by + [value, name]``, only
    positive totals, in no particular order (``value``: a non-null integer column taking few
    distinct values, such as a state code). The reference `window_sums.run_lengths` and the totals
    of `window_sums.run_sums` are checked against (rows in any order, groups by packed keys); it
    was `sweeps.group_lengths`, which had no caller left in the package."""
    keys = Keys([df], by, [])
    group, uniq = sweeps.dense_codes(keys.group_code(0))
    length = df.select(pl.col("end_ns") - pl.col("start_ns")).to_series().to_numpy()
    g, values, sums = window_sums._pair_sums(group, len(uniq), df[value].to_numpy(), length)
    return keys.attach_by(pl.DataFrame({
        GROUP: uniq[g], value: pl.Series(values, dtype=df.schema[value]), name: sums,
    }))


@settings(max_examples=100, deadline=None)
@given(cuts_st)
def test_group_lengths_equal_a_group_by(cuts):
    segs = _disjoint(cuts)
    got = group_lengths(segs, ["device_id"], "state_code", "d")
    want = (segs.group_by("device_id", "state_code")
            .agg((pl.col("end_ns") - pl.col("start_ns")).sum().alias("d")))
    key = ["device_id", "state_code"]
    assert got.sort(key).equals(want.sort(key).select(got.columns))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 50), max_size=30), st.sampled_from([1, 1 << 56]))
def test_sort_order_is_a_stable_argsort(keys, scale):
    k = np.array(keys, np.int64) * scale
    assert np.array_equal(sweeps.sort_order(k), np.argsort(k, kind="stable"))


@settings(max_examples=100, deadline=None)
@given(rows_st, st.sampled_from([1, 1 << 57]))
def test_total_and_union_equal_brute_force(rows, scale):
    df = _frame(rows, scale)
    tot = iv.total(df, by=["device_id"]).collect()
    uni = iv.union(df, by=["device_id"]).collect()
    for dev in (0, 1, None):
        cover = {t for d, _, s, n in rows if d == dev for t in range(s, s + n)}
        row = tot.filter(pl.col("device_id").eq_missing(dev))
        assert (row["busy_ns"].item() if row.height else 0) == len(cover) * scale
        blocks = uni.filter(pl.col("device_id").eq_missing(dev))
        assert sum((e - s) for s, e in blocks.select("start_ns", "end_ns").rows()) == (
            len(cover) * scale)
    everything = {t for _, _, s, n in rows for t in range(s, s + n)}
    assert iv.total(df).collect()["busy_ns"].item() == len(everything) * scale


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 30), st.integers(1, 8)),
                max_size=20))
def test_merge_sorted_gives_the_blocks_of_the_union(rows):
    """Both orders of the ends `merge_sorted` takes (sorted on their own, or the running max in
    start order), on keys packed per group, give the maximal runs of covered nanoseconds of
    each group (brute force: `intervals.union` itself is built on `merge_sorted`)."""
    span = 64  # every time below: group g's keys lie in [g * span, (g + 1) * span)
    covered = sorted({g * span + t for g, s, n in rows for t in range(s, s + n)})
    want = []  # [first, last + 1) of every run of consecutive covered instants
    for t in covered:
        if want and want[-1][1] == t:
            want[-1][1] = t + 1
        else:
            want.append([t, t + 1])
    s = np.array([g * span + s for g, s, _ in rows], np.int64)
    e = np.array([g * span + s + n for g, s, n in rows], np.int64)
    order = np.argsort(s, kind="stable")
    for ends in (np.sort(e), np.maximum.accumulate(e[order])):
        bs, be = iv.merge_sorted(s[order], ends)
        assert [[a, b] for a, b in zip(bs.tolist(), be.tolist(), strict=True)] == want


def test_tightest_with_sparse_query_ids_equals_dense_ids():
    ranges = pl.DataFrame({"range_id": [0, 1, 2], "start_ns": [0, 2, 3], "end_ns": [10, 8, 5]})
    pairs = pl.DataFrame({"query_id": [4, 4, 4, 7, 7], "range_id": [0, 1, 2, 0, 1]})
    dense = cn.tightest(pairs, ranges).collect().sort("query_id")
    sparse = cn.tightest(pairs.with_columns(pl.col("query_id") * 10**9), ranges).collect()
    assert dense["range_id"].to_list() == [2, 1]
    assert sparse.sort("query_id")["range_id"].to_list() == [2, 1]


def test_tightest_ties_on_length_fall_back_to_the_full_order():
    ranges = pl.DataFrame({"range_id": [0, 1, 2, 3], "start_ns": [0, 2, 20, 20],
                           "end_ns": [10, 12, 30, 30], "depth": [0, 0, 1, 0]})
    pairs = pl.DataFrame({"query_id": [0, 0, 1, 1], "range_id": [0, 1, 2, 3]})
    got = cn.tightest(pairs, ranges, depth="depth").collect().sort("query_id")
    assert got["range_id"].to_list() == [1, 2]  # later start; then greater depth


@pytest.mark.parametrize("seed", range(5))
def test_interval_events_equal_the_concatenated_sort(seed: int) -> None:
    """`sweeps.interval_events` builds and sorts in one array what the sweeps used to build
    from temporaries: the same events, in the same order; `sort_in_place` sorts like np.sort
    on sorted runs (its stable path) and on shuffled values."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 2000))
    starts = np.sort(rng.integers(0, 1 << 30, n)) if seed % 2 else rng.integers(0, 1 << 30, n)
    ends = starts + rng.integers(0, 1000, n)
    bits = int(rng.integers(1, 6))
    member = rng.integers(0, 1 << bits, n)
    np.testing.assert_array_equal(sweeps.interval_events(starts, ends),
                                  np.sort(np.concatenate([starts << 1 | 1, ends << 1])))
    np.testing.assert_array_equal(
        sweeps.interval_events(starts, ends, bits, member),
        np.sort(np.concatenate([((starts << 1 | 1) << bits) | member,
                                (ends << (1 + bits)) | member])))
    values = np.concatenate([starts, ends])
    expected = np.sort(values)
    assert sweeps.sort_in_place(values) is values
    np.testing.assert_array_equal(values, expected)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 9), max_size=30), st.integers(1, 12))
def test_runs_within_cover_every_item_once_within_the_limit(counts, limit):
    runs = sweeps.runs_within(np.cumsum(np.array(counts, np.int64)), limit)
    # consecutive, from the first item to the last
    assert [a for a, _ in runs] == ([0, *(b for _, b in runs[:-1])] if counts else [])
    assert (runs[-1][1] if runs else 0) == len(counts)
    for a, b in runs:
        assert b > a
        # within the limit, or one item too big alone; and as long as the limit allows
        assert sum(counts[a:b]) <= limit or b == a + 1
        if b < len(counts):
            assert sum(counts[a:b + 1]) > limit


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 9), st.integers(0, 1 << 40)), max_size=40),
       st.sampled_from([1, 3, 7, 1 << 22]), st.sampled_from([10, 2]))
def test_cell_sums_in_chunks_equal_one_exact_scatter(pairs, chunk, n):
    """Chunked bincounts (a bounded float64 copy of the weights), one bincount when the table
    is as large as a chunk, and the exact scatter for huge totals: the same integer sums."""
    cell = np.array([c % n for c, _ in pairs], np.int64)
    weights = np.array([w for _, w in pairs], np.int64)
    want = np.zeros(n, np.int64)
    np.add.at(want, cell, weights)
    saved = window_sums.CELL_CHUNK
    window_sums.CELL_CHUNK = chunk
    try:
        got = window_sums.cell_sums(cell, weights, n)
        huge = window_sums.cell_sums(cell, weights << 22, n)  # totals beyond 2**52 when long
    finally:
        window_sums.CELL_CHUNK = saved
    assert got.dtype == np.int64 and np.array_equal(got, want)
    assert np.array_equal(huge, want << 22)
