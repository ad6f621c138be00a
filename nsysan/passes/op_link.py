"""The CUDA API call that launched each GPU op, found once per trace and shared.

The gaps pass (launching threads), the kernels pass (launch statistics) and the findings (late
launches, launches without a GPU record) all tie GPU ops to their API calls on the op key
``(global_pid, correlation_id)``. Each used to hash-join the two largest frames (a million rows
each on big traces). When the API keys are distinct (they are in nsys exports), one sort and a
binary search per op (`op_keys.unique_rows`) give every op its call's row, and each consumer
then gathers the columns it needs; callers fall back to their joins otherwise.

Shared as the product `API_ROWS` of the analysis (`nsysan.frames.context`): built once per
analysis, for its (``gpu_ops``, ``cuda_api``) frame objects, freed when the analysis ends.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from nsysan.frames.context import Product, product
from nsysan.frames.trace import Trace
from nsysan.passes.op_keys import KEY, op_key, unique_rows


def _link(trace: Trace) -> np.ndarray | None:
    ops, api = trace.frame("gpu_ops"), trace.frame("cuda_api")
    key = op_key([ops, api])
    row = unique_rows(api.select(key)[KEY], ops.select(key)[KEY])
    return None if row is None else row.to_numpy()


#: the API row of every GPU op (8 bytes per op), or None
API_ROWS: Product[np.ndarray | None] = Product(
    "op_link.api_rows", ("gpu_ops", "cuda_api"), _link,
    "for every gpu_ops row, the cuda_api row with its op key")


def api_rows(trace: Trace) -> np.ndarray | None:
    """For every row of ``gpu_ops``, the row of ``cuda_api`` with the same op key (-1 when
    none, or when either key column is null), as Int64; None when some key is held by
    several API rows (then a join says what the callers mean) or a frame is missing."""
    if not (trace.has("gpu_ops") and trace.has("cuda_api")):
        return None
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
