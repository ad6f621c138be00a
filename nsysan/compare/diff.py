"""``nsysan diff``: compare two runs metric by metric, with noise, and say where time went.

`diff(base, new)` takes two `MetricSet` s and returns a `DiffResult`: one row per metric and
statistic (step time: mean, p50 and p95; sampled metrics: the mean; whole-trace metrics: the
value) with a verdict from `nsysan.compare.stats`, the decomposition of the change of mean step
time by engine state and by layer (`nsysan.compare.decompose`), and every reason why some or
all metrics are **not comparable** (`comparability`): never a silent verdict.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import polars as pl

from nsysan.compare import decompose as dec
from nsysan.compare.metrics import CATALOGUE, KINDS, Metric, MetricSet, MetricSpec, RunInfo
from nsysan.compare.stats import VERDICTS, Comparison, Resampler, StatsParams, compare_samples
from nsysan.errors import ConfigError
from nsysan.escape import md_code

DIFF = pl.Schema({
    "metric": pl.String,  # kind["selector"].name
    "kind": pl.String,  # null for run-wide metrics; layer | kernel | nccl | state | idle
    "selector": pl.String,
    "name": pl.String,
    "stat": pl.String,  # mean | p50 | p95 | value
    "unit": pl.String,
    "better": pl.String,  # lower | higher
    "base": pl.Float64,
    "new": pl.Float64,
    "delta": pl.Float64,
    "rel_delta": pl.Float64,
    "ci_low": pl.Float64,  # interval of delta at the configured confidence (bootstrap only)
    "ci_high": pl.Float64,
    "threshold": pl.Float64,  # smallest |delta| reported as a change
    "n_base": pl.Int64,  # samples behind the value (steps, or ops)
    "n_new": pl.Int64,
    "method": pl.String,  # bootstrap | threshold | none
    "verdict": pl.String,  # improved | regressed | unchanged | not comparable
    "reason": pl.String,
})

#: frames whose absence on one side makes these metric kinds not comparable
FRAME_SCOPES = {"nvtx": ("layer", "idle"), "osrt": ("idle",), "cuda_api": ("idle",),
                "sync": ("idle",)}
#: nsys CAPTURE_EVENT_TYPE values and the frame they feed
CAPTURE_FRAMES = {"NvtxEvents": "nvtx", "OSRuntime": "osrt", "Cuda": "gpu_ops"}
_ORDER = {None: 0, "state": 1, "idle": 2, "layer": 3, "nccl": 4, "kernel": 5}


@dataclass(frozen=True)
class DiffParams:
    stats: StatsParams = field(default_factory=StatsParams)
    #: kernel-mix similarity (shared share of kernel time, 0..1) below which the runs are
    #: different workloads
    min_kernel_mix_similarity: float = 0.5
    #: statistics of step time that get their own row
    step_stats: tuple[str, ...] = ("mean", "p50", "p95")

    def __post_init__(self) -> None:
        if not 0 <= self.min_kernel_mix_similarity <= 1:
            raise ConfigError("min_kernel_mix_similarity must be in [0, 1]")


@dataclass
class Comparability:
    """Why some or all metrics of two runs cannot be compared."""

    blockers: list[str] = field(default_factory=list)  # nothing is comparable
    scopes: dict[str, str] = field(default_factory=dict)  # scope -> reason
    notes: list[str] = field(default_factory=list)  # caveats that change no verdict
    kernel_mix_similarity: float | None = None

    @property
    def comparable(self) -> bool:
        return not self.blockers

    def reason_for(self, m: MetricSpec, windows: tuple[str, ...]) -> str | None:
        if self.blockers:
            return "; ".join(self.blockers)
        scopes = [m.kind or "run"]
        if m.per_step or "steps" in windows:
            scopes.append("steps")
        if m.kind == "kernel" or m.name in ("kernels_per_step", "kernel_ns_per_step") or (
                m.kind == "layer" and m.name == "gpu_ops_per_step"):
            scopes.append("graph")
        reasons = [self.scopes[s] for s in scopes if s in self.scopes]
        return "; ".join(reasons) if reasons else None


def _intersection(a: dict[str, float], b: dict[str, float]) -> float:
    return float(sum(min(v, b.get(k, 0.0)) for k, v in a.items()))


def kernel_mix_similarity(a: RunInfo, b: RunInfo) -> float | None:
    """The workload signature match, 0..1: the mean of the histogram intersections of the
    kernel-time shares and of the launch shares by kernel short name (1 = the same mix).

    Time shares alone move when cuDNN picks other algorithms for the same model; launch
    shares alone cannot tell two models built from the same elementwise kernels apart; the
    mean separates the shared traces cleanly (same workload 0.67, different models <= 0.34)."""
    if not a.kernel_mix or not b.kernel_mix:
        return None
    return (_intersection(a.kernel_mix, b.kernel_mix)
            + _intersection(a.launch_mix, b.launch_mix)) / 2


def comparability(base: MetricSet, new: MetricSet, params: DiffParams = DiffParams()
                  ) -> Comparability:
    """The workload signature, capture settings and steps of two runs, checked."""
    a, b = base.info, new.info
    out = Comparability()
    sim = kernel_mix_similarity(a, b)
    out.kernel_mix_similarity = sim
    if sim is None:
        out.notes.append("kernel mix unknown on one side (no kernels table): workload "
                         "signature not checked")
    elif sim < params.min_kernel_mix_similarity:
        top = [max(m, key=m.get) for m in (a.kernel_mix, b.kernel_mix)]
        out.blockers.append(
            f"different workloads: kernel-mix similarity {sim:.2f} < "
            f"{params.min_kernel_mix_similarity:.2f} (top kernel {md_code(top[0], 80)} vs "
            f"{md_code(top[1], 80)})")
    missing_a, missing_b = set(a.not_captured), set(b.not_captured)
    for frame in sorted(missing_a ^ missing_b):
        side = "NEW" if frame in missing_a else "BASE"
        reason = f"different capture: {frame} traced in {side} only"
        if frame == "gpu_ops":
            out.blockers.append(reason)
        for scope in FRAME_SCOPES.get(frame, ()):
            out.scopes.setdefault(scope, reason)
        if frame not in FRAME_SCOPES and frame != "gpu_ops":
            out.notes.append(reason)
    if a.capture_types and b.capture_types and a.capture_types != b.capture_types:
        only = sorted(set(a.capture_types) ^ set(b.capture_types))
        reason = f"different capture: traced domains differ ({', '.join(only)})"
        for t in only:
            frame = CAPTURE_FRAMES.get(t)
            if frame == "gpu_ops":
                out.blockers.append(reason)
            for scope in FRAME_SCOPES.get(frame or "", ()):
                out.scopes.setdefault(scope, reason)
        out.notes.append(reason)
    if a.graph_mode and b.graph_mode and a.graph_mode != b.graph_mode:
        out.scopes["graph"] = (f"different capture: CUDA graph trace mode {a.graph_mode} vs "
                               f"{b.graph_mode} (per-kernel counts and times differ by design)")
    elif (a.graph_mode is None) != (b.graph_mode is None):
        out.notes.append("CUDA graph trace mode known on one side only")
    for side, info in (("BASE", a), ("NEW", b)):
        if not info.n_steps:
            out.scopes.setdefault("steps", f"missing steps in {side}: {info.steps_note}")
    if a.n_steps and b.n_steps and a.steps_source != b.steps_source:
        # step sources name NVTX patterns from the trace: code spans (reasons are Markdown)
        out.scopes.setdefault("steps", f"step boundaries differ: {md_code(a.steps_source)} vs "
                                       f"{md_code(b.steps_source)}")
    _device_sets(a, b, out)
    if a.n_devices > 1 or b.n_devices > 1:
        out.notes.append("several devices: per-step metrics use the primary device; layer "
                         "times sum over devices")
    return out


def _ids(devices: tuple[int, ...]) -> str:
    return ", ".join(map(str, devices)) or "none"


def _device_sets(a: RunInfo, b: RunInfo, out: Comparability) -> None:
    """Runs on different sets of GPUs are not comparable (a GPU less halves the kernel time
    and moves every per-device share), unless the user selected the devices to compare
    (``--devices``): then those must be in both runs, and the metrics that sum over every
    device (kernels, layers) stay not comparable while the full sets differ."""
    if not a.all_devices or not b.all_devices:
        return  # unknown on one side (no overlap table): nothing to check
    selected = a.selected_devices if a.selected_devices is not None else b.selected_devices
    if selected is None:
        if a.all_devices != b.all_devices:
            out.blockers.append(
                f"different devices: BASE has GPU {_ids(a.all_devices)}, NEW has GPU "
                f"{_ids(b.all_devices)}; compare the GPUs both have with --devices "
                f"{','.join(map(str, sorted(set(a.all_devices) & set(b.all_devices))))}"
                if set(a.all_devices) & set(b.all_devices) else
                f"different devices: BASE has GPU {_ids(a.all_devices)}, NEW has GPU "
                f"{_ids(b.all_devices)}, none in common")
        return
    for side, info in (("BASE", a), ("NEW", b)):
        absent = sorted(set(selected) - set(info.all_devices))
        if absent:
            out.blockers.append(f"--devices {_ids(tuple(absent))}: not in {side} (its GPUs: "
                                f"{_ids(info.all_devices)})")
    if a.all_devices != b.all_devices:
        reason = (f"kernel and layer times sum over every GPU and the runs have different GPUs "
                  f"(BASE {_ids(a.all_devices)}, NEW {_ids(b.all_devices)}): --devices "
                  "selects only per-device metrics")
        for scope in ("kernel", "layer", "graph"):
            out.scopes.setdefault(scope, reason)
    else:
        out.notes.append(f"compared GPU {_ids(selected)} of {_ids(a.all_devices)}; kernel and "
                         "layer times are totals over every GPU")


@dataclass
class DiffResult:
    base: MetricSet
    new: MetricSet
    params: DiffParams
    rows: pl.DataFrame  # DIFF schema
    decomposition: pl.DataFrame  # decompose.DECOMPOSITION schema
    check: Comparability

    @property
    def comparable(self) -> bool:
        return self.check.comparable

    def counts(self) -> dict[str, int]:
        got = dict(self.rows.group_by("verdict").len().iter_rows())
        return {v: int(got.get(v, 0)) for v in VERDICTS}

    def row(self, metric: str, stat: str = "mean") -> dict[str, Any] | None:
        r = self.rows.filter((pl.col("metric") == metric) & (pl.col("stat") == stat))
        if r.is_empty():
            r = self.rows.filter((pl.col("metric") == metric) & (pl.col("stat") == "value"))
        return None if r.is_empty() else r.row(0, named=True)

    def verdict(self) -> str:
        """The headline: the verdict of mean step time (else of any metric)."""
        if not self.comparable:
            return "not comparable"
        step = self.row("step_time_ns")
        if step is not None and step["verdict"] != "not comparable":
            return str(step["verdict"])
        c = self.counts()
        return "regressed" if c["regressed"] else "improved" if c["improved"] else "unchanged"

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": "1",
            "base": {"trace_id": self.base.trace_id, "source": self.base.source,
                     "info": self.base.info.to_dict()},
            "new": {"trace_id": self.new.trace_id, "source": self.new.source,
                    "info": self.new.info.to_dict()},
            "verdict": self.verdict(),
            "comparable": self.comparable,
            "not_comparable": {"all": self.check.blockers, "scopes": self.check.scopes},
            "notes": self.check.notes,
            "kernel_mix_similarity": self.check.kernel_mix_similarity,
            "counts": self.counts(),
            "params": {"stats": asdict(self.params.stats),
                       "min_kernel_mix_similarity": self.params.min_kernel_mix_similarity,
                       "step_stats": list(self.params.step_stats)},
            "decomposition": self.decomposition.to_dicts(),
            "metrics": self.rows.to_dicts(),
        }


def _floor(spec: MetricSpec, params: StatsParams, base_step_ns: float | None) -> float:
    if spec.floor == "step":
        return params.min_step_frac * (base_step_ns or 0.0)
    if spec.floor == "frac":
        return params.frac_floor
    if spec.floor == "count":
        return params.count_floor
    return 0.0


def _zero_like(m: Metric, n_steps: int) -> Metric:
    """The value of an additive per-step metric in a run where its selector never occurred."""
    samples = np.zeros(n_steps) if m.samples is not None and n_steps else None
    return Metric(m.kind, m.selector, m.name, 0.0, samples, None, m.window,
                  "absent in this run: 0")


def _row(key: str, spec: MetricSpec, stat: str, mb: Metric | None, mn: Metric | None,
         c: Comparison | None, reason: str | None) -> dict[str, Any]:
    m = mb or mn
    assert m is not None
    verdict = c.verdict if c is not None else "not comparable"
    return {
        "metric": key, "kind": spec.kind, "selector": m.selector, "name": spec.name,
        "stat": stat, "unit": spec.unit, "better": spec.better,
        "base": c.base if c else (mb.value if mb else None),
        "new": c.new if c else (mn.value if mn else None),
        "delta": c.delta if c else None, "rel_delta": c.rel_delta if c else None,
        "ci_low": c.ci_low if c else None, "ci_high": c.ci_high if c else None,
        "threshold": c.threshold if c else None,
        "n_base": None if mb is None or mb.samples is None else int(mb.samples.size),
        "n_new": None if mn is None or mn.samples is None else int(mn.samples.size),
        "method": c.method if c else "none", "verdict": verdict,
        "reason": reason if reason is not None else (c.reason if c else None),
    }


def diff(base: MetricSet, new: MetricSet, params: DiffParams = DiffParams()) -> DiffResult:
    """Compare every metric of ``base`` and ``new`` (see the module docstring)."""
    check = comparability(base, new, params)
    base_step = base.value("step_time_ns")
    resampler = Resampler(params.stats.n_boot, params.stats.seed)
    keys = sorted(set(base.metrics) | set(new.metrics), key=lambda k: _sort_key(base, new, k))
    rows = []
    for key in keys:
        mb, mn = base.metrics.get(key), new.metrics.get(key)
        spec = (mb or mn).spec  # type: ignore[union-attr]
        windows = tuple(m.window for m in (mb, mn) if m is not None)
        reason = check.reason_for(spec, windows)
        if reason is None and (mb is None or mn is None):
            if spec.kind is not None and spec.additive:
                n = (base if mb is None else new).info.n_steps
                mb, mn = mb or _zero_like(mn, n), mn or _zero_like(mb, n)  # type: ignore[arg-type]
            else:
                side = "BASE" if mb is None else "NEW"
                reason = f"not measured in {side}"
        if reason is None and len(set(windows)) > 1:
            reason = "measured over different windows (steps vs whole trace)"
        if reason is None:
            missing = [m.note for m in (mb, mn) if m is not None and m.value is None]
            if missing:
                reason = missing[0] or "no value"
        stats = params.step_stats if key == "step_time_ns" else (
            ("mean",) if spec.sampled else ("value",))
        for stat in stats:
            c = None
            if reason is None:
                assert mb is not None and mn is not None
                c = compare_samples(
                    (mb.value, mb.samples, mb.weights), (mn.value, mn.samples, mn.weights),
                    stat="mean" if stat == "value" else stat, better=spec.better,
                    floor=_floor(spec, params.stats, base_step), params=params.stats,
                    resampler=resampler)
            rows.append(_row(key, spec, stat, mb, mn, c, reason))
    table = pl.DataFrame(rows, schema=DIFF)
    return DiffResult(base, new, params, table, dec.delta_decomposition(base, new), check)


_SPEC_ORDER = {(s.kind, s.name): i for i, s in enumerate(CATALOGUE)}


def _sort_key(base: MetricSet, new: MetricSet, key: str) -> tuple[int, int, str]:
    m = base.metrics.get(key) or new.metrics[key]
    return (_ORDER.get(m.kind, len(KINDS)), _SPEC_ORDER.get((m.kind, m.name), 99),
            m.selector or "")
