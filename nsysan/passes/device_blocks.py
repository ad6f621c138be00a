"""Per-device unions of GPU ops, all cut from one sorted stream of the ops.

The gaps pass (device idle time), the nccl pass (compute under each collective), the findings
(short gaps, exposed copies) and the timeline pictures (one lane per op class) each need the
union per device of some of the GPU ops: all of them, the compute kernels, one op class. Each
union used to sort its ops again (a sort of a million rows each). Here the ops are sorted once
by one packed ``(device, start)`` key (`nsysan.frames.packed_keys.Keys`); a subset of a sorted
stream is still sorted, so every union is then a boolean mask and a running maximum (numpy),
no sort. The stream (with the unions asked for) is the product `SORTED_OPS` of the analysis
(`nsysan.frames.context`): built once per ``gpu_ops`` frame object (a frame replaced after the
fact is never served a stale union) and freed when the analysis ends, after the reports.

The unions are exactly `intervals.union(ops, by=["device_id"])` of the selected ops: blocks
``device_id, start_ns, end_ns`` sorted by device (nulls first) then start, merged when they
overlap or touch; ops of zero or negative length cover nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Collection
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from nsysan.frames.context import Product, product
from nsysan.frames.intervals import merge_sorted
from nsysan.frames.packed_keys import GROUP, Keys
from nsysan.frames.schemas import OVERLAP_CLASS_OF_OP_CLASS
from nsysan.frames.trace import Trace

#: op_class values with a code of their own; any other value (or null) gets code len(...)
OP_CLASSES = tuple(OVERLAP_CLASS_OF_OP_CLASS)
#: stands for "an op_class not in OP_CLASSES (or null)" in a `union` selection
OTHER = None


@dataclass
class _Stream:
    """The ops with ``end_ns > start_ns``, sorted by packed (device, start)."""

    keys: Keys
    start: np.ndarray  # packed start keys, ascending
    end: np.ndarray  # packed end keys of the same rows
    code: np.ndarray  # index of the row's op_class in OP_CLASSES, len(OP_CLASSES) if none
    timed: np.ndarray  # start_ns > 0 (nsys writes 0 for ops it could not time)
    untimed_codes: frozenset[int]  # the codes of the ops that are not timed
    unions: dict[tuple[frozenset[int], bool], Blocks] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)  # (passes run in threads)


def _stream(trace: Trace) -> _Stream:
    return product(trace, SORTED_OPS)


def _sorted(ops: pl.DataFrame) -> _Stream:
    codes = {c: i for i, c in enumerate(OP_CLASSES)}
    x = ops.select(
        "device_id", "start_ns", "end_ns",
        pl.col("op_class").replace_strict(codes, default=len(OP_CLASSES),
                                          return_dtype=pl.Int8).alias("_c"),
    ).filter(pl.col("end_ns") > pl.col("start_ns"))
    keys = Keys([x], ["device_id"], ["start_ns", "end_ns"])
    # One sort of the packed start key (a single Int64 column), skipped when the ops come in
    # (device, start) order already (a one-device trace in time order); ties need no order:
    # a union does not depend on it.
    s = pl.DataFrame([keys.pack(0, "start_ns").alias("s"), keys.pack(0, "end_ns").alias("e"),
                      x["_c"], (x["start_ns"] > 0).alias("t")])
    if not s["s"].is_sorted():
        s = s.sort("s")
    code, timed = s["_c"].to_numpy(), s["t"].to_numpy()
    # (the stream is kept until the reports are written: its keys let go of ``x``, ~25
    # bytes per op, and of its group codes)
    return _Stream(keys.forget_rows(), s["s"].to_numpy(), s["e"].to_numpy(), code, timed,
                   frozenset(np.unique(code[~timed]).tolist()))


#: the GPU ops sorted by (device, start) and the unions made of them (~25 bytes per op)
SORTED_OPS: Product[_Stream] = Product(
    "device_blocks.sorted_ops", ("gpu_ops",), lambda trace: _sorted(trace.frame("gpu_ops")),
    "the GPU ops of positive length sorted by packed (device, start), with their unions")


def _codes(op_classes: Collection[str | None] | None) -> frozenset[int]:
    if op_classes is None:
        return frozenset(range(len(OP_CLASSES) + 1))
    return frozenset(OP_CLASSES.index(c) if c in OP_CLASSES else len(OP_CLASSES)
                     for c in op_classes)


@dataclass
class Blocks:
    """The blocks of one union, device by device: those of ``devices[i]`` are rows
    ``bounds[i]:bounds[i + 1]`` of ``start`` / ``end`` (times, sorted)."""

    devices: pl.Series
    bounds: np.ndarray
    start: pl.Series
    end: pl.Series

    def frame(self) -> pl.DataFrame:
        """``device_id, start_ns, end_ns``, as `intervals.union` gives. Built at each call,
        not kept with the blocks (which live until the reports are written): a device id
        per block is 8 bytes per op, and the few callers each take it once."""
        run = np.repeat(np.arange(self.devices.len()), np.diff(self.bounds))
        return pl.DataFrame([self.devices.gather(run), self.start, self.end])

    def of(self, device: int | None) -> tuple[np.ndarray, np.ndarray]:
        """Starts and ends of the blocks of ``device`` (empty when it has none)."""
        for i, d in enumerate(self.devices.to_list()):  # one iteration per device
            if d == device:
                lo, hi = int(self.bounds[i]), int(self.bounds[i + 1])
                return self.start[lo:hi].to_numpy(), self.end[lo:hi].to_numpy()
        return np.zeros(0, np.int64), np.zeros(0, np.int64)


def union(trace: Trace, op_classes: Collection[str | None] | None = None,
          timed: bool = True, keep: bool = True) -> pl.DataFrame:
    """Union per device of the GPU ops whose ``op_class`` is in ``op_classes`` (None: every
    op; `OTHER` stands for any other value, null included), only those with ``start_ns > 0``
    when ``timed``: ``device_id, start_ns, end_ns``, sorted, as `intervals.union` gives.

    Memoised with the stream unless ``keep`` is false (a union read once: its blocks, up to
    one per op, are not held until the reports are written)."""
    return blocks(trace, op_classes, timed, keep).frame()


def blocks(trace: Trace, op_classes: Collection[str | None] | None = None,
           timed: bool = True, keep: bool = True) -> Blocks:
    """`union` device by device, without building its frame (the pictures read the blocks
    of each device as arrays)."""
    st = _stream(trace)
    codes = _codes(op_classes)
    # no untimed op selected: the same union as the timed one (known from the codes, so
    # that a union already made is found without a pass over the ops)
    timed = timed or not codes & st.untimed_codes
    with st.lock:
        out = st.unions.get((codes, timed))
        if out is None:
            mask = (np.isin(st.code, np.fromiter(codes, np.int8)) if codes != _codes(None)
                    else None)
            if timed:
                mask = st.timed if mask is None else mask & st.timed
            elif mask is None:
                mask = np.ones(st.start.size, bool)
            out = _blocks(st, st.start[mask], st.end[mask])
            if keep:
                st.unions[(codes, timed)] = out
    return out


def _blocks(st: _Stream, s: np.ndarray, e: np.ndarray) -> Blocks:
    """Blocks of sorted packed intervals (`intervals.merge_sorted` on the running max of the
    ends, which never carries over from an earlier device: every key of an earlier device is
    smaller than any key of a later one)."""
    bs, be = merge_sorted(s, np.maximum.accumulate(e))
    # Blocks come device by device: only the few device codes are decoded to device ids,
    # not one per block; times decode arithmetically.
    g = bs // st.keys.span
    bounds = (np.concatenate([[0], np.flatnonzero(np.diff(g)) + 1, [g.size]]).astype(np.int64)
              if g.size else np.zeros(1, np.int64))
    devices = st.keys.attach_by(pl.DataFrame({GROUP: g[bounds[:-1]]},
                                             schema={GROUP: pl.Int64}))["device_id"]
    times = pl.DataFrame({"s": bs, "e": be, GROUP: g},
                         schema={"s": pl.Int64, "e": pl.Int64, GROUP: pl.Int64}).select(
        st.keys.time(pl.col("s"), pl.col(GROUP)).alias("start_ns"),
        st.keys.time(pl.col("e"), pl.col(GROUP)).alias("end_ns"))
    return Blocks(devices, bounds, times["start_ns"], times["end_ns"])


def gaps_between(blocks: pl.DataFrame) -> pl.DataFrame:
    """The complement of sorted disjoint ``blocks`` inside each device's span (what
    `intervals.complement` returns for the intervals the blocks are the union of), without
    sorting the blocks again."""
    # (the first row has no predecessor, also when its device is null)
    same = (pl.col("device_id").eq_missing(pl.col("device_id").shift(1))
            & (pl.int_range(pl.len()) > 0))
    return blocks.select(
        pl.col("device_id").filter(same),
        pl.col("end_ns").shift(1).filter(same).alias("start_ns"),
        pl.col("start_ns").filter(same).alias("end_ns"),
    )


def covered(blocks: pl.DataFrame, df: pl.DataFrame) -> pl.Series:
    """``covered_ns``: for every row of ``df`` (``device_id, start_ns, end_ns``), the length
    of its intersection with the sorted disjoint ``blocks`` of its device (a null device
    meets the null device's blocks), 0 for rows of no positive length: what
    `intervals.covered` gives against the ops the blocks are the union of."""
    out = np.zeros(df.height, np.int64)
    dev = df["device_id"]
    for d in dev.unique().to_list():  # one iteration per device
        rows = (dev.is_null() if d is None else (dev == d).fill_null(False)).to_numpy()
        b = blocks.filter(pl.col("device_id").is_null() if d is None
                          else pl.col("device_id") == d)
        s, e = df["start_ns"].to_numpy()[rows], df["end_ns"].to_numpy()[rows]
        bs, be = b["start_ns"].to_numpy(), b["end_ns"].to_numpy()
        # Both bounds in one search, so the device's prefix sum (blocks can be a million) is
        # built once.
        under = covered_before(bs, be, np.concatenate([e, s]))
        out[rows] = np.where(e > s, under[:e.size] - under[e.size:], 0)
    return pl.Series("covered_ns", out)


def covered_before(starts: np.ndarray, ends: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Length of the sorted disjoint intervals ``[starts, ends)`` that lies before each
    instant of ``t`` (Int64 ns): a prefix sum found by one binary search."""
    if starts.size == 0:
        return np.zeros(t.shape, dtype=np.int64)
    lengths = ends - starts
    cum = np.concatenate([[0], np.cumsum(lengths)])
    idx = np.searchsorted(starts, t, side="right") - 1
    i = np.clip(idx, 0, None)
    return np.where(idx >= 0, cum[i] + np.minimum(t - starts[i], lengths[i]), 0)
