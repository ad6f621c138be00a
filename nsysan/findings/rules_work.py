"""Rules about the work itself: communication, kernels, layers, allocations, start-up."""

from __future__ import annotations

import numpy as np
import polars as pl

from nsysan.escape import md_code
from nsysan.findings.context import Context, NotEvaluated
from nsysan.findings.evidence import (
    evidence,
    fmt_bytes,
    fmt_frac,
    fmt_ns,
    fmt_rate,
    grade,
    make_finding,
    metric,
    offender,
    ranked,
    window,
    windows_from,
)
from nsysan.frames import intervals
from nsysan.frames.text import per_value
from nsysan.passes.base import Finding

#: Matrix-multiply / convolution kernels: the ones that could use Tensor Cores.
MATRIX_KERNEL_RE = r"(?i)(gemm|conv|matmul|mma|cutlass|cublas|cudnn|wgrad|dgrad|fprop|winograd)"
#: NCCL's NVTX payload field names (nvtx_payload_schemas.h).
_SIZE_RE = r'"Message size \[bytes\]"\s*:\s*(\d+)'
_RANKS_RE = r'"No\. of ranks"\s*:\s*(\d+)'


# ---------------------------------------------------------------------------------------------
def exposed_communication(ctx: Context) -> list[Finding]:
    """EXPOSED_COMMUNICATION: NCCL active while compute is not."""
    p = ctx.params
    ctx.need_table("overlap")
    if ctx.device_time_ns <= 0:
        raise NotEvaluated("no GPU activity in the trace")
    nccl_ns, _ = ctx.state_share("nccl", None)
    if nccl_ns == 0:
        return []
    ns, share = ctx.state_share("nccl", "compute")
    sev = grade(share, p.comm_warn_frac, p.comm_crit_frac)
    if sev is None:
        return []
    windows = []
    if ctx.trace.has("gpu_ops") and ctx.window is not None:
        ops = ctx.trace.frame("gpu_ops").lazy().filter(
            pl.col("op_class").is_in(["compute", "nccl"])
            & (pl.col("end_ns") > ctx.window[0]) & (pl.col("start_ns") < ctx.window[1]))
        seg = (intervals.state_segments(ops, ["compute", "nccl"], by=["device_id"],
                                        class_col="op_class")
               .filter(pl.col("state") == "nccl").collect())
        windows = windows_from(seg, None, p.top_n, "NCCL without compute")
    kernels = ctx.table("kernels")
    offenders = []
    if kernels is not None:
        top = ranked(kernels.filter(pl.col("op_class") == "nccl"), "total_ns", p.top_n)
        offenders = [offender("kernel", r["short_name"] or r["demangled_name"], r["total_ns"],
                              "ns", count=r["count"], detail=f"mean {fmt_ns(r['mean_ns'])}")
                     for r in top.iter_rows(named=True)]
    hidden = 1 - ns / nccl_ns
    per_step = ns / ctx.n_steps if ctx.n_steps else None
    metrics = [
        metric("exposed_nccl_ns", "NCCL time with no compute", ns, "ns"),
        metric("exposed_nccl_frac", "share of steady-state device time", share, "frac"),
        metric("nccl_ns", "all NCCL time", nccl_ns, "ns"),
        metric("hidden_nccl_frac", "share of NCCL time hidden by compute", hidden, "frac"),
        metric("exposed_nccl_ns_per_step", "exposed per step", per_step, "ns"),
    ]
    msg = (f"Communication is exposed {fmt_ns(ns)} ({fmt_frac(share)} of steady-state device "
           f"time" + (f", {fmt_ns(per_step)} per step" if per_step is not None else "")
           + f"): only {fmt_frac(hidden)} of NCCL time overlaps compute.")
    return [make_finding("EXPOSED_COMMUNICATION", sev, msg,
                         evidence(metrics, windows, offenders))]


# ---------------------------------------------------------------------------------------------
def _bus_factor(op: pl.Expr, n: pl.Expr) -> pl.Expr:
    """nccl-tests' busBW / algBW factor; 1 when the rank count is unknown."""
    nf = n.cast(pl.Float64)
    return (pl.when(n.is_null() | (n < 2)).then(1.0)
            .when(op.str.contains("(?i)allreduce")).then(2 * (nf - 1) / nf)
            .when(op.str.contains("(?i)allgather|reducescatter|alltoall")).then((nf - 1) / nf)
            .otherwise(1.0))


def _collectives_from_nvtx(ctx: Context) -> pl.DataFrame:
    """Sized collectives from NCCL NVTX payloads + the ranges' GPU projection (attribution)."""
    p = ctx.params
    nvtx = ctx.need_frame("nvtx")
    att = ctx.need_table("attribution")
    nccl_domain = per_value(nvtx, "domain", pl.col("domain").str.to_lowercase() == "nccl")
    # (filtered inside a select: a filter of the whole frame would expand its constant
    # columns to every row, `nsysan.frames.trace`)
    sized = (nvtx.select(pl.col("range_id", "name", "payload_json").filter(
        pl.col("payload_json").is_not_null() & nccl_domain))
             .with_columns(pl.col("payload_json").str.extract(_SIZE_RE, 1).cast(pl.Int64)
                           .alias("msg_bytes"),
                           pl.col("payload_json").str.extract(_RANKS_RE, 1).cast(pl.Int64)
                           .alias("n_ranks"))
             .filter(pl.col("msg_bytes").is_not_null()))
    if sized.is_empty():
        ops = ctx.trace.frame("gpu_ops") if ctx.trace.has("gpu_ops") else None
        if ops is None or not ops.select((pl.col("op_class") == "nccl").any()).item():
            raise NotEvaluated("no NCCL collectives in the trace")
        raise NotEvaluated("collective message sizes are not in this export "
                           "(no NCCL NVTX payloads)")
    return (sized.select(["range_id", pl.col("name").cast(pl.String), "msg_bytes", "n_ranks"])
            .join(att.select(["range_id", pl.col("proj_start_ns").alias("start_ns"),
                              pl.col("proj_end_ns").alias("end_ns")]), on="range_id")
            .with_columns((pl.col("end_ns") - pl.col("start_ns")).alias("dur"))
            .filter((pl.col("dur") > 0) & (pl.col("msg_bytes") >= p.nccl_min_bytes))
            .with_columns((pl.col("msg_bytes") / (pl.col("dur") / 1e9)
                           * _bus_factor(pl.col("name"), pl.col("n_ranks"))).alias("busbw")))


def nccl_bandwidth(ctx: Context) -> list[Finding]:
    """NCCL_LOW_BANDWIDTH: bus bandwidth of sized collectives (nccl pass, else NVTX)."""
    p = ctx.params
    nccl = ctx.table("nccl")
    if nccl is not None:
        sized = nccl.filter(pl.col("bytes").is_not_null() & pl.col("busbw_gbps").is_not_null())
        if sized.is_empty():
            raise NotEvaluated("collective message sizes are not in this export "
                               "(no NCCL NVTX payloads)" if nccl.height else
                               "no NCCL collectives in the trace")
        # busbw_gbps is GB/s = bytes per ns
        coll = sized.filter(pl.col("bytes") >= p.nccl_min_bytes).select(
            pl.col("op").alias("name"), pl.col("bytes").alias("msg_bytes"), "n_ranks",
            "start_ns", "end_ns", (pl.col("busbw_gbps") * 1e9).alias("busbw"))
    else:
        coll = _collectives_from_nvtx(ctx)
    if coll.is_empty():
        raise NotEvaluated(f"no collective of >= {fmt_bytes(p.nccl_min_bytes)} with GPU work")
    med = float(coll["busbw"].median())
    sev = ("critical" if med < p.nccl_crit_busbw_Bps
           else "warning" if med < p.nccl_warn_busbw_Bps else None)
    if sev is None:
        return []
    by_op = ranked(coll.group_by("name").agg(pl.len(), pl.col("busbw").median(),
                                             pl.col("msg_bytes").median().alias("bytes")),
                   "busbw", p.top_n, descending=False)
    offenders = [offender("collective", nm, float(bw), "B/s", count=k,
                          detail=f"median message {fmt_bytes(b)}")
                 for nm, k, bw, b in by_op.iter_rows()]
    metrics = [
        metric("median_busbw", "median bus bandwidth", med, "B/s"),
        metric("n_collectives", f"collectives >= {fmt_bytes(p.nccl_min_bytes)}", coll.height,
               "count"),
        metric("rank_count_known", "collectives with a known rank count",
               int(coll["n_ranks"].is_not_null().sum()), "count"),
    ]
    msg = (f"The median bus bandwidth of {coll.height} collectives of >= "
           f"{fmt_bytes(p.nccl_min_bytes)} is {fmt_rate(med)}, below "
           f"{fmt_rate(p.nccl_warn_busbw_Bps)} (message size / GPU span of the collective, "
           "times the nccl-tests bus factor).")
    wins = windows_from(coll, "name", p.top_n)
    return [make_finding("NCCL_LOW_BANDWIDTH", sev, msg, evidence(metrics, wins, offenders))]


# ---------------------------------------------------------------------------------------------
def no_tensor_cores(ctx: Context) -> list[Finding]:
    """NO_TENSOR_CORES: matrix kernels classified as not using Tensor Cores."""
    p = ctx.params
    k = ctx.need_table("kernels")
    if k.is_empty():
        raise NotEvaluated("no kernels in the trace")
    name = pl.coalesce(pl.col("demangled_name"), pl.col("short_name"))
    bad = k.filter((pl.col("tensor_core") == False)  # noqa: E712 - null means "unknown"
                   & (pl.col("op_class") == "compute") & name.str.contains(MATRIX_KERNEL_RE))
    total = int(k.filter(pl.col("op_class") == "compute")["total_ns"].sum())
    if bad.is_empty() or total == 0:
        return []
    frac = int(bad["total_ns"].sum()) / total
    sev = grade(frac, p.tc_warn_frac, p.tc_crit_frac)
    if sev is None:
        return []
    top = ranked(bad, "total_ns", p.top_n)
    offenders = [offender("kernel", r["short_name"] or r["demangled_name"], r["total_ns"], "ns",
                          count=r["count"], detail=r["tensor_core_rule"])
                 for r in top.iter_rows(named=True)]
    metrics = [
        metric("no_tc_ns", "time in matrix kernels without Tensor Cores",
               int(bad["total_ns"].sum()), "ns"),
        metric("no_tc_frac", "share of compute kernel time", frac, "frac"),
        metric("n_kernels", "distinct kernels", bad.height, "count"),
    ]
    msg = (f"{fmt_frac(frac)} of compute kernel time is in {bad.height} matrix-multiply / "
           f"convolution kernels that do not use Tensor Cores; top: "
           f"{md_code(offenders[0]['name'], 80)}.")
    return [make_finding("NO_TENSOR_CORES", sev, msg, evidence(metrics, [], offenders))]


# ---------------------------------------------------------------------------------------------
def _step_name_pattern(ctx: Context) -> str | None:
    """The NVTX name pattern the steps pass used, when steps come from NVTX."""
    steps = ctx.table("steps")
    if steps is None or steps.is_empty():
        return None
    src = steps["source"][0] or ""
    return src[len("nvtx:"):] if src.startswith("nvtx:") else None


def dominant_layer(ctx: Context) -> list[Finding]:
    """DOMINANT_LAYER: one NVTX name holds most GPU time exclusively."""
    p = ctx.params
    layers = ctx.need_table("layers")
    if layers.is_empty():
        raise NotEvaluated("no NVTX range encloses GPU work")
    step_pat = _step_name_pattern(ctx)
    by_time = ranked(layers, "exclusive_gpu_ns")
    if step_pat:  # the step range itself is not a layer
        try:
            is_step = pl.col("name").str.contains(step_pat)
            by_time.select(is_step)
        except pl.exceptions.PolarsError:
            is_step = pl.col("name").str.contains(step_pat, literal=True)
        by_time = by_time.filter(~is_step.fill_null(False))
    if by_time.is_empty():
        return []
    top = by_time.row(0, named=True)
    if (top["exclusive_frac"] or 0) < p.dominant_layer_frac:
        return []
    offenders = [offender("layer", r["name"], r["exclusive_gpu_ns"], "ns", count=r["instances"],
                          detail=fmt_frac(r["exclusive_frac"]))
                 for r in by_time.head(p.top_n).iter_rows(named=True)]
    metrics = [
        metric("layer_exclusive_ns", "exclusive GPU time of the layer", top["exclusive_gpu_ns"],
               "ns"),
        metric("layer_exclusive_frac", "share of GPU busy time", top["exclusive_frac"], "frac"),
        metric("instances", "instances", top["instances"], "count"),
    ]
    msg = (f"NVTX range {md_code(top['name'], 80)} holds {fmt_frac(top['exclusive_frac'])} of "
           f"GPU busy time ({fmt_ns(top['exclusive_gpu_ns'])} in {top['instances']} instances): "
           "optimise there first.")
    return [make_finding("DOMINANT_LAYER", "info", msg, evidence(metrics, [], offenders))]


# ---------------------------------------------------------------------------------------------
def memory_churn(ctx: Context) -> list[Finding]:
    """MEMORY_CHURN: allocation calls in the steady state."""
    p = ctx.params
    api = ctx.need_frame("cuda_api")
    win = ctx.count_window
    if win is None:
        raise NotEvaluated("no GPU activity in the trace")
    # the class test first: the name regex then runs on allocation calls only (inside a
    # select: a filter of the whole frame would expand its constant columns to every call,
    # `nsysan.frames.trace`; every column is kept, since the evidence ranks ties by them)
    mallocs = api.select(pl.all().filter(pl.col("api_class") == "malloc"))
    calls = ctx.in_window(mallocs.filter(
        ~per_value(mallocs, "name", pl.col("name").str.contains("(?i)async"))), win)
    if calls.is_empty():
        return []
    wlen = win[1] - win[0]
    blocked = int(calls.select((pl.col("end_ns") - pl.col("start_ns")).sum()).item())
    frac = blocked / wlen if wlen else 0.0
    per_step = calls.height / ctx.n_steps if ctx.n_steps else None
    # Churn is repetition: allocations in most steps, or (without steps) many of them. A
    # few one-off allocations cost what they cost but are not churn: info at most.
    if ctx.n_steps:
        starts = calls["start_ns"].sort().to_numpy()
        s = ctx.steady_steps
        lo = np.searchsorted(starts, s["start_ns"].to_numpy(), side="left")
        hi = np.searchsorted(starts, s["end_ns"].to_numpy(), side="left")
        steps_hit = int((hi > lo).sum())
        repeated = steps_hit >= max(2, p.churn_min_step_frac * ctx.n_steps)
        why = f"allocations in {steps_hit} of {ctx.n_steps} steady-state steps"
    else:
        steps_hit = None
        repeated = calls.height >= p.churn_min_calls_without_steps
        why = (f"{calls.height} allocation calls and no steps (churn needs >= "
               f"{p.churn_min_calls_without_steps})")
    sustained = per_step is not None and per_step >= 1 and repeated
    sev = (grade(frac, p.churn_warn_frac, p.churn_crit_frac) or (
        "warning" if sustained else "info")) if repeated else "info"
    by = ranked(calls.group_by("name").agg(
        pl.len(), (pl.col("end_ns") - pl.col("start_ns")).sum().alias("ns")), "ns", p.top_n)
    offenders = [offender("api", nm, int(ns), "ns", count=k) for nm, k, ns in by.iter_rows()]
    metrics = [
        metric("n_calls", "allocation calls in the steady state", calls.height, "count"),
        metric("calls_per_step", "per step", per_step, "per_step"),
        metric("host_blocked_ns", "host time in them", blocked, "ns"),
        metric("host_blocked_frac", "share of the steady window", frac, "frac"),
        metric("steps_with_allocations", "steady-state steps with allocation calls",
               steps_hit, "count"),
    ]
    msg = ((f"Not churn ({why}): " if not repeated else "")
           + f"{calls.height} allocation calls in the steady state"
           + (f" ({per_step:.3g} per step)" if per_step is not None else "")
           + f" cost the host {fmt_ns(blocked)} ({fmt_frac(frac)}); cudaFree-style calls also "
           f"synchronise the device. Top: {md_code(offenders[0]['name'])} "
           f"×{offenders[0]['count']}.")
    return [make_finding("MEMORY_CHURN", sev, msg,
                         evidence(metrics, windows_from(calls, "name", p.top_n), offenders))]


# ---------------------------------------------------------------------------------------------
def slow_start(ctx: Context) -> list[Finding]:
    """SLOW_START: first CUDA call → first kernel / first collective."""
    p = ctx.params
    ops = ctx.need_frame("gpu_ops")
    api = ctx.need_frame("cuda_api")
    # first starts by aggregation: no copy of the kernel rows (1M+ on big traces)
    is_kernel = pl.col("kind") == "kernel"
    n_kernels, first_kernel, first_nccl = ops.select(
        is_kernel.sum(), pl.col("start_ns").filter(is_kernel).min().alias("k"),
        pl.col("start_ns").filter(is_kernel & (pl.col("op_class") == "nccl")).min()
        .alias("c")).row(0)
    if not n_kernels or api.is_empty():
        raise NotEvaluated("no kernels or no CUDA API calls in the trace")
    first_api = int(api["start_ns"].min())
    first_kernel = int(first_kernel)
    first_nccl = int(first_nccl) if first_nccl is not None else None
    ttfk = first_kernel - first_api
    ttfc = first_nccl - first_api if first_nccl is not None else None
    worst = max(ttfk, ttfc or 0)
    sev = ("warning" if worst >= p.start_warn_ns
           else "info" if worst >= p.start_info_ns else None)
    if sev is None:
        return []
    before = api.select(pl.col("name", "start_ns", "end_ns").filter(
        pl.col("start_ns") < first_kernel))
    by = ranked(before.group_by("name").agg(
        pl.len(), (pl.col("end_ns") - pl.col("start_ns")).sum().alias("ns")), "ns", p.top_n)
    offenders = [offender("api", nm, int(ns), "ns", count=k) for nm, k, ns in by.iter_rows()]
    metrics = [
        metric("time_to_first_kernel_ns", "first CUDA call → first kernel", ttfk, "ns"),
        metric("time_to_first_collective_ns", "first CUDA call → first NCCL kernel", ttfc,
               "ns"),
    ]
    wins = [window(first_api, first_kernel, "start-up before the first kernel")]
    msg = (f"The first kernel starts {fmt_ns(ttfk)} after the first CUDA call"
           + (f", the first collective after {fmt_ns(ttfc)}" if ttfc is not None else "")
           + (f"; top start-up call: {md_code(offenders[0]['name'])} "
              f"({fmt_ns(offenders[0]['value'])})." if offenders else "."))
    return [make_finding("SLOW_START", sev, msg, evidence(metrics, wins, offenders))]
