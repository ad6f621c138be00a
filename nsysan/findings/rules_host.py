"""Rules on host evidence (the ``host`` pass: CPU sampling and context switches).

Each rule raises `NotEvaluated` when the host pass ran without evidence (the profile was
recorded without CPU sampling / context switches: the reason says how to record them).
`nsysan.findings.rules.diagnose` skips these rules entirely when the host pass was not
selected, so analyses without it are unchanged.

Thresholds (documented in the catalogue's severity rules):

- a gap is **CPU-bound** when the device's primary launching thread was busy for >= 80% of
  it (on-CPU share from ``sched``; without scheduling data, samples x period / gap) and at
  least half of its samples in the gap are in the framework or data-pipeline layers;
- a gap is **contended** when, for >= 50% of it, the primary launcher or a communication
  thread was off-CPU without blocking (``host_gaps.unblocked_off_cpu_ns``) or more threads of
  the process tree wanted a CPU than it ran on (``host_gaps.oversubscribed_ns``).
"""

from __future__ import annotations

from dataclasses import replace

import polars as pl

from nsysan.escape import md_code
from nsysan.findings.baseline import Verdict
from nsysan.findings.context import Context, NotEvaluated
from nsysan.findings.evidence import (
    evidence,
    fmt_frac,
    fmt_ns,
    grade,
    make_finding,
    metric,
    offender,
    windows_from,
)
from nsysan.passes.base import Finding

HOST_CODES = ("HOST_CPU_BOUND", "HOST_WAITS_ON_GPU", "CPU_CONTENTION")
HOW_TO_RECORD = "nsys profile --sample=cpu --cpuctxsw=process-tree"
BUSY_MIN_FRAC = 0.8
FRAMEWORK_MIN_FRAC = 0.5
DESCHEDULED_MIN_FRAC = 0.5
MIN_GAPS = 3
MIN_GAP_SAMPLES = 10
GAP_WARN_FRAC, GAP_CRIT_FRAC = 0.05, 0.2
DRIVER_MIN_FRAC = 0.6
DRIVER_MIN_SAMPLES = 100
GPU_BUSY_MIN_FRAC = 0.7
LAYER_LABELS = {"framework": "framework / Python", "data_pipeline": "data pipeline",
                "runtime_driver": "CUDA driver", "communication": "communication",
                "operator_library": "operator libraries", "os": "OS", "profiler": "profiler",
                "unknown": "unknown modules"}


def _need_host(ctx: Context) -> tuple[pl.DataFrame, pl.DataFrame]:
    threads = ctx.need_table("host_threads")
    gaps = ctx.need_table("host_gaps")
    state = str(ctx.metric("host_evidence") or "")
    if state.startswith("not captured"):
        raise NotEvaluated(f"host evidence (CPU sampling, context switches) not captured: "
                           f"record with `{HOW_TO_RECORD}`")
    return threads, gaps


def _window_gaps(ctx: Context, gaps: pl.DataFrame) -> pl.DataFrame:
    """The primary launcher's rows of gaps starting in the analysed window."""
    rows = gaps.filter(pl.col("primary_launcher"))
    if ctx.window is not None:
        t0, t1 = ctx.window
        rows = rows.filter(pl.col("gap_start_ns").is_between(t0, t1, closed="left"))
    return rows


def _device_time(ctx: Context) -> int:
    total = ctx.device_time_ns
    if total <= 0:
        raise NotEvaluated("no GPU activity in the trace")
    return total


def cpu_bound(ctx: Context) -> list[Finding]:
    """HOST_CPU_BOUND: the GPU idles while its launcher computes in framework/data code."""
    threads, gaps = _need_host(ctx)
    if not int(threads["n_samples"].sum()):
        raise NotEvaluated(f"no CPU samples in the trace: record with `{HOW_TO_RECORD}`")
    total = _device_time(ctx)
    period = ctx.metric("sampling_period_ns")
    rows = _window_gaps(ctx, gaps)
    by_samples = (pl.col("n_samples") * pl.lit(period or 0) / pl.col("duration_ns")).clip(0, 1)
    fw = pl.col("framework_samples") + pl.col("data_pipeline_samples")
    rows = rows.with_columns(_busy=pl.coalesce("on_cpu_frac", by_samples),
                             _fw=fw / pl.col("n_samples"))
    hit = rows.filter((pl.col("_busy") >= BUSY_MIN_FRAC) & (pl.col("n_samples") > 0)
                      & (pl.col("_fw") >= FRAMEWORK_MIN_FRAC))
    n_samples = int(hit["n_samples"].sum())
    if hit.height < MIN_GAPS or n_samples < MIN_GAP_SAMPLES:
        return []
    idle = int(hit["duration_ns"].sum())
    share = idle / total
    sev = grade(share, GAP_WARN_FRAC, GAP_CRIT_FRAC)
    if sev is None:
        return []
    busy = float((hit["_busy"] * hit["duration_ns"]).sum() / idle)
    split = {layer: int(hit[f"{layer}_samples"].sum()) / n_samples
             for layer in ("data_pipeline", "framework")}
    parts = ", ".join(f"{LAYER_LABELS[k]} {fmt_frac(v)}" for k, v in split.items() if v)
    longest = hit.sort(["duration_ns", "gap_start_ns"], descending=[True, False])
    top = longest["top_symbols"].drop_nulls().head(1).to_list()
    detail = longest["host_detail"].drop_nulls().head(1).to_list()
    tid = int(hit["tid"][0])
    msg = (f"The GPU was idle {fmt_ns(idle)} in {hit.height} gaps ({fmt_frac(share)} of "
           f"steady-state device time) while its launching thread (tid {tid}) was on-CPU "
           f"{fmt_frac(busy)} of that time in the framework / data pipeline ({parts} of its "
           f"{n_samples} samples there): the host computes instead of feeding the GPU."
           + (f" Longest gap ({fmt_ns(int(longest['duration_ns'][0]))}): {detail[0]}."
              if detail else "")
           + (f" Hottest leaf functions there: {top[0]}." if top else ""))
    metrics = [
        metric("cpu_bound_idle_ns", "device idle while the launcher was CPU-busy", idle, "ns"),
        metric("cpu_bound_idle_frac", "share of steady-state device time", share, "frac"),
        metric("n_gaps", "CPU-bound gaps", hit.height, "count"),
        metric("launcher_on_cpu_frac", "launcher on-CPU share in those gaps", busy, "frac"),
        *(metric(f"{k}_sample_frac", f"{LAYER_LABELS[k]} share of the samples", v, "frac")
          for k, v in split.items()),
    ]
    offenders = [offender("layer", k, v, "frac") for k, v in split.items() if v]
    win = longest.select("device_id", start_ns="gap_start_ns", end_ns="gap_end_ns")
    ev = evidence(metrics, windows_from(win, None, ctx.params.top_n, "CPU-bound gap"),
                  offenders)
    return [make_finding("HOST_CPU_BOUND", sev, msg, ev, pid=int(hit["pid"][0]))]


def waits_on_gpu(ctx: Context) -> list[Finding]:
    """HOST_WAITS_ON_GPU: the launcher's samples are mostly driver waits, the GPU is busy."""
    threads, _ = _need_host(ctx)
    if not int(threads["n_samples"].sum()):
        raise NotEvaluated(f"no CPU samples in the trace: record with `{HOW_TO_RECORD}`")
    st = ctx.state_time
    if st is None:
        raise NotEvaluated("the overlap pass did not run (no `overlap` table)")
    total = _device_time(ctx)
    busy = 1 - st.get("idle", 0) / total
    launchers = threads.filter((pl.col("role") == "launcher")
                               & (pl.col("n_samples") >= DRIVER_MIN_SAMPLES))
    if launchers.is_empty():
        return []
    main = launchers.sort(["n_samples", "global_tid"], descending=[True, False]).row(0,
                                                                                  named=True)
    driver = main["runtime_driver_frac"] or 0.0
    if driver < DRIVER_MIN_FRAC or busy < GPU_BUSY_MIN_FRAC:
        return []
    name = main["name"] or f"tid {main['tid']}"
    msg = (f"{fmt_frac(driver)} of the {main['n_samples']} CPU samples of the launching "
           f"thread {name} are in the CUDA driver (waits, clock polling) while the GPU is busy "
           f"{fmt_frac(busy)} of the steady-state device time: the run is GPU-bound, and "
           f"CPU-side tuning (data loading, Python) will not make it faster.")
    metrics = [
        metric("driver_sample_frac", "launcher samples in the CUDA driver", driver, "frac"),
        metric("launcher_samples", "launcher samples", main["n_samples"], "count"),
        metric("gpu_busy_frac", "GPU busy share of steady-state device time", busy, "frac"),
        metric("launcher_on_cpu_ns", "launcher on-CPU time", main["on_cpu_ns"], "ns"),
    ]
    ev = evidence(metrics, (), [offender("layer", "runtime_driver", driver, "frac")])
    return [make_finding("HOST_WAITS_ON_GPU", "info", msg, ev, pid=int(main["pid"]))]


def _contention_rows(ctx: Context, gaps: pl.DataFrame) -> pl.DataFrame:
    """One row per device gap in the window: the primary launcher's unblocked off-CPU time
    (``_l``), the most descheduled communication thread's (``_c``, its ``_c_tid``), and the
    oversubscribed time (``_o``); ``_lost``: the largest of the three."""
    rows = gaps
    if ctx.window is not None:
        t0, t1 = ctx.window
        rows = rows.filter(pl.col("gap_start_ns").is_between(t0, t1, closed="left"))
    keys = ["device_id", "gap_start_ns"]
    launcher = rows.filter(pl.col("primary_launcher")).select(
        *keys, "gap_end_ns", "duration_ns", "pid", _l="unblocked_off_cpu_ns",
        _l_tid="tid", _o="oversubscribed_ns")
    comm = (rows.filter(pl.col("role") == "communication")
            .sort([*keys, "unblocked_off_cpu_ns", "global_tid"],
                  descending=[False, False, True, False], nulls_last=True)
            .group_by(keys, maintain_order=True)
            .agg(_c=pl.col("unblocked_off_cpu_ns").first(), _c_tid=pl.col("tid").first()))
    out = launcher.join(comm, on=keys, how="left", maintain_order="left")
    return out.with_columns(
        _lost=pl.max_horizontal(pl.col("_l").fill_null(0), pl.col("_c").fill_null(0),
                                pl.col("_o").fill_null(0)).clip(upper_bound=pl.col(
                                    "duration_ns")))


def contention(ctx: Context) -> list[Finding]:
    """CPU_CONTENTION: while the GPU idled, the launching or a communication thread could
    run but had no CPU, or the process's threads wanted more CPUs than it ran on."""
    threads, gaps = _need_host(ctx)
    rule = ctx.metric("deschedule_rule")
    if rule is None:
        raise NotEvaluated(
            "no evidence of involuntary descheduling: context switches without thread states "
            "need OS-runtime calls to tell sleeping from waiting for a CPU; "
            f"record with `{HOW_TO_RECORD} --trace=cuda,osrt`")
    total = _device_time(ctx)
    rows = _contention_rows(ctx, gaps)
    half = DESCHEDULED_MIN_FRAC * pl.col("duration_ns")
    hit = rows.filter(pl.col("_lost") >= half)
    if hit.height < MIN_GAPS:
        return []
    lost = int(hit["_lost"].sum())
    share = lost / total
    sev = grade(share, GAP_WARN_FRAC, GAP_CRIT_FRAC)
    if sev is None:
        return []
    by = {k: hit.filter(pl.col(c).fill_null(0) >= half)
          for k, c in (("launcher", "_l"), ("comm", "_c"), ("over", "_o"))}
    tid = int(hit["_l_tid"][0])
    me = threads.filter(pl.col("tid") == tid)
    migrations = int(me["n_migrations"].sum()) if me.height else 0
    switches = int(me["n_switches"].sum()) if me.height else 0
    cpus = ctx.metric("cpus_seen")
    parts = []
    if by["launcher"].height:
        parts.append(f"the launching thread (tid {tid}) was off-CPU without blocking for "
                     f"{fmt_ns(int(by['launcher']['_l'].sum()))} in {by['launcher'].height} "
                     f"of them")
    if by["comm"].height:
        ctid = int(by["comm"]["_c_tid"][0])
        name = threads.filter(pl.col("tid") == ctid)["name"].drop_nulls().head(1).to_list()
        parts.append(f"the communication thread {md_code(name[0], 60) + ' ' if name else ''}"
                     f"(tid {ctid}) was off-CPU without blocking for "
                     f"{fmt_ns(int(by['comm']['_c'].sum()))} in {by['comm'].height} of them")
    if by["over"].height:
        parts.append(f"more of the process's threads wanted a CPU than the {cpus} CPUs it "
                     f"ran on for {fmt_ns(int(by['over']['_o'].sum()))} in "
                     f"{by['over'].height} of them")
    how = ("the thread state at each switch-out says the thread was still runnable"
           if rule == "thread_state" else
           "no OS-runtime or CUDA synchronization call explains the off-CPU time; the "
           "export records no informative thread state at switches, and nsys traces only "
           "OS-runtime calls above its threshold, so short sleeps count here too")
    msg = (f"In {hit.height} GPU gaps ({fmt_ns(lost)}, {fmt_frac(share)} of steady-state "
           f"device time) threads that feed the GPU could run but had no CPU: "
           f"{'; '.join(parts)} ({how}). The launching thread migrated between CPUs "
           f"{migrations} times in {switches} switches.")
    metrics = [
        metric("contended_ns", "GPU-idle time with a thread waiting for a CPU", lost, "ns"),
        metric("contended_frac", "share of steady-state device time", share, "frac"),
        metric("n_gaps", "gaps with CPU contention", hit.height, "count"),
        metric("descheduled_ns", "launcher off-CPU without blocking in gaps",
               int(by["launcher"]["_l"].sum()) if by["launcher"].height else 0, "ns"),
        metric("comm_descheduled_ns", "communication thread off-CPU without blocking in gaps",
               int(by["comm"]["_c"].sum()) if by["comm"].height else 0, "ns"),
        metric("oversubscribed_ns", "more runnable threads than CPUs, in gaps",
               int(by["over"]["_o"].sum()) if by["over"].height else 0, "ns"),
        metric("cpus_seen", "CPUs the process tree ran on", cpus, "count"),
        metric("n_migrations", "launcher CPU migrations", migrations, "count"),
        metric("n_switches", "launcher switch-ins", switches, "count"),
    ]
    longest = hit.sort(["_lost", "gap_start_ns"], descending=[True, False])
    win = longest.select("device_id", start_ns="gap_start_ns", end_ns="gap_end_ns")
    ev = evidence(metrics, windows_from(win, None, ctx.params.top_n, "CPU contention"))
    return [make_finding("CPU_CONTENTION", sev, msg, ev, pid=int(hit["pid"][0]))]


#: what each host finding says about the verdict (appended to its reason)
VERDICT_NOTES = {
    "HOST_WAITS_ON_GPU": "host evidence: the launching thread mostly waits in the CUDA driver, "
                         "so the run is GPU-bound and CPU-side tuning will not help",
    "HOST_CPU_BOUND": "host evidence: during the GPU gaps the launching thread computes in "
                      "the framework / data pipeline (CPU-bound input)",
    "CPU_CONTENTION": "host evidence: the launching thread is descheduled during GPU gaps "
                      "(CPU contention; bind processes to cores)",
}


def with_host_evidence(verdict: Verdict, findings: list[Finding]) -> Verdict:
    """``verdict`` with what the host findings add to its reason (unchanged without any)."""
    notes = [VERDICT_NOTES[f.code] for f in findings if f.code in VERDICT_NOTES]
    if not notes:
        return verdict
    reason = verdict.reason.rstrip(".") + "; " + "; ".join(dict.fromkeys(notes)) + "."
    return replace(verdict, reason=reason)
