"""Per-device interval streams that several rules and the report pictures need, computed once
per trace and shared.

The unions themselves live in `nsysan.passes.device_blocks` (one sort of the GPU ops serves
the gaps pass, the short-gap classification (`Context.short_gaps`), the exposed-copy rules and
the timeline pictures); this module names the ones the findings use and adds what is built on
them.

`covered_before` is the numpy half of the coverage arithmetic: with sorted disjoint blocks, the
covered length before any instant is a prefix sum found by one binary search, which measures
"how much of X lies under Y" without another union of X and Y together.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from nsysan.frames.intervals import merge_sorted
from nsysan.frames.trace import Trace
from nsysan.passes import device_blocks
from nsysan.passes.device_blocks import covered_before, gaps_between

__all__ = ["busy_blocks", "covered_before", "exposed_ns", "gaps_between", "min_at",
           "starts_inside"]


def busy_blocks(trace: Trace) -> pl.DataFrame:
    """Union of every GPU op with a positive start, per device: ``device_id, start_ns,
    end_ns``, sorted by device then start (the blocks of `intervals.union`; the gaps pass
    built them already, `device_blocks`)."""
    return device_blocks.union(trace)


def starts_inside(df: pl.DataFrame, blocks: pl.DataFrame) -> np.ndarray:
    """For every row of ``df`` (``device_id, start_ns``), whether its start lies inside one of
    the sorted disjoint ``blocks`` of its device (``block start <= start_ns < block end``); a
    null device is inside nothing.

    What a backward as-of join on the block starts by device, then ``start_ns < end``, gives:
    the block found by one binary search per row is the last one starting at or before it
    (a join copies and regroups both frames; on a million short gaps it cost 2-3x more)."""
    out = np.zeros(df.height, bool)
    if df.is_empty() or blocks.is_empty():
        return out
    dev = df["device_id"]
    start = df["start_ns"].to_numpy()
    by_dev = blocks.partition_by("device_id", as_dict=True, maintain_order=True)
    for (d,), b in by_dev.items():  # one iteration per device
        if d is None:
            continue
        rows = (dev == d).fill_null(False).to_numpy()
        every = bool(rows.all())  # (one device: no row to pick out or scatter back)
        t = start if every else start[rows]
        bs, be = b["start_ns"].to_numpy(), b["end_ns"].to_numpy()
        inside = _inside(t, bs, be)
        if every:
            return inside
        out[rows] = inside
    return out


def _inside(t: np.ndarray, bs: np.ndarray, be: np.ndarray) -> np.ndarray:
    """``bs[k] <= t < be[k]`` for some k, for sorted disjoint blocks ``[bs, be)``.

    Few blocks against many sorted instants (the copies of a trace against its short gaps):
    each block finds the range of instants it holds (two binary searches per block) and the
    ranges are marked by a prefix sum. Otherwise one binary search per instant."""
    if bs.size == 0:
        return np.zeros(t.size, bool)
    if 4 * bs.size < t.size and bool((t[1:] >= t[:-1]).all()):
        lo, hi = np.searchsorted(t, bs), np.searchsorted(t, be)
        marks = np.bincount(lo, minlength=t.size + 1) - np.bincount(hi, minlength=t.size + 1)
        return np.cumsum(marks[:t.size]) > 0
    i = np.searchsorted(bs, t, side="right") - 1
    return (i >= 0) & (t < be[np.maximum(i, 0)])


def min_at(keys: pl.Series, at: pl.Series, values: pl.Series) -> pl.Series:
    """For every one of the Int64 ``keys``, the least of the Int64 ``values`` at the rows where
    ``at`` equals it (null when none; null values are ignored, a null key or ``at`` matches
    nothing), in the order of ``keys``: what ``group_by(at).min()`` left-joined on ``keys``
    gives.

    One binary search per row of ``at`` among the sorted keys and an unbuffered minimum
    (``np.minimum.at``), instead of a group-by and a join of hashed keys."""
    ok = (values.is_not_null() & at.is_not_null()).to_numpy()
    a, v = at.fill_null(0).to_numpy()[ok], values.fill_null(0).to_numpy()[ok]
    k = keys.fill_null(0).to_numpy()
    order = np.argsort(k, kind="stable")
    sk = k[order]
    pos = np.searchsorted(sk, a)
    hit = pos < sk.size
    hit[hit] = sk[pos[hit]] == a[hit]
    least = np.full(sk.size, np.iinfo(np.int64).max, np.int64)
    np.minimum.at(least, pos[hit], v[hit])
    found = np.zeros(sk.size, bool)
    found[pos[hit]] = True
    # the search lands on the first of equal keys: the others take its answer
    first = np.searchsorted(sk, sk)
    out, has = np.empty_like(least), np.empty_like(found)
    out[order], has[order] = least[first], found[first]
    has &= keys.is_not_null().to_numpy()
    res = pl.Series(values.name, out, pl.Int64)
    return res.scatter(np.flatnonzero(~has), None) if not has.all() else res


def exposed_ns(trace: Trace, subset: pl.DataFrame) -> int:
    """|∪subset| − |∪subset ∩ ∪compute| per device, summed: the time of ``subset``
    (``device_id, start_ns, end_ns``; rows of positive length) that no compute kernel
    covers (the union of the compute kernels, ``device_blocks.union(trace, ["compute"])``).

    The subset (copies, a few thousand at most) is merged in numpy, device by device, and
    measured against the memoised compute blocks of its device by prefix sums: the fixed
    costs of a polars union and a per-device filter of the compute union were most of it."""
    if subset.is_empty():
        return 0
    x = subset.select("device_id", "start_ns", "end_ns").filter(
        pl.col("end_ns") > pl.col("start_ns"))
    if x.is_empty():
        return 0
    compute = device_blocks.blocks(trace, ["compute"], timed=False)
    total = 0
    for (dev,), rows in x.partition_by("device_id", as_dict=True).items():
        # (starts and ends sorted each on their own: see `intervals.merge_sorted`)
        bs, be = merge_sorted(np.sort(rows["start_ns"].to_numpy()),
                              np.sort(rows["end_ns"].to_numpy()))
        total += int((be - bs).sum())
        if dev is None:  # (a null device meets no compute block)
            continue
        cs, ce = compute.of(dev)
        under = covered_before(cs, ce, np.concatenate([be, bs]))  # (one prefix sum for both)
        total -= int(under[:be.size].sum() - under[be.size:].sum())
    return total
