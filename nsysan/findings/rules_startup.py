"""STARTUP_COST: device idle that start-up calls cause (`nsysan.findings.startup`)."""

from __future__ import annotations

import polars as pl

from nsysan.escape import md_code
from nsysan.findings.context import Context, NotEvaluated
from nsysan.findings.evidence import (
    evidence,
    fmt_frac,
    fmt_ns,
    make_finding,
    metric,
    offender,
    ranked,
    windows_from,
)
from nsysan.passes.base import Finding

_WHY = {"first_launch": "first launch of a kernel (lazy module loading / JIT)",
        "module_load": "module / library loading", "context": "context creation",
        "nccl_init": "NCCL communicator init"}


def startup_cost(ctx: Context) -> list[Finding]:
    """STARTUP_COST: idle gaps of the analysed window that start-up calls cover."""
    p = ctx.params
    ctx.can_classify_short_gaps()
    ctx.need_table("gaps")
    short = ctx.short_gaps_of("startup").select(
        ["device_id", "start_ns", "end_ns", "duration_ns"])
    long = ctx.long_gaps
    rows = short
    if long is not None and not long.is_empty():
        rows = pl.concat([short, long.filter(pl.col("category") == "startup").select(
            ["device_id", "start_ns", "end_ns", "duration_ns"])])
    idle = int(rows["duration_ns"].sum())
    if idle == 0:
        return []
    win = ctx.window
    if win is None:
        raise NotEvaluated("no GPU activity in the trace")
    calls = ctx.startup_calls.filter((pl.col("end_ns") > win[0]) & (pl.col("start_ns") < win[1]))
    share = idle / ctx.device_time_ns
    sev = "warning" if idle >= p.startup_warn_ns else "info"
    by = ranked(calls.group_by(["why", "name"]).agg(
        pl.len(), (pl.col("end_ns") - pl.col("start_ns")).sum().alias("ns")), "ns", p.top_n)
    offenders = [offender("api", nm, int(ns), "ns", count=k, detail=_WHY.get(why, why))
                 for why, nm, k, ns in by.iter_rows()]
    metrics = [
        metric("startup_idle_ns", "device idle in start-up calls", idle, "ns"),
        metric("startup_idle_frac", "share of analysed device time", share, "frac"),
        metric("n_startup_calls", "start-up calls in the window", calls.height, "count"),
        metric("n_gaps", "gaps they cover", rows.height, "count"),
    ]
    top = (f" Top: {md_code(offenders[0]['name'])} ({offenders[0]['detail']}, "
           f"{fmt_ns(offenders[0]['value'])})." if offenders else "")
    msg = (f"The GPU idled {fmt_ns(idle)} ({fmt_frac(share)} of analysed device time) in "
           f"{rows.height} gaps while the host paid start-up costs ({calls.height} calls: first "
           "kernel launches, module loading, context or NCCL init). These are paid once, not "
           "per step: they are not counted as launch-bound or starvation." + top)
    ev = evidence(metrics, windows_from(rows, None, p.top_n, "start-up"), offenders)
    return [make_finding("STARTUP_COST", sev, msg, ev)]
