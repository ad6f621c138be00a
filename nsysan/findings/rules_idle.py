"""Rules about why the GPU idles: input starvation, copies, host syncs, launch overhead."""

from __future__ import annotations

import polars as pl

from nsysan.escape import md_code
from nsysan.findings.context import Context, NotEvaluated
from nsysan.findings.evidence import (
    evidence,
    fmt_bytes,
    fmt_frac,
    fmt_ns,
    grade,
    make_finding,
    metric,
    offender,
    ranked,
    windows_from,
)
from nsysan.passes.base import Finding


def _need_window(ctx: Context) -> tuple[int, int]:
    ctx.need_frame("gpu_ops")
    if ctx.window is None or ctx.device_time_ns <= 0:
        raise NotEvaluated("no GPU activity in the trace")
    return ctx.window


def _step_of(ctx: Context, df: pl.DataFrame) -> pl.DataFrame:
    """Add ``_step``: the steady step whose window contains the row's start (else null)."""
    steps = ctx.steady_steps
    if steps is None or df.is_empty():
        return df.with_columns(pl.lit(None, pl.Int64).alias("_step"))
    s = steps.select(pl.col("step").alias("_step"), pl.col("start_ns").alias("_s0"),
                     pl.col("end_ns").alias("_s1")).sort("_s0")
    out = df.sort("start_ns").join_asof(s, left_on="start_ns", right_on="_s0",
                                         strategy="backward", check_sortedness=False)
    return out.with_columns(
        pl.when(pl.col("start_ns") < pl.col("_s1")).then(pl.col("_step")).alias("_step")
    ).drop(["_s0", "_s1"])


def _regular(spacing: pl.Series, n: int, p) -> float | None:
    """The median spacing when ``n`` events recur regularly (>= starvation_min_gaps events,
    coefficient of variation of the spacing <= starvation_max_period_cv), else None."""
    if n < p.starvation_min_gaps or spacing.len() == 0:
        return None
    mean = float(spacing.mean())
    if mean <= 0 or float(spacing.std() or 0.0) / mean > p.starvation_max_period_cv:
        return None
    return float(spacing.median())


def _per_step(ctx: Context, value: float) -> float | None:
    return value / ctx.n_steps if ctx.n_steps else None


def _host_evidence(ctx: Context, gaps: pl.DataFrame, main_cause: str) -> str:
    """Where the traced host calls are silent (``no_cuda_activity``: no API, OS-runtime or
    NVTX evidence), what the CPU samples and context switches say of the longest of
    ``gaps``: the primary launching thread's `host_detail` (the host pass), or nothing."""
    host = ctx.table("host_gaps")
    if main_cause != "no_cuda_activity" or host is None or host.is_empty():
        return ""
    longest = gaps.sort(["duration_ns", "start_ns"], descending=[True, False]).head(1)
    row = host.filter(pl.col("primary_launcher")).join(
        longest.select("device_id", gap_start_ns="start_ns"), on=["device_id", "gap_start_ns"])
    detail = row["host_detail"].drop_nulls().to_list()
    if not detail:
        return ""
    return (f" Host evidence for the longest gap ({fmt_ns(int(longest['duration_ns'][0]))}): "
            f"its launching thread (tid {int(row['tid'][0])}) was {detail[0]}.")


# ---------------------------------------------------------------------------------------------
def starvation(ctx: Context) -> list[Finding]:
    """GPU_STARVATION_PERIODIC: recurring host-side idle gaps."""
    p = ctx.params
    _need_window(ctx)
    gaps = ctx.long_gaps
    if gaps is None:
        ctx.need_table("gaps")
        return []
    host = gaps.filter(pl.col("category") == "input")
    if host.is_empty():
        return []
    total = int(host["duration_ns"].sum())
    share = total / ctx.device_time_ns
    host = _step_of(ctx, host)
    n = host.height
    steps_hit_frac = None
    period = None  # ns between gaps (without steps)
    every = None  # steps between gapped steps
    if ctx.n_steps:
        hit = host["_step"].drop_nulls().unique().sort()
        steps_hit_frac = hit.len() / ctx.n_steps
        every = _regular(hit.diff().drop_nulls(), hit.len(), p)
        recurs = steps_hit_frac >= p.starvation_min_step_frac or every is not None
    else:
        # regular spacing on the device with most such gaps
        dev = ranked(host.group_by("device_id").len(), "len", 1)["device_id"][0]
        starts = host.filter(pl.col("device_id") == dev)["start_ns"].sort()
        period = _regular(starts.diff().drop_nulls(), starts.len(), p)
        recurs = period is not None
    sev = grade(share, p.starvation_warn_frac, p.starvation_crit_frac)
    if not recurs or sev is None:
        return []
    by_cause = ranked(host.group_by("cause").agg(pl.col("duration_ns").sum(), pl.len()),
                      "duration_ns")
    by_detail = ranked(host.group_by(pl.col("cause_detail").fill_null("")).agg(
        pl.col("duration_ns").sum(), pl.len()).filter(pl.col("cause_detail") != ""),
        "duration_ns", p.top_n)
    main_cause = by_cause["cause"][0]
    metrics = [
        metric("starved_ns", "device idle in host-side gaps", total, "ns"),
        metric("starved_frac", "share of steady-state device time", share, "frac"),
        metric("n_gaps", "gaps", n, "count"),
        metric("mean_gap_ns", "mean gap", total / n, "ns"),
        metric("starved_ns_per_step", "idle per step", _per_step(ctx, total), "ns"),
    ]
    if steps_hit_frac is not None:
        metrics.append(metric("steps_with_gap_frac", "steps with such a gap", steps_hit_frac,
                              "frac"))
    if every is not None:
        metrics.append(metric("period_steps", "steps between stalls", every, "count"))
    if period is not None:
        metrics.append(metric("period_ns", "median gap spacing", period, "ns"))
    offenders = [offender("cause", c, int(d), "ns", count=k) for c, d, k in by_cause.iter_rows()]
    offenders += [offender("nvtx_range" if main_cause == "nvtx_range" else "api", d, int(ns),
                           "ns", count=k) for d, ns, k in by_detail.iter_rows()]
    if ctx.n_steps:
        where = f"in {host['_step'].drop_nulls().n_unique()} of {ctx.n_steps} steps"
        if every is not None and every > 1:
            where += f" (every {every:g} steps)"
    else:
        where = f"every {fmt_ns(period)} on average"
    msg = (f"The GPU sat idle {fmt_ns(total)} ({fmt_frac(share)} of steady-state device time) "
           f"in {n} gaps of {fmt_ns(total / n)} on average, {where}, while the host was busy "
           f"elsewhere (main cause: {main_cause}"
           + (f", {md_code(by_detail['cause_detail'][0], 160)}" if by_detail.height else "")
           + ")." + _host_evidence(ctx, host, main_cause))
    ev = evidence(metrics, windows_from(host, "cause_detail", p.top_n), offenders)
    return [make_finding("GPU_STARVATION_PERIODIC", sev, msg, ev)]


# ---------------------------------------------------------------------------------------------
def h2d_not_overlapped(ctx: Context) -> list[Finding]:
    """H2D_NOT_OVERLAPPED: time with an H2D copy and no compute."""
    p = ctx.params
    ctx.need_table("overlap")
    _need_window(ctx)
    ns, share = ctx.state_share("h2d", "compute")
    sev = grade(share, p.h2d_warn_frac, p.h2d_crit_frac)
    if sev is None:
        return []
    if ctx.trace.has("cuda_api"):
        # Pageable / synchronous H2D copies cannot overlap by construction: when they make
        # up most of the exposed H2D time, PAGEABLE_OR_SYNC_COPIES names the root cause.
        bad_h2d = ctx.in_window(ctx.bad_copies.filter(pl.col("copy_kind") == "HtoD"))
        if ctx.exposed_ns(bad_h2d) >= 0.5 * ns:
            return []
    total_h2d, _ = ctx.state_share("h2d", None)
    ops = ctx.trace.frame("gpu_ops")  # (filtered inside a select, as in `launch_bound`)
    copies = ctx.in_window(ops.select(pl.all().filter(pl.col("op_class") == "memcpy_h2d")))
    top = ranked(copies.with_columns((pl.col("end_ns") - pl.col("start_ns")).alias("_d")),
                 ["_d", "start_ns"], p.top_n, descending=[True, False])
    offenders = [offender("copy", f"HtoD {fmt_bytes(r['bytes'])} from {r['src_kind'] or '?'} "
                          f"memory, stream {r['stream_id']}", int(r["_d"]), "ns",
                          detail=f"device {r['device_id']}")
                 for r in top.iter_rows(named=True)]
    metrics = [
        metric("h2d_unoverlapped_ns", "H2D copy time with no compute", ns, "ns"),
        metric("h2d_unoverlapped_frac", "share of steady-state device time", share, "frac"),
        metric("h2d_ns", "all H2D copy time", total_h2d, "ns"),
        metric("h2d_unoverlapped_ns_per_step", "per step", _per_step(ctx, ns), "ns"),
        metric("n_h2d_copies", "H2D copies in the window", copies.height, "count"),
    ]
    msg = (f"{fmt_ns(ns)} of H2D copies ({fmt_frac(share)} of steady-state device time"
           + (f", {fmt_ns(ns / ctx.n_steps)} per step" if ctx.n_steps else "")
           + f") ran while no compute kernel did; {fmt_frac(ns / total_h2d if total_h2d else 0)}"
           " of all H2D time is exposed.")
    ev = evidence(metrics, windows_from(copies, "name", p.top_n, "HtoD copy "), offenders)
    return [make_finding("H2D_NOT_OVERLAPPED", sev, msg, ev)]


# ---------------------------------------------------------------------------------------------
def pageable_or_sync_copies(ctx: Context) -> list[Finding]:
    """PAGEABLE_OR_SYNC_COPIES: pageable copies, or synchronous cudaMemcpy calls.

    Cost = their GPU time not overlapped by compute + the device idle they drain (gaps that
    start while the host is blocked in one of them)."""
    p = ctx.params
    ctx.need_frame("gpu_ops")
    ctx.need_frame("cuda_api")
    ctx.need_table("gaps")  # long gaps after copies come from the gaps pass
    _need_window(ctx)
    win = ctx.count_window
    bad = ctx.in_window(ctx.bad_copies, win).with_columns(
        pl.coalesce(pl.col("api_end") - pl.col("api_start"),
                    pl.col("end_ns") - pl.col("start_ns")).alias("blocked_ns"))
    if bad.is_empty():
        return []
    exposed = ctx.exposed_ns(bad)
    drained = int(ctx.short_gaps_of("copy")["duration_ns"].sum())
    long_ns, _ = _long_gap_ns(ctx, "copy")
    cost = exposed + drained + long_ns
    share = cost / ctx.device_time_ns
    wlen = win[1] - win[0]
    blocked = int(bad["blocked_ns"].sum())
    per_step = _per_step(ctx, bad.height)
    sev = grade(share, p.copy_warn_frac, p.copy_crit_frac) or "info"
    groups = (bad.group_by([pl.col("api_name").fill_null("(driver / unknown API)"),
                            "copy_kind", "src_kind", "dst_kind", "why"])
              .agg(pl.len(), pl.col("bytes").sum(), pl.col("blocked_ns").sum())
              .pipe(ranked, "blocked_ns", p.top_n))
    offenders = [offender("copy", f"{r['api_name']} {r['copy_kind']} "
                          f"{r['src_kind'] or '?'}→{r['dst_kind'] or '?'} ({r['why']})",
                          int(r["blocked_ns"]), "ns", count=r["len"],
                          detail=f"{fmt_bytes(r['bytes'])} in total, host time blocked")
                 for r in groups.iter_rows(named=True)]
    n_pageable = int((bad["why"] == "pageable").sum())
    metrics = [
        metric("cost_ns", "GPU time lost: copies not overlapped + idle they drain", cost, "ns"),
        metric("cost_frac", "share of steady-state device time", share, "frac"),
        metric("n_copies", "pageable or synchronous copies", bad.height, "count"),
        metric("n_pageable", "of which pageable", n_pageable, "count"),
        metric("copies_per_step", "per step", per_step, "per_step"),
        metric("host_blocked_ns", "host time blocked in them", blocked, "ns"),
        metric("host_blocked_frac", "share of the steady window (host)",
               blocked / wlen if wlen else None, "frac"),
        metric("bytes", "bytes copied", int(bad["bytes"].fill_null(0).sum()), "bytes"),
    ]
    msg = (f"{bad.height} steady-state copies are pageable ({n_pageable}) or synchronous "
           f"({bad.height - n_pageable})"
           + (f", {per_step:.3g} per step" if per_step is not None else "")
           + f"; they cost the GPU {fmt_ns(cost)} ({fmt_frac(share)} of steady-state device "
           f"time: {fmt_ns(exposed)} of copying beside no compute, {fmt_ns(drained + long_ns)} "
           f"idle after them) and blocked the host {fmt_ns(blocked)}. "
           f"Top: {md_code(offenders[0]['name'])}.")
    ev = evidence(metrics, windows_from(bad, "why", p.top_n, "copy "), offenders)
    return [make_finding("PAGEABLE_OR_SYNC_COPIES", sev, msg, ev)]


# ---------------------------------------------------------------------------------------------
def _long_gap_ns(ctx: Context, category: str) -> tuple[int, pl.DataFrame]:
    """Total and rows of the long gaps of one idle category (see `Context.long_gaps`)."""
    g = ctx.long_gaps
    if g is None:
        return 0, pl.DataFrame()
    rows = g.filter(pl.col("category") == category)
    return int(rows["duration_ns"].sum()), rows


def host_sync(ctx: Context) -> list[Finding]:
    """HOST_SYNC_IN_STEP: sync calls that drain the GPU."""
    p = ctx.params
    ctx.can_classify_short_gaps()
    ctx.need_table("gaps")
    short = ctx.short_gaps_of("sync")
    long_ns, long_rows = _long_gap_ns(ctx, "sync")
    idle = int(short["duration_ns"].sum()) + long_ns
    share = idle / ctx.device_time_ns
    syncs = ctx.in_window(ctx.sync_calls, ctx.count_window)
    n = syncs.height
    per_step = _per_step(ctx, n)
    often = (per_step >= 1) if per_step is not None else n >= p.sync_min_count_without_steps
    sev = grade(share, p.sync_warn_frac, p.sync_crit_frac)
    if sev is None or not often:
        return []
    by_name = ranked(syncs.group_by("name").agg(
        pl.len(), (pl.col("end_ns") - pl.col("start_ns")).sum().alias("ns")), "ns", p.top_n)
    offenders = [offender("api", nm, int(ns), "ns", count=k) for nm, k, ns in by_name.iter_rows()]
    win_rows = pl.concat([short.select(["device_id", "start_ns", "end_ns"]),
                          long_rows.select(["device_id", "start_ns", "end_ns"])]
                         if not long_rows.is_empty() else
                         [short.select(["device_id", "start_ns", "end_ns"])])
    metrics = [
        metric("sync_idle_ns", "device idle after syncs", idle, "ns"),
        metric("sync_idle_frac", "share of steady-state device time", share, "frac"),
        metric("n_syncs", "sync calls in the steady state", n, "count"),
        metric("syncs_per_step", "per step", per_step, "per_step"),
        metric("host_blocked_ns", "host time in sync calls",
               int(syncs.select((pl.col("end_ns") - pl.col("start_ns")).sum()).item() or 0),
               "ns"),
    ]
    msg = (f"{n} synchronising calls in the steady state"
           + (f" ({per_step:.3g} per step)" if per_step is not None else "")
           + f" drained the GPU: it then idled {fmt_ns(idle)} ({fmt_frac(share)} of steady-state"
           f" device time) until the host launched again."
           + (f" Top: {md_code(offenders[0]['name'])}." if offenders else ""))
    ev = evidence(metrics, windows_from(win_rows, None, p.top_n, "idle after sync"), offenders)
    return [make_finding("HOST_SYNC_IN_STEP", sev, msg, ev)]


# ---------------------------------------------------------------------------------------------
def launch_bound(ctx: Context) -> list[Finding]:
    """LAUNCH_BOUND: short gaps that end with a late launch."""
    p = ctx.params
    ctx.can_classify_short_gaps()
    ctx.need_table("gaps")  # long launch-bound gaps come from the gaps pass
    short = ctx.short_gaps_of("launch")
    long_ns, long_rows = _long_gap_ns(ctx, "launch")
    idle = int(short["duration_ns"].sum()) + long_ns
    share = idle / ctx.device_time_ns
    sev = grade(share, p.launch_warn_frac, p.launch_crit_frac)
    if sev is None:
        return []
    # (filtered inside a select: a filter of a whole frame would expand its constant columns
    # to every row, `nsysan.frames.trace`)
    kernels = ctx.in_window(ctx.trace.frame("gpu_ops").select(
        pl.col("name", "start_ns", "end_ns").filter(pl.col("kind") == "kernel")))
    dur = kernels["end_ns"] - kernels["start_ns"]
    launches = ctx.in_window(ctx.trace.frame("cuda_api").select(
        pl.col("start_ns", "end_ns").filter(pl.col("api_class") == "launch")))
    top = ranked(kernels.group_by("name").agg(
        pl.len(), (pl.col("end_ns") - pl.col("start_ns")).mean().alias("mean_ns")),
        ["len", "mean_ns"], p.top_n)
    offenders = [offender("kernel", nm, float(m), "ns", count=k,
                          detail=f"mean {fmt_ns(m)}") for nm, k, m in top.iter_rows()]
    wlen = ctx.window[1] - ctx.window[0]
    metrics = [
        metric("launch_idle_ns", "device idle waiting for launches", idle, "ns"),
        metric("launch_idle_frac", "share of steady-state device time", share, "frac"),
        metric("n_late_gaps", "gaps ended by a late launch", short.height + long_rows.height,
               "count"),
        metric("kernels_per_step", "kernels per step", _per_step(ctx, kernels.height),
               "per_step"),
        metric("kernel_rate", "kernels per second", kernels.height / (wlen / 1e9)
               if wlen else None, "1/s"),
        metric("median_kernel_ns", "median kernel duration",
               float(dur.median()) if kernels.height else None, "ns"),
        metric("mean_launch_api_ns", "mean launch call duration",
               float((launches["end_ns"] - launches["start_ns"]).mean())
               if launches.height else None, "ns"),
    ]
    med = fmt_ns(float(dur.median())) if kernels.height else "n/a"
    msg = (f"The GPU waited {fmt_ns(idle)} ({fmt_frac(share)} of steady-state device time) for "
           f"kernel launches: {short.height + long_rows.height} gaps ended only when the host "
           f"got round to the next launch. Kernels are short (median {med}, "
           f"{kernels.height} in the window).")
    win_rows = short.select(["device_id", "start_ns", "end_ns"])
    ev = evidence(metrics, windows_from(win_rows, None, p.top_n, "late launch"), offenders)
    return [make_finding("LAUNCH_BOUND", sev, msg, ev)]
