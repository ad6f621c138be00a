"""`nsysan.passes.op_keys`: joins on (global_pid, correlation_id) through one packed key give the
same rows as the two-column join, on the packed path and on the struct fallback."""

from __future__ import annotations

import random

import polars as pl
import pytest

from nsysan.passes import op_keys


def frames(seed: int, corr_span: int) -> tuple[pl.DataFrame, pl.DataFrame]:
    rng = random.Random(seed)

    def rows(n: int) -> pl.DataFrame:
        return pl.DataFrame(
            {
                "global_pid": [rng.choice([None, 1 << 24, 2 << 24, 7 << 40]) for _ in range(n)],
                "correlation_id": [rng.choice([None, -3, 0, 5, corr_span]) for _ in range(n)],
                "x": list(range(n)),
            },
            schema={"global_pid": pl.Int64, "correlation_id": pl.Int64, "x": pl.Int64},
        )

    return rows(40), rows(30).rename({"x": "y"})


def canon(df: pl.DataFrame) -> pl.DataFrame:
    return df.sort(df.columns, nulls_last=True)


@pytest.mark.parametrize("how", ["inner", "left", "semi", "anti"])
@pytest.mark.parametrize("corr_span", [10, 1 << 61], ids=["packed", "struct_fallback"])
def test_join_on_op_equals_the_two_column_join(how, corr_span):
    for seed in range(5):
        left, right = frames(seed, corr_span)
        got = op_keys.join_on_op(left.lazy(), right.lazy(), [left, right], how=how).collect()
        want = left.join(right, on=op_keys.OP_KEY, how=how)
        assert got.columns == want.columns
        assert canon(got).equals(canon(want))


def test_key_is_packed_when_it_fits_and_a_struct_otherwise():
    small, _ = frames(0, 10)
    huge, _ = frames(0, 1 << 61)
    assert small.select(op_keys.op_key([small])).dtypes == [pl.Int64]
    assert isinstance(huge.select(op_keys.op_key([huge])).dtypes[0], pl.Struct)


def test_no_rows_gives_a_key_that_joins_nothing():
    empty = pl.DataFrame(schema={"global_pid": pl.Int64, "correlation_id": pl.Int64})
    got = op_keys.join_on_op(empty.lazy(), empty.lazy(), [empty]).collect()
    assert got.is_empty() and got.columns == op_keys.OP_KEY
