"""Per-range and per-layer sums of the attribution pass, over dense integer indices.

Ranges (``rix``) and layers (``lid``) are dense 0-based indices, so every per-range or
per-layer result is an array indexed by them, filled by unbuffered scatters (``np.add.at``,
``np.minimum.at``): no hash group-by over the million-row membership table, and no join to put
the results back on the ranges (the attribution table is in ``rix`` order).
"""

from __future__ import annotations

import numpy as np
import polars as pl

from nsysan.frames import intervals as iv
from nsysan.frames.packed_keys import GROUP, Keys
from nsysan.frames.sweeps import dense_codes

_MAX = np.iinfo(np.int64).max
_MIN = np.iinfo(np.int64).min


def _extreme(index: np.ndarray, values: pl.Series, n: int, lowest: bool) -> pl.Series:
    """Min (``lowest``) or max of ``values`` per index in ``[0, n)``, ignoring nulls; null
    where an index has no value (a group-by's ``min``/``max``)."""
    ok = values.is_not_null().to_numpy()
    idx, v = index[ok], values.filter(pl.Series(ok)).to_numpy().astype(np.int64)
    out = np.full(n, _MAX if lowest else _MIN, np.int64)
    (np.minimum if lowest else np.maximum).at(out, idx, v)
    seen = np.bincount(idx, minlength=n) > 0
    return pl.Series(out).set(pl.Series(~seen), None)


def projection(rix: np.ndarray, start: pl.Series, end: pl.Series, n: int,
               ) -> tuple[pl.Series, pl.Series]:
    """``proj_start_ns`` (min op start) and ``proj_end_ns`` (max op end) per range."""
    return _extreme(rix, start, n, True), _extreme(rix, end, n, False)


def distinct_counts(group: np.ndarray, item: np.ndarray, n_groups: int) -> np.ndarray:
    """Number of distinct non-negative ``item`` values per ``group`` in ``[0, n_groups)``."""
    if not len(item):
        return np.zeros(n_groups, np.int64)
    span = int(item.max()) + 1
    # (group, item) packed into one Int64: a sort of values, then the runs of equal values.
    pair = np.sort(group.astype(np.int64) * span + item)
    first = np.ones(len(pair), bool)
    first[1:] = pair[1:] != pair[:-1]
    return np.bincount(pair[first] // span, minlength=n_groups).astype(np.int64)


def union_busy(group: np.ndarray, members: pl.DataFrame, n_groups: int) -> np.ndarray:
    """Per group in ``[0, n_groups)``: the union of its intervals (``members``' rows:
    ``device_id, start_ns, end_ns``, ``device_id`` non-null) per device, summed over
    devices (what `intervals.total` by ``[group, device_id]`` then a sum per group gives)."""
    ok = (members["end_ns"] > members["start_ns"]).fill_null(False)
    x = members.filter(ok).select("device_id", "start_ns", "end_ns")
    device, devices = dense_codes(x["device_id"].cast(pl.Int64))
    n_dev = max(len(devices), 1)
    code = group[ok.to_numpy()].astype(np.int64) * n_dev + device
    keys = Keys([x.with_columns(pl.Series("_c", code))], ["_c"], ["start_ns", "end_ns"])
    g, bs, be = iv.packed_blocks(keys, 0, "start_ns", "end_ns")
    block_code = keys.attach_by(pl.DataFrame({GROUP: g}, schema={GROUP: pl.Int64}))["_c"]
    busy = np.zeros(n_groups, np.int64)
    np.add.at(busy, block_code.to_numpy() // n_dev, keys.lengths(bs, be))
    return busy
