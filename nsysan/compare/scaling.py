"""``nsysan scaling``: how much efficiency was lost between two scales of one job, and to what.

Each run is one job at one scale, measured by `nsysan.compare.scaling_measure`. For every pair
of runs (fewer GPUs first):

**Scaling efficiency** is the ratio of throughput per GPU, ``E = (W_b / (t_b G_b)) /
(W_a / (t_a G_a))`` with ``W`` the work per step (samples or tokens, given per run), ``t`` the
mean step time and ``G`` the GPU count found in the data (distinct devices used by the rank
processes). Strong scaling (the same global work at both scales, ``W_a = W_b``) gives ``E =
t_a G_a / (t_b G_b)``; weak scaling (``--weak``: constant work per GPU, ``W ∝ G``) gives ``E =
t_a / t_b``. 1 is perfect. The interval is a percentile bootstrap of the per-step samples
(the mean over ranks of each common steady step), the resampling `nsysan diff` uses
(`nsysan.compare.stats.Resampler`), at the same confidence.

**Step-time growth** ``t_b - t_a`` is decomposed by engine state (compute, exposed
communication, copies, idle) and by layer (NVTX layers, the outside-ranges remainder, GPU
idle); each partition's items are means over the same (rank, step) pairs as the step time, so
they sum exactly to the change.

**End-of-step gap**: per run the mean over ranks and steps of the time after the last compute
kernel of the step (communication or nothing), and how much of it is communication.

**Who grew**: ranks by the waiting they imposed on the others per step (arrival skew at
collectives, `nsysan.multirank`) and by idle time, collectives by their change per step.

**Not comparable** (``comparable`` false, exit 4 in the CLI, with every reason): a run
without common steady steps, runs whose compute-kernel mix differs (different workloads,
`kernel_mix_similarity` below the threshold), runs that are all on the same number of GPUs.
Two runs at one scale among others (before and after a fix) form no pair: a note says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from nsysan.compare.scaling_measure import STATES, LinkParams, ScaleRun
from nsysan.compare.stats import Resampler, StatsParams
from nsysan.errors import ConfigError
from nsysan.passes.base import Finding

EFFICIENCY = pl.Schema({
    "base": pl.String, "new": pl.String, "base_gpus": pl.Int64, "new_gpus": pl.Int64,
    "mode": pl.String,  # weak | work (throughput per GPU from the given work per step)
    "base_step_ns": pl.Float64, "new_step_ns": pl.Float64,
    "base_throughput_per_gpu": pl.Float64, "new_throughput_per_gpu": pl.Float64,
    "efficiency": pl.Float64, "ci_low": pl.Float64, "ci_high": pl.Float64,
    "confidence": pl.Float64,
    "n_base": pl.Int64, "n_new": pl.Int64,
    "base_end_gap_ns": pl.Float64, "new_end_gap_ns": pl.Float64,
    "base_end_gap_comm_ns": pl.Float64, "new_end_gap_comm_ns": pl.Float64,
})
DECOMPOSITION = pl.Schema({
    "base": pl.String, "new": pl.String, "by": pl.String, "item": pl.String,
    "kind": pl.String, "base_ns_per_step": pl.Float64, "new_ns_per_step": pl.Float64,
    "delta_ns_per_step": pl.Float64, "share_of_delta": pl.Float64,
})
STATE_LABEL = {"communication": "exposed communication", "compute": "compute",
               "copies": "copies", "idle": "GPU idle"}


@dataclass(frozen=True)
class ScalingParams:
    weak: bool = False
    #: work per step of each run, in the order given (samples or tokens); None with weak
    work_per_step: tuple[float, ...] | None = None
    work_unit: str = "samples"
    stats: StatsParams = field(default_factory=StatsParams)
    min_kernel_mix_similarity: float = 0.5
    link: LinkParams = field(default_factory=LinkParams)

    def __post_init__(self) -> None:
        if self.weak == (self.work_per_step is not None):
            raise ConfigError("give the work per step of every run (--samples-per-step or "
                              "--tokens-per-step, one value per run) or --weak, not both")
        if self.work_per_step is not None and any(not w > 0 for w in self.work_per_step):
            raise ConfigError("work per step must be positive")
        if not 0 <= self.min_kernel_mix_similarity <= 1:
            raise ConfigError("min_kernel_mix_similarity must be in [0, 1]")


@dataclass
class ScalingResult:
    runs: list[ScaleRun]
    params: ScalingParams
    efficiency: pl.DataFrame  # EFFICIENCY, one row per pair
    decomposition: pl.DataFrame  # DECOMPOSITION
    ranks: pl.DataFrame  # per run and rank (scaling_measure._ranks) + growth vs the base
    collectives: pl.DataFrame  # per run and op
    blockers: list[str]
    notes: list[str]
    findings: list[Finding]
    verdict: str
    similarity: dict[str, float | None]

    @property
    def comparable(self) -> bool:
        return not self.blockers

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": "1",
            "comparable": self.comparable,
            "not_comparable": self.blockers,
            "verdict": self.verdict,
            "notes": self.notes,
            "params": {"weak": self.params.weak,
                       "work_per_step": list(self.params.work_per_step or []),
                       "work_unit": self.params.work_unit,
                       "confidence": self.params.stats.confidence,
                       "n_boot": self.params.stats.n_boot,
                       "min_kernel_mix_similarity": self.params.min_kernel_mix_similarity},
            "runs": [{"run": r.run, "source": r.source, "n_gpus": r.n_gpus,
                      "n_ranks": r.n_ranks, "n_nodes": r.n_nodes,
                      "n_steps": len(r.step_numbers), "gpu_names": r.gpu_names,
                      "kernel_mix_similarity_to_first": self.similarity.get(r.run),
                      "notes": r.notes} for r in self.runs],
            "efficiency": self.efficiency.to_dicts(),
            "decomposition": self.decomposition.to_dicts(),
            "collectives": self.collectives.to_dicts(),
            "findings": [{"code": f.code, "severity": f.severity, "title": f.title,
                          "message": f.message, "evidence": f.evidence}
                         for f in self.findings],
        }


def _similarity(a: ScaleRun, b: ScaleRun) -> float | None:
    if not a.kernel_mix or not b.kernel_mix:
        return None

    def inter(x: dict[str, float], y: dict[str, float]) -> float:
        return float(sum(min(v, y.get(k, 0.0)) for k, v in x.items()))

    return (inter(a.kernel_mix, b.kernel_mix) + inter(a.launch_mix, b.launch_mix)) / 2


def _efficiency(a: ScaleRun, b: ScaleRun, wa: float, wb: float, params: ScalingParams,
                resampler: Resampler) -> dict[str, Any]:
    xa = a.step_samples()["duration_ns"].to_numpy().astype(np.float64)
    xb = b.step_samples()["duration_ns"].to_numpy().astype(np.float64)
    ta, tb = float(a.steps["duration_ns"].mean()), float(b.steps["duration_ns"].mean())  # type: ignore[arg-type]
    # throughput per GPU, per second (work per ns x 1e9)
    pa, pb = wa / (ta * a.n_gpus) * 1e9, wb / (tb * b.n_gpus) * 1e9
    scale = (wb / b.n_gpus) / (wa / a.n_gpus)
    lo = hi = None
    st = params.stats
    if xa.size >= st.min_samples and xb.size >= st.min_samples:
        ra = resampler.replicates(xa, None, "mean", 0)
        rb = resampler.replicates(xb, None, "mean", 1)
        alpha = (1 - st.confidence) / 2
        lo, hi = (float(v) for v in np.quantile(scale * ra / rb, [alpha, 1 - alpha]))

    def gap(r: ScaleRun, col: str) -> float | None:
        v = r.steps[col].mean()
        return None if v is None else float(v)  # type: ignore[arg-type]

    return {
        "base": a.run, "new": b.run, "base_gpus": a.n_gpus, "new_gpus": b.n_gpus,
        "mode": "weak" if params.weak else "work", "base_step_ns": ta, "new_step_ns": tb,
        "base_throughput_per_gpu": pa, "new_throughput_per_gpu": pb,
        "efficiency": pb / pa, "ci_low": lo, "ci_high": hi, "confidence": st.confidence,
        "n_base": int(xa.size), "n_new": int(xb.size),
        "base_end_gap_ns": gap(a, "end_gap_ns"), "new_end_gap_ns": gap(b, "end_gap_ns"),
        "base_end_gap_comm_ns": gap(a, "end_gap_comm_ns"),
        "new_end_gap_comm_ns": gap(b, "end_gap_comm_ns"),
    }


def item_means(r: ScaleRun) -> pl.DataFrame:
    """``by, item, kind, ns``: mean ns per (rank, step) of every item of both partitions."""
    n = r.steps.height
    states = pl.DataFrame({
        "by": ["state"] * len(STATES), "item": list(STATES), "kind": ["state"] * len(STATES),
        "ns": [float(r.steps[f"{s}_ns"].sum()) / n if n else 0.0 for s in STATES]})
    layers = (r.layers.group_by("item", "kind").agg((pl.col("ns").sum() / max(n, 1))
                                                     .alias("ns"))
              .select(pl.lit("layer").alias("by"), "item", "kind", "ns"))
    return pl.concat([states, layers])


def _decomposition(a: ScaleRun, b: ScaleRun, total: float) -> pl.DataFrame:
    ma, mb = item_means(a), item_means(b)
    d = (ma.rename({"ns": "base_ns_per_step"})
         .join(mb.rename({"ns": "new_ns_per_step"}), on=["by", "item", "kind"], how="full",
               coalesce=True)
         .with_columns(pl.col("base_ns_per_step", "new_ns_per_step").fill_null(0.0))
         .with_columns((pl.col("new_ns_per_step") - pl.col("base_ns_per_step"))
                       .alias("delta_ns_per_step")))
    return d.with_columns(
        pl.lit(a.run).alias("base"), pl.lit(b.run).alias("new"),
        (pl.col("delta_ns_per_step") / total if total else pl.lit(None, pl.Float64))
        .alias("share_of_delta"),
    ).select(list(DECOMPOSITION)).sort(
        ["by", pl.col("delta_ns_per_step").abs(), "kind", "item"],
        descending=[True, True, False, False])


def _bandwidth_findings(r: ScaleRun, link: LinkParams) -> list[Finding]:
    out = []
    if r.collectives.is_empty():
        return out
    judged = r.collectives.filter(
        pl.col("link_share").is_not_null() & (pl.col("message_bytes") >= link.min_bytes))
    for row in judged.iter_rows(named=True):  # one row per op
        share = row["link_share"]
        if share >= link.low_share:
            continue
        sev = "critical" if share < link.critical_share else "warning"
        out.append(Finding(
            code="NCCL_LOW_BANDWIDTH", severity=sev, layer="communication",
            title="Low NCCL bus bandwidth",
            message=(
                f"Run {r.run}: {row['op']} of {row['message_bytes'] / 2**20:.0f} MiB over "
                f"{row['n_ranks']} ranks ({row['scope']}) reaches a bus bandwidth of "
                f"{row['transfer_busbw_gbps']:.1f} GB/s over its transfer (first end minus "
                f"last arrival, so waiting for late ranks is excluded), {share:.0%} of the "
                f"{row['rated_gbps']:.0f} GB/s rated link ({row['rated_from']})."),
            evidence={"run": r.run, "op": row["op"], "busbw_gbps": row["transfer_busbw_gbps"],
                      "rated_gbps": row["rated_gbps"], "link_share": share,
                      "message_bytes": row["message_bytes"], "scope": row["scope"]},
        ))
    return out


def _rank_growth(a: ScaleRun, b: ScaleRun) -> pl.DataFrame:
    base = a.ranks.select(pl.col("step_ns", "end_gap_ns", "idle_ns").mean().name.prefix("_b"))
    return b.ranks.join(base, how="cross").select(
        pl.lit(a.run).alias("base"), *b.ranks.columns,
        (pl.col("step_ns") - pl.col("_bstep_ns")).alias("step_growth_ns"),
        (pl.col("end_gap_ns") - pl.col("_bend_gap_ns")).alias("end_gap_growth_ns"),
        (pl.col("idle_ns") - pl.col("_bidle_ns")).alias("idle_growth_ns"),
    )


def _ms(v: float | None) -> str:
    return "n/a" if v is None else f"{v / 1e6:.1f} ms"


def _verdict(a: ScaleRun, b: ScaleRun, eff: dict[str, Any], dec: pl.DataFrame,
             ranks: pl.DataFrame, findings: list[Finding]) -> str:
    ci = (f" ({params_conf(eff)} interval {eff['ci_low']:.1%}–{eff['ci_high']:.1%})"
          if eff["ci_low"] is not None else "")
    delta = eff["new_step_ns"] - eff["base_step_ns"]
    parts = [f"{a.run} → {b.run} ({a.n_gpus} → {b.n_gpus} GPUs): scaling efficiency "
             f"{eff['efficiency']:.1%}{ci}; "
             f"step time {_ms(eff['base_step_ns'])} → {_ms(eff['new_step_ns'])} "
             f"({'+' if delta >= 0 else ''}{delta / 1e6:.1f} ms per step)."]
    states = dec.filter(pl.col("by") == "state").sort("delta_ns_per_step", descending=True)
    if delta > 0 and states.height:
        top = states.row(0, named=True)
        rest = ", ".join(f"{STATE_LABEL[s['item']]} {s['delta_ns_per_step'] / 1e6:+.1f} ms"
                         for s in states.slice(1).iter_rows(named=True))
        parts.append(f"The loss is {STATE_LABEL[top['item']]}: "
                     f"{top['delta_ns_per_step'] / 1e6:+.1f} ms per step "
                     f"({top['share_of_delta']:.1%} of the growth; {rest}).")
    gap_a, gap_b = eff["base_end_gap_comm_ns"], eff["new_end_gap_comm_ns"]
    if gap_b is not None and gap_a is not None:
        if b.collectives.is_empty():
            parts.append(f"No NCCL kernels: every step ends with {_ms(eff['new_end_gap_ns'])} "
                         f"of copies or idle GPU after the last compute kernel (was "
                         f"{_ms(eff['base_end_gap_ns'])}).")
        else:
            op = b.collectives.sort(["exposed_ns_per_step", "op"],
                                    descending=[True, False])["op"][0]
            parts.append(f"Every step now ends with {_ms(gap_b)} of exposed {op} after the "
                         f"last compute kernel (was {_ms(gap_a)}).")
    for f in findings:
        if f.evidence.get("run") == b.run:
            e = f.evidence
            parts.append(f"{e['op']} reaches {e['busbw_gbps']:.1f} GB/s bus bandwidth, "
                         f"{e['link_share']:.0%} of the rated {e['rated_gbps']:.0f} GB/s "
                         f"{e['scope']} link.")
    if not b.collectives.is_empty() and b.collectives["transfer_busbw_gbps"].null_count() \
            == b.collectives.height:
        parts.append("Message sizes are unknown in these profiles: bandwidth not measured.")
    late = ranks.filter(pl.col("wait_imposed_ns_per_step") > 0).sort(
        ["wait_imposed_ns_per_step", "rank"], descending=[True, False])
    if late.height:
        r = late.row(0, named=True)
        idle = r["idle_growth_ns"]
        host = _host_evidence(b)
        others = max(b.n_ranks - 1, 1)
        parts.append(f"Rank {r['rank']} arrived last at {r['n_last']} collectives, making each "
                     f"other rank wait {_ms(r['wait_imposed_ns_per_step'] / others)} per step "
                     f"on average"
                     + (f"; its GPU idles {_ms(idle)} more per step than the "
                        f"{a.n_gpus}-GPU ranks" if idle and idle > 0 else "")
                     + f" ({host}).")
    return " ".join(parts)


def params_conf(eff: dict[str, Any]) -> str:
    return f"{eff['confidence']:.0%}"


def _host_evidence(r: ScaleRun) -> str:
    codes = {f.code for f in r.job.findings}
    hits = sorted({*(c for c in codes if "CONTENTION" in c or "CPU" in c), *r.host_findings})
    if hits:
        return f"host evidence: {', '.join(hits)} — check CPU binding (mpirun --bind-to core)"
    if r.host_captured:
        return ("the rank profiles' CPU sampling and scheduling show no CPU contention; "
                "binding ranks to cores is unlikely to help")
    return ("no host evidence in these profiles (record with `nsys profile --sample=cpu "
            "--cpuctxsw=process-tree`); if NCCL and compute threads share cores, bind ranks "
            "to cores")


def scaling(runs: list[ScaleRun], params: ScalingParams) -> ScalingResult:
    """Compare the runs pairwise (see the module docstring)."""
    if len(runs) < 2:
        raise ConfigError("nsysan scaling needs at least two runs")
    if params.work_per_step is not None and len(params.work_per_step) != len(runs):
        raise ConfigError(f"{len(params.work_per_step)} work-per-step values for {len(runs)} "
                          "runs: give one per run, in the order of the runs")
    blockers: list[str] = []
    notes: list[str] = []
    similarity: dict[str, float | None] = {}
    for r in runs:
        if r.steps.is_empty():
            blockers.append(f"missing steps in run {r.run}: no steady step common to every "
                            "rank (name steps with an NVTX range such as `train_step`)")
        sim = _similarity(runs[0], r)
        similarity[r.run] = sim
        if sim is not None and sim < params.min_kernel_mix_similarity:
            blockers.append(f"different workloads: compute-kernel mix of run {r.run} matches "
                            f"run {runs[0].run} only {sim:.2f} < "
                            f"{params.min_kernel_mix_similarity:.2f}")
        notes += [f"{r.run}: {n}" for n in r.notes]
    work = list(params.work_per_step or [float(r.n_gpus) for r in runs])
    order = sorted(range(len(runs)), key=lambda i: (runs[i].n_gpus, i))
    pairs = [(order[i], order[j]) for i in range(len(order)) for j in range(i + 1, len(order))]
    same = [(i, j) for i, j in pairs if runs[i].n_gpus == runs[j].n_gpus]
    for i, j in same:
        reason = (f"runs {runs[i].run} and {runs[j].run} both use {runs[i].n_gpus} GPUs: not "
                  "two scales (compare them with `nsysan diff`)")
        (notes if len(same) < len(pairs) else blockers).append(reason)
    pairs = [p for p in pairs if p not in same]
    findings = [f for r in runs for f in _bandwidth_findings(r, params.link)]
    collectives = pl.concat([r.collectives for r in runs if not r.collectives.is_empty()],
                            how="diagonal_relaxed") if any(
        not r.collectives.is_empty() for r in runs) else pl.DataFrame()
    if blockers:
        return ScalingResult(runs, params, pl.DataFrame(schema=EFFICIENCY),
                             pl.DataFrame(schema=DECOMPOSITION), pl.DataFrame(), collectives,
                             blockers, notes, findings, "not comparable: " + "; ".join(blockers),
                             similarity)
    resampler = Resampler(params.stats.n_boot, params.stats.seed)
    effs, decs, growth, verdicts = [], [], [], []
    for i, j in pairs:
        a, b = runs[i], runs[j]
        eff = _efficiency(a, b, work[i], work[j], params, resampler)
        dec = _decomposition(a, b, eff["new_step_ns"] - eff["base_step_ns"])
        g = _rank_growth(a, b)
        effs.append(eff)
        decs.append(dec)
        growth.append(g)
        verdicts.append(_verdict(a, b, eff, dec, g, findings))
    return ScalingResult(
        runs, params, pl.DataFrame(effs, schema=EFFICIENCY), pl.concat(decs),
        pl.concat(growth), collectives, blockers, notes, findings, "\n\n".join(verdicts),
        similarity)
