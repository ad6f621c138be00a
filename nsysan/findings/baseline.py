"""The baseline block at the top of every report, and the verdict.

Baseline first (DESIGN.md): step time, throughput, GPU busy %, communication share, exposed
communication, memory; then the verdict compute- / communication- / input- / launch-bound.
Every value says where it came from; a value nsysan cannot compute is None with the reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import polars as pl

from nsysan.findings.context import Context
from nsysan.findings.evidence import fmt_frac
from nsysan.passes.base import Finding

VERDICTS = ("compute-bound", "communication-bound", "input-bound", "launch-bound",
            "undetermined", "insufficient-data")

#: The verdict category of each stall finding: a warning- or critical-level one lowers the
#: bar for that category to ``verdict_finding_min_share`` and is named in the reason, so the
#: verdict never contradicts the findings.
STALL_CATEGORY = {
    "GPU_STARVATION_PERIODIC": "input", "H2D_NOT_OVERLAPPED": "input",
    "PAGEABLE_OR_SYNC_COPIES": "input", "HOST_SYNC_IN_STEP": "launch",
    "LAUNCH_BOUND": "launch", "EXPOSED_COMMUNICATION": "communication",
}


@dataclass(frozen=True)
class BaselineItem:
    key: str
    label: str
    value: float | int | None
    unit: str  # as evidence units: ns, frac, count, bytes, 1/s, per_step
    source: str  # where the number comes from
    note: str | None = None  # why the value is missing, or a caveat
    device_id: int | None = None


@dataclass
class Baseline:
    window_start_ns: int | None
    window_end_ns: int | None
    window_source: str
    items: list[BaselineItem] = field(default_factory=list)

    def get(self, key: str) -> float | int | None:
        for it in self.items:
            if it.key == key and it.device_id is None:
                return it.value
        return None

    def to_dict(self) -> dict[str, Any]:
        return {"window": {"start_ns": self.window_start_ns, "end_ns": self.window_end_ns,
                           "source": self.window_source},
                "items": [asdict(i) for i in self.items]}


@dataclass(frozen=True)
class Verdict:
    label: str  # one of VERDICTS
    reason: str
    shares: dict[str, float]  # compute, communication, input, launch, other: device-time shares

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _steps_items(ctx: Context, samples: float | None, tokens: float | None) -> list[BaselineItem]:
    steps = ctx.steady_steps
    items: list[BaselineItem] = []
    if steps is None:
        why = ("the steps pass did not run" if ctx.table("steps") is None
               else "no step ranges in NVTX and no periodicity detected")
        seen = ctx.metric("step_periods_seen")
        if seen and ctx.metric("steps_reason"):  # periods were seen, and refused: say why
            why = f"{ctx.metric('steps_reason')} (periods seen: {seen})"
        items.append(BaselineItem("step_time_mean_ns", "step time", None, "ns", "steps", why))
    else:
        d = steps["duration_ns"].cast(pl.Float64)
        src = f"steps ({steps['source'][0]}), {steps.height} steady-state steps"
        note = None
        if steps["source"][0] == "periodicity":
            note = (f"a period of {ctx.metric('step_period_kernels')} kernels (periods seen: "
                    f"{ctx.metric('step_periods_seen')}); a period may be a repeated block "
                    "rather than an iteration: NVTX step ranges settle it")
        items += [
            BaselineItem("n_steps", "steady-state steps", steps.height, "count", src, note),
            BaselineItem("step_time_mean_ns", "step time (mean)", float(d.mean()), "ns", src),
            BaselineItem("step_time_p50_ns", "step time (p50)", float(d.quantile(0.5,
                         "nearest")), "ns", src),
            BaselineItem("step_time_p95_ns", "step time (p95)", float(d.quantile(0.95,
                         "nearest")), "ns", src),
        ]
    mean_s = (float(steps["duration_ns"].mean()) / 1e9) if steps is not None else None
    for key, label, per_step, flag in (("samples_per_s", "throughput (samples/s)", samples,
                                        "--samples-per-step"),
                                       ("tokens_per_s", "throughput (tokens/s)", tokens,
                                        "--tokens-per-step")):
        if per_step is None:
            if key == "samples_per_s" or tokens is not None:
                items.append(BaselineItem(key, label, None, "1/s", "options",
                                          f"pass {flag} to compute it"))
            continue
        if not mean_s:
            items.append(BaselineItem(key, label, None, "1/s", "options", "needs step times"))
            continue
        items.append(BaselineItem(key, label, per_step / mean_s, "1/s",
                                  f"{flag}={per_step:g} / mean step time"))
    return items


def _device_items(ctx: Context) -> list[BaselineItem]:
    items: list[BaselineItem] = []
    st = ctx.state_time
    total = ctx.device_time_ns
    if st is None or not total:
        why = "the overlap pass did not run" if st is None else "no GPU activity"
        for key, label in (("gpu_busy_frac", "GPU busy"), ("comm_frac", "communication share"),
                           ("exposed_comm_frac", "exposed communication")):
            items.append(BaselineItem(key, label, None, "frac", "overlap", why))
        return items
    src = f"overlap, {ctx.window_source}"
    busy = 1 - st.get("idle", 0) / total
    _, comm = ctx.state_share("nccl", None)
    exp_ns, exp = ctx.state_share("nccl", "compute")
    _, h2d = ctx.state_share("h2d", "compute")
    items += [
        BaselineItem("gpu_busy_frac", "GPU busy", busy, "frac", src),
        BaselineItem("comm_frac", "communication share", comm, "frac", src),
        BaselineItem("exposed_comm_frac", "exposed communication", exp, "frac", src),
        BaselineItem("h2d_unoverlapped_frac", "H2D copies not overlapped", h2d, "frac", src),
    ]
    if ctx.n_steps:
        items.append(BaselineItem("exposed_comm_ns_per_step", "exposed communication per step",
                                  exp_ns / ctx.n_steps, "ns", src))
    ov = ctx.table("overlap_summary")
    if ov is not None and ov.height > 1:  # per-device busy share over the whole trace
        for r in ov.sort("device_id").iter_rows(named=True):
            if r["span_ns"]:
                items.append(BaselineItem("gpu_busy_frac", "GPU busy (whole trace)",
                                          r["busy_ns"] / r["span_ns"], "frac",
                                          "overlap_summary", device_id=r["device_id"]))
    return items


def _memory_items(ctx: Context) -> list[BaselineItem]:
    items: list[BaselineItem] = []
    gpus = ctx.trace.frame("gpus") if ctx.trace.has("gpus") else None
    if gpus is not None and gpus.height:
        used = (ctx.trace.frame("gpu_ops")["device_id"].unique().implode()
                if ctx.trace.has("gpu_ops") else gpus["device_id"].implode())
        for r in (gpus.filter(pl.col("device_id").is_in(used))
                  .sort("device_id", maintain_order=True).iter_rows(named=True)):
            if r["total_memory_bytes"]:
                items.append(BaselineItem("gpu_memory_bytes", f"GPU memory ({r['name']})",
                                          r["total_memory_bytes"], "bytes", "gpus",
                                          device_id=r["device_id"]))
    peak = ctx.metric("peak_memory_bytes")
    items.append(BaselineItem(
        "memory_used_bytes", "device memory in use (peak)", peak if isinstance(peak, int) else
        None, "bytes", "memory events",
        None if isinstance(peak, int) else
        "memory usage not captured or not analysed (record with --cuda-memory-usage=true)"))
    return items


def compute_baseline(ctx: Context, samples_per_step: float | None = None,
                     tokens_per_step: float | None = None) -> Baseline:
    win = ctx.window
    b = Baseline(win[0] if win else None, win[1] if win else None, ctx.window_source)
    b.items += _steps_items(ctx, samples_per_step, tokens_per_step)
    b.items += _device_items(ctx)
    if ctx.trace.has("gpu_ops") and win is not None:
        # counted by aggregation: filtering first would copy every kernel row
        n_k = int(ctx.trace.frame("gpu_ops").select(
            ((pl.col("kind") == "kernel") & (pl.col("start_ns") >= win[0])
             & (pl.col("start_ns") < win[1])).sum()).item())
        if ctx.n_steps:
            b.items.append(BaselineItem("kernels_per_step", "kernels per step",
                                        n_k / ctx.n_steps, "per_step", "gpu_ops"))
        else:
            b.items.append(BaselineItem("n_kernels", "kernels", n_k, "count", "gpu_ops"))
    b.items += _memory_items(ctx)
    return b


def compute_verdict(ctx: Context, findings: Sequence[Finding] = (),
                    insufficient: str | None = None) -> Verdict:
    """Split steady-state device time into compute / communication / input / launch / other
    and name the bottleneck.

    Partition of device time: states with compute → compute; else with nccl → communication;
    else with an H2D copy → input; other busy states → other. Idle: long gaps by cause (input:
    host-side causes; launch: launch calls or host syncs), short gaps (launch: late launch or
    sync drain) — see `Context.idle_breakdown`; the rest is other.

    ``insufficient`` (the judgement's reason, `nsysan.findings.judgement.insufficient`) makes
    the verdict ``insufficient-data``; ``findings`` at warning or above name their stall
    category (`STALL_CATEGORY`)."""
    st = ctx.state_time
    total = ctx.device_time_ns
    if st is None:
        return Verdict("undetermined", "the overlap pass did not run", {})
    if not total:
        return Verdict("undetermined", "no GPU activity in the trace", {})
    ns = {"compute": 0, "communication": 0, "input": 0, "launch": 0, "other": 0}
    for state, d in st.items():
        parts = state.split("+")
        if state == "idle":
            continue
        key = ("compute" if "compute" in parts else "communication" if "nccl" in parts
               else "input" if "h2d" in parts else "other")
        ns[key] += d
    idle = ctx.idle_breakdown
    ns["input"] += idle.get("input", 0) + idle.get("copy", 0)
    ns["launch"] += idle.get("launch", 0) + idle.get("sync", 0)
    # start-up idle (STARTUP_COST) is a one-off cost, not a bottleneck of the loop
    ns["other"] += idle.get("other", 0) + idle.get("unclassified", 0) + idle.get("startup", 0)
    shares = {k: v / total for k, v in ns.items()}
    named = {"communication": "exposed communication", "input": "input / host-side stalls",
             "launch": "launch / host-sync stalls"}
    detail = ", ".join(f"{named[k]} {fmt_frac(shares[k])}" for k in named)
    detail += f", other {fmt_frac(shares['other'])}"
    best = max(named, key=lambda k: shares[k])
    p = ctx.params
    flagged: dict[str, list[str]] = {}
    for f in findings:
        if f.code in STALL_CATEGORY and f.severity in ("warning", "critical"):
            flagged.setdefault(STALL_CATEGORY[f.code], []).append(f"{f.code} ({f.severity})")
    if insufficient is not None:
        return Verdict("insufficient-data", insufficient[0].upper() + insufficient[1:], shares)
    bar = p.verdict_finding_min_share if best in flagged else p.verdict_min_share
    if shares[best] >= bar:
        label = {"communication": "communication-bound", "input": "input-bound",
                 "launch": "launch-bound"}[best]
        why = (f"reported by {', '.join(flagged[best])}" if best in flagged
               and shares[best] < p.verdict_min_share else f">= {fmt_frac(p.verdict_min_share)}")
        reason = (f"{named[best]} take {fmt_frac(shares[best])} of steady-state device time "
                  f"({why}), more than any other stall; compute "
                  f"{fmt_frac(shares['compute'])}; {detail}.")
    elif shares["compute"] >= 0.5:
        label = "compute-bound"
        reason = (f"compute kernels run {fmt_frac(shares['compute'])} of steady-state device "
                  f"time and no stall reaches {fmt_frac(p.verdict_min_share)}: {detail}.")
    else:
        label = "undetermined"
        reason = (f"compute runs only {fmt_frac(shares['compute'])} of device time but no "
                  f"single stall reaches {fmt_frac(p.verdict_min_share)}: {detail}.")
    named_cat = best if label.startswith(best) else None
    if named_cat is not None and named_cat not in flagged:
        reason += (" No finding reports this stall at warning level (the stalls do not recur "
                   "regularly, or each cause stays under its rule's threshold): the gaps table "
                   "lists their causes.")
    also = [c for k, codes in sorted(flagged.items()) if k != named_cat for c in codes]
    if also:  # smaller stalls that findings report: the verdict says so
        reason += f" Also reported: {', '.join(also)}."
    return Verdict(label, reason, shares)
