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
_CHUNK = 500_000  # slice events encoded at a time


def _varint(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The base-128 varints of ``v`` (uint64): an (n, width) byte matrix and each one's
    length."""
    top = int(v.max()) if v.size else 0
    width = max(1, (top.bit_length() + 6) // 7)  # as many columns as the largest needs
    shifts = np.arange(width, dtype=np.uint64) * np.uint64(7)
    groups = ((v[:, None] >> shifts) & np.uint64(0x7F)).astype(np.uint8)
    length = 1 + (v[:, None] >= (np.uint64(1) << shifts[1:])).sum(axis=1)
    more = np.arange(width)[None, :] < (length - 1)[:, None]
    return groups | (more.astype(np.uint8) << 7), length


def _byte(value: int, n: int, present: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """One constant byte per row (absent where ``present`` is False)."""
    return (np.full((n, 1), value, np.uint8),
            np.ones(n, np.int64) if present is None else present.astype(np.int64))


def _join(fields: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Row-wise concatenation of variable-length byte fields: (bytes, length per row)."""
    matrix = np.hstack([m for m, _ in fields])
    keep = np.hstack([np.arange(m.shape[1])[None, :] < n[:, None] for m, n in fields])
    return matrix[keep], sum(n for _, n in fields)


def _encode_events(ts: np.ndarray, uuid: np.ndarray, kind: np.ndarray, iid: np.ndarray,
                   cat: np.ndarray) -> bytes:
    """Slice events as serialised ``Trace.packet`` entries, encoded with numpy (the protobuf
    classes cost ~6 µs per packet: 40 s for the 6.6M events of the 1M-kernel trace). Each is
    a TracePacket {timestamp=8, trusted_packet_sequence_id=10: 1, sequence_flags=13:
    NEEDS_INCREMENTAL_STATE, track_event=11 {type=9, track_uuid=11, name_iid=10,
    category_iids=3}}; field numbers from perfetto_trace.proto, checked by the tests, which
    parse the result with the package's classes."""
    n = ts.size
    named, with_cat = iid > 0, cat > 0
    te = [_byte(0x48, n), _varint(kind), _byte(0x58, n), _varint(uuid),
          _byte(0x50, n, named), _masked(_varint(iid), named),
          _byte(0x18, n, with_cat), _masked(_varint(cat), with_cat)]
    te_len = sum(length for _, length in te)
    head = [_byte(0x40, n), _varint(ts),
            (np.tile(np.array([[0x50, _SEQ, 0x68, 2]], np.uint8), (n, 1)),
             np.full(n, 4, np.int64)),
            _byte(0x5A, n), _varint(te_len.astype(np.uint64))]
    packet_len = sum(length for _, length in head) + te_len
    outer = [_byte(0x0A, n), _varint(packet_len.astype(np.uint64))]
    data, _ = _join(outer + head + te)
    return data.tobytes()


def _masked(field: tuple[np.ndarray, np.ndarray], present: np.ndarray
            ) -> tuple[np.ndarray, np.ndarray]:
    return field[0], np.where(present, field[1], 0)


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
        self.cats: dict[str, int] = {}
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
               starts: np.ndarray, ends: np.ndarray, names: Sequence[str] | pl.Series,
               categories: Sequence[str] | pl.Series | None = None) -> list[int]:
        """The intervals as slices on a track (and overflow siblings where they overlap
        without nesting); returns the uuids of the tracks used."""
        order = np.lexsort((-ends, starts))
        layers: list[list[int]] = []  # per track: the ends of the open slices (a stack)
        layer_of = np.zeros(starts.size, np.int64)
        reach = np.maximum.accumulate(ends[order]) if starts.size else ends
        disjoint = bool(np.all(starts[order][1:] >= reach[:-1])) if starts.size else True
        for i in ([] if disjoint else order.tolist()):  # (disjoint: all on one track)
            # one pass: assign each slice the first track it nests on
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
        if disjoint and starts.size:
            layers = [[]]
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
        names_s = pl.Series(names, dtype=pl.String) if not isinstance(names, pl.Series) \
            else names
        cats_s = None if categories is None else (
            categories if isinstance(categories, pl.Series)
            else pl.Series(categories, dtype=pl.String))
        self._interned(names_s.unique(maintain_order=True).to_list(),
                       None if cats_s is None else cats_s.unique(maintain_order=True).to_list())
        iid = names_s.replace_strict(self.names, return_dtype=pl.UInt64).to_numpy()
        cat = (np.zeros(n, np.uint64) if cats_s is None else
               cats_s.replace_strict(self.cats, default=0, return_dtype=pl.UInt64).to_numpy())
        i = idx[seq]
        begin = ev_kind[seq] == 1
        self.flush()
        for lo in range(0, seq.size, _CHUNK):  # (the encoder's matrices are ~80 B per event)
            sl = slice(lo, lo + _CHUNK)
            b = begin[sl]
            self.chunks.append(_encode_events(
                ev_t[seq][sl].astype(np.uint64),
                np.asarray(uuids, np.uint64)[layer_of[i[sl]]],
                np.where(b, self.pb.TrackEvent.TYPE_SLICE_BEGIN,
                         self.pb.TrackEvent.TYPE_SLICE_END).astype(np.uint64),
                np.where(b, iid[i[sl]], 0), np.where(b, cat[i[sl]], 0)))
        return uuids

    def _interned(self, names: Sequence[str], categories: Sequence[str] | None) -> None:
        """One packet with the names (and categories) not interned yet, before their use."""
        p = None
        for name in names:
            if name not in self.names:
                p = p or self.packet()
                self.name_iid(p, name)
        for c in categories or ():
            if c and c not in self.cats:
                p = p or self.packet()
                self.cats[c] = len(self.cats) + 1
                e = p.interned_data.event_categories.add()
                e.iid, e.name = self.cats[c], c
        if p is not None:
            p.sequence_flags = self.pb.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE

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


def _names(col: pl.Series) -> pl.Series:
    """Slice names: a Categorical stays one (interning maps its codes, no string per
    slice), anything else becomes String; null is ``""``."""
    if isinstance(col.dtype, (pl.Categorical, pl.Enum)):
        return col.cast(pl.Categorical).fill_null("")
    return col.cast(pl.String).fill_null("")


def build(trace: Trace, tables: dict[str, pl.DataFrame],
          findings: Sequence[dict[str, Any]]) -> bytes:
    """The serialised trace. ``findings`` are findings.json's findings (``code``,
    ``severity``, ``evidence.windows``)."""
    from nsysan.report import plots

    w = _Writer(require())
    rank = 0
    if trace.has("gpu_ops") and not trace.gpu_ops.is_empty():
        # (filtered inside the select: a filter of the whole frame would expand its
        # constant columns to every row, `nsysan.frames.trace`)
        ops = trace.gpu_ops.select(
            pl.col("device_id", "pid", "stream_id", "start_ns", "end_ns", "name", "op_class")
            .filter((pl.col("start_ns") > 0) & pl.col("device_id").is_not_null()
                    & (pl.col("end_ns") >= pl.col("start_ns"))))
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
        nvtx = trace.nvtx.select(
            pl.col("pid", "tid", "global_tid", "start_ns", "end_ns", "name")
            .filter(pl.col("end_ns").is_not_null() & (pl.col("end_ns") >= pl.col("start_ns"))))
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
                     rows["end_ns"].to_numpy(), ("gap: " + _names(rows["cause"])).to_list())
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
