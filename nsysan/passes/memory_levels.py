"""The numeric core of the memory pass: in-use levels of keyed events, in numpy.

Why numpy: a capture with memory-usage events has one row per allocation and free, a million
and more; the levels are one cumulative sum per key in time order, and every statistic of the
pass (bin maxima, peaks, levels at step boundaries) is a reduction over sorted runs or a binary
search in them. Grouping and sorting the same rows in polars by (key, time) cost seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl


@dataclass
class Levels:
    """One row per key and distinct timestamp, in (key, time) order: the level after every
    event of the key at or before that time. ``keys`` row ``k`` is key id ``k``; ``seg[k] :
    seg[k + 1]`` are its rows; ``kid_raw`` is the key id of every input event."""

    keys: pl.DataFrame
    kid: np.ndarray
    t: np.ndarray
    level: np.ndarray
    seg: np.ndarray
    kid_raw: np.ndarray

    @property
    def n_keys(self) -> int:
        return self.keys.height

    def before(self, k: int, times: np.ndarray) -> np.ndarray:
        """Level of key ``k`` from its events strictly before each of ``times``."""
        lo, hi = int(self.seg[k]), int(self.seg[k + 1])
        i = np.searchsorted(self.t[lo:hi], times, side="left") - 1
        return np.where(i >= 0, self.level[lo:hi][np.maximum(i, 0)], 0)

    def peaks(self) -> tuple[np.ndarray, np.ndarray]:
        """Per key: the highest level and the first time it is reached."""
        best = np.zeros(self.n_keys, np.int64)
        when = np.zeros(self.n_keys, np.int64)
        for k in range(self.n_keys):  # one iteration per key (process x device), not per event
            lo, hi = int(self.seg[k]), int(self.seg[k + 1])
            i = int(np.argmax(self.level[lo:hi]))
            best[k], when[k] = self.level[lo + i], self.t[lo + i]
        return best, when


def key_ids(ev: pl.DataFrame, by: list[str]) -> tuple[pl.DataFrame, np.ndarray]:
    """The distinct keys of ``ev`` (sorted) and each row's key id.

    Each key column is coded by its position among its few sorted distinct values (a hash
    join of the rows to them) and the codes are packed into one integer; the packed values
    present are ranked through a lookup array over all possible ones (small: devices x
    processes x kinds), or by a sort when there are too many. No sort or join of whole rows."""
    uniques = [ev.get_column(c).unique().sort(nulls_last=True) for c in by]
    widths = [max(int(u.len()), 1) for u in uniques]
    codes = np.zeros(ev.height, np.int64)
    for c, u, w in zip(by, uniques, widths, strict=True):
        codes = codes * w + _codes(ev.get_column(c), u)
    space = int(np.prod(widths, dtype=np.float64))
    if space <= 1 << 22:
        present = np.zeros(space, bool)
        present[codes] = True
        uniq = np.flatnonzero(present)
        rank = np.cumsum(present) - 1
        kid = rank[codes]
    else:
        uniq, kid = np.unique(codes, return_inverse=True)
    cols = {}
    rest = uniq.astype(np.int64)
    for c, u, w in reversed(list(zip(by, uniques, widths, strict=True))):
        cols[c] = u.gather(pl.Series(rest % w))
        rest = rest // w
    return pl.DataFrame({c: cols[c] for c in by}), kid.astype(np.int64)


def _codes(col: pl.Series, uniques: pl.Series) -> np.ndarray:
    """Position of each value of ``col`` among its sorted distinct values ``uniques``."""
    if uniques.len() == 1:
        return np.zeros(col.len(), np.int64)
    if col.dtype.is_integer() and not col.null_count():
        return np.searchsorted(uniques.to_numpy(), col.to_numpy())
    if not col.null_count():
        return col.replace_strict(uniques, pl.int_range(uniques.len(), eager=True),
                                  return_dtype=pl.Int64).to_numpy()
    table = pl.DataFrame({"v": uniques, "_i": pl.int_range(uniques.len(), eager=True)})
    got = pl.DataFrame({"v": col}).join(table, on="v", how="left", maintain_order="left",
                                         nulls_equal=True)
    return got["_i"].cast(pl.Int64).to_numpy()


def levels(ev: pl.DataFrame, by: list[str], t: np.ndarray, signed: np.ndarray) -> Levels:
    """`Levels` of the rows of ``ev`` (``t``: their start times, ``signed``: + bytes for an
    allocation, - for a free) per ``by`` key. Events at one timestamp apply together."""
    keys, kid = key_ids(ev, by)
    return levels_of(keys, kid, t, signed)


def coarser(keys: pl.DataFrame, kid: np.ndarray, by: list[str]
            ) -> tuple[pl.DataFrame, np.ndarray]:
    """Keys and ids by a prefix ``by`` of the columns of ``keys`` (sorted, so each coarser
    key is one run of them)."""
    sub = keys.select(by)
    if sub.height <= 1:
        return sub, np.zeros_like(kid)
    changed = np.zeros(sub.height - 1, bool)
    for c in by:
        v = sub[c]
        changed |= v[1:].ne_missing(v[:-1]).to_numpy()
    new = np.r_[True, changed]
    return sub.filter(pl.Series(new)), (np.cumsum(new) - 1)[kid]


def regrouped(lv: Levels, keys: pl.DataFrame, kid: np.ndarray) -> Levels | None:
    """``lv`` under coarser ``keys`` (ids ``kid`` of the same events) when the coarsening
    merges no two keys of ``lv`` (one kind per process, one process per device: the common
    case), so the levels are the same; None otherwise."""
    if keys.height != lv.n_keys:
        return None
    return Levels(keys, lv.kid, lv.t, lv.level, lv.seg, kid)


def levels_of(keys: pl.DataFrame, kid: np.ndarray, t: np.ndarray, signed: np.ndarray
              ) -> Levels:
    """`levels` from key ids already known (``keys`` row ``k`` is id ``k``)."""
    if keys.height == 1 and (t.size < 2 or bool((t[1:] >= t[:-1]).all())):
        order = np.arange(t.size)
    elif t.size > 1 and bool((t[1:] >= t[:-1]).all()):  # rows already in time order: a
        # stable sort by key id (radix for 16-bit ids) gives (key, time) order
        order = np.argsort(kid.astype(np.int16) if keys.height < 1 << 15 else kid,
                           kind="stable")
    else:
        order = np.lexsort((t, kid))
    k, ts, s = kid[order], t[order], signed[order]
    total = np.cumsum(s)
    new_key = np.r_[True, k[1:] != k[:-1]]
    starts = np.flatnonzero(new_key)
    before_key = (total - s)[starts]
    level = total - np.repeat(before_key, np.diff(np.r_[starts, k.size]))
    last = np.r_[(k[1:] != k[:-1]) | (ts[1:] != ts[:-1]), True]
    k, ts, level = k[last], ts[last], level[last]
    seg = np.searchsorted(k, np.arange(keys.height + 1), side="left")
    return Levels(keys, k, ts, level, seg, kid)


def binned(lv: Levels, lo: int, width: int, n_bins: int, t_raw: np.ndarray,
           alloc: np.ndarray, nbytes: np.ndarray) -> dict[str, np.ndarray]:
    """Per key and bin (``key * n_bins + bin``, dense): the exact maximum level in the bin
    (``max``), the level at its end (``end``), whether the key has started (``live``), and
    the allocation / free counts and bytes of the raw events (``alloc_bytes`` ...)."""
    size = lv.n_keys * n_bins
    b = np.clip((lv.t - lo) // width, 0, n_bins - 1)
    idx = lv.kid * n_bins + b  # non-decreasing: rows are in (key, time) order
    run = np.flatnonzero(np.r_[True, idx[1:] != idx[:-1]])
    ends = np.r_[run[1:], idx.size] - 1
    has = np.zeros(size, bool)
    has[idx[run]] = True
    mx = np.zeros(size, np.int64)
    mx[idx[run]] = np.maximum.reduceat(lv.level, run)
    last = np.zeros(size, np.int64)
    last[idx[run]] = lv.level[ends]
    pos = np.where(has, np.arange(size) % n_bins, -1).reshape(lv.n_keys, n_bins)
    pos = np.maximum.accumulate(pos, axis=1)
    rows = np.arange(lv.n_keys)[:, None] * n_bins
    end = np.where(pos >= 0, last[np.maximum(pos, 0) + rows], 0)
    carried = np.zeros_like(end)
    carried[:, 1:] = end[:, :-1]  # the level each bin starts with (0 before the first event)
    flat_has = has.reshape(lv.n_keys, n_bins)
    top = np.where(flat_has, np.maximum(mx.reshape(lv.n_keys, n_bins), carried), carried)
    raw_bin = np.clip((t_raw - lo) // width, 0, n_bins - 1)
    raw_idx = lv.kid_raw * n_bins + raw_bin
    return {
        "max": top.ravel(), "end": end.ravel(), "live": (pos >= 0).ravel(),
        "alloc_bytes": _sum(raw_idx, np.where(alloc, nbytes, 0), size),
        "free_bytes": _sum(raw_idx, np.where(alloc, 0, nbytes), size),
        "n_allocs": np.bincount(raw_idx, weights=alloc, minlength=size).astype(np.int64),
        "n_frees": np.bincount(raw_idx, weights=~alloc, minlength=size).astype(np.int64),
    }


def _sum(idx: np.ndarray, values: np.ndarray, size: int) -> np.ndarray:
    """Exact integer sums of ``values`` per ``idx`` (bincount sums in floats)."""
    out = np.zeros(size, np.int64)
    np.add.at(out, idx, values)
    return out


def in_steps(t: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The step (index into the time-sorted ``starts``/``ends``) holding each time, -1 when
    none: steps are half-open and do not overlap."""
    j = np.searchsorted(starts, t, side="right") - 1
    ok = (j >= 0) & (t < ends[np.maximum(j, 0)])
    return np.where(ok, j, -1)
