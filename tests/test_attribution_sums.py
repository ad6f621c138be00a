"""Fast paths of `attribution_sums` and `sweeps` (numpy packing, timsort on sorted runs,
arithmetic member codes) give exactly what the general `packed_keys` paths give."""

from __future__ import annotations

import itertools

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nsysan.frames import intervals as iv
from nsysan.frames import sweeps
from nsysan.frames.packed_keys import Keys
from nsysan.passes import attribution_sums as sums

members_st = st.lists(
    st.tuples(st.integers(0, 5), st.sampled_from([-1, 0, 3, 1 << 40]),
              st.one_of(st.none(), st.integers(0, 40)), st.integers(-2, 9)),
    max_size=25,
)


def _members(rows, scale: int) -> tuple[np.ndarray, pl.DataFrame]:
    group = np.array([g for g, _, _, _ in rows], np.int64)
    df = pl.DataFrame(
        {"device_id": [d for _, d, _, _ in rows],
         "start_ns": [None if s is None else s * scale for _, _, s, _ in rows],
         "end_ns": [None if s is None else (s + n) * scale for _, _, s, n in rows]},
        schema={"device_id": pl.Int64, "start_ns": pl.Int64, "end_ns": pl.Int64},
    )
    return group, df


def _oracle(group: np.ndarray, df: pl.DataFrame, n: int) -> np.ndarray:
    per = iv.total(df.with_columns(pl.Series("g", group)), by=["g", "device_id"]).collect()
    out = np.zeros(n, np.int64)
    np.add.at(out, per["g"].to_numpy(), per["busy_ns"].to_numpy())
    return out


@settings(max_examples=200, deadline=None)
@given(members_st, st.sampled_from([1, 1000, 1 << 55]), st.sampled_from([None, 1, 4]),
       st.booleans())
def test_union_busies_equals_the_union_per_group_and_device(rows, scale, chunk, in_order):
    """Also with the groups summed a few rows at a time (``chunk``: `UNION_CHUNK`), over
    rows in group order (memberships: slices) or not (selected by mask)."""
    if in_order:
        rows = sorted(rows, key=lambda r: r[0])
    group, df = _members(rows, scale)
    if chunk is not None:
        old = sums.UNION_CHUNK
        sums.UNION_CHUNK = chunk
        try:
            _check_union_busies(group, df)
        finally:
            sums.UNION_CHUNK = old
    else:
        _check_union_busies(group, df)


def _check_union_busies(group: np.ndarray, df: pl.DataFrame) -> None:
    assert sums.union_busies(df, [(group, 6)])[0].tolist() == _oracle(group, df, 6).tolist()
    both = sums.union_busies(df, [(group, 6), (group % 2, 2)])
    assert [b.tolist() for b in both] == [_oracle(group, df, 6).tolist(),
                                          _oracle(group % 2, df, 2).tolist()]


def test_union_busies_takes_the_keys_path_when_times_do_not_pack():
    # 6 groups x 2 devices (or more device codes) x a span of 2**60 does not fit in 62 bits:
    # the ranked-time path.
    group = np.array([0, 5, 5, 1], np.int64)
    df = pl.DataFrame({"device_id": [0, 7, 7, 0], "start_ns": [0, 1 << 60, 3, 5],
                       "end_ns": [10, (1 << 60) + 4, 1 << 60, 6]})
    assert sums._pack(group * 2, 12, df["start_ns"].to_numpy(), df["end_ns"].to_numpy()) is None
    assert sums.union_busies(df, [(group, 6)])[0].tolist() == [10, 1, 0, 0, 0, (1 << 60) + 1]


def test_union_busies_of_nothing():
    df = pl.DataFrame(schema={"device_id": pl.Int64, "start_ns": pl.Int64, "end_ns": pl.Int64})
    assert sums.union_busies(df, [(np.zeros(0, np.int64), 3)])[0].tolist() == [0, 0, 0]


@pytest.mark.parametrize("values", [
    [], [5], [3, 1, 2], list(range(100)) + list(range(50, 150)),  # two sorted runs: timsort
    list(np.random.default_rng(1).integers(0, 1 << 60, 500)),  # shuffled: quicksort
])
def test_sorted_values_is_a_sort(values):
    a = np.array(values, np.int64)
    before = a.copy()
    out = sweeps.sorted_values(a)
    assert out.dtype == np.int64 and np.array_equal(out, np.sort(a))
    assert np.array_equal(a, before)  # the input is left as it was


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 6)), max_size=40))
def test_distinct_counts_counts_distinct_items_per_group(pairs):
    group = np.array([g for g, _ in pairs], np.int64)
    item = np.array([i for _, i in pairs], np.int64)
    want = [len({i for g, i in pairs if g == k}) for k in range(5)]
    assert sums.distinct_counts(group, item, 5).tolist() == want


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0, 1, None]), st.sampled_from([4, 4, 1 << 50]),
                          st.integers(0, 3)), max_size=20))
def test_member_codes_partition_rows_like_the_packed_keys(rows):
    df = pl.DataFrame({"d": [d for d, _, _ in rows], "p": [p for _, p, _ in rows],
                       "s": [s for _, _, s in rows]},
                      schema={"d": pl.Int64, "p": pl.Int64, "s": pl.Int64})
    code, n = sweeps.member_codes(df, ["d", "p", "s"])
    want, uniq = sweeps.dense_codes(Keys([df], ["d", "p", "s"], []).group_code(0))
    assert len(code) == 0 or (code.min() >= 0 and code.max() < n)
    # Same partition: equal codes exactly where the reference codes are equal.
    pairs = set(zip(code.tolist(), want.tolist(), strict=True))
    assert len(pairs) == len(set(code.tolist())) == len(uniq)


def _layer_ids_by_group_by(ranges: pl.DataFrame, group_numbered: bool) -> dict:
    """The layer (domain, name) of every rix, by a plain group-by over the strings."""
    from nsysan.passes.attribution import layer_name

    layer = layer_name(pl.col("name")) if group_numbered else pl.col("name")
    out = ranges.with_columns(layer.alias("_layer"))
    return {r: (d, n) for r, d, n in out.select("rix", "domain", "_layer").iter_rows()}


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([None, "", "a", "b"]),
                          st.sampled_from([None, "", "x", "step 1", "step 2", "mm, seq = 3"])),
                max_size=20), st.booleans())
def test_layer_ids_group_ranges_by_domain_and_layer_name(rows, group_numbered):
    from nsysan.passes.attribution import _layer_ids

    ranges = pl.DataFrame({"domain": [d for d, _ in rows], "name": [n for _, n in rows]},
                          schema={"domain": pl.String, "name": pl.String}).with_row_index("rix")
    tab, lid = _layer_ids(ranges, group_numbered)
    assert tab.select("domain", "name").n_unique() == tab.height
    assert tab["lid"].to_list() == list(range(tab.height))
    by_lid = {i: (d, n) for i, d, n in tab.select("lid", "domain", "name").iter_rows()}
    assert {r: by_lid[i] for r, i in enumerate(lid.to_list())} == \
        _layer_ids_by_group_by(ranges, group_numbered)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.one_of(st.none(), st.integers(-5, 50))),
                max_size=30), st.booleans())
def test_projection_equals_a_group_by(rows, in_order):
    if in_order:  # memberships in range order take the reduction, others ufunc.at
        rows = sorted(rows, key=lambda r: r[0])
    index = np.array([i for i, _ in rows], np.int64)
    start = pl.Series("s", [v for _, v in rows], pl.Int64)
    end = pl.Series("e", [None if v is None else v * 2 for _, v in rows], pl.Int64)
    lo, hi = sums.projection(index, start, end, 8)
    want = (
        pl.DataFrame({"i": index, "s": start, "e": end}, schema={"i": pl.Int64, "s": pl.Int64,
                                                                  "e": pl.Int64})
        .group_by("i").agg(pl.col("s").min(), pl.col("e").max())
    )
    got_lo = dict(enumerate(lo.to_list()))
    got_hi = dict(enumerate(hi.to_list()))
    for i in range(8):
        row = want.filter(pl.col("i") == i)
        assert got_lo[i] == (row["s"][0] if row.height else None)
        assert got_hi[i] == (row["e"][0] if row.height else None)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0, 1]), st.integers(0, 3), st.integers(0, 30),
                          st.integers(-1, 6)), max_size=20), st.booleans())
def test_member_concurrency_serial_path_equals_the_member_sweeps(rows, serial):
    from unittest import mock

    if serial:  # per stream one op after the other (touching allowed), as CUDA runs them
        ends: dict = {}
        placed = []
        for d, m, s, n in sorted(rows, key=lambda r: r[2]):
            s = max(s, ends.get((d, m), s))
            ends[(d, m)] = s + max(n, 0)
            placed.append((d, m, s, n))
        rows = placed
    rows = sorted(rows, key=lambda r: (r[0], r[2]))  # by device, then start: as gpu_ops come
    df = pl.DataFrame({"device_id": [r[0] for r in rows], "stream_id": [r[1] for r in rows],
                       "start_ns": [r[2] for r in rows],
                       "end_ns": [r[2] + r[3] for r in rows]},
                      schema={"device_id": pl.Int64, "stream_id": pl.Int64,
                              "start_ns": pl.Int64, "end_ns": pl.Int64})
    got = sweeps.member_concurrency(df, ["device_id"], ["stream_id"], "mx", "mean")
    with mock.patch.object(sweeps, "_serial", return_value=False):
        want = sweeps.member_concurrency(df, ["device_id"], ["stream_id"], "mx", "mean")
    assert got.equals(want)
    x = df.filter(pl.col("end_ns") > pl.col("start_ns"))
    member, n = sweeps.member_codes(x, ["device_id", "stream_id"])
    if serial:
        keys = Keys([x], ["device_id"], ["start_ns", "end_ns"])
        assert sweeps._serial(member, n, keys.pack(0, "start_ns").to_numpy(),
                              keys.pack(0, "end_ns").to_numpy())


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 30), st.integers(0, 6)),
                max_size=25), st.sampled_from([1, 2, 3, 1 << 20]))
def test_the_serial_check_is_the_same_in_any_slices(rows, slice_rows):
    """`_serial` checks the member order a slice at a time: a member's two overlapping
    intervals are found wherever the slices cut."""
    from unittest import mock

    rows = sorted(rows, key=lambda r: r[1])  # in start order, as the sweep gives them
    member = np.array([m for m, _, _ in rows], np.int64)
    start = np.array([s for _, s, _ in rows], np.int64)
    end = start + np.array([n for _, _, n in rows], np.int64)
    by_member: dict[int, list[tuple[int, int]]] = {}
    for m, s, e in zip(member, start, end, strict=True):
        by_member.setdefault(int(m), []).append((int(s), int(e)))
    want = all(a[1] <= b[0] for iv in by_member.values() for a, b in itertools.pairwise(iv))
    with mock.patch.object(sweeps, "SERIAL_SLICE", slice_rows):
        assert sweeps._serial(member, 4, start, end) == want


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 20), st.integers(-3, 8)),
                max_size=15),
       st.lists(st.tuples(st.integers(0, 2), st.integers(0, 20), st.integers(0, 12)),
                max_size=8),
       st.sampled_from([1, 1 << 57]), st.booleans())
def test_enclosing_numpy_keys_give_the_same_pairs_in_the_same_order(qs, rs, scale, keyed):
    from unittest import mock

    from nsysan.frames import containment as cn

    q = pl.DataFrame({"tid": [t for t, _, _ in qs], "query_id": list(range(len(qs))),
                      "start_ns": [s * scale for _, s, _ in qs],
                      "end_ns": [(s + n) * scale for _, s, n in qs]},  # n < 0: end < start
                     schema={"tid": pl.Int64, "query_id": pl.Int64, "start_ns": pl.Int64,
                             "end_ns": pl.Int64})
    r = pl.DataFrame({"tid": [t for t, _, _ in rs], "range_id": list(range(len(rs))),
                      "start_ns": [s * scale for _, s, _ in rs],
                      "end_ns": [(s + n) * scale for _, s, n in rs]},
                     schema={"tid": pl.Int64, "range_id": pl.Int64, "start_ns": pl.Int64,
                             "end_ns": pl.Int64})
    by = ["tid"] if keyed else []
    got = cn.enclosing(q, r, by=by).collect()
    with mock.patch.object(cn, "_pack_one_key", return_value=None):
        want = cn.enclosing(q, r, by=by).collect()
    assert got.equals(want)


@pytest.mark.parametrize("dtype", [pl.Int32, pl.UInt32, pl.UInt64, pl.Int64])
def test_member_concurrency_takes_any_integer_member_columns(dtype):
    df = pl.DataFrame({"device_id": [0, 0, 0], "stream_id": [7, 9, 7],
                       "start_ns": [0, 5, 20], "end_ns": [10, 15, 30]},
                      schema={"device_id": pl.Int64, "stream_id": dtype, "start_ns": pl.Int64,
                              "end_ns": pl.Int64})
    got = sweeps.member_concurrency(df, ["device_id"], ["stream_id"], "mx", "mean")
    assert got.rows() == [(0, 2, 25 / 25 + 5 / 25)]
