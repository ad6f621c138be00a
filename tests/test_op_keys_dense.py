"""`op_keys.unique_rows`: the lookup-table path (dense keys) and the sort-and-search path
(sparse keys) give the same rows, and both decline tables that hold a key twice."""

from __future__ import annotations

import random

import polars as pl
import pytest

from nsysan.passes.op_keys import unique_rows

SPARSE = 1 << 40  # keys this far apart never take the lookup-table path


def _expected(table: list[int | None], queries: list[int | None]) -> list[int]:
    row = {k: i for i, k in enumerate(table) if k is not None}
    return [row.get(q, -1) if q is not None else -1 for q in queries]


@pytest.mark.parametrize("scale", [1, SPARSE])
@pytest.mark.parametrize("seed", range(4))
def test_both_paths_equal_a_lookup(seed, scale):
    rnd = random.Random(seed)
    table: list[int | None] = [k * scale for k in rnd.sample(range(300), 80)] + [None] * 3
    rnd.shuffle(table)
    queries = [rnd.choice([None, -1, *range(320)]) for _ in range(150)]
    queries = [q * scale if q is not None and q >= 0 else q for q in queries]
    got = unique_rows(pl.Series(table, dtype=pl.Int64), pl.Series(queries, dtype=pl.Int64))
    assert got is not None and got.dtype == pl.Int64
    assert got.to_list() == _expected(table, queries)


@pytest.mark.parametrize("scale", [1, SPARSE])
def test_both_paths_decline_a_key_held_twice(scale):
    table = pl.Series([3 * scale, None, 5 * scale, 3 * scale], dtype=pl.Int64)
    assert unique_rows(table, pl.Series([3 * scale], dtype=pl.Int64)) is None


def test_all_null_table_matches_nothing():
    got = unique_rows(pl.Series([None, None], dtype=pl.Int64), pl.Series([0, None], dtype=pl.Int64))
    assert got is not None and got.to_list() == [-1, -1]
