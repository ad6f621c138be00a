"""Start-up costs: host calls that pay once for getting the GPU ready, not per step.

A **start-up call** lasts at least ``startup_min_call_ns`` and is one of:
- ``first_launch``: the launch call of the first kernel of each name in a process. Under CUDA
  lazy loading (the default since CUDA 12.2) the module of a kernel is loaded and its code
  JIT-compiled when it is first launched, so that launch takes milliseconds;
- ``module_load``: module / library loading and linking (``cuModuleLoad*``, ``cuLibraryLoad*``,
  ``cuLink*``, ``nvrtcCompileProgram``);
- ``context``: context creation (``cuCtxCreate``, ``cuDevicePrimaryCtxRetain``, ``cuInit``)
  and the first CUDA call of each process, which creates the primary context;
- ``nccl_init``: NCCL communicator initialisation (NVTX ranges ``ncclCommInit*``).

Device idle time that such a call covers for at least half of a gap is start-up idle: it is
reported by STARTUP_COST and not counted as launch-bound, host-sync or input starvation.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from nsysan.frames.text import per_value
from nsysan.frames.trace import Trace

_LOAD_RE = r"^(?:cuModuleLoad|cuLibraryLoad|cuLink|nvrtcCompileProgram|cuModuleGetFunction)"
_CONTEXT_RE = r"^(?:cuCtxCreate|cuDevicePrimaryCtxRetain|cuInit)"
_NCCL_INIT_RE = r"(?i)^ncclCommInit"


def startup_calls(trace: Trace, min_ns: int) -> pl.DataFrame:
    """``pid, name, why, start_ns, end_ns`` of the start-up calls, sorted by start (then by
    the other columns: a total order). Needs cuda_api (callers check)."""
    calls = trace.frame("cuda_api")
    # The calls long enough are few: found in one pass over the calls, then every kind of
    # start-up call is looked for among them alone (each kind filtering every call held a
    # duration column of all of them per kind, at once: the parts of a concat run together).
    slow = calls.lazy().filter((pl.col("end_ns") - pl.col("start_ns")) >= min_ns).select(
        "global_pid", "correlation_id", "pid", "name", "api_class", "start_ns", "end_ns",
    ).collect()
    cols = ["pid", "name", "why", "start_ns", "end_ns"]
    # (the regexes once per distinct API name)
    named = slow.lazy().filter(per_value(slow, "name", pl.col("name").str.contains(_LOAD_RE)))
    named = named.with_columns(pl.lit("module_load").alias("why"))
    ctx = slow.lazy().filter(per_value(slow, "name", pl.col("name").str.contains(_CONTEXT_RE)))
    ctx = ctx.with_columns(pl.lit("context").alias("why"))
    # the first call of each process (no sort of every call: a min per process, joined back)
    t0 = calls.lazy().group_by("pid").agg(pl.col("start_ns").min().alias("_t0"))
    first_api = (slow.lazy().join(t0, on="pid").filter(pl.col("start_ns") == pl.col("_t0"))
                 .with_columns(pl.lit("context").alias("why")))
    parts = [named.select(cols), ctx.select(cols), first_api.select(cols)]
    if trace.has("gpu_ops"):
        parts.append(_first_launches(trace, slow).lazy().select(cols))
    if trace.has("nvtx"):
        nvtx = trace.frame("nvtx")
        parts.append(nvtx.lazy().filter(
            per_value(nvtx, "name", pl.col("name").str.contains(_NCCL_INIT_RE)).fill_null(False)
            & pl.col("end_ns").is_not_null()
            & ((pl.col("end_ns") - pl.col("start_ns")) >= min_ns))
            .with_columns(pl.lit("nccl_init").alias("why")).select(cols))
    out = pl.concat([p.with_columns(pl.col("pid").cast(pl.Int64)) for p in parts]).collect()
    # a call can be both the first of its process and a first launch: keep one reason
    out = out.sort(["start_ns", "end_ns", "pid", "why", "name"], nulls_last=True)
    return out.unique(["pid", "start_ns", "end_ns", "name"], keep="first", maintain_order=True)


def _first_launches(trace: Trace, slow_calls: pl.DataFrame) -> pl.DataFrame:
    """The launch calls among ``slow_calls`` whose kernel is the first of its name in its
    process, with ``why``.

    The slow launches are few, so only their kernels, and the kernels of the same names, are
    read: a join or a group-by over every kernel held ~0.6 GB more on 10M kernels."""
    slow = slow_calls.filter(pl.col("api_class") == "launch").select(
        ["global_pid", "correlation_id", "pid", "name", "start_ns", "end_ns"])
    kernels = trace.frame("gpu_ops").lazy().filter(pl.col("kind") == "kernel")
    linked = slow.lazy().join(
        kernels.filter(pl.col("correlation_id").is_in(slow["correlation_id"].implode()))
        .select(["global_pid", "correlation_id", pl.col("name").alias("_k"),
                 pl.col("start_ns").alias("_ks")]),
        on=["global_pid", "correlation_id"]).collect()
    # the first start of each of those kernel names per process: an aggregation, no sort
    first = (kernels.filter(pl.col("name").is_in(linked["_k"].implode()))
             .group_by(["global_pid", pl.col("name").alias("_k")])
             .agg(pl.col("start_ns").min().alias("_first")))
    return (linked.lazy().join(first, on=["global_pid", "_k"])
            .filter(pl.col("_ks") == pl.col("_first"))
            .with_columns(pl.lit("first_launch").alias("why")).collect())


def covered_ns(calls: pl.DataFrame, start: pl.Series, end: pl.Series) -> np.ndarray:
    """Per interval ``[start, end)``, how many ns of it the union of ``calls`` covers."""
    if calls.is_empty() or start.len() == 0:
        return np.zeros(start.len(), np.int64)
    iv = calls.select(["start_ns", "end_ns"]).sort("start_ns").to_numpy()
    merged: list[list[int]] = []
    for a, b in iv:  # the start-up calls are few (one per kernel name at most)
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([int(a), int(b)])
    u = np.asarray(merged, np.int64)
    cum = np.concatenate([[0], np.cumsum(u[:, 1] - u[:, 0])])

    def upto(t: np.ndarray) -> np.ndarray:  # covered length of (-inf, t)
        i = np.searchsorted(u[:, 0], t, side="right")  # intervals starting before t
        full = cum[np.maximum(i - 1, 0)]
        last = np.where(i > 0, np.clip(t - u[np.maximum(i - 1, 0), 0], 0,
                                       u[np.maximum(i - 1, 0), 1] - u[np.maximum(i - 1, 0), 0]),
                        0)
        return np.where(i > 0, full + last, 0)

    return upto(end.to_numpy()) - upto(start.to_numpy())


def is_startup(calls: pl.DataFrame, gaps: pl.DataFrame) -> pl.Series:
    """Per gap (``start_ns``, ``end_ns``), whether start-up calls cover at least half of it."""
    cov = covered_ns(calls, gaps["start_ns"], gaps["end_ns"])
    dur = (gaps["end_ns"] - gaps["start_ns"]).to_numpy()
    return pl.Series("_startup", (dur > 0) & (2 * cov >= dur))
