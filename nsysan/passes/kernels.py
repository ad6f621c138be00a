"""kernels: per-kernel summary with Tensor Core classification and launch statistics.

Semantics:

- Kernels are grouped by ``demangled_name`` (the full templated signature; kernels without one
  fall back to their short name), which is how ``nsys stats -r gpukernsum`` names its rows.
  That report (2022.4) also splits rows by grid and block dimensions; summing its rows of one
  name gives this table's ``count``, ``total_ns``, ``min_ns`` and ``max_ns`` exactly.
  ``short_name`` is the kernel's short name (the most frequent one, should a demangled name
  carry several).
- Durations are ``end_ns - start_ns``; ``median_ns`` is the median of the durations (the mean
  of the two middle values for an even count).
- ``gpu_time_frac`` = ``total_ns`` / the sum of ``total_ns`` over all kernels: a share of summed
  kernel time, like gpukernsum's "Time (%)", not of wall time (concurrent kernels both count).
- ``op_class``: compute | nccl, from the loader (the most frequent value of the group).
- ``tensor_core`` / ``tensor_core_rule``: the name taxonomy of `nsysan.passes.tensor_core`
  (``TAXONOMY_VERSION`` is reported in the metrics); null when no rule knows the name.
- Launch statistics join each kernel to the CUDA API call that launched it on
  ``(global_pid, correlation_id)``: ``api_mean_ns`` is the mean duration of that call,
  ``queue_mean_ns`` / ``queue_max_ns`` the mean / max of ``kernel start - call start`` (launch
  latency plus time queued behind earlier work). All kernels of a CUDA graph launch share its
  call. Kernels whose call was not captured are left out of these three columns only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from nsysan.frames import schemas
from nsysan.frames.trace import Trace
from nsysan.passes import op_link
from nsysan.passes import tensor_core as tc
from nsysan.passes.base import PassResult, PassSpec, Results


@dataclass(frozen=True)
class KernelsParams:
    #: Kernels shorter than this are "tiny": their launch overhead rivals their work.
    tiny_kernel_ns: int = 10_000
    #: Kernels listed in the ``top_kernels`` metric.
    top_n: int = 10


def run(trace: Trace, params: KernelsParams, results: Results) -> PassResult:
    trace_id = trace.trace_id
    ops = trace.gpu_ops
    # The fallback to the short name is spelled out only when some op lacks a demangled name.
    name = pl.col("demangled_name")
    if ops.get_column("demangled_name").null_count():
        name = pl.coalesce("demangled_name", "name").alias("demangled_name")
    launched = _launch_stats(ops, trace.cuda_api, op_link.api_rows(trace), name)
    summary = _summary(launched, params.tiny_kernel_ns).lazy()
    table = (
        tc.classify(summary)
        .with_columns(
            (pl.col("total_ns") / pl.col("total_ns").sum()).alias("gpu_time_frac"),
            pl.lit(trace_id).alias("trace_id"),
        )
        .sort(["total_ns", "demangled_name"], descending=[True, False])
        .collect()
    )
    return PassResult(
        tables={"kernels": schemas.conform(table, schemas.KERNELS)},
        metrics=_metrics(params, table),
    )


_MODES = ("short_name", "op_class")


def _launch_stats(ops: pl.DataFrame, api: pl.DataFrame, rows: np.ndarray,
                  name: pl.Expr) -> pl.DataFrame:
    """The kernel rows of ``ops`` as `_summary` reads them (``demangled_name, short_name,
    op_class, _dur, _api_dur, _queue``, in op order), their launching calls at ``rows``
    (`op_link.api_rows`); the call statistics are null for a kernel whose call, or whose
    call's start or end, is unknown.

    The call's duration and the queueing time are numpy gathers of the call bounds: two
    polars gathers through a null-masked index and two subtractions per kernel cost several
    times more on a million kernels. Only when some call's bound is null (never in a loaded
    trace: docs/data-quality.md) do polars gathers carry the nulls."""
    a_start, a_end = api["start_ns"], api["end_ns"]
    is_kernel = (ops["kind"] == "kernel").fill_null(False)
    kernels = ops.select(
        name, pl.col("name").alias("short_name"), "op_class",
        (pl.col("end_ns") - pl.col("start_ns")).alias("_dur"), "start_ns",
    ).filter(is_kernel)  # (the columns read first: a filter copies every column it keeps)
    row = rows[is_kernel.to_numpy()]
    if a_start.null_count() or a_end.null_count():
        s_, e_ = op_link.gather(a_start, row), op_link.gather(a_end, row)
        return kernels.drop("start_ns").with_columns(
            (e_ - s_).alias("_api_dur"), (kernels["start_ns"] - s_).alias("_queue"))
    linked = row >= 0
    at = np.where(linked, row, 0) if api.height else np.zeros(row.size, np.int64)
    s = a_start.to_numpy()[at] if api.height else at
    e = a_end.to_numpy()[at] if api.height else at
    api_dur, queue = pl.Series("_api_dur", e - s), kernels["start_ns"] - pl.Series(s)
    if not linked.all():  # ops whose call is unknown: null statistics
        unknown = pl.Series(~linked)
        api_dur, queue = api_dur.set(unknown, None), queue.set(unknown, None)
    return kernels.drop("start_ns").with_columns(api_dur, queue.alias("_queue"))


def _summary(launched: pl.DataFrame, tiny_ns: int) -> pl.DataFrame:
    """Per demangled name: the most frequent short name and op class, counts, durations,
    launch statistics (before the Tensor Core columns)."""
    aggs = [
        pl.len().cast(pl.Int64).alias("count"),
        pl.col("_dur").sum().alias("total_ns"),
        pl.col("_dur").mean().alias("mean_ns"),
        pl.col("_dur").median().alias("median_ns"),
        pl.col("_dur").min().alias("min_ns"),
        pl.col("_dur").max().alias("max_ns"),
        pl.col("_api_dur").mean().alias("api_mean_ns"),
        pl.col("_queue").mean().alias("queue_mean_ns"),
        pl.col("_queue").max().alias("queue_max_ns"),
        (pl.col("_dur") < tiny_ns).sum().cast(pl.Int64).alias("_n_tiny"),
        pl.col("_dur").filter(pl.col("_dur") < tiny_ns).sum().alias("_tiny_ns"),
    ]
    if any(launched[c].null_count() for c in _MODES):  # (a null mode: the plain form)
        return launched.group_by("demangled_name").agg(
            *(pl.col(c).mode().sort().first() for c in _MODES), *aggs).with_columns(
            pl.col("demangled_name", *_MODES).cast(pl.String))
    # Every grouping runs on categorical codes (the names are Categorical in gpu_ops, the
    # op class an Enum) and the names are decoded per group.
    cat = launched.with_columns(pl.col("demangled_name", *_MODES).cast(pl.Categorical))
    out = cat.group_by("demangled_name").agg(aggs).with_columns(
        pl.col("demangled_name").cast(pl.String))
    for c in _MODES:
        out = out.join(_mode(cat, c), on="demangled_name", how="left", nulls_equal=True)
    return out.select("demangled_name", *_MODES, *(a.meta.output_name() for a in aggs))


def _mode(cat: pl.DataFrame, col: str) -> pl.DataFrame:
    """``demangled_name, col``: the most frequent value of ``col`` per demangled name, the
    smallest of equally frequent ones (``mode().sort().first()`` for a column without nulls),
    counted on categorical codes."""
    n = cat.group_by("demangled_name", col).agg(pl.len().alias("_n")).with_columns(
        pl.col("demangled_name", col).cast(pl.String))
    return (n.filter(pl.col("_n") == pl.col("_n").max().over("demangled_name"))
            .group_by("demangled_name").agg(pl.col(col).min()))


def _frac(part: int | float, whole: int | float) -> float | None:
    return part / whole if whole else None


def _metrics(params: KernelsParams, table: pl.DataFrame) -> dict[str, Any]:
    total = int(table["total_ns"].sum()) if table.height else 0
    count = int(table["count"].sum()) if table.height else 0

    def time_where(cond: pl.Expr) -> int:
        return int(table.filter(cond)["total_ns"].sum()) if table.height else 0

    n_tiny = int(table["_n_tiny"].sum()) if table.height else 0
    top = table.head(params.top_n)
    return {
        "n_kernels": count,
        "n_kernel_names": table.height,
        "kernel_time_ns": total,
        "tensor_core_time_ns": time_where(pl.col("tensor_core") == True),  # noqa: E712
        "tensor_core_frac": _frac(time_where(pl.col("tensor_core") == True), total),  # noqa: E712
        "tensor_core_unknown_frac": _frac(time_where(pl.col("tensor_core").is_null()), total),
        #: matrix kernels the taxonomy knows run without Tensor Cores (NO_TENSOR_CORES reads it)
        "matmul_without_tc_frac": _frac(
            time_where(pl.col("tensor_core_rule").is_in(list(tc.MATMUL_WITHOUT_TC_RULES))), total
        ),
        "tensor_core_taxonomy_version": tc.TAXONOMY_VERSION,
        "tiny_kernel_ns": params.tiny_kernel_ns,
        "tiny_kernel_count": n_tiny,
        "tiny_kernel_frac": _frac(n_tiny, count),
        "tiny_kernel_time_frac": _frac(int(table["_tiny_ns"].sum()) if table.height else 0, total),
        "top_kernels": [  # at most top_n rows: rendering, not event processing
            {"name": r["short_name"], "demangled_name": r["demangled_name"],
             "total_ns": r["total_ns"], "count": r["count"], "gpu_time_frac": r["gpu_time_frac"],
             "tensor_core": r["tensor_core"]}
            for r in top.iter_rows(named=True)
        ],
    }


SPEC = PassSpec(
    name="kernels",
    description="Kernel summary by name: time, counts, Tensor Core use, launch statistics",
    params=KernelsParams,
    tables={"kernels": schemas.KERNELS},
    run=run,
    default=True,
)
