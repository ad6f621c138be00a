"""The CUDA API call that launched each GPU op, found once per trace and shared.

The gaps pass (launching threads), the kernels pass (launch statistics) and the findings (late
launches, launches without a GPU record) all tie GPU ops to their API calls on the op key
``(global_pid, correlation_id)``. Each used to hash-join the two largest frames (a million rows
each on big traces). `api_rows` gives every op its call's row once, and each consumer then
gathers the columns it needs: one code path per consumer. The API keys are distinct in loaded
traces (the ``duplicate_correlation`` rule keeps one call per key, docs/data-quality.md), so
one sort and a binary search per op find the rows: of the correlation ids alone in a trace of
one process (`_by_correlation`), else of packed keys (`op_keys.unique_rows`); only frames of
several processes built in memory with a key held twice, or keys too wide to pack, take a
join, which links each op to the first call holding its key.

Shared as the product `API_ROWS` of the analysis (`nsysan.frames.context`): built once per
analysis, for its (``gpu_ops``, ``cuda_api``) frame objects, freed when the analysis ends.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from nsysan.frames.context import Product, product
from nsysan.frames.trace import Trace
from nsysan.passes.op_keys import KEY, first_rows, op_key, unique_rows


def _link(trace: Trace) -> np.ndarray:
    ops, api = trace.frame("gpu_ops"), trace.frame("cuda_api")
    row = _by_correlation(ops, api)
    if row is not None:
        return row
    key = op_key([ops, api])
    row = unique_rows(api.select(key)[KEY], ops.select(key)[KEY])
    if row is not None:
        return row.to_numpy()
    # a key held by several calls (frames built in memory) or struct keys: the first call of
    # each key, by a join (left: one row per op, in op order)
    calls = (api.select(key).with_row_index("_api").filter(pl.col(KEY).is_not_null())
             .unique(KEY, keep="first", maintain_order=True))
    linked = (ops.select(key).with_row_index("_op")
              .join(calls, on=KEY, how="left").sort("_op"))
    return linked["_api"].cast(pl.Int64).fill_null(-1).to_numpy()


def _by_correlation(ops: pl.DataFrame, api: pl.DataFrame) -> np.ndarray | None:
    """`_link` of the common trace, one process per file: there the op key is the
    correlation id alone, and the calls' ids are sorted and searched as they are (4 bytes a
    call in the frames, and the sort's order) instead of packed Int64 keys of both frames
    (+643-685 MiB at 10M kernels through the general lookup, +443 MiB here). Calls come
    nearly in id order, so the stable sort of their ids is cheap. None when the frames hold
    several processes, a null id, or ids of two types (the general path takes those)."""
    if not ops.height or not api.height:
        return None
    # (the process id as expressions: the column is usually a constant of the frame at
    # rest, which a Series would spell out row by row)
    pid = pl.col("global_pid")
    bounds = [f.select(pid.min().alias("lo"), pid.max().alias("hi"), pid.null_count()).row(0)
              for f in (ops, api)]
    ids = [f.get_column("correlation_id") for f in (ops, api)]
    if (any(nulls for _, _, nulls in bounds)
            or len({v for lo, hi, _ in bounds for v in (lo, hi)}) != 1
            or any(c.null_count() or not c.dtype.is_integer() for c in ids)
            or ids[0].dtype != ids[1].dtype):  # (numpy would compare a mix as floats)
        return None
    calls, queries = ids[1].to_numpy(), ids[0].to_numpy()
    # (stable: of calls holding one id, the first in row order comes first, and the search
    # from the left finds it, the call the general path's join links)
    order = np.argsort(calls, kind="stable")
    return first_rows(order, calls[order], queries)


#: the API row of every GPU op (8 bytes per op)
API_ROWS: Product[np.ndarray] = Product(
    "op_link.api_rows", ("gpu_ops", "cuda_api"), _link,
    "for every gpu_ops row, the cuda_api row with its op key")


def api_rows(trace: Trace) -> np.ndarray:
    """For every row of ``gpu_ops``, the row of ``cuda_api`` with the same op key (-1 when
    none, or when either key column is null; the first such row when several hold the key),
    as Int64: always aligned with ``gpu_ops`` (all -1 when no API calls were captured)."""
    return product(trace, API_ROWS)


def gather(col: pl.Series, rows: pl.Series | np.ndarray) -> pl.Series:
    """``col`` at ``rows`` (API rows from `api_rows`), null where a row is -1."""
    idx = pl.Series(rows, dtype=pl.Int64)
    return col.gather(idx.set(idx < 0, None))


def launched(trace: Trace, rows: np.ndarray) -> pl.Series:
    """Per ``cuda_api`` row: some GPU op was launched by it (``rows`` from `api_rows`)."""
    used = np.zeros(trace.frame("cuda_api").height, bool)
    used[rows[rows >= 0]] = True
    return pl.Series("_launched", used)
