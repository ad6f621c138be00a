"""The payload of report.html's timeline as `nsysan.report.html_data` computed it before issue
21 ("ten million kernels in 4 GiB"): polars over every GPU op (a filtered copy, a sort of all
of them by every column for the cap, a partition per lane, joins for the string table). It is
the definition the bounded-memory passes of `html_data` are checked against
(tests/test_report_html_data_fast.py); the caps and bin counts are read from `html_data`, so a
test that lowers them lowers them for both.
"""

from __future__ import annotations

import base64
import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from nsysan.frames.trace import Trace
from nsysan.passes import op_link
from nsysan.report import html_data as hd
from nsysan.report.plots import DeviceTimeline


@dataclass
class _Blob:
    """Typed columns appended one after the other (8-byte aligned), described by `layout`."""

    parts: list[bytes] = field(default_factory=list)
    layout: dict[str, dict[str, Any]] = field(default_factory=dict)
    size: int = 0

    def add(self, name: str, values: np.ndarray) -> None:
        values = np.asarray(values)
        top = int(values.max()) if values.size else 0
        if values.size and int(values.min()) < 0:
            raise ValueError(f"{name}: negative values cannot be packed")
        dtype = next((t for t in (np.uint8, np.uint16, np.uint32) if top <= np.iinfo(t).max),
                     np.float64)
        raw = np.ascontiguousarray(values.astype("<" + np.dtype(dtype).str[1:])).tobytes()
        self.layout[name] = {"type": np.dtype(dtype).name, "offset": self.size,
                             "length": int(values.size)}
        pad = (-len(raw)) % 8
        self.parts.append(raw + b"\0" * pad)
        self.size += len(raw) + pad

    def encode(self) -> str:
        # level 1: deterministic for the same bytes; on the 1M-kernel trace 0.46 s for 6.0 MB
        # where level 6 takes 1.5 s for 5.4 MB
        return base64.b64encode(zlib.compress(b"".join(self.parts), 1)).decode("ascii")


class _Strings:
    """A string table: each distinct name once, in the order of first use (deterministic
    because every caller adds names in a sorted order)."""

    def __init__(self) -> None:
        self.values: list[str] = []
        self._index: dict[str, int] = {}

    def index(self, names: pl.Series) -> np.ndarray:
        """The table index of each of ``names`` (null -> the empty string). Categorical
        names stay codes: only the distinct ones become text."""
        encoded = isinstance(names.dtype, (pl.Categorical, pl.Enum))
        s = (names.cast(pl.Categorical) if encoded else names.cast(pl.String)).fill_null("")
        uniq = s.unique(maintain_order=True).to_list()
        for u in uniq:
            if u not in self._index:
                self._index[u] = len(self.values)
                self.values.append(u)
        mapping = pl.DataFrame({"_n": uniq, "_i": [self._index[u] for u in uniq]},
                               schema={"_n": pl.String, "_i": pl.UInt32}
                               ).with_columns(pl.col("_n").cast(s.dtype))
        return (pl.DataFrame({"_n": s}).join(mapping, on="_n", how="left",
                                             maintain_order="left")["_i"].to_numpy())


def _b64(a: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(a, dtype=np.uint8).tobytes()).decode("ascii")


def _share_bytes(share: np.ndarray) -> str:
    """Shares in [0, 1] as one byte each (0..255), base64."""
    return _b64(np.clip(np.rint(np.nan_to_num(share) * 255), 0, 255).astype(np.uint8))


def _lane_coverage(starts: np.ndarray, ends: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Share of each bin covered by the union of the (start-sorted) intervals."""
    if starts.size == 0:
        return np.zeros(edges.size - 1)
    reach = np.maximum.accumulate(ends)
    new = np.concatenate([[True], starts[1:] > reach[:-1]])
    first = np.flatnonzero(new)
    b_s = starts[first]
    b_e = np.maximum.reduceat(ends, first)
    cum = np.concatenate([[0], np.cumsum(b_e - b_s)])
    i = np.searchsorted(b_s, edges, side="right") - 1
    ic = np.clip(i, 0, None)
    before = np.where(i >= 0, cum[ic] + np.minimum(edges, b_e[ic]) - b_s[ic], 0)
    return np.diff(before) / np.maximum(np.diff(edges), 1)


def _ops_frame(trace: Trace) -> pl.DataFrame:
    """The GPU ops to draw: device, lane key, times, class, name and launching API call."""
    ops = trace.gpu_ops
    rows = op_link.api_rows(trace)
    cols = [pl.col("device_id"), pl.col("pid"), pl.col("stream_id"), pl.col("start_ns"),
            pl.col("end_ns"), pl.col("op_class"), pl.col("name")]
    df = ops.select(cols)
    if rows is not None:
        api = trace.cuda_api
        df = df.with_columns(op_link.gather(api["name"], rows).alias("api"),
                             op_link.gather(api["global_tid"], rows).alias("launch_tid"))
    else:
        df = df.with_columns(pl.lit(None, pl.String).alias("api"),
                             pl.lit(None, pl.Int64).alias("launch_tid"))
    return df.filter(pl.col("start_ns") > 0, pl.col("device_id").is_not_null(),
                     pl.col("end_ns") >= pl.col("start_ns"))


def _capped(df: pl.DataFrame, cap: int) -> pl.DataFrame:
    """At most ``cap`` rows: the longest, ties broken by every key (row order is no data)."""
    if df.height <= cap:
        return df
    return df.with_columns((pl.col("end_ns") - pl.col("start_ns")).alias("_d")).sort(
        ["_d", *[c for c in df.columns if c != "_d"]], descending=[True] + [False] * df.width,
        nulls_last=True).head(cap).drop("_d")


def timeline_data(trace: Trace, tables: dict[str, pl.DataFrame],
                  states: list[DeviceTimeline]) -> dict[str, Any]:
    """The page's timeline payload (see the module docstring); ``states`` are the binned
    per-device class shares (`plots.device_timelines`) drawn as the engine-state strip."""
    strings = _Strings()
    blob = _Blob()
    all_ops = _ops_frame(trace) if trace.has("gpu_ops") else pl.DataFrame()
    if all_ops.is_empty():
        return {"t0": 0, "t1": 1, "devices": [], "nvtx": None, "steps": [], "strings": [],
                "blob": "", "layout": {}, "notes": ["No GPU op to draw."]}
    t0 = int(all_ops["start_ns"].min())
    t1 = int(all_ops["end_ns"].max())
    t1 = max(t1, t0 + 1)
    notes = []
    ops = _capped(all_ops, hd.MAX_RAW_OPS)
    if ops.height < all_ops.height:
        notes.append(f"Zoomed in, the timeline shows the {ops.height:,} longest of "
                     f"{all_ops.height:,} GPU ops (the overview counts all of them).")
    ops = ops.sort(["device_id", "pid", "stream_id", "start_ns", "end_ns", "name", "api",
                    "op_class"], nulls_last=True)
    edges = np.linspace(t0, t1, hd.N_BINS + 1).round().astype(np.int64)
    state_of = {tl.device_id: tl for tl in states}
    devices = []
    lanes_all = all_ops.select("device_id", "pid", "stream_id").unique().sort(
        ["device_id", "pid", "stream_id"], nulls_last=True)
    lane_ids: dict[tuple, int] = {}
    dev_list = lanes_all["device_id"].unique().sort().to_list()
    by_lane = all_ops.select("device_id", "pid", "stream_id", "start_ns", "end_ns",
                             "op_class").partition_by(["device_id", "pid", "stream_id"],
                                                      as_dict=True)
    for dev in dev_list:
        mine = lanes_all.filter(pl.col("device_id") == dev)
        pids = mine["pid"].unique()
        lanes = []
        for pid, stream in mine.select("pid", "stream_id").iter_rows():
            lane_ids[(dev, pid, stream)] = len(lanes)
            of_lane = by_lane[(dev, pid, stream)].sort(["start_ns", "end_ns"])
            classes = of_lane["op_class"].value_counts().sort(
                ["count", "op_class"], descending=[True, False], nulls_last=True)
            label = (f"pid {pid} stream {stream}" if pids.len() > 1 else f"stream {stream}")
            lanes.append({"pid": pid, "stream": stream, "label": label,
                          "cls": hd.CLASS_INDEX.get(classes["op_class"][0], hd.OTHER_CLASS),
                          "n_ops": of_lane.height,
                          "overview": _share_bytes(_lane_coverage(
                              of_lane["start_ns"].to_numpy(), of_lane["end_ns"].to_numpy(),
                              edges))})
        tl = state_of.get(int(dev))
        state = None
        if tl is not None:
            state = {"t0": int(tl.edges[0]) - t0, "t1": int(tl.edges[-1]) - t0,
                     "rows": [{"name": n, "share": _share_bytes(v)}
                              for n, v in tl.lanes.items()]}
        devices.append({"id": int(dev), "lanes": lanes, "state": state,
                        "busy": None if tl is None else tl.busy_frac,
                        "gaps": _gaps(tables.get("gaps"), int(dev), t0, strings)})
    _pack_ops(ops, lane_ids, t0, strings, blob)
    nvtx = _nvtx(trace, all_ops, t0, strings, blob, notes)
    steps = tables.get("steps")
    step_rows = ([] if steps is None or steps.is_empty() else
                 [[int(s) - t0, int(e) - t0, int(n)] for n, s, e in
                  steps.sort("start_ns", "step").select("step", "start_ns", "end_ns")
                  .drop_nulls().iter_rows()])
    return {"t0": t0, "t1": t1 - t0, "n_bins": hd.N_BINS, "devices": devices, "nvtx": nvtx,
            "steps": step_rows, "strings": strings.values, "blob": blob.encode(),
            "layout": blob.layout, "notes": notes}


def _gaps(gaps: pl.DataFrame | None, dev: int, t0: int, strings: _Strings) -> list[list]:
    if gaps is None or gaps.is_empty():
        return []
    g = gaps.filter((pl.col("scope") == "device") & (pl.col("device_id") == dev))
    g = _capped(g.select("start_ns", "end_ns", "cause", "cause_detail"), hd.MAX_GAPS).sort(
        ["start_ns", "end_ns", "cause", "cause_detail"], nulls_last=True)
    cause = strings.index(g["cause"])
    detail = strings.index(g["cause_detail"])
    return [[s - t0, e - t0, int(c), int(d)] for (s, e), c, d in
            zip(g.select("start_ns", "end_ns").iter_rows(), cause, detail, strict=True)]


def _pack_ops(ops: pl.DataFrame, lane_ids: dict[tuple, int], t0: int, strings: _Strings,
              blob: _Blob) -> None:
    """The ops columns, grouped by device then lane, start-sorted within a lane."""
    ids = pl.DataFrame([(d, p, st, i) for (d, p, st), i in lane_ids.items()],
                       schema={"device_id": ops.schema["device_id"], "pid": ops.schema["pid"],
                               "stream_id": ops.schema["stream_id"], "_lane": pl.Int64},
                       orient="row")
    lane = ops.select("device_id", "pid", "stream_id").join(
        ids, on=["device_id", "pid", "stream_id"], how="left", nulls_equal=True,
        maintain_order="left")["_lane"].to_numpy()
    dev = ops["device_id"].to_numpy()
    start = ops["start_ns"].to_numpy() - t0
    # a lane's first op keeps its absolute offset; the others, the delta to the previous one
    same = np.zeros(start.size, bool)
    if start.size:
        same[1:] = (dev[1:] == dev[:-1]) & (lane[1:] == lane[:-1])
    delta = start.copy()
    delta[1:] = np.where(same[1:], start[1:] - start[:-1], start[1:])
    cls = ops["op_class"].replace_strict(hd.CLASS_INDEX, default=hd.OTHER_CLASS,
                                         return_dtype=pl.UInt8).to_numpy()
    blob.add("op_device", dev.astype(np.int64))
    blob.add("op_lane", lane)
    blob.add("op_start", delta)
    blob.add("op_dur", (ops["end_ns"] - ops["start_ns"]).to_numpy())
    blob.add("op_class", cls)
    blob.add("op_name", strings.index(ops["name"]))
    blob.add("op_api", strings.index(ops["api"]))


def _nvtx(trace: Trace, ops: pl.DataFrame, t0: int, strings: _Strings, blob: _Blob,
          notes: list[str]) -> dict[str, Any] | None:
    """NVTX ranges of the threads that launched GPU ops, one lane per thread."""
    if not trace.has("nvtx") or trace.nvtx.is_empty():
        return None
    launchers = ops["launch_tid"].drop_nulls().unique()
    n = trace.nvtx.select("start_ns", "end_ns", "global_tid", "pid", "tid", "name", "depth")
    n = n.filter(pl.col("end_ns").is_not_null() & (pl.col("end_ns") >= pl.col("start_ns"))
                 & (pl.col("end_ns") >= t0) & pl.col("global_tid").is_in(launchers.implode()))
    # a range that began before the first GPU op is drawn from there (offsets are unsigned)
    n = n.with_columns(pl.max_horizontal("start_ns", pl.lit(t0)).alias("start_ns"))
    if n.is_empty():
        return None
    total = n.height
    n = _capped(n, hd.MAX_NVTX)
    if n.height < total:
        notes.append(f"The NVTX lanes show the {n.height:,} longest of {total:,} ranges.")
    threads = n.select("global_tid", "pid", "tid").unique().sort("global_tid")
    index = {g: i for i, g in enumerate(threads["global_tid"].to_list())}
    n = n.sort(["global_tid", "start_ns", "end_ns", "name", "depth"], nulls_last=True)
    depth = n["depth"].fill_null(0).clip(0, hd.MAX_NVTX_DEPTH).to_numpy()
    thread = n["global_tid"].replace_strict(index, return_dtype=pl.Int64).to_numpy()
    blob.add("nvtx_thread", thread)
    blob.add("nvtx_depth", depth)
    blob.add("nvtx_start", n["start_ns"].to_numpy() - t0)
    blob.add("nvtx_dur", (n["end_ns"] - n["start_ns"]).to_numpy())
    blob.add("nvtx_name", strings.index(n["name"]))
    rows = []
    for i, (g, pid, tid) in enumerate(threads.iter_rows()):
        rows.append({"pid": pid, "tid": tid, "label": f"pid {pid} tid {tid}",
                     "depth": int(depth[thread == i].max()) + 1, "global_tid": g})
    return {"threads": rows, "n": n.height}
