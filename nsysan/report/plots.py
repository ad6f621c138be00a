"""Pictures: a per-device utilisation timeline (PNG), a per-layer bar chart (PNG), and one
self-contained interactive HTML page (inline SVG with hover titles, no CDN, no script).

The timeline bins each device's span into ``n_bins`` equal bins. For every bin it gives the
share of time each op class is active (from the union of that class's intervals, so a bin is
never over 100%), the busy share (union of all ops), exposed NCCL (nccl active, compute not =
|nccl ∪ compute| − |compute|) and the idle share; long gaps from the gaps pass are shaded with
their cause. The PNGs are rasterised with numpy and Pillow (`nsysan.report.raster`), not
matplotlib, whose import alone cost more than a whole analysis of a small trace.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from nsysan.findings.evidence import fmt_frac, fmt_ns
from nsysan.frames.host_taxonomy import HOST_LAYERS
from nsysan.frames.schemas import OVERLAP_CLASS_OF_OP_CLASS
from nsysan.frames.trace import Trace
from nsysan.passes import device_blocks
from nsysan.passes.device_blocks import covered_before
from nsysan.report.jsonout import atomic_write

CLASSES = ("compute", "nccl", "h2d", "d2h", "d2d", "p2p", "memset")
_COLORS = {"compute": "#2e7d32", "nccl": "#1565c0", "h2d": "#ef6c00", "d2h": "#8e24aa",
           "d2d": "#6d4c41", "p2p": "#00838f", "memset": "#757575",
           "exposed nccl": "#c62828", "idle": "#bdbdbd", "memory in use": "#6a1b9a"}
MAX_GAPS = 300  # longest gaps drawn per device (all are in gaps.parquet)
PNG_BINS = 600  # time bins of the timeline pictures
MAX_STEP_LINES = 400


@dataclass
class DeviceTimeline:
    device_id: int
    edges: np.ndarray  # n_bins + 1 bin edges, ns
    busy: np.ndarray  # share of each bin with any op active
    lanes: dict[str, np.ndarray]  # class (and "exposed nccl", "idle") -> share per bin
    gaps: pl.DataFrame  # start_ns, end_ns, duration_ns, cause, cause_detail
    steps: list[int] = field(default_factory=list)  # step start times
    window: tuple[int, int] | None = None  # analysed window
    # host lane -> per bin, the `HOST_LAYERS` index most of the thread's samples in the bin
    # are in (-1: no sample in the bin); the PNG colours the lane's bins by it
    host_layers: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def busy_frac(self) -> float:
        w = np.diff(self.edges)
        return float((self.busy * w).sum() / w.sum()) if w.sum() else 0.0


def _coverage(starts: np.ndarray, ends: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Share of each bin covered by disjoint sorted intervals: B(t) = covered length before t,
    evaluated at the edges with one binary search."""
    if starts.size == 0:
        return np.zeros(edges.size - 1)
    return np.diff(covered_before(starts, ends, edges)) / np.maximum(np.diff(edges), 1)


def _covered_by_both(a_s: np.ndarray, a_e: np.ndarray, b_s: np.ndarray, b_e: np.ndarray,
                     t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Length of A, and of A ∪ B, before each instant of ``t``, for two sets of sorted
    disjoint blocks: |A ∪ B| = |A| + |B| − |A ∩ B|, where A's part of B is, per block of B, a
    difference of A's prefix sums (integers: exactly the covered length of the union of the
    ops of A and of B, without another union of them)."""
    idx = np.searchsorted(b_s, t, side="right") - 1
    i = np.clip(idx, 0, None)
    if not b_s.size:
        a_t = covered_before(a_s, a_e, t)
        return a_t, a_t
    # A's prefix sums at every point needed, in one search (A may have a block per op)
    n, m = b_s.size, t.size
    under = covered_before(a_s, a_e, np.concatenate(
        [b_e, b_s, np.minimum(t, b_e[i]), b_s[i], t]))
    in_b = under[:n] - under[n:2 * n]  # |A ∩ B block|
    cum = np.concatenate([[0], np.cumsum(in_b)])
    part = under[2 * n:2 * n + m] - under[2 * n + m:2 * n + 2 * m]
    both = np.where(idx >= 0, cum[i] + part, 0)
    a_t = under[2 * n + 2 * m:]
    return a_t, a_t + covered_before(b_s, b_e, t) - both


def _present_classes(op_classes: pl.Series) -> set[str | None]:
    """The distinct ``op_classes``, any other value (or null) as `device_blocks.OTHER`."""
    known = set(OVERLAP_CLASS_OF_OP_CLASS)
    return {c if c in known else device_blocks.OTHER for c in op_classes.to_list()}


def device_timelines(trace: Trace, tables: dict[str, pl.DataFrame],
                     window: tuple[int, int] | None = None,
                     n_bins: int = PNG_BINS) -> list[DeviceTimeline]:
    """Binned per-device activity from gpu_ops (and gaps / steps tables when present)."""
    return binned_timelines(trace, tables, window, (n_bins,))[0]


def binned_timelines(trace: Trace, tables: dict[str, pl.DataFrame],
                     window: tuple[int, int] | None, bins: Sequence[int]
                     ) -> list[list[DeviceTimeline]]:
    """`device_timelines` at each bin count of ``bins`` (the pictures' and the page's), from
    the same unions: each is cut from the sorted ops once, not once per bin count."""
    if not trace.has("gpu_ops") or trace.gpu_ops.is_empty():
        return [[] for _ in bins]
    ops = trace.gpu_ops.lazy()
    spans, classes = pl.collect_all([  # (side by side in polars' threads)
        ops.filter(pl.col("start_ns") > 0)
        .group_by("device_id").agg(pl.col("start_ns").min(), pl.col("end_ns").max()),
        ops.select(pl.col("op_class").unique())])
    # Every union is cut from the GPU ops that the gaps pass sorted already (device_blocks):
    # the busy union (which the findings' short-gap classification used too) and one per
    # class (an op_class outside the overlap classes counts as compute); compute ∪ nccl is
    # measured from the compute and nccl blocks (`_covered_by_both`), not cut again.
    # Only the classes present are cut (an absent class has no lane); without an op of any
    # other class the compute lane is the compute union the nccl pass memoised already.
    present = _present_classes(classes.to_series())
    of_cls = {c: [op for op, k in OVERLAP_CLASS_OF_OP_CLASS.items() if k == c and op in present]
              for c in CLASSES}
    if device_blocks.OTHER in present:
        of_cls["compute"].append(device_blocks.OTHER)
    per_cls = {c: device_blocks.blocks(trace, sel, keep=False)
               for c, sel in of_cls.items() if sel}
    busy = device_blocks.blocks(trace)
    gaps = tables.get("gaps")
    steps = tables.get("steps")
    step_starts = (steps.sort("start_ns")["start_ns"].to_list()
                   if steps is not None and steps.height <= MAX_STEP_LINES else [])
    memory = _memory_levels(trace) if "memory" in tables else {}
    host = _host_lanes(trace, tables)
    out: list[list[DeviceTimeline]] = [[] for _ in bins]
    for dev, t0, t1 in spans.sort("device_id").iter_rows():  # one iteration per device
        if t1 <= t0:
            continue
        # (a null device id gets no blocks: the equality filter this replaces matched none)
        mine = {c: b.of(dev) if dev is not None else (np.zeros(0), np.zeros(0))
                for c, b in [*per_cls.items(), ("busy", busy)]}
        drawn = [c for c in per_cls if mine[c][0].size]
        g = pl.DataFrame(schema={"start_ns": pl.Int64, "end_ns": pl.Int64,
                                 "duration_ns": pl.Int64, "cause": pl.String,
                                 "cause_detail": pl.String})
        if gaps is not None:
            g = (gaps.filter((pl.col("scope") == "device") & (pl.col("device_id") == dev))
                 .sort(["duration_ns", "start_ns"], descending=[True, False]).head(MAX_GAPS)
                 .select(g.columns).sort("start_ns"))
        for n_bins, timelines in zip(bins, out, strict=True):
            edges = np.linspace(t0, t1, n_bins + 1).round().astype(np.int64)
            width = np.maximum(np.diff(edges), 1)
            # compute, and compute ∪ nccl (exposed nccl: the part compute leaves), from the
            # same prefix sums of the compute blocks
            none = (np.zeros(0, np.int64), np.zeros(0, np.int64))
            shared = (_covered_by_both(*mine.get("compute", none), *mine["nccl"], edges)
                      if "nccl" in drawn else None)
            lanes = {c: np.diff(shared[0]) / width if c == "compute" and shared is not None
                     else _coverage(*mine[c], edges) for c in drawn}
            b = _coverage(*mine["busy"], edges)
            if shared is not None:
                lanes["exposed nccl"] = np.clip(np.diff(shared[1]) / width
                                                - lanes.get("compute", 0.0), 0, 1)
            lanes["idle"] = 1 - b
            host_layers = {}
            for lane in host:
                lanes[lane.label], host_layers[lane.label] = lane.bins(edges)
            if int(dev) in memory:  # only when the memory pass found memory-usage events
                lanes["memory in use"] = _memory_share(*memory[int(dev)], edges)
            timelines.append(DeviceTimeline(int(dev), edges, b, lanes, g, step_starts, window,
                                            host_layers))
    return out


_LAYER_ABBR = {"runtime_driver": "drv", "data_pipeline": "data", "framework": "fw",
               "communication": "comm", "operator_library": "ops", "os": "os",
               "profiler": "prof", "unknown": "?"}


@dataclass
class _HostLane:
    """A launching thread drawn as a host lane: its on-CPU intervals (sorted, disjoint) and
    its samples' times and `HOST_LAYERS` indexes."""
    label: str
    on_start: np.ndarray
    on_end: np.ndarray
    sample_ns: np.ndarray
    sample_layer: np.ndarray

    def bins(self, edges: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Its on-CPU share and its layer (`_bin_layers`) per bin of ``edges``."""
        return (_coverage(self.on_start, self.on_end, edges),
                _bin_layers(self.sample_ns, self.sample_layer, edges))


# the host lanes' bins by the layer of most samples (`HOST_LAYERS` order; the last entry is
# the colour of bins without a sample: index -1)
_HOST_LAYER_COLORS = {
    "framework": "#8e24aa", "data pipeline": "#ef6c00", "communication": "#283593",
    "operator library": "#00897b", "driver": "#1e88e5", "os": "#795548", "profiler": "#9e9d24",
    "unknown": "#9e9e9e", "no sample": "#263238",
}


def _host_lanes(trace: Trace, tables: dict[str, pl.DataFrame]) -> list[_HostLane]:
    """One lane per launching thread (`host.lane_threads`), labelled with its thread id and
    the layer most of its samples are in (abbreviated). Read once, binned per device and bin
    count."""
    from nsysan.passes import host

    threads = tables.get("host_threads")
    if threads is None or threads.is_empty() or not trace.meta.tables.has_rows("SCHED_EVENTS"):
        return []
    drawn = host.lane_threads(threads)
    if drawn.is_empty():
        return []
    on_cpu, samples = host.lanes(trace, drawn)
    out = []
    for r in drawn.iter_rows(named=True):  # at most `host.LANE_THREADS`
        on = on_cpu.filter(pl.col("global_tid") == r["global_tid"])
        mine = samples.filter(pl.col("global_tid") == r["global_tid"])
        # short: the lane labels share a narrow margin ("host 4242 drv": tid, top layer)
        label = f"host {r['tid']} {_LAYER_ABBR.get(r['top_layer'] or '', '')}".strip()
        out.append(_HostLane(label, on["start_ns"].to_numpy(), on["end_ns"].to_numpy(),
                             mine["time_ns"].to_numpy(), mine["code"].to_numpy()))
    return out


def _bin_layers(t: np.ndarray, layer: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Per bin, the `HOST_LAYERS` index most of the samples (times ``t``, indexes ``layer``)
    in the bin have (ties: the first in `HOST_LAYERS` order, as the tables' ``top_layer``);
    -1 where the bin has none. A bin holds [its start, the next bin's start); the last, its
    end too."""
    n_bins, n_layers = edges.size - 1, len(HOST_LAYERS)
    inside = (t >= edges[0]) & (t <= edges[-1])
    k = np.minimum(np.searchsorted(edges, t[inside], side="right") - 1, n_bins - 1)
    code = layer[inside].astype(np.int64)
    counts = np.bincount(k * n_layers + code, minlength=n_bins * n_layers)
    counts = counts.reshape(n_bins, n_layers)
    return np.where(counts.any(axis=1), counts.argmax(axis=1), -1).astype(np.int8)


def _memory_levels(trace: Trace) -> dict[int, tuple[np.ndarray, np.ndarray, int]]:
    """Per device whose memory size is known: the times and levels of its device memory in
    use (`nsysan.passes.memory.device_levels`, shared with the pass) and its memory size."""
    from nsysan.passes.memory import device_levels

    gpus = trace.frame("gpus") if trace.has("gpus") else None
    if gpus is None:
        return {}
    totals = {d: m for d, m in gpus.select("device_id", "total_memory_bytes").iter_rows()
              if isinstance(d, int) and isinstance(m, int) and m > 0}
    return {dev: (t, lvl, totals[dev]) for dev, (t, lvl) in device_levels(trace).items()
            if dev in totals}


def _memory_share(t: np.ndarray, lvl: np.ndarray, total: int, edges: np.ndarray) -> np.ndarray:
    """Per bin, the highest level (`_memory_levels`) as a share of the device's memory,
    exactly: the level a bin starts with or reaches after any of its events."""
    first = np.searchsorted(t, edges[:-1], side="left")
    last = np.searchsorted(t, edges[1:], side="left")
    last[-1] = np.searchsorted(t, edges[-1], side="right")  # the last bin holds its end
    level = np.where(first > 0, lvl[np.maximum(first - 1, 0)], 0)
    has = last > first
    if has.any():
        level[has] = np.maximum(level[has],
                                np.maximum.reduceat(lvl[:last[-1]], first[has]))
    return np.clip(level / total, 0, 1)


# ---------------------------------------------------------------------------------------------
# PNG
# ---------------------------------------------------------------------------------------------
def timeline_png(tl: DeviceTimeline, path: Path, title: str = "") -> Path:
    """Utilisation (top) with gaps shaded, and one lane per class (bottom heat strip)."""
    from nsysan.report import raster  # Pillow: imported only when pictures are drawn

    title = title or (f"device {tl.device_id}: GPU busy {fmt_frac(tl.busy_frac)} "
                      f"(red: gaps ≥ threshold, dashed: analysed window)")
    host = (tl.host_layers, [*_HOST_LAYER_COLORS.items()]) if tl.host_layers else None
    png = raster.timeline(tl.edges, tl.busy, tl.lanes, tl.gaps, tl.steps, tl.window, _COLORS,
                          title, host)
    return atomic_write(path, png)


def layers_png(layers: pl.DataFrame, path: Path, top: int = 15) -> Path:
    """Horizontal bars of exclusive GPU time per NVTX range name."""
    from nsysan.report import raster

    d = (layers.filter(pl.col("exclusive_gpu_ns") > 0)
         .sort("exclusive_gpu_ns", descending=True, maintain_order=True).head(top))
    names = [n if len(n) <= 60 else n[:59] + "…" for n in d["name"].fill_null("").to_list()]
    ms = (d["exclusive_gpu_ns"].fill_null(0) / 1e6).to_list()
    labels = [fmt_frac(f) for f in d["exclusive_frac"].fill_null(0).to_list()]
    png = raster.bars(names, ms, labels, _COLORS["compute"],
                      "GPU time per NVTX layer (innermost range, no double counting)",
                      "exclusive GPU time (ms)")
    return atomic_write(path, png)


# ---------------------------------------------------------------------------------------------
# HTML (inline SVG, hover titles)
# ---------------------------------------------------------------------------------------------
def _fracs(values: np.ndarray) -> list[str]:
    """`fmt_frac` of each value, every distinct value formatted once (most bins of a lane
    share a few values: 0, 1); distinct by bit pattern, as -0.0 prints differently."""
    bits = np.ascontiguousarray(values, dtype=np.float64).view(np.int64)
    uniq, inv = np.unique(bits, return_inverse=True)
    texts = [fmt_frac(v) for v in uniq.view(np.float64).tolist()]
    return [texts[k] for k in inv.ravel().tolist()]


def _svg_timeline(tl: DeviceTimeline, width: int = 1000) -> str:
    lanes = list(tl.lanes)
    top_h, lane_h = 120, 14
    h = top_h + lane_h * len(lanes) + 24
    t0, t1 = int(tl.edges[0]), int(tl.edges[-1])
    scale = width / max(t1 - t0, 1)
    bw = width / (tl.edges.size - 1)
    n_bins = tl.edges.size - 1
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width + 90}" height="{h}" '
           f'class="tl"><g transform="translate(90,0)">']
    # What the bars of every row share is formatted once per bin (x, the bin's time) or once
    # (the width), and each share once per distinct value: the busy bars' tooltips repeat
    # every lane's shares, and the lane cells repeat them again.
    xs = [f"{i * bw:.2f}" for i in range(n_bins)]
    secs = [f"{s:.6f}" for s in (tl.edges[:n_bins] / 1e9).tolist()]
    bar_w = f"{bw + 0.3:.2f}"
    shares = {n: tl.lanes[n].tolist() for n in lanes}
    texts = {n: _fracs(tl.lanes[n]) for n in lanes}
    busy = tl.busy.tolist()
    busy_texts = _fracs(tl.busy)
    tips = ([", ".join(parts) for parts in zip(*([f"{n} {t}" for t in texts[n]] for n in lanes),
                                                strict=True)]
            if lanes else [""] * n_bins)
    fill = _COLORS["compute"]
    for i in range(n_bins):  # one rect per bin (bounded by n_bins), not per event
        bh = top_h * busy[i]
        out.append(f'<rect x="{xs[i]}" y="{top_h - bh:.2f}" width="{bar_w}" '
                   f'height="{bh:.2f}" fill="{fill}" fill-opacity="0.55">'
                   f'<title>{secs[i]} s: busy {busy_texts[i]}; '
                   f'{html.escape(tips[i])}</title></rect>')
    for s, e, d, cause, detail in tl.gaps.iter_rows():
        x = (s - t0) * scale
        out.append(f'<rect x="{x:.2f}" y="0" width="{max((e - s) * scale, 1):.2f}" '
                   f'height="{top_h}" fill="#e53935" fill-opacity="0.3"><title>gap '
                   f'{s / 1e9:.6f} s, {fmt_ns(d)}: {html.escape(str(cause))} '
                   f'{html.escape(str(detail or ""))}</title></rect>')
    for j, n in enumerate(lanes):
        y = top_h + 4 + j * lane_h
        out.append(f'<text x="-4" y="{y + 10}" text-anchor="end" font-size="10">'
                   f'{html.escape(n)}</text>')
        head = f'" y="{y}" width="{bar_w}" height="{lane_h - 2}" fill="{_COLORS.get(n, "#555")}"'
        for i, (v, text) in enumerate(zip(shares[n], texts[n], strict=True)):
            if v > 0.005:
                out.append(f'<rect x="{xs[i]}{head} fill-opacity="{min(v, 1):.2f}">'
                           f'<title>{n}: {text} of {secs[i]} s bin</title></rect>')
    out.append(f'<text x="0" y="{h - 4}" font-size="10">{t0 / 1e9:.3f} s</text>'
               f'<text x="{width}" y="{h - 4}" font-size="10" text-anchor="end">'
               f'{t1 / 1e9:.3f} s</text></g></svg>')
    return "".join(out)


def _svg_layers(layers: pl.DataFrame, top: int = 20, width: int = 700) -> str:
    d = layers.filter(pl.col("exclusive_gpu_ns") > 0).sort(
        "exclusive_gpu_ns", descending=True, maintain_order=True).head(top)
    vmax = max(int(d["exclusive_gpu_ns"].fill_null(0).max() or 0), 1)
    rows = []
    for i, r in enumerate(d.iter_rows(named=True)):
        w = width * (r["exclusive_gpu_ns"] or 0) / vmax
        name = html.escape(r["name"] or "")
        rows.append(f'<text x="-4" y="{i * 18 + 12}" text-anchor="end" font-size="11">'
                    f'{html.escape((r["name"] or "")[:50])}</text><rect x="0" y="{i * 18}" '
                    f'width="{w:.1f}" height="14" fill="{_COLORS["compute"]}"><title>{name}: '
                    f'{fmt_ns(r["exclusive_gpu_ns"])} exclusive ({fmt_frac(r["exclusive_frac"])}),'
                    f' {r["instances"]} instances, {r["n_gpu_ops"]} GPU ops</title></rect>')
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width + 330}" '
            f'height="{18 * d.height + 10}"><g transform="translate(320,0)">{"".join(rows)}'
            "</g></svg>")


def report_html(path: Path, diagnosis: Any, trace: Trace, timelines: list[DeviceTimeline],
                layers: pl.DataFrame | None,
                tables: dict[str, pl.DataFrame] | None = None,
                states: list[DeviceTimeline] | None = None,
                payload: dict[str, Any] | None = None) -> Path:
    """The interactive page (`nsysan.report.html_page`); the SVG strips are its no-script
    fallback. ``states``: the devices binned at `html_data.N_BINS` (binned here when not
    given; `binned_timelines` bins both at once). ``payload``: `html_data.timeline_payload`
    of ``trace`` and ``tables`` when the caller built it already."""
    from nsysan.report import html_data, html_page

    tables = tables if tables is not None else {}
    window = timelines[0].window if timelines else None
    if states is None:
        states = device_timelines(trace, tables, window, n_bins=html_data.N_BINS)
    if payload is None:
        payload = html_data.timeline_payload(trace, tables)
    payload = html_data.with_states(payload, states)
    svgs = [(tl.device_id, fmt_frac(tl.busy_frac), _svg_timeline(tl)) for tl in timelines]
    with_layers = (layers is not None and layers.height > 0
                   and diagnosis.attribution_note() is None)
    parts = html_page.render_parts(diagnosis, trace, tables, payload, svgs,
                                   _svg_layers(layers) if with_layers and layers is not None
                                   else None)
    del payload  # (the parts hold the raw ops' text)
    return atomic_write(path, parts)
