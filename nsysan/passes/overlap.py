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

import polars as pl

from nsysan.frames import intervals as iv
from nsysan.frames import schemas
from nsysan.frames.packed_keys import GROUP, Keys, group_agg
from nsysan.frames.trace import Trace
from nsysan.passes.base import PassResult, PassSpec, Results
from nsysan.passes.steps import OVERLAP_CLASSES, device_segments, state_has, step_windows

IDLE = 0  # state code with no class active


@dataclass(frozen=True)
class OverlapParams:
    per_step: bool = True  # also break states down per step when steps are known


def _stream_concurrency(ops: pl.DataFrame) -> pl.LazyFrame:
    """``device_id, max_stream_concurrency, mean_stream_concurrency`` (over busy time)."""
    per_stream = iv.union(ops, by=["device_id", "pid", "stream_id"]).collect()
    # Per-stream unions are disjoint, so a running sum of +1 at every start and -1 at every
    # end, in (device, time) order, is the number of active streams. One Int64 per event
    # (packed device and time, start flag in the low bit) makes that one single-column sort.
    keys = Keys([per_stream], ["device_id"], ["start_ns", "end_ns"], low=2)
    events = pl.concat(
        [keys.pack(0, "start_ns") * 2 + 1, keys.pack(0, "end_ns") * 2]
    ).sort().alias("_e").to_frame()
    key, nxt = pl.col("_k"), pl.col("_k").shift(-1)
    levels = (
        events.lazy()
        .select((pl.col("_e") // 2).alias("_k"), ((pl.col("_e") % 2) * 2 - 1).cum_sum().alias("_n"))
        .filter(key != key.shift(-1, fill_value=-1))  # the level after all events at an instant
        .select(
            keys.group(key).alias(GROUP),
            "_n",
            pl.when(keys.group(key) == keys.group(nxt))
            .then(keys.length(key, nxt)).alias("_len"),
        )
        .filter(pl.col("_len").is_not_null() & (pl.col("_n") > 0))
        .group_by(GROUP)
        .agg(
            pl.col("_n").max().cast(pl.Int64).alias("max_stream_concurrency"),
            ((pl.col("_n") * pl.col("_len")).sum() / pl.col("_len").sum())
            .alias("mean_stream_concurrency"),
        )
        .collect()
    )
    return keys.attach_by(levels).lazy()


def _per_step(
    segs: pl.LazyFrame, spans: pl.LazyFrame, steps: pl.DataFrame
) -> pl.LazyFrame:
    """``device_id, step, state_code, duration_ns``: states clipped to every step window."""
    windows = spans.select("device_id").join(steps.lazy(), how="cross")
    dur = pl.col("end_ns") - pl.col("start_ns")
    pieces = iv.overlay(segs, windows.select("device_id", "step", "start_ns", "end_ns"),
                        by=["device_id"], window_cols=["step"]).collect()
    inside = group_agg(
        pieces, ["device_id", "step"], "state_code", [dur.sum().alias("duration_ns")]
    ).lazy()
    # The part of a window outside the device span is idle.
    outside = (
        windows.join(spans, on="device_id")
        .with_columns(
            (dur - (pl.min_horizontal("end_ns", "_e") - pl.max_horizontal("start_ns", "_s"))
             .clip(lower_bound=0)).alias("duration_ns")
        )
        .filter(pl.col("duration_ns") > 0)
        .select("device_id", "step", pl.lit(IDLE, pl.Int64).alias("state_code"), "duration_ns")
    )
    return (
        pl.concat([inside, outside])
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
        .collect()
    )
    # States stay integer bit sets (cheap to group) until the tables are small. The steps
    # pass usually built them already.
    segs_df = device_segments(trace)
    label = pl.col("state_code").replace_strict(
        iv.state_names(OVERLAP_CLASSES), return_dtype=pl.String
    ).alias("state")
    dur = pl.col("end_ns") - pl.col("start_ns")
    whole = (
        group_agg(segs_df, ["device_id"], "state_code", [dur.sum().alias("duration_ns")])
        .select("device_id", label, "duration_ns", pl.lit(None, pl.Int64).alias("step"))
    )
    parts = [whole.lazy()]
    steps = step_windows(results) if params.per_step else None
    if steps is not None and not segs_df.is_empty():
        spans = segs_df.lazy().group_by("device_id").agg(
            pl.col("start_ns").min().alias("_s"), pl.col("end_ns").max().alias("_e")
        )
        per_step = _per_step(segs_df.lazy(), spans, steps.select("step", "start_ns", "end_ns"))
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
        .join(_stream_concurrency(ops), on="device_id", how="left")
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
    after=("steps",),
)
