"""The metric model: a flat, documented set of metrics of one run, for diffs and budgets.

Every metric has a name, a unit, a direction (``lower`` or ``higher`` is better), a value and,
where the run has them, **per-step samples** (one value per steady-state step; per NCCL op for
per-op NCCL metrics) from which the value is computed, so that diffs can estimate noise.
Metrics about one layer, kernel, NCCL op, engine state or idle cause carry a *selector* and
are written ``kind["selector"].name`` (``layer["forward"].exclusive_ns_per_step``). The full
list, with units and sources, is `CATALOGUE` (rendered in docs/diff.md).

Windows: ``*_per_step`` metrics and everything sampled per step cover the steady-state steps
(non-warm-up) on the primary device; kernel metrics come from the whole-trace ``kernels``
table and are normalised by the number of steps of the capture. Without steps only the
whole-trace metrics exist (``gpu_busy_frac`` then covers the whole GPU span).

`extract` computes the set from a `RunData`, itself built from an `AnalysisResult` or from an
output directory: the same code path for both.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from nsysan.compare import decompose as dec
from nsysan.compare.inputs import RunData

KINDS = ("layer", "kernel", "nccl", "state", "idle")


@dataclass(frozen=True)
class MetricSpec:
    kind: str | None  # None: a run-wide metric; else the selector kind
    name: str
    unit: str  # ns | frac | count | 1/s | GB/s
    better: str  # lower | higher
    sampled: bool  # per-step (or per-op) samples exist when steps are known
    additive: bool  # sums over selectors: a glob selector may aggregate several
    per_step: bool  # needs steps
    floor: str  # noise floor kind: step (share of step time) | frac | count | none
    label: str
    source: str


def _s(kind: str | None, name: str, unit: str, better: str, floor: str, label: str, source: str,
       *, sampled: bool = False, additive: bool = False, per_step: bool = False) -> MetricSpec:
    """One catalogue row; the flags by name (a row of positional booleans was unreadable)."""
    return MetricSpec(kind, name, unit, better, sampled=sampled, additive=additive,
                      per_step=per_step, floor=floor, label=label, source=source)


CATALOGUE: tuple[MetricSpec, ...] = (
    _s(None, "step_time_ns", "ns", "lower", "step", "step time", "steps.duration_ns", sampled=True,
       per_step=True),
    _s(None, "steps_per_s", "1/s", "higher", "none", "throughput (steps/s)", "1e9 / mean step time",
       sampled=True, per_step=True),
    _s(None, "samples_per_s", "1/s", "higher", "none", "throughput (samples/s)",
       "--samples-per-step / mean step time", sampled=True, per_step=True),
    _s(None, "tokens_per_s", "1/s", "higher", "none", "throughput (tokens/s)",
       "--tokens-per-step / mean step time", sampled=True, per_step=True),
    _s(None, "gpu_busy_frac", "frac", "higher", "frac", "GPU busy",
       "steps.gpu_busy_frac (time-weighted); overlap_summary without steps", sampled=True),
    _s(None, "idle_ns_per_step", "ns", "lower", "step", "GPU idle per step", "steps.idle_ns",
       sampled=True, per_step=True),
    _s(None, "exposed_nccl_ns_per_step", "ns", "lower", "step", "exposed communication per step",
       "steps.exposed_nccl_ns", sampled=True, per_step=True),
    _s(None, "exposed_nccl_frac", "frac", "lower", "frac", "exposed communication share",
       "steps.exposed_nccl_ns / duration (time-weighted)", sampled=True, per_step=True),
    _s(None, "h2d_unoverlapped_ns_per_step", "ns", "lower", "step", "unoverlapped H2D per step",
       "steps.h2d_unoverlapped_ns", sampled=True, per_step=True),
    _s(None, "nccl_ns_per_step", "ns", "lower", "step", "NCCL kernel time per step",
       "nccl.duration_ns by step", sampled=True, per_step=True),
    _s(None, "nccl_ops_per_step", "count", "lower", "count", "NCCL ops per step",
       "nccl rows by step", sampled=True, per_step=True),
    _s(None, "kernels_per_step", "count", "lower", "count", "kernel launches per step",
       "kernels.count / steps of the capture", per_step=True),
    _s(None, "kernel_ns_per_step", "ns", "lower", "step", "kernel time per step",
       "kernels.total_ns / steps of the capture", per_step=True),
    _s("state", "ns_per_step", "ns", "lower", "step",
       "time per step in an engine state (compute, communication, copies, idle)",
       "overlap rows of each step, primary device", sampled=True, additive=True, per_step=True),
    _s("idle", "ns_per_step", "ns", "lower", "step",
       "GPU idle per step by cause (NVTX range, gap cause, short gaps)",
       "gaps (device scope) clipped to each step; short gaps = the rest of the idle time",
       sampled=True, additive=True, per_step=True),
    _s("layer", "exclusive_ns_per_step", "ns", "lower", "step",
       "exclusive GPU time per step of an NVTX layer",
       "attribution.exclusive_gpu_ns, instances by the step their projection starts in",
       sampled=True, additive=True, per_step=True),
    _s("layer", "gpu_ops_per_step", "count", "lower", "count",
       "GPU ops launched per step inside an NVTX layer", "attribution.n_gpu_ops", sampled=True,
       additive=True, per_step=True),
    _s("kernel", "time_ns_per_step", "ns", "lower", "step",
       "kernel time per step (kernels grouped by short name)", "kernels.total_ns", additive=True,
       per_step=True),
    _s("kernel", "count_per_step", "count", "lower", "count", "launches per step of a kernel",
       "kernels.count", additive=True, per_step=True),
    _s("kernel", "mean_ns", "ns", "lower", "none", "mean duration of a kernel",
       "kernels.total_ns / kernels.count"),
    _s("nccl", "time_ns_per_step", "ns", "lower", "step", "NCCL op time per step",
       "nccl.duration_ns by step", sampled=True, additive=True, per_step=True),
    _s("nccl", "exposed_ns_per_step", "ns", "lower", "step", "exposed NCCL op time per step",
       "nccl.exposed_ns by step", sampled=True, additive=True, per_step=True),
    _s("nccl", "count_per_step", "count", "lower", "count", "NCCL ops per step",
       "nccl rows by step", sampled=True, additive=True, per_step=True),
    _s("nccl", "mean_ns", "ns", "lower", "none", "mean duration of an NCCL op (samples: ops)",
       "nccl.duration_ns", sampled=True),
    _s("nccl", "busbw_gbps", "GB/s", "higher", "none",
       "NCCL bus bandwidth (mean over ops with known sizes)", "nccl.busbw_gbps", sampled=True),
)
SPECS: dict[tuple[str | None, str], MetricSpec] = {(m.kind, m.name): m for m in CATALOGUE}


def metric_key(kind: str | None, selector: str | None, name: str) -> str:
    if kind is None:
        return name
    sel = (selector or "").replace("\\", "\\\\").replace('"', '\\"')
    return f'{kind}["{sel}"].{name}'


@dataclass
class Metric:
    kind: str | None
    selector: str | None
    name: str
    value: float | None
    samples: np.ndarray | None = None  # per step (or per op), float64
    weights: np.ndarray | None = None  # for time-weighted means
    window: str = "steps"  # steps | trace
    note: str | None = None  # why the value is missing, or a caveat

    @property
    def spec(self) -> MetricSpec:
        return SPECS[(self.kind, self.name)]

    @property
    def key(self) -> str:
        return metric_key(self.kind, self.selector, self.name)


@dataclass
class RunInfo:
    """What decides whether two runs can be compared at all."""

    n_steps: int  # steady-state steps
    n_steps_all: int
    steps_source: str | None
    steps_note: str | None
    primary_device: int | None
    n_devices: int  # of the compared devices
    capture_types: tuple[str, ...] | None  # nsys CAPTURE_EVENT_TYPE values, when exported
    graph_mode: str | None  # graph | node | None (unknown)
    not_captured: tuple[str, ...]
    kernel_mix: dict[str, float]  # short name -> share of kernel time
    launch_mix: dict[str, float]  # short name -> share of kernel launches
    findings: list[dict[str, Any]]
    exporter_version: str | None
    options: dict[str, Any]
    #: the devices compared (all of the run's, or those selected with ``devices``)
    devices: tuple[int, ...] = ()
    #: every device of the run with GPU work (overlap_summary), selected or not
    all_devices: tuple[int, ...] = ()
    #: the ``devices`` selection the metrics were computed for (None: every device)
    selected_devices: tuple[int, ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        top = sorted(self.kernel_mix.items(), key=lambda kv: -kv[1])[:10]
        return {"n_steps": self.n_steps, "n_steps_all": self.n_steps_all,
                "steps_source": self.steps_source, "steps_note": self.steps_note,
                "primary_device": self.primary_device, "n_devices": self.n_devices,
                "capture_types": list(self.capture_types) if self.capture_types else None,
                "graph_mode": self.graph_mode, "not_captured": list(self.not_captured),
                "kernel_mix_top": [{"kernel": k, "share": v} for k, v in top],
                "findings": self.findings, "exporter_version": self.exporter_version,
                "options": self.options, "devices": list(self.devices),
                "all_devices": list(self.all_devices),
                "selected_devices": None if self.selected_devices is None
                else list(self.selected_devices)}


@dataclass
class MetricSet:
    trace_id: str
    source: str
    info: RunInfo
    metrics: dict[str, Metric] = field(default_factory=dict)

    def __iter__(self) -> Iterator[Metric]:
        return iter(self.metrics.values())

    def add(self, m: Metric) -> None:
        self.metrics[m.key] = m

    def get(self, name: str, kind: str | None = None, selector: str | None = None
            ) -> Metric | None:
        return self.metrics.get(metric_key(kind, selector, name))

    def value(self, name: str, kind: str | None = None, selector: str | None = None
              ) -> float | None:
        m = self.get(name, kind, selector)
        return None if m is None else m.value

    def selectors(self, kind: str, name: str) -> list[str]:
        return [m.selector for m in self if m.kind == kind and m.name == name
                and m.selector is not None]

    def headline(self) -> dict[str, float | None]:
        """A few run-wide values (for baseline listings and the catalog)."""
        keys = ("step_time_ns", "steps_per_s", "gpu_busy_frac", "exposed_nccl_ns_per_step",
                "idle_ns_per_step")
        return {k: self.value(k) for k in keys}


# ---------------------------------------------------------------------------------------------
def _arr(s: pl.Series) -> np.ndarray:
    return s.cast(pl.Float64).fill_null(0.0).to_numpy().astype(np.float64, copy=True)


def _sampled(kind: str | None, sel: str | None, name: str, x: np.ndarray,
             w: np.ndarray | None = None) -> Metric:
    value = float((x * w).sum() / w.sum()) if w is not None and w.sum() else float(x.mean())
    return Metric(kind, sel, name, value, x, w)


def _per_item(out: MetricSet, kind: str, name: str, grid: pl.DataFrame | None,
              col: str = "ns") -> None:
    """One sampled metric per item of a complete ``step, item, <col>`` grid (every item has a
    row for every step, sorted by item then step): one reshape, no per-group frames."""
    if grid is None or grid.is_empty():
        return
    items = grid["item"].unique(maintain_order=True).to_list()
    values = _arr(grid[col]).reshape(len(items), -1)
    for item, row in zip(items, values, strict=True):
        out.add(_sampled(kind, str(item), name, row.copy()))


def _device_ids(ov: pl.DataFrame | None) -> tuple[int, ...]:
    if ov is None or ov.is_empty():
        return ()
    return tuple(sorted(int(d) for d in ov["device_id"].drop_nulls().unique().to_list()))


#: pass tables with a device_id column: what ``devices`` restricts
DEVICE_TABLES = ("overlap", "overlap_summary", "gaps", "nccl")


def select_devices(run: RunData, devices: tuple[int, ...]) -> RunData:
    """``run`` with its per-device tables cut to ``devices`` (see `extract`)."""
    keep = pl.col("device_id").is_in(list(devices))
    tables = {name: df.filter(keep) if name in DEVICE_TABLES and "device_id" in df.columns
              else df for name, df in run.tables.items()}
    return replace(run, tables=tables)


def _info(run: RunData, steady: pl.DataFrame | None) -> RunInfo:
    steps = run.table("steps")
    ov = run.table("overlap_summary")
    kernels = run.table("kernels")
    mix: dict[str, float] = {}
    launches: dict[str, float] = {}
    if kernels is not None and not kernels.is_empty():
        k = kernels.group_by("short_name").agg(pl.col("total_ns", "count").sum())
        total, count = float(k["total_ns"].sum()), float(k["count"].sum())
        if total and count:
            mix = {str(r[0]): float(r[1]) / total for r in k.iter_rows()}
            launches = {str(r[0]): float(r[2]) / count for r in k.iter_rows()}
    types = run.capture.get("CAPTURE_EVENT_TYPE")
    graph = next((v[0] for k, v in run.capture.items()
                  if k.endswith("CUDA_GRAPH_TRACE_OPTIONS:MODE") and v), None)
    if graph is None and any(f["code"] == "CUDA_GRAPH_NO_NODES" for f in run.findings):
        graph = "graph"  # graphs launched, no node-level records: traced as whole graphs
    return RunInfo(
        n_steps=0 if steady is None else steady.height,
        n_steps_all=0 if steps is None else steps.height,
        steps_source=None if steps is None or steps.is_empty() else str(steps["source"][0]),
        steps_note=(run.notes.get("step_time_mean_ns") or "no steps found") if steady is None
        else None,
        primary_device=dec.primary_device(ov),
        n_devices=0 if ov is None else ov.height,
        capture_types=tuple(sorted(types)) if types else None,
        graph_mode=graph.lower() if graph else None,
        not_captured=tuple(sorted(run.not_captured)),
        kernel_mix=mix,
        launch_mix=launches,
        findings=list(run.findings),
        exporter_version=run.exporter_version,
        options={k: v for k, v in run.options.items() if v is not None},
        devices=_device_ids(ov),
        all_devices=_device_ids(ov),
    )


def _step_metrics(out: MetricSet, run: RunData, steady: pl.DataFrame) -> None:
    steps = run.table("steps")
    assert steps is not None
    rows = steps.join(steady.select("step"), on="step").sort("start_ns")
    dur = _arr(rows["duration_ns"])
    out.add(_sampled(None, None, "step_time_ns", dur))
    safe = np.where(dur > 0, dur, np.nan)
    rate = np.nan_to_num(1e9 / safe)
    out.add(_sampled(None, None, "steps_per_s", rate, dur))
    for opt, name in (("samples_per_step", "samples_per_s"), ("tokens_per_step", "tokens_per_s")):
        per = run.options.get(opt)
        if per:
            out.add(_sampled(None, None, name, rate * float(per), dur))
    out.add(_sampled(None, None, "gpu_busy_frac", _arr(rows["gpu_busy_frac"]), dur))
    out.add(_sampled(None, None, "idle_ns_per_step", _arr(rows["idle_ns"])))
    exposed = _arr(rows["exposed_nccl_ns"])
    out.add(_sampled(None, None, "exposed_nccl_ns_per_step", exposed))
    out.add(_sampled(None, None, "exposed_nccl_frac", np.nan_to_num(exposed / safe), dur))
    out.add(_sampled(None, None, "h2d_unoverlapped_ns_per_step",
                     _arr(rows["h2d_unoverlapped_ns"])))


def _decomposition_metrics(out: MetricSet, run: RunData, steady: pl.DataFrame,
                           device: int | None) -> None:
    states = dec.state_per_step(run.table("overlap"), steady, device)
    source = out.info.steps_source or ""
    step_name = source.removeprefix("nvtx:") if source.startswith("nvtx:") else None
    layers = dec.layer_per_step(run.table("attribution"), steady, step_name,
                                grouped=run.group_numbered)
    _per_item(out, "state", "ns_per_step", states)
    _per_item(out, "idle", "ns_per_step", dec.idle_per_step(run.table("gaps"), states, steady,
                                                             device))
    _per_item(out, "layer", "exclusive_ns_per_step", layers)
    _per_item(out, "layer", "gpu_ops_per_step", layers, "ops")
    outside = dec.outside_per_step(states, layers, steady)
    if outside is not None:
        m = _sampled("layer", dec.OUTSIDE, "exclusive_ns_per_step", _arr(outside["ns"]))
        if out.info.n_devices > 1:
            m.note = ("several devices: layer times cover every device, step time the primary "
                      "device only")
        out.add(m)


def _nccl_metrics(out: MetricSet, run: RunData, steady: pl.DataFrame) -> None:
    nccl = run.table("nccl")
    if nccl is None or nccl.is_empty():
        return
    rows = nccl.filter(pl.col("step").is_in(steady["step"].implode()))
    per = rows.group_by("step", pl.col("op").alias("item")).agg(
        pl.col("duration_ns").sum().alias("ns"), pl.col("exposed_ns").sum().alias("exp"),
        pl.len().alias("n"))
    ops = rows.select(pl.col("op").alias("item")).unique()
    if not ops.is_empty():
        g = dec.grid(steady, ops, per).with_columns(pl.col("exp", "n").fill_null(0))
        _per_item(out, "nccl", "time_ns_per_step", g)
        _per_item(out, "nccl", "exposed_ns_per_step", g, "exp")
        _per_item(out, "nccl", "count_per_step", g, "n")
        total = g.group_by("step").agg(pl.col("ns", "n").sum()).sort("step")
        total = steady.select("step").join(total, on="step", how="left").fill_null(0)
        out.add(_sampled(None, None, "nccl_ns_per_step", _arr(total["ns"])))
        out.add(_sampled(None, None, "nccl_ops_per_step", _arr(total["n"])))


def _op_metrics(out: MetricSet, run: RunData, steady: pl.DataFrame | None) -> None:
    """Per-op NCCL statistics (samples are ops of the steady steps, or of the whole trace)."""
    nccl = run.table("nccl")
    if nccl is None or nccl.is_empty():
        return
    window = "steps" if steady is not None else "trace"
    rows = nccl if steady is None else nccl.filter(pl.col("step").is_in(steady["step"].implode()))
    for (op,), g in rows.sort("op").group_by("op", maintain_order=True):
        m = _sampled("nccl", str(op), "mean_ns", _arr(g["duration_ns"]))
        m.window = window
        out.add(m)
        bw = g["busbw_gbps"].drop_nulls()
        if bw.len():
            m = _sampled("nccl", str(op), "busbw_gbps", _arr(bw))
            m.window = window
            out.add(m)


def _kernel_metrics(out: MetricSet, run: RunData, n_steps_all: int) -> None:
    kernels = run.table("kernels")
    if kernels is None or kernels.is_empty():
        return
    k = (kernels.group_by("short_name").agg(pl.col("count").sum(), pl.col("total_ns").sum())
         .sort("short_name"))
    for name, count, total in k.iter_rows():
        out.add(Metric("kernel", str(name), "mean_ns", float(total) / count if count else None,
                       window="trace"))
        if n_steps_all:
            out.add(Metric("kernel", str(name), "time_ns_per_step", float(total) / n_steps_all,
                           window="trace"))
            out.add(Metric("kernel", str(name), "count_per_step", float(count) / n_steps_all,
                           window="trace"))
    if n_steps_all:
        out.add(Metric(None, None, "kernels_per_step", float(k["count"].sum()) / n_steps_all,
                       window="trace"))
        out.add(Metric(None, None, "kernel_ns_per_step", float(k["total_ns"].sum()) / n_steps_all,
                       window="trace"))


def _busy_whole_trace(run: RunData, device: int | None) -> Metric:
    ov = run.table("overlap_summary")
    if ov is None or device is None:
        return Metric(None, None, "gpu_busy_frac", None, window="trace",
                      note="the overlap pass did not run")
    row = ov.filter(pl.col("device_id") == device).row(0, named=True)
    value = row["busy_ns"] / row["span_ns"] if row["span_ns"] else None
    return Metric(None, None, "gpu_busy_frac", value, window="trace",
                  note="whole GPU span of the primary device (no steps)")


def extract(run: RunData, devices: tuple[int, ...] | None = None) -> MetricSet:
    """The metric set of one run (see the module docstring and `CATALOGUE`).

    ``devices``: compare only these devices: the per-device tables (`DEVICE_TABLES`: engine
    states, GPU busy, idle causes, NCCL) are cut to them and the primary device is the
    busiest of them. Kernel and layer tables have no device: they stay totals over every
    device, and `nsysan.compare.diff.comparability` says when that makes them not
    comparable."""
    all_devices = _device_ids(run.table("overlap_summary"))
    if devices is not None:
        run = select_devices(run, tuple(sorted(set(devices))))
    steady = dec.steady_steps(run.table("steps"))
    info = _info(run, steady)
    info.all_devices = all_devices
    info.selected_devices = None if devices is None else tuple(sorted(set(devices)))
    out = MetricSet(run.trace_id, run.source, info)
    device = info.primary_device
    if steady is not None:
        _step_metrics(out, run, steady)
        _decomposition_metrics(out, run, steady, device)
        _nccl_metrics(out, run, steady)
    else:
        out.add(_busy_whole_trace(run, device))
        for spec in CATALOGUE:
            if spec.kind is None and spec.per_step:
                out.add(Metric(None, None, spec.name, None, note=f"no steps: {info.steps_note}"))
    _op_metrics(out, run, steady)
    _kernel_metrics(out, run, info.n_steps_all)
    return out


def from_result(result: Any, devices: tuple[int, ...] | None = None) -> MetricSet:
    """The metric set of an `nsysan.api.AnalysisResult` (``devices``: see `extract`)."""
    return extract(RunData.from_result(result), devices)


def from_dir(directory: str | Path, devices: tuple[int, ...] | None = None) -> MetricSet:
    """The metric set of an ``nsysan analyze`` output directory (``devices``: see
    `extract`)."""
    return extract(RunData.from_dir(directory), devices)
