"""Where step time goes, step by step: engine states and layers, from the pass tables.

Two per-step partitions of every steady-state step's GPU window (on the *primary device*, the
device with the most busy time — the one the steps pass measures):

* **by engine state** (from the ``overlap`` table's per-step rows): ``compute`` (any state with
  a compute kernel), ``communication`` (NCCL active, no compute), ``copies`` (only copies /
  memsets active) and ``idle``. They sum exactly to the step duration.
* **by layer**: each NVTX layer's exclusive GPU time (``attribution`` rows, each range instance
  assigned to the step its GPU projection starts in), ``(outside NVTX ranges)`` for the rest of
  the busy time, and the idle time split by what the host was doing (``gaps`` rows of the
  device scope: the NVTX range that explains a gap, else its cause; ``short gaps`` for idle
  time in gaps below the gaps pass threshold). They sum exactly to the step duration too (the
  outside-ranges item is the remainder). With several devices the layers hold the GPU time of
  every device, so the remainder can turn negative: the decomposition says so.

`delta_decomposition` turns the per-step means of two runs into "step time changed by X:
+Y in communication, +Z in layer NCCL:ncclAllReduce".
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from nsysan.passes.attribution import layer_name

if TYPE_CHECKING:
    from nsysan.compare.metrics import MetricSet

STATE_ITEMS = ("compute", "communication", "copies", "idle")
OUTSIDE = "(outside NVTX ranges)"
SHORT_GAPS = "short gaps"
#: the NVTX range named first in a gap's cause_detail ("NAME (nvtx) 24.1 ms of 25.0 ms; ...")
_NVTX_IN_DETAIL = r"(?:^|; )([^;]+?) \(nvtx\) "

DECOMPOSITION = pl.Schema({
    "by": pl.String,  # state | layer
    "item": pl.String,
    "kind": pl.String,  # state | layer | idle
    "base_ns_per_step": pl.Float64,
    "new_ns_per_step": pl.Float64,
    "delta_ns_per_step": pl.Float64,
    "share_of_delta": pl.Float64,  # delta / step-time delta (null when that is 0)
})


def steady_steps(steps: pl.DataFrame | None) -> pl.DataFrame | None:
    """Non-warm-up steps (all of them when every step is warm-up), sorted; None if none."""
    if steps is None or steps.is_empty():
        return None
    steady = steps.filter(~pl.col("warmup").fill_null(False))
    if steady.is_empty():
        steady = steps
    return steady.select("step", "start_ns", "end_ns", "duration_ns").sort("start_ns")


def primary_device(overlap_summary: pl.DataFrame | None) -> int | None:
    """The device with the most busy time (ties: the lowest id), as the steps pass picks."""
    if overlap_summary is None or overlap_summary.is_empty():
        return None
    row = overlap_summary.sort(["busy_ns", "device_id"], descending=[True, False]).row(
        0, named=True)
    return int(row["device_id"])


def grid(steps: pl.DataFrame, items: pl.DataFrame, per_step: pl.DataFrame) -> pl.DataFrame:
    """Every (step, item) pair with its ns (0 where the item did not occur in the step)."""
    keys = list(items.columns)
    return (
        steps.select("step").join(items, how="cross")
        .join(per_step, on=["step", *keys], how="left")
        .with_columns(pl.col("ns").fill_null(0).cast(pl.Float64))
        .sort([*keys, "step"])
    )


def state_per_step(overlap: pl.DataFrame | None, steps: pl.DataFrame,
                   device: int | None) -> pl.DataFrame | None:
    """``step, item, ns``: time of each engine-state category per steady step."""
    if overlap is None or device is None:
        return None
    parts = pl.col("state").str.split("+")
    cat = (pl.when(pl.col("state") == "idle").then(pl.lit("idle"))
           .when(parts.list.contains("compute")).then(pl.lit("compute"))
           .when(parts.list.contains("nccl")).then(pl.lit("communication"))
           .otherwise(pl.lit("copies")))
    per = (
        overlap.filter(pl.col("step").is_in(steps["step"].implode())
                       & (pl.col("device_id") == device))
        .group_by("step", cat.alias("item"))
        .agg(pl.col("duration_ns").sum().alias("ns"))
    )
    if per.is_empty():
        return None
    items = pl.DataFrame({"item": list(STATE_ITEMS)})
    return grid(steps, items, per)


def _assign_steps(df: pl.DataFrame, at: str, steps: pl.DataFrame) -> pl.DataFrame:
    """Rows of ``df`` whose ``at`` time lies in a steady step window, with that ``step``."""
    windows = steps.select(pl.col("start_ns").alias("_ws"), pl.col("end_ns").alias("_we"),
                           "step")
    return (
        df.filter(pl.col(at).is_not_null()).sort(at)
        .join_asof(windows.sort("_ws"), left_on=at, right_on="_ws", strategy="backward")
        .filter(pl.col("_ws").is_not_null() & (pl.col(at) < pl.col("_we")))
        .drop("_ws", "_we")
    )


def layer_label(grouped: bool = False) -> pl.Expr:
    """``domain:name`` (just ``name`` in the default domain), as the attribution pass labels
    layers; ``grouped``: with its grouping of numbered names (`attribution.layer_name`)."""
    name = layer_name(pl.col("name")) if grouped else pl.col("name")
    return (pl.when(pl.col("domain").fill_null("") == "").then(name)
            .otherwise(pl.format("{}:{}", pl.col("domain"), name)))


def layer_per_step(attribution: pl.DataFrame | None, steps: pl.DataFrame,
                   step_name: str | None = None, *, grouped: bool = False
                   ) -> pl.DataFrame | None:
    """``step, item, ns, ops``: exclusive GPU time and GPU ops of each layer per steady step
    (layers with no exclusive time and no ops in any steady step are left out).

    ``grouped``: layers group numbered range names as the attribution pass did for the run's
    ``layers`` table. Otherwise ``step_name``, the steps pass's name of the step ranges with
    digit runs as ``N`` (``step N``), still makes ``step 0``, ``step 1``, ... one layer, as
    every step has its own instance."""
    if attribution is None:
        return None
    label = layer_label(grouped)
    if step_name is not None and not grouped:
        is_step = ((pl.col("domain").fill_null("") == "")
                   & (pl.col("name").str.replace_all(r"\d+", "N") == step_name))
        label = pl.when(is_step).then(pl.lit(step_name)).otherwise(label)
    rows = _assign_steps(
        attribution.filter((pl.col("exclusive_gpu_ns") > 0) | (pl.col("n_gpu_ops") > 0))
        .select(label.alias("item"), "proj_start_ns", "exclusive_gpu_ns", "n_gpu_ops"),
        "proj_start_ns", steps)
    per = rows.group_by("step", "item").agg(
        pl.col("exclusive_gpu_ns").sum().alias("ns"), pl.col("n_gpu_ops").sum().alias("ops"))
    if per.is_empty():
        return None
    items = per.select("item").unique()
    times = grid(steps, items, per.drop("ops"))
    ops = grid(steps, items, per.drop("ns").rename({"ops": "ns"})).rename({"ns": "ops"})
    return times.join(ops, on=["step", "item"])


def idle_per_step(gaps: pl.DataFrame | None, states: pl.DataFrame | None, steps: pl.DataFrame,
                  device: int | None) -> pl.DataFrame | None:
    """``step, item, ns``: the idle time of each steady step by what explains it."""
    if states is None or device is None:
        return None
    idle = states.filter(pl.col("item") == "idle").select("step", pl.col("ns").alias("_idle"))
    per = pl.DataFrame(schema={"step": pl.Int64, "item": pl.String, "ns": pl.Float64})
    if gaps is not None and not gaps.is_empty():
        g = (
            gaps.filter((pl.col("scope") == "device") & (pl.col("device_id") == device))
            .join(steps.select("step", pl.col("start_ns").alias("_ws"),
                               pl.col("end_ns").alias("_we")), on="step")
            .with_columns(
                (pl.min_horizontal("end_ns", "_we") - pl.max_horizontal("start_ns", "_ws"))
                .clip(lower_bound=0).cast(pl.Float64).alias("ns"),
                pl.when(pl.col("cause") == "nvtx_range")
                .then(pl.col("cause_detail").str.extract(_NVTX_IN_DETAIL, 1)
                      .fill_null(pl.col("cause")))
                .otherwise(pl.col("cause")).alias("item"),
            )
        )
        per = g.group_by("step", "item").agg(pl.col("ns").sum())
    explained = per.group_by("step").agg(pl.col("ns").sum().alias("_gaps"))
    short = (
        idle.join(explained, on="step", how="left")
        .select("step", pl.lit(SHORT_GAPS).alias("item"),
                (pl.col("_idle") - pl.col("_gaps").fill_null(0)).alias("ns"))
    )
    per = pl.concat([per, short.cast(per.schema)])
    return grid(steps, per.select("item").unique(), per)


def outside_per_step(states: pl.DataFrame | None, layers: pl.DataFrame | None,
                     steps: pl.DataFrame) -> pl.DataFrame | None:
    """``step, item, ns``: busy time of each step not owned by any layer (the remainder)."""
    if states is None:
        return None
    busy = (states.filter(pl.col("item") != "idle").group_by("step")
            .agg(pl.col("ns").sum().alias("_busy")))
    owned = (layers.group_by("step").agg(pl.col("ns").sum().alias("_owned"))
             if layers is not None else pl.DataFrame(schema={"step": pl.Int64,
                                                             "_owned": pl.Float64}))
    return (
        steps.select("step").join(busy, on="step", how="left").join(owned, on="step", how="left")
        .select("step", pl.lit(OUTSIDE).alias("item"),
                (pl.col("_busy").fill_null(0) - pl.col("_owned").fill_null(0)).alias("ns"))
        .sort("step")
    )


def delta_decomposition(base: MetricSet, new: MetricSet) -> pl.DataFrame:
    """Per item of both partitions: mean ns per step in each run and the change, with its
    share of the change of mean step time. Items present in one run only count as 0 in the
    other. Sorted by partition, then by the size of the change (then by kind and item)."""
    step_b, step_n = base.value("step_time_ns"), new.value("step_time_ns")
    total = (step_n - step_b) if step_b is not None and step_n is not None else None
    rows = []
    for by, kinds in (("state", ("state",)), ("layer", ("layer", "idle"))):
        metric = {"state": "ns_per_step", "layer": "exclusive_ns_per_step", "idle": "ns_per_step"}
        for kind in kinds:
            name = metric[kind]
            items = sorted(set(base.selectors(kind, name)) | set(new.selectors(kind, name)))
            for item in items:
                vb = base.value(name, kind, item) or 0.0
                vn = new.value(name, kind, item) or 0.0
                rows.append({"by": by, "item": item, "kind": kind, "base_ns_per_step": vb,
                             "new_ns_per_step": vn, "delta_ns_per_step": vn - vb,
                             "share_of_delta": (vn - vb) / total if total else None})
    df = pl.DataFrame(rows, schema=DECOMPOSITION)
    return df.sort(["by", pl.col("delta_ns_per_step").abs(), "kind", "item"],
                   descending=[True, True, False, False])
