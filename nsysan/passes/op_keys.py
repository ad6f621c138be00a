"""Joins on the op key ``(global_pid, correlation_id)`` through one packed Int64 column.

Every GPU op is tied to the CUDA API call that launched it by ``(global_pid,
correlation_id)``. Joining or de-duplicating million-row frames on those two columns costs two
to four times the same on one Int64 column (polars hashes a row encoding of multi-column
keys), so the pair is packed into ``code(global_pid) * span + (correlation_id - min)``:
processes are few, and the correlation ids of one trace span far less than 2**62 / processes.
When they do not fit, the key is a struct of the two columns (slower, same result).

Either way the key is null when either column is: like a join on the two columns, null keys
never match.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import polars as pl

OP_KEY = ["global_pid", "correlation_id"]
#: name of the column `op_key` computes
KEY = "_op_key"
#: packed keys stay below this
_LIMIT = 1 << 62

JoinHow = Literal["inner", "left", "semi", "anti"]


def op_key(sources: Sequence[pl.DataFrame]) -> pl.Expr:
    """Expression for the ``_op_key`` column: equal for two rows taken from ``sources``
    exactly when their ``global_pid`` and ``correlation_id`` are (null when either is).

    ``sources`` are the frames the rows come from (rows may be filtered): the packing is
    fixed by the values they hold, so keys of rows from other frames are meaningless.
    """
    both = pl.col("global_pid").is_not_null() & pl.col("correlation_id").is_not_null()
    fallback = pl.when(both).then(pl.struct(OP_KEY)).alias(KEY)
    # One process per trace is common (a trace per rank): its min and max are equal, and then
    # neither the distinct pids (a hash of every row) nor a lookup per row are needed.
    ends = {f.get_column("global_pid").min() for f in sources} | {
        f.get_column("global_pid").max() for f in sources}
    ends.discard(None)
    one_process = len(ends) == 1
    if one_process:
        pids = pl.Series(list(ends), dtype=pl.Int64)
    else:
        pids = pl.concat([f.get_column("global_pid").unique() for f in sources]).unique()
        pids = pids.drop_nulls().sort()
    corr = pl.concat([f.get_column("correlation_id") for f in sources])
    lo, hi = corr.min(), corr.max()
    if lo is None or hi is None or pids.is_empty():
        return fallback  # no key can match: any form will do
    span = int(hi) - int(lo) + 1  # type: ignore[arg-type]
    if span * pids.len() >= _LIMIT:
        return fallback
    # (Int64 whatever the frames hold: `unique_rows` takes packed keys as Int64 only)
    offset = pl.col("correlation_id").cast(pl.Int64) - lo
    if one_process:  # code 0: the offset, null where the pid is
        return pl.when(pl.col("global_pid").is_not_null()).then(offset).alias(KEY)
    codes = dict(zip(pids.to_list(), range(pids.len()), strict=True))
    code = pl.col("global_pid").replace_strict(codes, default=None, return_dtype=pl.Int64)
    return (code * span + offset).alias(KEY)


def join_on_op(
    left: pl.LazyFrame,
    right: pl.LazyFrame,
    sources: Sequence[pl.DataFrame],
    how: JoinHow = "inner",
    **kwargs: Any,
) -> pl.LazyFrame:
    """``left.join(right, on=["global_pid", "correlation_id"], how=how, **kwargs)`` (not for
    ``nulls_equal``), through `op_key` of ``sources``: the frames ``left`` and ``right`` take
    their rows from. The output has ``left``'s key columns, as the plain join has."""
    key = op_key(sources)
    right_cols = right.collect_schema().names()
    packed_right = right.with_columns(key).drop([c for c in OP_KEY if c in right_cols])
    return left.with_columns(key).join(packed_right, on=KEY, how=how, **kwargs).drop(KEY)


def unique_rows(table: pl.Series, queries: pl.Series) -> pl.Series | None:
    """For every key of ``queries``, the row of ``table`` holding the same key (-1: none; null
    keys match nothing), when ``table``'s non-null keys are distinct non-negative integers
    (packed keys of `op_key` or `packed_keys.Keys`); None otherwise (struct keys, or a key
    held twice: use a join then).

    Why not a hash join: keys follow launch order, so both sides come nearly sorted; a
    (nearly free) stable argsort and a binary search per query stay in cache, where hash
    tables of millions of rows do not, and grow worse than linearly with the trace. Packed
    op keys are usually dense (correlation ids count up per process): then a table indexed
    by key replaces the sort and the searches (two linear passes).
    """
    if table.dtype != pl.Int64 or queries.dtype != pl.Int64:
        return None
    lowest, highest = table.min(), table.max()
    if lowest is not None and int(lowest) < 0:  # type: ignore[arg-type]
        return None
    keys = table.fill_null(-1).to_numpy()  # -1 marks null: no key is negative
    q = queries.fill_null(-1).to_numpy()
    if highest is not None and int(highest) < 2 * len(keys) + (1 << 20):  # type: ignore[arg-type]
        return _dense_rows(keys, q, int(highest))  # type: ignore[arg-type]
    order = np.argsort(keys, kind="stable")
    ordered = keys[order]
    if np.any((ordered[1:] == ordered[:-1]) & (ordered[1:] >= 0)):
        return None
    if not len(ordered):
        return pl.Series(np.full(len(q), -1, np.int64))
    rows = first_rows(order, ordered, q)
    rows[q < 0] = -1  # null queries match nothing (nor the null keys, also -1)
    return pl.Series(rows)


def first_rows(order: np.ndarray, ordered: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """For every query, the row ``order[i]`` of the first ``ordered[i]`` equal to it, -1 where
    none is: ``ordered`` is a column sorted by ``order`` (`np.argsort`; stable, so that of
    rows holding one value the first comes first), not empty. Int64."""
    pos = np.searchsorted(ordered, queries)
    np.minimum(pos, len(ordered) - 1, out=pos)
    found = ordered[pos] == queries
    del ordered  # (gone before the rows are gathered, when the caller passed a temporary)
    rows = order[pos].astype(np.int64, copy=False)
    rows[~found] = -1
    return rows


def _dense_rows(keys: np.ndarray, queries: np.ndarray, highest: int) -> pl.Series | None:
    """`unique_rows` through a lookup table indexed by key (keys in ``[-1, highest]``)."""
    rows = np.arange(len(keys), dtype=np.int64)
    valid = keys >= 0
    lut = np.full(highest + 2, -1, np.int64)  # the last slot: keys -1 and queries out of range
    lut[keys] = rows
    # A key held twice keeps one row in the table: the other row does not find itself.
    if np.any(valid & (lut[keys] != rows)):
        return None
    lut[-1] = -1  # null keys (-1) wrote their rows there
    inside = (queries >= 0) & (queries <= highest)
    return pl.Series(lut[np.where(inside, queries, -1)])
