"""``trace.pftrace``: the analysed timeline, annotated, for the Perfetto UI (ui.perfetto.dev).

Written with the protobuf classes of the PyPI ``perfetto`` package (the optional extra
``nsysan[perfetto]``): Perfetto's own trace format (``TrackDescriptor`` + ``TrackEvent``
packets) opens in ui.perfetto.dev and in a local Perfetto UI. Tracks:

- ``GPU <device>`` with one child track per stream (``stream <id>``, ``pid <p> stream <id>``
  when several processes share the device): every GPU op as a slice named by the op, its class
  as the category;
- ``GPU <device> busy``: a counter, the share of each time bin in which any op runs;
- ``NVTX pid <p> tid <t>``: the NVTX ranges of each thread, nested as on the thread;
- ``nsysan findings``: ``gaps device <d>`` (each gap of the gaps pass, named by its cause) and
  ``finding windows`` (each evidence window of each finding, named
  ``[SEVERITY] CODE: label``); ``steps``: one slice per step.

A track holds properly nested slices only; slices that overlap without nesting (two ops of
one stream whose times overlap, windows of several findings) go onto a sibling track named
like it with `` (2)``, `` (3)``... so nothing is lost or mis-nested. Event names are interned
(written once per name), so a million ops cost about 20 bytes each.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from nsysan.errors import ConfigError
from nsysan.frames.trace import Trace
from nsysan.report.atomic import atomic_write

PERFETTO_TRACE = "trace.pftrace"
_SEQ = 1  # trusted_packet_sequence_id of every packet (one writer)
_BATCH = 20_000  # packets serialised per Trace message (concatenated messages merge)


def require() -> Any:
    """The ``perfetto_trace_pb2`` module, or a `ConfigError` that says how to install it."""
    try:
        from perfetto.protos.perfetto.trace import perfetto_trace_pb2
    except ImportError:
        raise ConfigError("writing a Perfetto trace needs the perfetto package: "
                          "pip install 'nsysan[perfetto]'") from None
    return perfetto_trace_pb2


class _Writer:
    """Packets in order, names interned, serialised in batches."""

    def __init__(self, pb: Any) -> None:
        self.pb = pb
        self.chunks: list[bytes] = []
        self.batch = pb.Trace()
        self.names: dict[str, int] = {}
        self.next_uuid = 1
        self.first = True

    def packet(self) -> Any:
        if len(self.batch.packet) >= _BATCH:  # (before the new one: it is filled in after)
            self.flush()
        p = self.batch.packet.add()
        p.trusted_packet_sequence_id = _SEQ
        if self.first:
            p.sequence_flags = self.pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
            self.first = False
        return p

    def flush(self) -> None:
        if len(self.batch.packet):
            self.chunks.append(self.batch.SerializeToString())
            self.batch = self.pb.Trace()

    def track(self, name: str, parent: int | None = None, rank: int = 0,
              counter: bool = False) -> int:
        uuid = self.next_uuid
        self.next_uuid += 1
        d = self.packet().track_descriptor
        d.uuid = uuid
        d.name = name
        d.child_ordering = self.pb.TrackDescriptor.EXPLICIT
        d.sibling_order_rank = rank
        if parent is not None:
            d.parent_uuid = parent
        if counter:
            d.counter.SetInParent()
        return uuid

    def name_iid(self, p: Any, name: str) -> int:
        iid = self.names.get(name)
        if iid is None:
            iid = self.names[name] = len(self.names) + 1
            e = p.interned_data.event_names.add()
            e.iid, e.name = iid, name
        return iid

    def slices(self, track_name: str, parent: int | None, rank: int,
               starts: np.ndarray, ends: np.ndarray, names: Sequence[str],
               categories: Sequence[str] | None = None) -> list[int]:
        """The intervals as slices on a track (and overflow siblings where they overlap
        without nesting); returns the uuids of the tracks used."""
        order = np.lexsort((-ends, starts))
        layers: list[list[int]] = []  # per track: the ends of the open slices (a stack)
        layer_of = np.empty(starts.size, np.int64)
        for i in order.tolist():  # one pass: assign each slice the first track it nests on
            s, e = int(starts[i]), int(ends[i])
            for k, stack in enumerate(layers):
                while stack and stack[-1] <= s:
                    stack.pop()
                if not stack or e <= stack[-1]:
                    stack.append(e)
                    layer_of[i] = k
                    break
            else:
                layers.append([e])
                layer_of[i] = len(layers) - 1
        uuids = [self.track(track_name if k == 0 else f"{track_name} ({k + 1})", parent,
                            rank * 100 + k) for k in range(max(len(layers), 1))]
        # Events in time order. At one instant: ends (inner first: later start, then the
        # later of two equal slices), then begins (outer first: later end, then the earlier),
        # then the ends of zero-length slices (after their own begin).
        n = starts.size
        ev_t = np.concatenate([starts, ends])
        zero = ends == starts
        ev_kind = np.concatenate([np.ones(n, np.int8), np.where(zero, 2, 0).astype(np.int8)])
        idx = np.concatenate([np.arange(n), np.arange(n)])
        tie = np.concatenate([-ends, -starts])
        tie2 = np.concatenate([np.arange(n), -np.arange(n)])
        seq = np.lexsort((tie2, tie, ev_kind, ev_t))
        slice_begin = self.pb.TrackEvent.TYPE_SLICE_BEGIN
        slice_end = self.pb.TrackEvent.TYPE_SLICE_END
        for j in seq.tolist():
            i = int(idx[j])
            p = self.packet()
            p.timestamp = int(ev_t[j])
            p.sequence_flags = self.pb.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE
            te = p.track_event
            te.track_uuid = uuids[int(layer_of[i])]
            if ev_kind[j] == 1:
                te.type = slice_begin
                te.name_iid = self.name_iid(p, names[i])
                if categories is not None and categories[i]:
                    te.categories.append(categories[i])
            else:
                te.type = slice_end
        return uuids

    def counter(self, uuid: int, times: Iterable[int], values: Iterable[float]) -> None:
        kind = self.pb.TrackEvent.TYPE_COUNTER
        for t, v in zip(times, values, strict=True):
            p = self.packet()
            p.timestamp = int(t)
            p.track_event.type = kind
            p.track_event.track_uuid = uuid
            p.track_event.double_counter_value = float(v)

    def bytes(self) -> bytes:
        self.flush()
        return b"".join(self.chunks)


def _names(col: pl.Series) -> list[str]:
    return col.cast(pl.String).fill_null("").to_list()


def build(trace: Trace, tables: dict[str, pl.DataFrame],
          findings: Sequence[dict[str, Any]]) -> bytes:
    """The serialised trace. ``findings`` are findings.json's findings (``code``,
    ``severity``, ``evidence.windows``)."""
    from nsysan.report import plots

    w = _Writer(require())
    rank = 0
    if trace.has("gpu_ops") and not trace.gpu_ops.is_empty():
        ops = trace.gpu_ops.filter(pl.col("start_ns") > 0, pl.col("device_id").is_not_null(),
                                   pl.col("end_ns") >= pl.col("start_ns")).select(
            "device_id", "pid", "stream_id", "start_ns", "end_ns", "name", "op_class")
        busy = {tl.device_id: tl for tl in plots.device_timelines(trace, tables)}
        for (dev,), of_dev in sorted(ops.partition_by("device_id", as_dict=True).items()):
            parent = w.track(f"GPU {dev}", rank=rank)
            rank += 1
            several = of_dev["pid"].n_unique() > 1
            lanes = of_dev.partition_by(["pid", "stream_id"], as_dict=True)
            for k, ((pid, stream), lane) in enumerate(sorted(
                    lanes.items(), key=lambda kv: tuple((x is None, x or 0) for x in kv[0]))):
                lane = lane.sort(["start_ns", "end_ns", "name", "op_class"], nulls_last=True)
                w.slices(f"pid {pid} stream {stream}" if several else f"stream {stream}",
                         parent, k, lane["start_ns"].to_numpy(), lane["end_ns"].to_numpy(),
                         _names(lane["name"]), _names(lane["op_class"]))
            tl = busy.get(int(dev))
            if tl is not None:
                c = w.track(f"GPU {dev} busy", rank=rank, counter=True)
                rank += 1
                w.counter(c, [*tl.edges[:-1].tolist(), int(tl.edges[-1])],
                          [*tl.busy.tolist(), 0.0])
    if trace.has("nvtx") and not trace.nvtx.is_empty():
        nvtx = trace.nvtx.filter(pl.col("end_ns").is_not_null()
                                 & (pl.col("end_ns") >= pl.col("start_ns"))).select(
            "pid", "tid", "global_tid", "start_ns", "end_ns", "name")
        for _, rows in sorted(nvtx.partition_by("global_tid", as_dict=True).items(),
                                    key=lambda kv: (kv[0][0] is None, kv[0][0] or 0)):
            rows = rows.sort(["start_ns", "end_ns", "name"], nulls_last=True)
            w.slices(f"NVTX pid {rows['pid'][0]} tid {rows['tid'][0]}", None, rank,
                     rows["start_ns"].to_numpy(), rows["end_ns"].to_numpy(),
                     _names(rows["name"]))
            rank += 1
    top = w.track("nsysan findings", rank=rank)
    rank += 1
    gaps = tables.get("gaps")
    if gaps is not None and not gaps.is_empty():
        g = gaps.filter(pl.col("scope") == "device")
        for k, ((dev,), rows) in enumerate(sorted(
                g.partition_by("device_id", as_dict=True).items(),
                key=lambda kv: (kv[0][0] is None, kv[0][0] or 0))):
            rows = rows.sort(["start_ns", "end_ns"])
            w.slices(f"gaps device {dev}", top, k, rows["start_ns"].to_numpy(),
                     rows["end_ns"].to_numpy(), [f"gap: {c}" for c in _names(rows["cause"])])
    windows = [(int(win["start_ns"]), int(win["end_ns"]),
                f"[{f['severity'].upper()}] {f['code']}: {win['label']}")
               for f in findings for win in (f.get("evidence") or {}).get("windows", [])]
    if windows:
        windows.sort()
        w.slices("finding windows", top, 1000, np.array([x[0] for x in windows]),
                 np.array([x[1] for x in windows]), [x[2] for x in windows])
    steps = tables.get("steps")
    if steps is not None and not steps.is_empty():
        s = steps.drop_nulls(["start_ns", "end_ns"]).sort("start_ns", "step")
        w.slices("steps", None, rank, s["start_ns"].to_numpy(), s["end_ns"].to_numpy(),
                 [f"step {n}" for n in s["step"].to_list()])
    return w.bytes()


def write_perfetto(path: str | Path, trace: Trace, tables: dict[str, pl.DataFrame],
                   findings: Sequence[dict[str, Any]]) -> Path:
    return atomic_write(Path(path), build(trace, tables, findings))
