"""The packed-key paths of `enclosing`, `tightest` and `equal_shares` that the small brute-force
inputs of `tests/test_intervals_containment.py` never reach: times so large that packing falls
back to time ranks, and string group keys (codes are dense ranks)."""

from __future__ import annotations

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_intervals_containment import (
    arbitrary_case,
    brute_innermost,
    brute_pairs,
    brute_shares,
    frames,
    nested_case,
)

from nsysan.frames import containment as cn
from nsysan.frames.packed_keys import Keys

SCALE = 1 << 55  # 64 * 2^55 = 2^61: with three groups the packed range exceeds 2^62
SHIFT = 12345


def scaled(df: pl.DataFrame) -> pl.DataFrame:
    return df.with_columns(pl.col("start_ns", "end_ns") * SCALE + SHIFT)


def as_strings(df: pl.DataFrame) -> pl.DataFrame:
    return df.with_columns(pl.format("k{}", pl.col("key")).alias("key"))


@settings(max_examples=100, deadline=None)
@given(st.one_of(nested_case(), arbitrary_case()), st.sampled_from([scaled, as_strings]))
def test_enclosing_and_innermost_on_packed_fallbacks(case, transform):
    queries, ranges = case
    q, r = (transform(f) for f in frames(queries, ranges))
    got = cn.enclosing(q, r, by=["key"]).collect()
    assert set(got.select("query_id", "range_id").iter_rows()) == brute_pairs(queries, ranges)
    assert got.height == len(set(got.select("query_id", "range_id").iter_rows()))
    inner = cn.innermost_enclosing(q, r, by=["key"]).collect()
    assert dict(inner.select("query_id", "range_id").iter_rows()) == brute_innermost(
        queries, ranges
    )


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from([0, 1, 2]), st.integers(0, 50), st.integers(0, 20)), max_size=20
    )
)
def test_equal_shares_with_huge_times(raw):
    rows = [(d, s, s + n) for d, s, n in raw]
    df = pl.DataFrame(rows, schema=["device_id", "start_ns", "end_ns"], orient="row")
    got = cn.equal_shares(scaled(df), by=["device_id"]).collect()
    expected = [share * SCALE for share in brute_shares(rows)]
    assert got["share_ns"].to_list() == pytest.approx(expected, rel=1e-9, abs=1e-6)


def test_equal_shares_null_bounds_get_zero_and_do_not_count():
    df = pl.DataFrame({"start_ns": [0, None, 4, 2], "end_ns": [10, 5, 8, None]})
    got = cn.equal_shares(df).collect()
    assert got.columns == ["start_ns", "end_ns", "share_ns"]
    assert got["share_ns"].to_list() == [8.0, 0.0, 2.0, 0.0]


def test_the_rank_fallback_is_taken_and_exact():
    queries = [(0, 1, 10, 20), (1, 2, 40, 41), (2, 3, 60, 64)]
    ranges = [(0, 1, 0, 64), (1, 1, 10, 20), (2, 2, 0, 50), (3, 3, 64, 64)]
    q, r = (scaled(f) for f in frames(queries, ranges))
    keys = Keys([q, r], ["key"], ["start_ns", "end_ns"])
    assert keys.span < SCALE  # times were replaced by their ranks
    got = cn.enclosing(q, r, by=["key"]).collect()
    assert set(got.select("query_id", "range_id").iter_rows()) == {(0, 0), (0, 1), (1, 2)}


@settings(max_examples=60, deadline=None)
@given(st.one_of(nested_case(), arbitrary_case()), st.sampled_from([1, 2, 5]))
def test_enclosing_expands_pairs_chunk_by_chunk_to_the_same_rows(case, chunk):
    """Candidate pairs expanded a few at a time (`PAIR_CHUNK`) give the same pairs, in the
    same order, as one expansion of all of them."""
    queries, ranges = case
    q, r = frames(queries, ranges)
    whole = cn.enclosing(q, r, by=["key"]).collect()
    old = cn.PAIR_CHUNK
    cn.PAIR_CHUNK = chunk
    try:
        chunked = cn.enclosing(q, r, by=["key"]).collect()
    finally:
        cn.PAIR_CHUNK = old
    assert chunked.equals(whole)
    assert set(chunked.select("query_id", "range_id").iter_rows()) == brute_pairs(queries, ranges)


def test_enclosing_without_the_key_columns_lists_the_same_pairs():
    q = pl.DataFrame({"key": [1, 1, 2], "query_id": [10, 11, 12], "start_ns": [5, 7, 5],
                      "end_ns": [6, 9, 6]})
    r = pl.DataFrame({"key": [1, 2, 2], "range_id": [0, 1, 2], "start_ns": [0, 0, 6],
                      "end_ns": [8, 10, 7]})
    full = cn.enclosing(q, r, by=["key"]).collect()
    bare = cn.enclosing(q, r, by=["key"], keep_by=False).collect()
    assert bare.columns == ["query_id", "range_id"]
    assert bare.equals(full.drop("key"))
    assert set(bare.iter_rows()) == {(10, 0), (12, 1)}
