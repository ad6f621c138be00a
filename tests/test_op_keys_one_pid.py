"""`op_keys.op_key` when every row of the sources has one process (or none): the packed key is
the correlation offset alone, with neither the distinct pids nor a lookup per row; it must
equal what the general packing gives (code 0 for that process) and join like the two-column
join, null pids and null correlation ids included, and a second process in any one source
must take the general path."""

from __future__ import annotations

import random

import polars as pl
import pytest

from nsysan.passes import op_keys


def _rows(rng: random.Random, n: int, pids: list[int | None],
          corr: pl.DataType = pl.Int64) -> pl.DataFrame:
    return pl.DataFrame(
        {"global_pid": [rng.choice(pids) for _ in range(n)],
         "correlation_id": [rng.choice([None, -3, 0, 5, 11]) for _ in range(n)]},
        schema={"global_pid": pl.Int64, "correlation_id": corr},
    )


def _general(sources: list[pl.DataFrame], df: pl.DataFrame) -> pl.Series:
    """The packing with a code per distinct pid (what op_key did for every trace)."""
    pids = pl.concat([f["global_pid"] for f in sources]).drop_nulls().unique().sort()
    corr = pl.concat([f["correlation_id"] for f in sources])
    lo, hi = corr.min(), corr.max()
    codes = dict(zip(pids.to_list(), range(pids.len()), strict=True))
    code = pl.col("global_pid").replace_strict(codes, default=None, return_dtype=pl.Int64)
    return df.select(code * (hi - lo + 1) + (pl.col("correlation_id") - lo))[
        "global_pid"]


@pytest.mark.parametrize("corr", [pl.Int64, pl.Int32])  # the frames hold Int32 ids
@pytest.mark.parametrize("pids", [[7 << 24], [None, 7 << 24], [None, 7 << 24, 3]])
def test_one_process_keys_equal_the_general_packing(pids, corr):
    for seed in range(6):
        rng = random.Random(seed)
        a, b = _rows(rng, 30, pids, corr), _rows(rng, 20, [None, 7 << 24], corr)
        expr = op_keys.op_key([a, b])
        for df in (a, b):
            got = df.select(expr)[op_keys.KEY]
            assert got.dtype == pl.Int64
            assert got.to_list() == _general([a, b], df).to_list()
        joined = op_keys.join_on_op(a.lazy(), b.lazy(), [a, b]).collect()
        want = a.join(b, on=op_keys.OP_KEY)
        assert joined.sort(joined.columns).equals(want.sort(want.columns))


def test_only_null_pids_match_nothing():
    a = pl.DataFrame({"global_pid": [None, None], "correlation_id": [1, 2]},
                     schema={"global_pid": pl.Int64, "correlation_id": pl.Int64})
    assert op_keys.join_on_op(a.lazy(), a.lazy(), [a]).collect().is_empty()


def test_int32_correlation_ids_of_one_process_take_the_lookup_path():
    # the packed key is Int64 whatever the frames hold: an Int32 key made `unique_rows`
    # decline, and every op link went through a hash join (5x slower on 1M kernels)
    ids = pl.Series("correlation_id", [4, 9, 5, None, 7], dtype=pl.Int32)
    calls = pl.DataFrame({"global_pid": [7 << 24] * 5, "correlation_id": ids})
    ops = calls.reverse()
    key = op_keys.op_key([calls, ops])
    rows = op_keys.unique_rows(calls.select(key)[op_keys.KEY], ops.select(key)[op_keys.KEY])
    assert rows is not None and rows.to_list() == [4, -1, 2, 1, 0]
