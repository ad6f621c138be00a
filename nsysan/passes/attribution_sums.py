"""Per-range and per-layer sums of the attribution pass, over dense integer indices.

Ranges (``rix``) and layers (``lid``) are dense 0-based indices, so every per-range or
per-layer result is an array indexed by them, filled by unbuffered scatters (``np.add.at``,
``np.minimum.at``): no hash group-by over the million-row membership table, and no join to put
the results back on the ranges (the attribution table is in ``rix`` order).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import polars as pl

from nsysan.frames import intervals as iv
from nsysan.frames.packed_keys import GROUP, LIMIT, Keys
from nsysan.frames.sweeps import member_codes, runs_within, sorted_values

_MAX = np.iinfo(np.int64).max
_MIN = np.iinfo(np.int64).min


def _extreme(index: np.ndarray, values: pl.Series, n: int, lowest: bool) -> pl.Series:
    """Min (``lowest``) or max of ``values`` per index in ``[0, n)``, ignoring nulls; null
    where an index has no value (a group-by's ``min``/``max``)."""
    if values.null_count():
        ok = values.is_not_null().to_numpy()
        idx, v = index[ok], values.filter(pl.Series(ok)).to_numpy().astype(np.int64)
    else:
        idx, v = index, values.to_numpy().astype(np.int64, copy=False)
    out = np.full(n, _MAX if lowest else _MIN, np.int64)
    op = np.minimum if lowest else np.maximum
    if len(idx) and np.all(idx[1:] >= idx[:-1]):
        # Memberships come in range order: each index's values are one run, reduced at once
        # (an unbuffered ``ufunc.at`` costs several times a reduction).
        firsts = np.flatnonzero(np.r_[True, idx[1:] != idx[:-1]])
        out[idx[firsts]] = op.reduceat(v, firsts)
        seen = np.zeros(n, bool)
        seen[idx[firsts]] = True
    else:
        op.at(out, idx, v)
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
    pair = sorted_values(group.astype(np.int64) * span + item)
    first = np.ones(len(pair), bool)
    first[1:] = pair[1:] != pair[:-1]
    return np.bincount(pair[first] // span, minlength=n_groups).astype(np.int64)


#: `union_busies` works on the rows of at most this many members at a time (whole groups:
#: a group with more rows is taken alone): its packed keys, sorted copies and blocks are six
#: Int64 arrays of that many rows, not of every membership (25M on a 10M-kernel trace)
UNION_CHUNK = 1 << 22


def union_busies(members: pl.DataFrame, groupings: Sequence[tuple[np.ndarray, int]],
                 ) -> list[np.ndarray]:
    """Per grouping (``group, n_groups``: a group in ``[0, n_groups)`` of every row of
    ``members``, e.g. per range and per layer), per group: the union of its intervals
    (``members``' rows: ``device_id, start_ns, end_ns``, ``device_id`` non-null) per device,
    summed over devices (what `intervals.total` by ``[group, device_id]`` then a sum per group
    gives). The rows, devices and times are read once for all groupings; groups are summed
    apart, a few at a time (`UNION_CHUNK`)."""
    ok = (members["end_ns"] > members["start_ns"]).fill_null(False)
    every = bool(ok.all())
    x = (members if every else members.filter(ok)).select("device_id", "start_ns", "end_ns")
    keep = None if every else ok.to_numpy()
    device, n_dev = member_codes(x, ["device_id"])
    if n_dev <= 1:  # one device (or none): nothing to tell apart
        device, n_dev = None, 1
    start, end = x["start_ns"].to_numpy(), x["end_ns"].to_numpy()
    out = []
    for group, n_groups in groupings:  # per grouping, not per row
        g = group if keep is None else group[keep]
        busy = np.zeros(n_groups, np.int64)
        for rows, lo, hi in _group_chunks(g, n_groups):
            code = g[rows].astype(np.int64) - lo
            if device is not None:
                code = code * n_dev + device[rows]
            busy[lo:hi] = _busy(code, hi - lo, n_dev, start[rows], end[rows],
                                lambda rows=rows: x[rows])
        out.append(busy)
    return out


def _group_chunks(group: np.ndarray, n_groups: int,
                  ) -> list[tuple[slice | np.ndarray, int, int]]:
    """(rows, first group, end group): the rows of ``group`` whose group is in [first, end),
    for consecutive runs of groups of about `UNION_CHUNK` rows each (a slice when the rows
    come in group order, as memberships do)."""
    if len(group) <= UNION_CHUNK:
        return [(slice(None), 0, n_groups)]
    upto = np.cumsum(np.bincount(group, minlength=n_groups))  # rows of groups <= i
    ordered = bool(np.all(group[1:] >= group[:-1]))
    return [((slice(int(upto[lo - 1]) if lo else 0, int(upto[hi - 1])) if ordered
              else np.flatnonzero((group >= lo) & (group < hi))), lo, hi)
            for lo, hi in runs_within(upto, UNION_CHUNK)]


def _busy(code: np.ndarray, n_groups: int, n_dev: int, start: np.ndarray, end: np.ndarray,
          rows_frame: Callable[[], pl.DataFrame]) -> np.ndarray:
    """Busy time per group in [0, ``n_groups``) of the rows given: ``code`` = group * n_dev +
    device, their bounds; ``rows_frame`` gives them as a frame for the general keys."""
    packed = _pack(code, n_groups * n_dev, start, end)
    if packed is None:  # times too far apart to pack next to the codes: the general keys
        return _union_busy_keys(code, rows_frame(), n_dev, n_groups)
    starts, ends, span = packed
    # The union's blocks of every (group, device) code, as in `intervals.packed_blocks`.
    bs, be = iv.merge_sorted(sorted_values(starts), sorted_values(ends))
    del starts, ends
    # Blocks come sorted by code, so a group's blocks are one run: its busy time is a
    # difference of running sums at the run's bounds, found by a binary search per group
    # (no division or scatter per block).
    total = np.zeros(len(bs) + 1, np.int64)
    np.cumsum(be - bs, out=total[1:])
    bounds = np.searchsorted(bs, np.arange(n_groups + 1, dtype=np.int64) * (span * n_dev))
    return total[bounds[1:]] - total[bounds[:-1]]


def _pack(code: np.ndarray, n_codes: int, start: np.ndarray, end: np.ndarray,
          ) -> tuple[np.ndarray, np.ndarray, int] | None:
    """``code * span + (time - min time)`` of the starts and ends (Int64, ordered by code,
    then time) and ``span``; None when that would not fit in 62 bits."""
    if not len(code):
        return code, code, 1
    tmin = int(start.min())
    span = int(end.max()) - tmin + 1
    if n_codes * span >= LIMIT:
        return None
    base = code * span - tmin
    return base + start, base + end, span


def _union_busy_keys(code: np.ndarray, x: pl.DataFrame, n_dev: int, n_groups: int,
                     ) -> np.ndarray:
    """One grouping of `union_busies` through `packed_keys.Keys`, which ranks the times when
    they are too far apart to pack as offsets."""
    keys = Keys([x.with_columns(pl.Series("_c", code))], ["_c"], ["start_ns", "end_ns"])
    g, bs, be = iv.packed_blocks(keys, 0, "start_ns", "end_ns")
    block_code = keys.attach_by(pl.DataFrame({GROUP: g}, schema={GROUP: pl.Int64}))["_c"]
    busy = np.zeros(n_groups, np.int64)
    np.add.at(busy, block_code.to_numpy() // n_dev, keys.lengths(bs, be))
    return busy
