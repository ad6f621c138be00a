"""overlap: what runs concurrently on each device.

A sweep over all ops of a device (every process and stream; ops with ``start_ns == 0``, which
nsys writes for records it could not time, are left out, as in the gaps pass) gives, at every
instant, the set of active classes among compute, nccl, h2d, d2h, d2d, p2p and memset
(``op_class`` mapped by `schemas.OVERLAP_CLASS_OF_OP_CLASS`); ``idle`` when none. The
``overlap`` table holds the time per state per device over the device span
``[first op start, last op end)`` (``step`` null), and, when the steps pass ran, per step: the
part of the step window inside the device span, clipped to the window, plus ``idle`` for the
part of the window outside the span, so a step's rows sum to its window. States sum exactly
to the span.

``overlap_summary`` per device: exposed nccl (nccl active, compute not), nccl only (state
exactly ``nccl``), hidden fraction = 1 - exposed / union(nccl) (null without nccl), h2d
unoverlapped (h2d active, compute not), and stream concurrency: the number of distinct streams
(``(pid, stream_id)``) with an op running, its maximum and its time-weighted mean over busy time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from nsysan.frames import intervals as iv
from nsysan.frames import schemas, sweeps
from nsysan.frames.trace import Trace
from nsysan.passes.base import PassResult, PassSpec, Results
from nsysan.passes.steps import (
    OVERLAP_CLASSES,
    device_segments,
    device_totals,
    state_has,
    step_states,
    step_windows,
)

IDLE = 0  # state code with no class active


@dataclass(frozen=True)
class OverlapParams:
    per_step: bool = True  # also break states down per step when steps are known


def _stream_concurrency(ops: pl.LazyFrame) -> pl.LazyFrame:
    """``device_id, max_stream_concurrency, mean_stream_concurrency`` (over busy time)."""
    return sweeps.member_concurrency(
        ops, ["device_id"], ["pid", "stream_id"],
        "max_stream_concurrency", "mean_stream_concurrency",
    ).lazy()


def _spans(segs: pl.DataFrame) -> pl.DataFrame:
    """``device_id, _s, _e``: each device's span. The segments tile each device's span and
    come sorted by device, then start: the span runs from a device's first segment to its
    last (no group-by)."""
    dev = segs["device_id"]
    if dev.null_count() == 0:  # the runs' bounds by one numpy comparison of neighbours
        d = dev.to_numpy()
        change = np.flatnonzero(d[1:] != d[:-1]) + 1
        first, last = np.r_[0, change], np.r_[change - 1, len(d) - 1]
        return pl.DataFrame([dev.gather(first), segs["start_ns"].gather(first).alias("_s"),
                             segs["end_ns"].gather(last).alias("_e")])
    return _spans_by_exprs(segs)


def _spans_by_exprs(segs: pl.DataFrame) -> pl.DataFrame:
    """`_spans` for any device column (nulls: one device of their own)."""
    col = pl.col("device_id")
    first = col.ne_missing(col.shift(1)) | (pl.int_range(pl.len()) == 0)
    last = col.ne_missing(col.shift(-1)) | (pl.int_range(pl.len()) == pl.len() - 1)
    return segs.select(
        col.filter(first), pl.col("start_ns").filter(first).alias("_s"),
        pl.col("end_ns").filter(last).alias("_e"),
    )


def _per_step(states: pl.DataFrame, spans: pl.DataFrame, steps: pl.DataFrame) -> pl.LazyFrame:
    """``device_id, step, state_code, duration_ns``: states clipped to every step window
    (``states``: `steps.step_states`), and idle for the part of a window outside the span."""
    windows = spans.select("device_id").join(steps, how="cross")
    dur = pl.col("end_ns") - pl.col("start_ns")
    outside = (
        windows.lazy().join(spans.lazy(), on="device_id")
        .with_columns(
            (dur - (pl.min_horizontal("end_ns", "_e") - pl.max_horizontal("start_ns", "_s"))
             .clip(lower_bound=0)).alias("duration_ns")
        )
        .filter(pl.col("duration_ns") > 0)
        .select("device_id", "step", pl.lit(IDLE, pl.Int64).alias("state_code"), "duration_ns")
    )
    return (
        pl.concat([states.lazy(), outside])
        .group_by("device_id", "step", "state_code")
        .agg(pl.col("duration_ns").sum())
    )


def run(trace: Trace, params: OverlapParams, results: Results) -> PassResult:
    tid = trace.trace_id
    ops = (
        trace.frame("gpu_ops").lazy()
        .filter((pl.col("start_ns") > 0)
                & pl.col("op_class").is_in(list(schemas.OVERLAP_CLASS_OF_OP_CLASS)))
        .select("device_id", "pid", "stream_id", "start_ns", "end_ns")
    )
    # First, from the ops' one copy, which is freed before the state sweeps below run.
    concurrency = _stream_concurrency(ops)
    # States stay integer bit sets (cheap to group) until the tables are small. The steps
    # pass usually built them already.
    segs_df = device_segments(trace)
    label = pl.col("state_code").replace_strict(
        iv.state_names(OVERLAP_CLASSES), return_dtype=pl.String
    ).alias("state")
    whole = (
        device_totals(trace, segs_df)
        .select("device_id", label, "duration_ns", pl.lit(None, pl.Int64).alias("step"))
    )
    parts = [whole.lazy()]
    steps = step_windows(results) if params.per_step else None
    if steps is not None and not segs_df.is_empty():
        spans = _spans(segs_df)
        windows = steps.select("step", "start_ns", "end_ns")
        per_step = _per_step(step_states(trace, segs_df, windows), spans, windows)
        parts.append(per_step.select("device_id", "step", label, "duration_ns"))
    table = (
        pl.concat(parts, how="diagonal_relaxed")
        .with_columns(pl.lit(tid).alias("trace_id"))
        .sort("device_id", "step", "duration_ns", "state",
              descending=[False, False, True, False], nulls_last=False)
        .collect()
    )
    table = schemas.conform(table, schemas.OVERLAP)

    by_state = whole.lazy()
    not_compute = ~state_has("compute")
    d = pl.col("duration_ns")
    summary = (
        by_state.group_by("device_id")
        .agg(
            d.sum().alias("span_ns"),
            d.filter(pl.col("state") != "idle").sum().alias("busy_ns"),
            d.filter(pl.col("state") == "idle").sum().alias("idle_ns"),
            d.filter(state_has("compute")).sum().alias("compute_ns"),
            d.filter(state_has("nccl")).sum().alias("nccl_ns"),
            d.filter(pl.col("state") == "nccl").sum().alias("nccl_only_ns"),
            d.filter(state_has("nccl") & not_compute).sum().alias("exposed_nccl_ns"),
            d.filter(state_has("h2d")).sum().alias("h2d_ns"),
            d.filter(state_has("h2d") & not_compute).sum().alias("h2d_unoverlapped_ns"),
        )
        .with_columns(
            pl.when(pl.col("nccl_ns") > 0)
            .then(1 - pl.col("exposed_nccl_ns") / pl.col("nccl_ns"))
            .alias("hidden_nccl_frac"),
        )
        .join(concurrency, on="device_id", how="left")
        .with_columns(pl.lit(tid).alias("trace_id"))
        .sort("device_id")
        .collect()
    )
    summary = schemas.conform(summary, schemas.OVERLAP_SUMMARY)
    return PassResult(
        tables={"overlap": table, "overlap_summary": summary}, metrics=_metrics(summary)
    )


def _metrics(summary: pl.DataFrame) -> dict[str, Any]:
    """Totals over all devices."""
    tot = {c: int(summary[c].sum()) for c in (
        "span_ns", "busy_ns", "compute_ns", "nccl_ns", "exposed_nccl_ns", "nccl_only_ns",
        "h2d_ns", "h2d_unoverlapped_ns",
    )}
    return {
        "n_devices": summary.height,
        "compute_ns": tot["compute_ns"],
        "nccl_ns": tot["nccl_ns"],
        "nccl_only_ns": tot["nccl_only_ns"],
        "exposed_nccl_ns": tot["exposed_nccl_ns"],
        "hidden_nccl_frac": (
            1 - tot["exposed_nccl_ns"] / tot["nccl_ns"] if tot["nccl_ns"] else None
        ),
        "h2d_ns": tot["h2d_ns"],
        "h2d_unoverlapped_ns": tot["h2d_unoverlapped_ns"],
        "compute_busy_frac": tot["compute_ns"] / tot["span_ns"] if tot["span_ns"] else None,
        "max_stream_concurrency": (
            int(summary["max_stream_concurrency"].max()) if summary.height else None  # type: ignore[arg-type]
        ),
    }


SPEC = PassSpec(
    name="overlap",
    description="Time per concurrency state (compute, nccl, copies) per device and per step",
    params=OverlapParams,
    tables={"overlap": schemas.OVERLAP, "overlap_summary": schemas.OVERLAP_SUMMARY},
    run=run,
    default=True,
    after=("steps",),
    # the steps pass's state sweeps: their last user (~1 GB on 10M kernels)
    frees=("steps.device_segments", "steps.step_states", "steps.device_totals"),
)
