"""Judgement: how much activity a severity needs, so that small traces raise no false alarms.

A symptom finding (`JUDGED`) measures a share of the analysed window; on a trace with two
kernels that share means nothing. So its severity is capped by the activity there is to judge:

- **warning** needs >= ``judge_warn_min_ops`` GPU ops (kernels, copies, memsets) starting in
  the analysed window, >= ``judge_warn_min_ns`` of analysed device time, and repetition:
  >= ``judge_warn_min_steps`` steps, or without steps >= ``judge_warn_min_ops_without_steps``
  ops;
- **critical** also needs >= ``judge_crit_min_ns`` and a steady state: >= ``judge_crit_min_steps``
  steps, or without steps >= ``judge_crit_min_ops`` ops.

Below that the finding is kept at the highest severity the activity allows (``info`` at
least) and its message says why. Capture-quality findings, SLOW_START (one event by nature)
and DOMINANT_LAYER (always info) are not capped. A trace below the warning minimums gets the
verdict ``insufficient-data`` with what to capture instead (`insufficient_verdict`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import polars as pl

from nsysan.findings.context import Context
from nsysan.findings.evidence import fmt_ns
from nsysan.passes.base import SEVERITIES, Finding

#: Codes whose severity the activity caps (other branches may add theirs).
JUDGED = frozenset({
    "GPU_STARVATION_PERIODIC", "H2D_NOT_OVERLAPPED", "PAGEABLE_OR_SYNC_COPIES",
    "HOST_SYNC_IN_STEP", "LAUNCH_BOUND", "EXPOSED_COMMUNICATION", "NCCL_LOW_BANDWIDTH",
    "NO_TENSOR_CORES", "MEMORY_CHURN", "STARTUP_COST",
})

#: The minimum-activity sentence of every judged code, for docs/findings.md.
RULE_TEXT = (
    "warning needs >= 20 GPU ops, >= 5 ms of device time in the analysed window and "
    "repetition (>= 2 steps, or >= 100 ops without steps), "
    "critical also >= 20 ms and >= 3 steps (or >= 200 ops without steps) "
    "(`findings.judge_*`); below that the finding is at "
    "most what the activity allows (info at least) and says why."
)


#: Extra judgement of single codes (docs/findings.md).
CODE_TEXT = {
    "MEMORY_CHURN": (
        "churn is repetition: with steps, allocation calls in >= 50% of the steady-state "
        "steps (`findings.churn_min_step_frac`, and >= 2 steps); without steps, >= 10 calls "
        "(`findings.churn_min_calls_without_steps`). Fewer are one-off allocations: info, "
        "saying so."),
    "LAUNCH_BOUND": (
        "gaps that a start-up call covers (first launch of a kernel, module loading, context "
        "creation) are STARTUP_COST, not launch-bound."),
    "GPU_STARVATION_PERIODIC": (
        "gaps that a start-up call covers are STARTUP_COST, not starvation."),
}

#: The page section on judgement and the verdict (docs/findings.md).
DOC = """## Judgement: activity, steady state, start-up and the verdict

- **Minimum activity.** A symptom finding measures a share of the analysed window; on a trace
  with a handful of kernels that share means nothing. Its severity is capped by the activity
  in the analysed window: warning needs >= 20 GPU ops (kernels, copies, memsets), >= 5 ms
  of device time and repetition: >= 2 steps, or >= 100 ops without steps
  (`judge_warn_min_steps`, `judge_warn_min_ops_without_steps`); critical also >= 20 ms
  and a steady state: >= 3 steps, or >= 200 ops without steps (`findings.judge_warn_min_ops`,
  `judge_warn_min_ns`, `judge_crit_min_ns`, `judge_crit_min_steps`, `judge_crit_min_ops`).
  Below that the finding
  stays at what the activity allows (info at least) and its message says why
  ("Held at info (measured critical): only ...").
- **Steady state** is the span of the non-warm-up steps when there are steps (NVTX, else a
  period of the kernel sequence); without steps, count-based rules skip the first 20% of the
  GPU span, and churn needs repetition (see MEMORY_CHURN).
- **Start-up costs** (first launch of each kernel under CUDA lazy loading / JIT, module and
  library loading, context creation, NCCL communicator init) are recognised by their calls
  (`nsysan.findings.startup`) and reported as STARTUP_COST; the idle gaps they cover count
  neither as launch-bound nor as starvation, and as *other* in the verdict.
- **Verdict.** A stall category (communication, input, launch) becomes the verdict when it
  takes >= 20% of steady-state device time (`findings.verdict_min_share`) and more than any
  other stall, or >= 10% (`verdict_finding_min_share`) when a warning- or critical-level
  finding reports it; any other warning-level stall finding is named in the reason ("Also
  reported: ..."), and a stall verdict that no warning-level finding reports says so, so
  verdict and findings never contradict. A trace below the warning
  minimums gets `insufficient-data`, with what to capture instead.
- Every threshold is settable: `nsysan analyze --set findings.PARAM=VALUE` (API:
  `analyze(..., settings={"findings.PARAM": "VALUE"})`); `nsysan findings` lists them with
  their defaults.
"""


@dataclass(frozen=True)
class Activity:
    n_ops: int  # GPU ops starting in the analysed window
    device_ns: int  # analysed device time
    n_steps: int | None

    def describe(self) -> str:
        steps = f"{self.n_steps} steady-state steps" if self.n_steps else "no steps"
        return f"{self.n_ops} GPU ops in {fmt_ns(self.device_ns)} of analysed device time, {steps}"


def activity(ctx: Context) -> Activity:
    win = ctx.window
    n = 0
    if win is not None and ctx.trace.has("gpu_ops"):
        n = int(ctx.trace.frame("gpu_ops").select(
            ((pl.col("start_ns") >= win[0]) & (pl.col("start_ns") < win[1])).sum()).item())
    return Activity(n, int(ctx.device_time_ns or 0), ctx.n_steps)


def allowed(ctx: Context, act: Activity) -> str:
    """The highest severity the activity supports."""
    p = ctx.params
    repeats = ((act.n_steps or 0) >= p.judge_warn_min_steps
               or act.n_ops >= p.judge_warn_min_ops_without_steps)
    if act.n_ops < p.judge_warn_min_ops or act.device_ns < p.judge_warn_min_ns or not repeats:
        return "info"
    steady = (act.n_steps or 0) >= p.judge_crit_min_steps or act.n_ops >= p.judge_crit_min_ops
    return "critical" if steady and act.device_ns >= p.judge_crit_min_ns else "warning"


def cap(ctx: Context, act: Activity, findings: list[Finding]) -> list[Finding]:
    """``findings`` with the severity of judged codes capped by the activity."""
    top = allowed(ctx, act)
    p = ctx.params
    need = (f">= {fmt_ns(p.judge_crit_min_ns)} and >= {p.judge_crit_min_steps} steps (or "
            f">= {p.judge_crit_min_ops} ops)" if top == "warning" else
            f">= {p.judge_warn_min_ops} ops, >= {fmt_ns(p.judge_warn_min_ns)} and >= "
            f"{p.judge_warn_min_steps} steps (or >= {p.judge_warn_min_ops_without_steps} ops)")
    out = []
    for f in findings:
        if f.code in JUDGED and SEVERITIES.index(f.severity) > SEVERITIES.index(top):
            note = (f" Held at {top} (measured {f.severity}): only {act.describe()}; "
                    f"{SEVERITIES[SEVERITIES.index(top) + 1]} needs {need}.")
            f = replace(f, severity=top, message=f.message + note)
        out.append(f)
    return out


def insufficient(ctx: Context, act: Activity) -> str | None:
    """Why the trace is too small to judge (the verdict's reason), or None."""
    p = ctx.params
    if act.n_ops == 0 or allowed(ctx, act) != "info":
        return None
    return (f"too little activity to judge: {act.describe()} (a verdict needs >= "
            f"{p.judge_warn_min_ops} ops, >= {fmt_ns(p.judge_warn_min_ns)} and >= "
            f"{p.judge_warn_min_steps} steps, or >= {p.judge_warn_min_ops_without_steps} ops "
            "without steps). Capture "
            "several steady-state iterations after warm-up, e.g. `nsys profile --delay` or "
            "a capture range (`--capture-range=cudaProfilerApi`) around 10-20 training steps "
            "marked with NVTX ranges.")
