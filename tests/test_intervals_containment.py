"""Containment primitives of the interval kernel (`enclosing`, `innermost_enclosing`,
`tightest`) and `equal_shares`, against brute force."""

from __future__ import annotations

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nsysan.frames import containment as cn
from nsysan.frames import intervals as iv

# ----------------------------------------------------------------------------------------------
# Brute-force oracles (tiny inputs only: quadratic on purpose)
# ----------------------------------------------------------------------------------------------


def brute_pairs(queries: list[tuple], ranges: list[tuple]) -> set[tuple[int, int]]:
    """(query_id, range_id) for every range on the same key containing the query, inclusive."""
    return {
        (qid, rid)
        for (qid, qk, qs, qe) in queries
        for (rid, rk, rs, re) in ranges
        if qk == rk and rs <= qs and qe <= re
    }


def brute_innermost(queries: list[tuple], ranges: list[tuple]) -> dict[int, int]:
    by_id = {r[0]: r for r in ranges}
    best: dict[int, int] = {}
    for qid, rid in brute_pairs(queries, ranges):
        _, _, rs, re = by_id[rid]
        key = (re - rs, -rs, -rid)
        if qid not in best:
            best[qid] = rid
        else:
            _, _, bs, be = by_id[best[qid]]
            if key < (be - bs, -bs, -best[qid]):
                best[qid] = rid
    return best


def frames(queries: list[tuple], ranges: list[tuple]) -> tuple[pl.DataFrame, pl.DataFrame]:
    q = pl.DataFrame(
        queries, schema=["query_id", "key", "start_ns", "end_ns"], orient="row"
    ).cast(pl.Int64)
    r = pl.DataFrame(
        ranges, schema=["range_id", "key", "start_ns", "end_ns"], orient="row"
    ).cast(pl.Int64)
    return q, r


def nested_ranges(draw, key: int, first_id: int, lo: int, hi: int, depth: int) -> list[tuple]:
    """A random properly nested family of ranges inside [lo, hi] (push/pop discipline)."""
    out: list[tuple] = []
    t = lo
    while t < hi and len(out) < 12:
        s = draw(st.integers(t, hi))
        e = draw(st.integers(s, hi))
        out.append((first_id + len(out), key, s, e))
        if depth > 0 and e > s:
            inner = nested_ranges(draw, key, first_id + len(out) + 100, s, e, depth - 1)
            out.extend(inner)
            first_id += len(inner) + 100
        t = e + draw(st.integers(0, 3))
        if draw(st.booleans()):
            break
    return out


@st.composite
def nested_case(draw):
    ranges: list[tuple] = []
    for key in (1, 2):
        ranges += nested_ranges(draw, key, key * 10_000, 0, 60, 3)
    # Re-number so that ids are unique whatever the recursion produced.
    ranges = [(i, k, s, e) for i, (_, k, s, e) in enumerate(ranges)]
    n_q = draw(st.integers(0, 25))
    queries = []
    for i in range(n_q):
        s = draw(st.integers(0, 62))
        e = draw(st.integers(s, min(s + 8, 64)))
        queries.append((i, draw(st.sampled_from([1, 2, 3])), s, e))
    return queries, ranges


@st.composite
def arbitrary_case(draw):
    """Ranges that may overlap without nesting (start/end ranges), duplicates, zero lengths."""
    rows = draw(
        st.lists(
            st.tuples(st.sampled_from([1, 2]), st.integers(0, 40), st.integers(0, 15)),
            max_size=25,
        )
    )
    ranges = [(i, k, s, s + d) for i, (k, s, d) in enumerate(rows)]
    qrows = draw(
        st.lists(
            st.tuples(st.sampled_from([1, 2]), st.integers(0, 50), st.integers(0, 6)),
            max_size=30,
        )
    )
    queries = [(i, k, s, s + d) for i, (k, s, d) in enumerate(qrows)]
    return queries, ranges


def got_pairs(q: pl.DataFrame, r: pl.DataFrame) -> set[tuple[int, int]]:
    out = cn.enclosing(q, r, by=["key"]).collect()
    assert out.columns == ["key", "query_id", "range_id"]
    assert out.height == len(set(out.select("query_id", "range_id").iter_rows()))
    return set(out.select("query_id", "range_id").iter_rows())


@settings(max_examples=150, deadline=None)
@given(nested_case())
def test_enclosing_equals_brute_force_on_nested_ranges(case):
    queries, ranges = case
    q, r = frames(queries, ranges)
    assert got_pairs(q, r) == brute_pairs(queries, ranges)
    inner = cn.innermost_enclosing(q, r, by=["key"]).collect()
    assert dict(inner.select("query_id", "range_id").iter_rows()) == brute_innermost(
        queries, ranges
    )


@settings(max_examples=150, deadline=None)
@given(arbitrary_case())
def test_enclosing_equals_brute_force_on_crossing_ranges(case):
    queries, ranges = case
    q, r = frames(queries, ranges)
    assert got_pairs(q, r) == brute_pairs(queries, ranges)
    inner = cn.innermost_enclosing(q, r, by=["key"]).collect()
    assert dict(inner.select("query_id", "range_id").iter_rows()) == brute_innermost(
        queries, ranges
    )


@pytest.mark.parametrize(
    ("case", "query", "ranges", "expected"),
    [
        ("inside", (10, 20), [(0, 0, 30)], {0}),
        ("same bounds (inclusive)", (10, 20), [(0, 10, 20)], {0}),
        ("starts at range end", (30, 30), [(0, 0, 30)], {0}),
        ("straddles the range end", (25, 35), [(0, 0, 30)], set()),
        ("straddles the range start", (5, 15), [(0, 10, 30)], set()),
        ("after the range", (31, 32), [(0, 0, 30)], set()),
        ("zero-length range at the query", (5, 5), [(0, 5, 5)], {0}),
        ("nested: all ancestors", (12, 13), [(0, 0, 100), (1, 10, 20), (2, 11, 14)], {0, 1, 2}),
        ("crossing start/end ranges", (12, 13), [(0, 0, 15), (1, 10, 30)], {0, 1}),
        ("crossing, only one contains", (14, 18), [(0, 0, 15), (1, 10, 30)], {1}),
        ("duplicate starts", (10, 11), [(0, 10, 11), (1, 10, 12), (2, 10, 9)], {0, 1}),
    ],
)
def test_enclosing_named_cases(case, query, ranges, expected):
    q = pl.DataFrame({"query_id": [7], "start_ns": [query[0]], "end_ns": [query[1]]})
    r = pl.DataFrame(ranges, schema=["range_id", "start_ns", "end_ns"], orient="row")
    got = set(cn.enclosing(q, r).collect()["range_id"].to_list())
    assert got == expected, case


def test_enclosing_respects_keys_and_many_equal_query_starts():
    # Several queries with one start on two keys: each block must be found completely.
    q = pl.DataFrame(
        {
            "query_id": [0, 1, 2, 3, 4],
            "tid": [1, 1, 1, 2, 2],
            "start_ns": [5, 5, 5, 5, 6],
            "end_ns": [5, 6, 9, 6, 7],
        }
    )
    r = pl.DataFrame({"range_id": [10, 11], "tid": [1, 2], "start_ns": [5, 0], "end_ns": [8, 6]})
    got = set(cn.enclosing(q, r, by=["tid"]).select("query_id", "range_id").collect().iter_rows())
    assert got == {(0, 10), (1, 10), (3, 11)}


def test_innermost_tie_breaks_by_depth_then_id():
    q = pl.DataFrame({"query_id": [0], "start_ns": [5], "end_ns": [6]})
    # Two identical ranges: the deeper one wins when a depth column is given, else the higher id.
    r = pl.DataFrame(
        {"range_id": [1, 2], "start_ns": [0, 0], "end_ns": [10, 10], "depth": [1, 0]}
    )
    assert cn.innermost_enclosing(q, r).collect()["range_id"].to_list() == [2]
    assert cn.innermost_enclosing(q, r, depth="depth").collect()["range_id"].to_list() == [1]


def test_enclosing_empty_inputs_keep_columns():
    q = pl.DataFrame(schema={"query_id": pl.Int64, "start_ns": pl.Int64, "end_ns": pl.Int64})
    r = pl.DataFrame({"range_id": [1], "start_ns": [0], "end_ns": [1]})
    assert cn.enclosing(q, r).collect().columns == ["query_id", "range_id"]
    assert cn.enclosing(r.rename({"range_id": "query_id"}), q.rename(
        {"query_id": "range_id"})).collect().height == 0


# ----------------------------------------------------------------------------------------------
# equal_shares
# ----------------------------------------------------------------------------------------------


def brute_shares(rows: list[tuple[int, int, int]]) -> list[float]:
    """Per-nanosecond oracle: each ns is split equally among the intervals covering it."""
    shares = [0.0] * len(rows)
    for dev in {r[0] for r in rows}:
        idx = [i for i, r in enumerate(rows) if r[0] == dev]
        if not idx:
            continue
        lo = min(rows[i][1] for i in idx)
        hi = max(rows[i][2] for i in idx)
        for t in range(lo, hi):
            active = [i for i in idx if rows[i][1] <= t < rows[i][2]]
            for i in active:
                shares[i] += 1.0 / len(active)
    return shares


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from([0, 1]), st.integers(0, 50), st.integers(0, 20)), max_size=20
    )
)
def test_equal_shares_equals_per_ns_oracle(raw):
    rows = [(d, s, s + n) for d, s, n in raw]
    df = pl.DataFrame(rows, schema=["device_id", "start_ns", "end_ns"], orient="row")
    got = cn.equal_shares(df, by=["device_id"]).collect()
    assert got.height == len(rows)
    assert got["share_ns"].to_list() == pytest.approx(brute_shares(rows), abs=1e-9)
    # The shares of a device tile its union exactly.
    if rows:
        unions = iv.total(df, by=["device_id"]).collect()
        per_dev = got.group_by("device_id").agg(pl.col("share_ns").sum())
        joined = unions.join(per_dev, on="device_id")
        assert joined["share_ns"].to_list() == pytest.approx(
            joined["busy_ns"].cast(pl.Float64).to_list()
        )


def test_equal_shares_named_case():
    # [0,10) alone 0-4, with [4,8) 4-8 (k=2), alone 8-10: shares 4+2+2 = 8 and 2.
    df = pl.DataFrame({"start_ns": [0, 4, 20], "end_ns": [10, 8, 20]})
    got = cn.equal_shares(df).collect()["share_ns"].to_list()
    assert got == [8.0, 2.0, 0.0]
