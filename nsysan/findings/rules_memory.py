"""Rules over the memory pass (CUDA memory-usage events): near-OOM, growth, pool
fragmentation, and the event evidence added to MEMORY_CHURN.

The memory pass runs only on traces whose export holds memory-usage events; without its
tables these rules raise `NotApplicable` and are left out of the report altogether (the
baseline's "device memory in use (peak)" line says how to capture them), so traces without
events keep their findings byte for byte. Thresholds are the memory pass's params
(``memory.*``), reported in its ``thresholds`` metric.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import polars as pl

from nsysan.findings.context import Context, NotApplicable, NotEvaluated
from nsysan.findings.evidence import (
    evidence,
    fmt_bytes,
    fmt_frac,
    make_finding,
    metric,
    offender,
    window,
)
from nsysan.passes.base import Finding

NOT_CAPTURED = "no CUDA memory-usage events (record with `nsys profile --cuda-memory-usage=true`)"


def _summary(ctx: Context) -> tuple[pl.DataFrame, dict[str, Any]]:
    r = ctx.results.get("memory")
    if r is None or "memory_summary" not in r.tables:
        raise NotApplicable(NOT_CAPTURED)
    summary = r.tables["memory_summary"]
    if summary.is_empty():
        raise NotEvaluated("no device-resident allocations among the memory-usage events")
    return summary, r.metrics["thresholds"]


def _sites(ctx: Context, r: dict[str, Any], th: dict[str, Any], *, steady: bool = True
           ) -> list[dict[str, Any]]:
    """The allocation sites of the finding's process (memory_sites: NVTX ranges around its
    allocation calls, in the steady steps or in the whole trace), most bytes first."""
    sites = ctx.table("memory_sites")
    if sites is None:
        return []
    n, b = ("steady_n_allocs", "steady_alloc_bytes") if steady else ("n_allocs", "alloc_bytes")
    mine = sites.filter((pl.col("device_id") == r["device_id"]) & (pl.col("pid") == r["pid"])
                        & pl.col("nvtx_name").is_not_null() & (pl.col(b) > 0))
    top = mine.sort([b, "nvtx_name"], descending=[True, False]).head(ctx.params.top_n)
    return [offender("nvtx_range", name, nbytes, "bytes", count=k,
                     detail="allocation site: NVTX range around the allocation calls")
            for name, nbytes, k in top.select("nvtx_name", b, n).iter_rows()]


# ---------------------------------------------------------------------------------------------
def near_oom(ctx: Context) -> list[Finding]:
    """MEMORY_NEAR_OOM: the device's peak in use within a margin of its memory."""
    summary, th = _summary(ctx)
    known = summary.filter(pl.col("device_total_bytes").is_not_null()
                           & (pl.col("device_total_bytes") > 0))
    if known.is_empty():
        raise NotEvaluated("device memory sizes unknown (no TARGET_INFO_GPU.totalMemory)")
    out = []
    # one finding per device; its largest process names the allocation site
    per_device = known.sort(["device_id", "peak_bytes", "pid"],
                            descending=[False, True, False]).unique("device_id", keep="first",
                                                                   maintain_order=True)
    for r in per_device.iter_rows(named=True):
        frac = r["margin_frac"]
        if frac > th["near_oom_warn_frac"]:
            continue
        sev = "critical" if frac <= th["near_oom_crit_frac"] else "warning"
        metrics = [
            metric("device_peak_bytes", "peak device memory in use", r["device_peak_bytes"],
                   "bytes"),
            metric("device_total_bytes", "device memory", r["device_total_bytes"], "bytes"),
            metric("margin_bytes", "free at the peak", r["margin_bytes"], "bytes"),
            metric("margin_frac", "share of device memory free at the peak", frac, "frac"),
        ]
        msg = (f"Device {r['device_id']} peaked at {fmt_bytes(r['device_peak_bytes'])} in use "
               f"of {fmt_bytes(r['device_total_bytes'])}: only {fmt_bytes(r['margin_bytes'])} "
               f"({fmt_frac(frac)}) left; a larger batch, a longer sequence or fragmentation "
               "will run out of memory.")
        peak = r["device_peak_ns"]
        out.append(make_finding("MEMORY_NEAR_OOM", sev, msg, evidence(
            metrics, [window(peak, peak + 1, "peak in use", r["device_id"])],
            _sites(ctx, r, th, steady=False)),
            device_id=r["device_id"]))
    return out


# ---------------------------------------------------------------------------------------------
def growth(ctx: Context) -> list[Finding]:
    """MEMORY_GROWTH: device memory in use grows step over step."""
    summary, th = _summary(ctx)
    stepped = summary.filter(pl.col("n_steps") > 0)
    if stepped.is_empty():
        raise NotEvaluated("no steps: growth per step needs step markers (NVTX step ranges)")
    out = []
    for r in stepped.iter_rows(named=True):
        g, grown = r["growth_bytes_per_step"], r["steps_grown_frac"]
        if (r["n_steps"] < th["growth_min_steps"] or grown < th["growth_min_step_frac"]
                or g < th["growth_min_bytes_per_step"]):
            continue
        left = r["margin_bytes"]
        steps_left = left / g if left is not None and left > 0 else None
        sev = ("critical" if left is not None
               and (left <= 0 or (steps_left or 0) <= th["growth_crit_steps_to_oom"])
               else "warning")
        metrics = [
            metric("growth_bytes_per_step", "growth per step", g, "bytes"),
            metric("steps_grown_frac", "share of steps that end higher", grown, "frac"),
            metric("n_steps", "steady steps", r["n_steps"], "count"),
            metric("alloc_bytes_per_step", "allocated per step", r["alloc_bytes_per_step"],
                   "bytes"),
            metric("free_bytes_per_step", "freed per step", r["free_bytes_per_step"], "bytes"),
            metric("steps_to_oom", "steps until the device is full at this rate", steps_left,
                   "count"),
        ]
        msg = (f"Process {r['pid']} on device {r['device_id']}: device memory in use grows "
               f"{fmt_bytes(g)} per step ({fmt_frac(grown)} of {r['n_steps']} steps end "
               "higher than they started)"
               + (f"; the remaining {fmt_bytes(left)} last about {steps_left:.0f} more steps"
                  if steps_left is not None else "") + ".")
        out.append(make_finding("MEMORY_GROWTH", sev, msg,
                                evidence(metrics, [], _sites(ctx, r, th)),
                                device_id=r["device_id"], pid=r["pid"]))
    return out


# ---------------------------------------------------------------------------------------------
def pool_fragmentation(ctx: Context) -> list[Finding]:
    """POOL_FRAGMENTATION: a memory pool reserves far more than it uses and keeps growing."""
    summary, th = _summary(ctx)
    pooled = summary.filter(pl.col("pool_reserved_peak_bytes").is_not_null())
    if pooled.is_empty():
        raise NotEvaluated("no memory-pool reports among the events (no stream-ordered "
                           "allocations, or an export without the pool columns)")
    out = []
    for r in pooled.iter_rows(named=True):
        n, frac = r["pool_growths_with_slack"] or 0, r["pool_utilized_frac"]
        if n < th["frag_min_growths"] or frac is None or frac > th["frag_max_utilized_frac"]:
            continue
        metrics = [
            metric("pool_reserved_peak_bytes", "pool reserved at its peak",
                   r["pool_reserved_peak_bytes"], "bytes"),
            metric("pool_utilized_at_peak_bytes", "of which in use",
                   r["pool_utilized_at_peak_bytes"], "bytes"),
            metric("pool_utilized_frac", "share in use at the reserved peak", frac, "frac"),
            metric("pool_growths", "pool growths in the steady state", r["pool_growths"],
                   "count"),
            metric("pool_growths_with_slack", "... with enough free bytes in the pool", n,
                   "count"),
        ]
        msg = (f"Process {r['pid']} on device {r['device_id']}: its memory pool reserves "
               f"{fmt_bytes(r['pool_reserved_peak_bytes'])} but uses "
               f"{fmt_bytes(r['pool_utilized_at_peak_bytes'])} ({fmt_frac(frac)}), and grew "
               f"{n} times in the steady state although its free bytes could have held the "
               "allocation: the free space is fragmented.")
        out.append(make_finding("POOL_FRAGMENTATION", "warning", msg,
                                evidence(metrics, [], _sites(ctx, r, th)),
                                device_id=r["device_id"], pid=r["pid"]))
    return out


# ---------------------------------------------------------------------------------------------
def with_event_evidence(rule: Callable[[Context], list[Finding]]
                        ) -> Callable[[Context], list[Finding]]:
    """``rule`` (MEMORY_CHURN, judged on the CUDA API calls), its findings' evidence extended
    with what the memory-usage events say about repetition per step, when they were
    captured. The judgement itself is the API rule's; without events nothing changes."""

    def churn(ctx: Context) -> list[Finding]:
        found = rule(ctx)
        r = ctx.results.get("memory")
        if not found or r is None or "memory_summary" not in r.tables:
            return found
        return [_add_events(f, r.tables["memory_summary"]) for f in found]

    churn.__doc__ = rule.__doc__
    return churn


def _add_events(f: Finding, summary: pl.DataFrame) -> Finding:
    from dataclasses import replace

    rows = summary.filter(pl.col("n_steps") > 0).sort(["device_id", "pid"])
    if rows.is_empty():
        return f
    extra = []
    for r in rows.iter_rows(named=True):
        where = f" (pid {r['pid']}, device {r['device_id']})" if rows.height > 1 else ""
        extra += [
            metric("event_allocs_per_step", f"device allocations per step{where}",
                   r["allocs_per_step"], "per_step"),
            metric("event_alloc_bytes_per_step", f"bytes allocated per step{where}",
                   r["alloc_bytes_per_step"], "bytes"),
            metric("event_steps_allocating_frac", f"share of steps that allocate{where}",
                   r["steps_allocating_frac"], "frac"),
        ]
    top = rows.sort("alloc_bytes_per_step", descending=True).row(0, named=True)
    msg = f.message + (f" Memory-usage events: {top['allocs_per_step']:.3g} device allocations "
                       f"({fmt_bytes(top['alloc_bytes_per_step'])}) per step, in "
                       f"{fmt_frac(top['steps_allocating_frac'])} of the steps"
                       + ".")
    ev = dict(f.evidence)
    ev["metrics"] = [*ev.get("metrics", []), *extra]
    return replace(f, message=msg, evidence=ev)
