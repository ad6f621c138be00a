"""The timeline data that report.html embeds: compact, deterministic, JSON-ready.

Times are offsets in ns from the trace's first GPU op (``t0``). Per device there is one lane per
stream (key ``(pid, stream_id)``), a binned overview of each lane (busy share per bin, one byte
per bin, over the whole session span) for the zoomed-out view and the first paint, the
engine-state strip (the share of each op class per bin, from `plots.DeviceTimeline`), and the
longest device gaps with their cause. The raw ops (and the NVTX ranges of the threads that
launched them) go into one deflate-compressed blob of typed columns that the page inflates with
the browser's own ``DecompressionStream``: start times as deltas within a lane, durations, name
and launch-API indexes into one string table, each column in the narrowest unsigned type that
holds it. Past `MAX_RAW_OPS` (or `MAX_NVTX`) the longest rows are kept and the page says so.

Memory: a page is written after the analysis, whose frames are all still held, so what it
needs of ten million ops must cost little more than its own size. The ops are read
`html_encoding.CHUNK` rows at a time, never copied whole (no sort, partition or join of every
op): one pass finds the drawn ops and their lanes, one merges each lane's busy time as the ops
come in start order (loaded frames are), and the cap is a partial selection on the durations
(`html_encoding.longest`), with only the rows of exactly the cap's duration ordered by their
other columns. Only the rows drawn raw are gathered, column by column; names stay dictionary
codes until the string table, and each blob column is deflated as soon as it is made (the
encoding itself is `nsysan.report.html_encoding`).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from nsysan.frames.trace import Trace
from nsysan.passes import op_link
from nsysan.passes.device_blocks import covered_before
from nsysan.report.html_encoding import (
    Blob,
    Strings,
    chunks,
    ints,
    lex_order,
    longest,
    rank,
    share_bytes,
    text_rank,
)
from nsysan.report.plots import DeviceTimeline

N_BINS = 2000  # overview bins per lane, over the whole session span
MAX_RAW_OPS = 1_200_000  # raw GPU ops embedded (longest kept): ~10 MB of page at 1M ops
MAX_NVTX = 300_000  # raw NVTX ranges embedded (longest kept)
MAX_GAPS = 5000  # longest device gaps per device
MAX_NVTX_DEPTH = 12  # deeper ranges are drawn on the last row
#: op_class -> colour class index in the page (see report.js CLASSES)
CLASS_INDEX = {"compute": 0, "nccl": 1, "memcpy_h2d": 2, "memcpy_d2h": 3, "memcpy_d2d": 4,
               "memcpy_p2p": 5, "memset": 6}
OTHER_CLASS = 7


# ---------------------------------------------------------------------------------------------
# GPU ops
# ---------------------------------------------------------------------------------------------
_LANE = ["device_id", "pid", "stream_id"]


class _Lanes:
    """The lanes ``(device, pid, stream)`` of the drawn ops in sorted order (nulls last), and
    each op's position in it, found by arithmetic on the ranks of its three keys."""

    def __init__(self, lanes: pl.DataFrame) -> None:
        self.table = lanes.unique().sort(_LANE, nulls_last=True)
        #: per key column, its distinct values (sorted)
        self.values = [np.unique(self.table[c].drop_nulls().to_numpy()) for c in _LANE]
        pair = self._pair(self.table)
        self.pairs = np.unique(pair)  # the (device, pid) pairs' codes
        self.codes = self._code(self.table, pair)  # each lane's code, ascending

    def _pair(self, df: pl.DataFrame) -> np.ndarray:
        return (rank(self.values[0], df["device_id"]) * (self.values[1].size + 1)
                + rank(self.values[1], df["pid"]))

    def _code(self, df: pl.DataFrame, pair: np.ndarray) -> np.ndarray:
        # (a lane's code is below lanes ** 2: no overflow whatever the ids)
        return (np.searchsorted(self.pairs, pair) * (self.values[2].size + 1)
                + rank(self.values[2], df["stream_id"]))

    def __len__(self) -> int:
        return self.table.height

    def of(self, df: pl.DataFrame) -> np.ndarray:
        """The lane (position in `table`) of each row of ``df`` (``device_id, pid,
        stream_id``); meaningless for a row whose lane is not in the table."""
        if len(self) == 1:
            return np.zeros(df.height, np.int64)
        return np.searchsorted(self.codes, self._code(df, self._pair(df)))


def _keep(f: pl.DataFrame) -> np.ndarray:
    """The ops drawn: timed, on a device, of no negative length."""
    return f.select(((pl.col("start_ns") > 0) & pl.col("device_id").is_not_null()
                     & (pl.col("end_ns") >= pl.col("start_ns"))).fill_null(False)
                    ).to_series().to_numpy()


@dataclass
class _Scan:
    keep: np.ndarray  # per op: drawn
    t0: int
    t1: int
    in_order: bool  # the drawn ops are in start order already (loaded frames are)
    lanes: _Lanes


def _scan(ops: pl.DataFrame) -> _Scan | None:
    """One pass over the ops: which are drawn, their span, their lanes (None: none drawn)."""
    keep = np.zeros(ops.height, bool)
    t0, t1, last, in_order = None, None, None, True
    lanes = []
    for a, b in chunks(ops.height):
        f = ops.slice(a, b - a)
        k = keep[a:b] = _keep(f)
        if not k.any():
            continue
        s, e = ints(f["start_ns"])[k], ints(f["end_ns"])[k]
        t0 = int(s.min()) if t0 is None else min(t0, int(s.min()))
        t1 = int(e.max()) if t1 is None else max(t1, int(e.max()))
        in_order = in_order and (last is None or s[0] >= last) and bool(np.all(s[1:] >= s[:-1]))
        last = int(s[-1])
        f = f.select(_LANE)
        lanes.append((f if k.all() else f.filter(pl.Series(k))).unique())
    if t0 is None or t1 is None:
        return None
    return _Scan(keep, t0, t1, in_order, _Lanes(pl.concat(lanes)))


def _in_start_order(ops: pl.DataFrame, scan: _Scan, api_rows: np.ndarray
                    ) -> Iterator[tuple[pl.DataFrame, np.ndarray]]:
    """The drawn ops in start order, chunk by chunk, with their API rows."""
    cols = ops.select(*_LANE, "start_ns", "end_ns", "op_class")
    if scan.in_order:
        for a, b in chunks(ops.height):
            k = scan.keep[a:b]
            if k.all():
                yield cols.slice(a, b - a), api_rows[a:b]
            elif k.any():
                yield cols.slice(a, b - a).filter(pl.Series(k)), api_rows[a:b][k]
        return
    rows = np.flatnonzero(scan.keep)  # (frames built in memory: sorted here)
    rows = rows[np.argsort(ints(ops["start_ns"])[rows], kind="stable")]
    for a, b in chunks(rows.size):
        yield cols[rows[a:b]], api_rows[rows[a:b]]


@dataclass
class _Cover:
    """A lane's busy time: its ops' union, merged as the ops come in start order; the closed
    blocks are counted into ``before`` (covered length before each bin edge, exact integers)
    and the last block is kept open for the next chunk."""

    before: np.ndarray
    open_s: int | None = None
    open_e: int = 0

    def add(self, s: np.ndarray, e: np.ndarray, edges: np.ndarray) -> None:
        if self.open_s is not None:
            s, e = np.concatenate([[self.open_s], s]), np.concatenate([[self.open_e], e])
        reach = np.maximum.accumulate(e)
        first = np.flatnonzero(np.concatenate([[True], s[1:] > reach[:-1]]))
        b_s, b_e = s[first], np.maximum.reduceat(e, first)
        self.before += covered_before(b_s[:-1], b_e[:-1], edges)
        self.open_s, self.open_e = int(b_s[-1]), int(b_e[-1])

    def share(self, edges: np.ndarray) -> np.ndarray:
        if self.open_s is not None:
            self.before += covered_before(np.array([self.open_s]), np.array([self.open_e]),
                                          edges)
            self.open_s = None
        return np.diff(self.before) / np.maximum(np.diff(edges), 1)


def _class_codes(op_class: pl.Series) -> np.ndarray:
    """The Enum code of each op's class (its physical type: one byte); null: the number of
    classes."""
    codes = op_class.to_physical()
    return (codes.fill_null(len(op_class.dtype.categories)) if codes.null_count()
            else codes).to_numpy()


def _lane_stats(ops: pl.DataFrame, scan: _Scan, edges: np.ndarray, api_rows: np.ndarray,
                n_api: int) -> tuple[np.ndarray, list[_Cover], np.ndarray]:
    """Per lane: its ops per class (lanes x classes + 1, null last) and its busy time; and
    which API calls launched a drawn op."""
    n_cls = len(ops.schema["op_class"].categories) + 1
    counts = np.zeros(len(scan.lanes) * n_cls, np.int64)
    covers = [_Cover(np.zeros(edges.size, np.int64)) for _ in range(len(scan.lanes))]
    launched = np.zeros(n_api, bool)
    small = np.uint16 if len(scan.lanes) <= 1 << 16 else np.int64  # (a radix sort)
    for f, rows in _in_start_order(ops, scan, api_rows):
        lane = scan.lanes.of(f)
        counts += np.bincount(lane * n_cls + _class_codes(f["op_class"]),
                              minlength=counts.size)
        s, e = ints(f["start_ns"]), ints(f["end_ns"])
        by_lane = np.argsort(lane.astype(small), kind="stable")  # start order within a lane
        lane = lane[by_lane]
        cuts = np.concatenate([[0], np.flatnonzero(lane[1:] != lane[:-1]) + 1, [lane.size]])
        for lo, hi in itertools.pairwise(cuts):
            mine = by_lane[lo:hi]
            covers[lane[lo]].add(s[mine], e[mine], edges)
        launched[rows[rows >= 0]] = True
    return counts.reshape(len(scan.lanes), n_cls), covers, launched


def timeline_data(trace: Trace, tables: dict[str, pl.DataFrame],
                  states: list[DeviceTimeline]) -> dict[str, Any]:
    """The page's timeline payload (see the module docstring); ``states`` are the binned
    per-device class shares (`plots.device_timelines`) drawn as the engine-state strip."""
    return with_states(timeline_payload(trace, tables), states)


def with_states(payload: dict[str, Any], states: list[DeviceTimeline]) -> dict[str, Any]:
    """``payload`` (from `timeline_payload`) with each device's engine-state strip and busy
    share from ``states``, in place."""
    state_of = {tl.device_id: tl for tl in states}
    for device in payload["devices"]:
        tl = state_of.get(device["id"])
        if tl is None:
            continue
        device["state"] = {"t0": int(tl.edges[0]) - payload["t0"],
                           "t1": int(tl.edges[-1]) - payload["t0"],
                           "rows": [{"name": n, "share": share_bytes(v)}
                                    for n, v in tl.lanes.items()]}
        device["busy"] = tl.busy_frac
    return payload


def timeline_payload(trace: Trace, tables: dict[str, pl.DataFrame]) -> dict[str, Any]:
    """`timeline_data` without the engine-state strips (`with_states` adds them): everything
    of the page's timeline that the pass results alone decide. Why apart: the strips are
    binned over the window the findings choose, the rest can be built while they are drawn
    (`nsysan.api` overlaps the two)."""
    strings = Strings()
    blob = Blob()
    ops = trace.gpu_ops if trace.has("gpu_ops") else None
    scan = _scan(ops) if ops is not None else None
    if ops is None or scan is None:
        return {"t0": 0, "t1": 1, "devices": [], "nvtx": None, "steps": [], "strings": [],
                "blob": "", "layout": {}, "notes": ["No GPU op to draw."]}
    t0 = scan.t0
    t1 = max(scan.t1, t0 + 1)
    notes = []
    api = trace.cuda_api
    api_rows = op_link.api_rows(trace)
    edges = np.linspace(t0, t1, N_BINS + 1).round().astype(np.int64)
    counts, covers, launched = _lane_stats(ops, scan, edges, api_rows, api.height)
    n_drawn = int(counts.sum())
    drawn = _raw_ops(ops, scan, api, api_rows)
    if drawn.size < n_drawn:
        notes.append(f"Zoomed in, the timeline shows the {drawn.size:,} longest of "
                     f"{n_drawn:,} GPU ops (the overview counts all of them).")
    classes = ops.schema["op_class"].categories.to_list()
    devices = []
    lanes_all = scan.lanes.table
    lane_devices = lanes_all["device_id"].to_numpy()
    for dev in lanes_all["device_id"].unique().sort().to_list():
        mine = lanes_all.with_row_index("_lane").filter(pl.col("device_id") == dev)
        pids = mine["pid"].unique()
        lanes = []
        for g, pid, stream in mine.select("_lane", "pid", "stream_id").iter_rows():
            top = int(np.argmax(counts[g]))  # the most ops; the first class on a tie
            label = (f"pid {pid} stream {stream}" if pids.len() > 1 else f"stream {stream}")
            lanes.append({"pid": pid, "stream": stream, "label": label,
                          "cls": CLASS_INDEX.get(classes[top] if top < len(classes) else None,
                                                 OTHER_CLASS),
                          "n_ops": int(counts[g].sum()),
                          "overview": share_bytes(covers[g].share(edges))})
        # (the state strip and busy share: `with_states`; the keys keep the page's order)
        devices.append({"id": int(dev), "lanes": lanes, "state": None, "busy": None,
                        "gaps": _gaps(tables.get("gaps"), int(dev), t0, strings)})
    del covers
    _pack_ops(ops, drawn, scan.lanes, lane_devices, t0, strings, blob, api, api_rows)
    del drawn
    launchers = api["global_tid"].filter(pl.Series(launched)).drop_nulls().unique()
    nvtx = _nvtx(trace, launchers, t0, strings, blob, notes)
    steps = tables.get("steps")
    step_rows = ([] if steps is None or steps.is_empty() else
                 [[int(s) - t0, int(e) - t0, int(n)] for n, s, e in
                  steps.sort("start_ns", "step").select("step", "start_ns", "end_ns")
                  .drop_nulls().iter_rows()])
    return {"t0": t0, "t1": t1 - t0, "n_bins": N_BINS, "devices": devices, "nvtx": nvtx,
            "steps": step_rows, "strings": strings.values, "blob": blob.encode(),
            "layout": blob.layout, "notes": notes}


def _raw_ops(ops: pl.DataFrame, scan: _Scan, api: pl.DataFrame, api_rows: np.ndarray
             ) -> np.ndarray:
    """The rows of the ops drawn one by one: the `MAX_RAW_OPS` longest, ties broken by
    every column (device, pid, stream, start, end, class, name, launching call and thread;
    row order is no data)."""
    start, end = ops["start_ns"], ops["end_ns"]

    def durations(a: int, b: int) -> np.ndarray:
        d = ints(end.slice(a, b - a)) - ints(start.slice(a, b - a))
        d[~scan.keep[a:b]] = -1
        return d

    def tie_order(rows: np.ndarray) -> np.ndarray:
        tied = ops.select(*_LANE, "start_ns", "end_ns", "op_class", "name")[rows]
        return tied.with_columns(
            op_link.gather(api["name"], api_rows[rows]).alias("api"),
            op_link.gather(api["global_tid"], api_rows[rows]).alias("launch_tid"),
            pl.Series("_row", rows)).sort([*tied.columns, "api", "launch_tid"],
                                          nulls_last=True)["_row"].to_numpy()

    return longest(ops.height, durations, MAX_RAW_OPS, tie_order)[0]


def _pack_ops(ops: pl.DataFrame, rows: np.ndarray, lanes: _Lanes, lane_devices: np.ndarray,
              t0: int, strings: Strings, blob: Blob, api: pl.DataFrame,
              api_rows: np.ndarray) -> None:
    """The ops columns of ``rows``, grouped by device then lane, start-sorted within a lane
    (then by end, name, launching call and class)."""
    lane = np.zeros(rows.size, np.int32)
    keys = ops.select(_LANE)
    for a, b in chunks(rows.size):
        lane[a:b] = lanes.of(keys[rows[a:b]])
    start = ints(ops["start_ns"].gather(rows))
    end = ints(ops["end_ns"].gather(rows))
    name = ops["name"].gather(rows)
    call = op_link.gather(api["name"], api_rows[rows])
    op_class = ops["op_class"].gather(rows)
    order = lex_order([lane, start, end, text_rank(name), text_rank(call),
                       _class_codes(op_class)])
    lane, start, end = lane[order], start[order], end[order]
    # a lane's position among its device's lanes (lanes are sorted by device)
    first_of_device = np.searchsorted(lane_devices, lane_devices)
    dev = lane_devices[lane]
    end -= t0
    start -= t0
    # a lane's first op keeps its absolute offset; the others, the delta to the previous one
    same = np.zeros(start.size, bool)
    if start.size:
        same[1:] = lane[1:] == lane[:-1]
    delta = start.copy()
    delta[1:] = np.where(same[1:], start[1:] - start[:-1], start[1:])
    cls = np.array([CLASS_INDEX.get(c, OTHER_CLASS) for c in
                    [*op_class.dtype.categories.to_list(), None]], np.uint8)
    blob.add("op_device", dev)
    blob.add("op_lane", lane - first_of_device[lane])
    blob.add("op_start", delta)
    del delta
    blob.add("op_dur", end - start)
    blob.add("op_class", cls[_class_codes(op_class.gather(order))])
    blob.add("op_name", strings.index(name.gather(order)))
    blob.add("op_api", strings.index(call.gather(order)))


def _capped(df: pl.DataFrame, cap: int) -> pl.DataFrame:
    """At most ``cap`` rows: the longest, ties broken by every key (row order is no data)."""
    if df.height <= cap:
        return df
    return df.with_columns((pl.col("end_ns") - pl.col("start_ns")).alias("_d")).sort(
        ["_d", *[c for c in df.columns if c != "_d"]], descending=[True] + [False] * df.width,
        nulls_last=True).head(cap).drop("_d")


def _gaps(gaps: pl.DataFrame | None, dev: int, t0: int, strings: Strings) -> list[list]:
    if gaps is None or gaps.is_empty():
        return []
    g = gaps.filter((pl.col("scope") == "device") & (pl.col("device_id") == dev))
    g = _capped(g.select("start_ns", "end_ns", "cause", "cause_detail"), MAX_GAPS).sort(
        ["start_ns", "end_ns", "cause", "cause_detail"], nulls_last=True)
    cause = strings.index(g["cause"])
    detail = strings.index(g["cause_detail"])
    return [[s - t0, e - t0, int(c), int(d)] for (s, e), c, d in
            zip(g.select("start_ns", "end_ns").iter_rows(), cause, detail, strict=True)]


def _nvtx(trace: Trace, launchers: pl.Series, t0: int, strings: Strings, blob: Blob,
          notes: list[str]) -> dict[str, Any] | None:
    """NVTX ranges of the threads that launched GPU ops (``launchers``), one lane per
    thread."""
    if not trace.has("nvtx") or trace.nvtx.is_empty():
        return None
    nvtx = trace.nvtx
    cols = ["start_ns", "end_ns", "global_tid", "pid", "tid", "name", "depth"]
    drawn = (pl.col("end_ns").is_not_null() & (pl.col("end_ns") >= pl.col("start_ns"))
             & (pl.col("end_ns") >= t0) & pl.col("global_tid").is_in(launchers.implode()))
    # a range that began before the first GPU op is drawn from there (offsets are unsigned)
    from_t0 = pl.max_horizontal("start_ns", pl.lit(t0)).alias("start_ns")

    def durations(a: int, b: int) -> np.ndarray:
        f = nvtx.slice(a, b - a)
        k = f.select(drawn.fill_null(False)).to_series().to_numpy()
        d = ints(f["end_ns"]) - np.maximum(ints(f["start_ns"]), t0)
        d[~k] = -1
        return d

    def tie_order(rows: np.ndarray) -> np.ndarray:
        tied = nvtx.select(cols)[rows].with_columns(from_t0, pl.Series("_row", rows))
        return tied.sort(cols, nulls_last=True)["_row"].to_numpy()

    rows, total = longest(nvtx.height, durations, MAX_NVTX, tie_order)
    if total == 0:
        return None
    if rows.size < total:
        notes.append(f"The NVTX lanes show the {rows.size:,} longest of {total:,} ranges.")
    n = nvtx.select(cols)[rows].with_columns(from_t0)
    del rows
    threads = n.select("global_tid", "pid", "tid").unique().sort("global_tid")
    index = {g: i for i, g in enumerate(threads["global_tid"].to_list())}
    n = n[lex_order([ints(n["global_tid"]), ints(n["start_ns"]), ints(n["end_ns"]),
                     text_rank(n["name"]), ints(n["depth"], 1 << 40)])]
    depth = n["depth"].fill_null(0).clip(0, MAX_NVTX_DEPTH).to_numpy()
    thread = n["global_tid"].replace_strict(index, return_dtype=pl.Int64).to_numpy()
    blob.add("nvtx_thread", thread)
    blob.add("nvtx_depth", depth)
    blob.add("nvtx_start", n["start_ns"].to_numpy() - t0)
    blob.add("nvtx_dur", (n["end_ns"] - n["start_ns"]).to_numpy())
    blob.add("nvtx_name", strings.index(n["name"]))
    out = []
    for i, (g, pid, tid) in enumerate(threads.iter_rows()):
        out.append({"pid": pid, "tid": tid, "label": f"pid {pid} tid {tid}",
                    "depth": int(depth[thread == i].max()) + 1, "global_tid": g})
    return {"threads": out, "n": n.height}
