"""Per-device interval streams that several rules and the report pictures need, computed once
per trace and shared.

On a 1M-kernel trace one union of all GPU ops costs a few hundred milliseconds; the short-gap
classification (`Context.short_gaps`) and the timeline pictures (`nsysan.report.plots`) both
need the same union of busy time, and the exposed-copy rules need the union of compute
kernels more than once. They are memoised here per `Trace` (weakly, so a dropped trace frees
them) and per ``gpu_ops`` frame object (so a frame replaced after the fact is never served a
stale union).

`covered_before` is the numpy half of the coverage arithmetic: with sorted disjoint blocks, the
covered length before any instant is a prefix sum found by one binary search, which measures
"how much of X lies under Y" without another union of X and Y together.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import numpy as np
import polars as pl

from nsysan.frames import intervals
from nsysan.frames.trace import Trace

#: trace -> stream name -> (the gpu_ops frame it was computed from, the stream)
_MEMO: weakref.WeakKeyDictionary[Trace, dict[str, tuple[pl.DataFrame, pl.DataFrame]]] = (
    weakref.WeakKeyDictionary())


def _memo(trace: Trace, name: str, build: Callable[[pl.DataFrame], pl.DataFrame]) -> pl.DataFrame:
    ops = trace.frame("gpu_ops")
    slot = _MEMO.setdefault(trace, {})
    hit = slot.get(name)
    if hit is not None and hit[0] is ops:
        return hit[1]
    out = build(ops)
    slot[name] = (ops, out)
    return out


def forget(trace: Trace) -> None:
    """Drop the streams of ``trace`` (up to 48 bytes per GPU op) once its reports are written."""
    _MEMO.pop(trace, None)


def busy_blocks(trace: Trace) -> pl.DataFrame:
    """Union of every GPU op with a positive start, per device: ``device_id, start_ns,
    end_ns``, sorted by device then start (the blocks of `intervals.union`)."""
    return _memo(trace, "busy", lambda ops: intervals.union(
        ops.lazy().filter(pl.col("start_ns") > 0), by=["device_id"]).collect())


def compute_blocks(trace: Trace) -> pl.DataFrame:
    """Union of the compute kernels (``op_class == "compute"``) per device, sorted."""
    return _memo(trace, "compute", lambda ops: intervals.union(
        ops.lazy().filter(pl.col("op_class") == "compute"), by=["device_id"]).collect())


def gaps_between(blocks: pl.DataFrame) -> pl.DataFrame:
    """The complement of sorted disjoint ``blocks`` inside each device's span (what
    `intervals.complement` returns for the intervals the blocks are the union of), without
    sorting the blocks again."""
    same = pl.col("device_id").eq_missing(pl.col("device_id").shift(1))
    return blocks.select(
        pl.col("device_id").filter(same),
        pl.col("end_ns").shift(1).filter(same).alias("start_ns"),
        pl.col("start_ns").filter(same).alias("end_ns"),
    )


def covered_before(starts: np.ndarray, ends: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Length of the sorted disjoint intervals ``[starts, ends)`` that lies before each
    instant of ``t`` (Int64 ns)."""
    if starts.size == 0:
        return np.zeros(t.shape, dtype=np.int64)
    lengths = ends - starts
    cum = np.concatenate([[0], np.cumsum(lengths)])
    idx = np.searchsorted(starts, t, side="right") - 1
    i = np.clip(idx, 0, None)
    return np.where(idx >= 0, cum[i] + np.minimum(t - starts[i], lengths[i]), 0)


def uncovered_ns(blocks: pl.DataFrame, cover: pl.DataFrame) -> int:
    """Total length of sorted disjoint ``blocks`` not under sorted disjoint ``cover`` (both
    ``device_id, start_ns, end_ns``), matched per device; a null device matches nothing."""
    total = 0
    for (dev,), b in blocks.group_by(["device_id"]):  # one iteration per device
        s, e = b["start_ns"].to_numpy(), b["end_ns"].to_numpy()
        total += int((e - s).sum())
        if dev is None:
            continue
        c = cover.filter(pl.col("device_id") == dev)
        cs, ce = c["start_ns"].to_numpy(), c["end_ns"].to_numpy()
        total -= int((covered_before(cs, ce, e) - covered_before(cs, ce, s)).sum())
    return total
