"""attribution: GPU time per NVTX range instance and per layer (range name).

Semantics (DESIGN.md "attribution"):

- **Ranges**: NVTX push/pop and start/end ranges that start and end on one thread
  (``end_global_tid`` null); marks and ranges ended on another thread take no part.
- **Membership** (Nsight Systems ``nvtxgpuproj``): a GPU op (kernel, memcpy, memset) belongs to a
  range when the CUDA API call that launched it, joined on ``(global_pid, correlation_id)``,
  lies inside the range on the same thread, inclusively: ``range.start <= api.start`` and
  ``api.end <= range.end``. Every enclosing range gets the op. All kernels of one CUDA graph
  launch share the launch's correlation id, so they all follow that launch (one-to-many).
- Per range, ``proj_start_ns`` = min op start, ``proj_end_ns`` = max op end and ``n_gpu_ops`` =
  number of distinct launching API calls (nvtxgpuproj counts distinct correlation ids: a graph
  launch is one) equal that report's values. nvtxgpuproj drops ranges without GPU ops; here
  they are kept with ``n_gpu_ops = 0`` and null projections unless
  ``keep_empty_ranges=False``, so that ``n_gpu_ops > 0`` selects exactly its rows.
- ``gpu_busy_ns``: the union of the range's op intervals (not the projected span), per device,
  summed over devices (GPU-time: two GPUs busy for 1 s count 2 s).
- ``exclusive_gpu_ns``: each op is owned by its innermost range only (the tightest enclosing
  range of its launch call, `intervals.tightest`). On each device, the time covered by owned
  ops is split equally among the owned ops running at each instant (`intervals.equal_shares`),
  so concurrent ops of two layers each get half and nothing is counted twice. Shares are
  rounded to whole ns by largest remainder per device, so exclusive times over all ranges sum
  **exactly** to the attributed busy time (union of owned ops), which never exceeds total GPU
  busy time.
- ``layers``: per ``(domain, name)``: ``instances`` (all range instances), ``n_gpu_ops``
  (distinct launches inside any instance), ``gpu_busy_ns`` (union across instances, per device,
  summed), ``exclusive_gpu_ns`` (sum over instances) and ``exclusive_frac`` = exclusive / total
  GPU busy time of the trace (union of all GPU ops per device, summed over devices).
- Unterminated ranges end where the loader put their end (session end); nvtxgpuproj uses the
  last NVTX timestamp instead, which can differ only for API calls after the last NVTX event.
- ``depth`` and ``parent_range_id`` come from the loader; where it left them null they are
  computed here with `intervals.nesting` (nvtxgpuproj's tightest-enclosing parent rule).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from nsysan.frames import containment as cn
from nsysan.frames import intervals as iv
from nsysan.frames import schemas
from nsysan.frames.trace import Trace
from nsysan.passes.base import PassResult, PassSpec, Results
from nsysan.passes.op_keys import KEY, op_key, unique_rows

RANGE_STYLES = ("push_pop", "start_end")
_OP_KEY = ["global_pid", "correlation_id"]


@dataclass(frozen=True)
class AttributionParams:
    #: Keep ranges that launched no GPU work (n_gpu_ops = 0, null projection). nvtxgpuproj
    #: drops them; set False to get exactly its rows.
    keep_empty_ranges: bool = True
    #: Layers listed in the ``top_layers`` metric.
    top_n: int = 5
    #: Group range names into layers by their stable part: standalone numbers become ``N``
    #: (``step 12`` → ``step N``, ``layers.3.mlp`` → ``layers.N.mlp``; ``conv2d`` is kept) and
    #: PyTorch's ``, seq = …, op_id = …, sizes = …`` suffixes are dropped
    #: (``aten::mm, op_id = 7`` → ``aten::mm``). False keeps every distinct name as a layer.
    group_numbered: bool = True


def layer_name(name: pl.Expr) -> pl.Expr:
    """The layer a range name belongs to (see `AttributionParams.group_numbered`)."""
    base = (
        pl.when(name.str.contains(r"^[A-Za-z_][\w:.<>]*, \w+ ="))
        .then(name.str.extract(r"^([^,]+),", 1))
        .otherwise(name)
    )
    return base.str.replace_all(r"\b\d+\b", "N")


def eligible_ranges(nvtx: pl.DataFrame) -> pl.DataFrame:
    """NVTX ranges that take part in attribution: same-thread push/pop and start/end ranges."""
    return nvtx.filter(
        pl.col("style").is_in(RANGE_STYLES)
        & pl.col("end_global_tid").is_null()
        & pl.col("start_ns").is_not_null()
        & pl.col("end_ns").is_not_null()
        & (pl.col("end_ns") >= pl.col("start_ns"))
    )


def _with_nesting(ranges: pl.DataFrame) -> pl.DataFrame:
    """Fill ``depth`` / ``parent_range_id`` where the loader left them null."""
    if ranges.is_empty() or ranges["depth"].null_count() == 0:
        return ranges
    nest = cn.nesting(ranges, by=["global_tid"]).select(
        "range_id", pl.col("parent_range_id").alias("_p"), pl.col("depth").alias("_d")
    )
    missing = pl.col("depth").is_null()
    return (
        ranges.join(nest, on="range_id", how="left")
        .with_columns(
            pl.when(missing).then(pl.col("_p")).otherwise(pl.col("parent_range_id"))
            .alias("parent_range_id"),
            pl.when(missing).then(pl.col("_d")).otherwise(pl.col("depth")).alias("depth"),
        )
        .drop("_p", "_d")
    )


def _largest_remainder(shares: pl.LazyFrame, unions: pl.LazyFrame) -> pl.LazyFrame:
    """Round per-(range index, device) Float64 shares to Int64 ns so that each device's sum equals
    its union exactly: floor everything, then hand the missing ns to the largest remainders
    (or, if float error overshot, take them back from the smallest)."""
    floored = shares.with_columns(pl.col("share").floor().alias("_fl")).with_columns(
        (pl.col("share") - pl.col("_fl")).alias("_frac"), pl.col("_fl").cast(pl.Int64)
    )
    need = (
        floored.group_by("device_id")
        .agg(pl.col("_fl").sum().alias("_sum"))
        .join(unions, on="device_id", how="left")
        .select("device_id", (pl.col("busy_ns") - pl.col("_sum")).alias("_need"))
    )
    ranked = (
        floored.join(need, on="device_id", how="left")
        .sort(["device_id", "_frac", "rix"], descending=[False, True, False])
        .with_columns(pl.int_range(pl.len()).over("device_id").alias("_rank_desc"))
        .with_columns(
            (pl.len().over("device_id") - 1 - pl.col("_rank_desc")).alias("_rank_asc")
        )
    )
    plus = (pl.col("_need") > 0) & (pl.col("_rank_desc") < pl.col("_need"))
    # (Overshoot is float error of a few ulps: never take a ns from a zero share.)
    minus = (pl.col("_need") < 0) & (pl.col("_rank_asc") < -pl.col("_need")) & (pl.col("_fl") > 0)
    return ranked.select(
        "rix",
        "device_id",
        (pl.col("_fl") + plus.cast(pl.Int64) - minus.cast(pl.Int64)).alias("exclusive_gpu_ns"),
    )


def _launches(cuda_api: pl.DataFrame, ops: pl.DataFrame,
              ) -> tuple[pl.DataFrame, pl.DataFrame, bool]:
    """The API calls that launched GPU ops (``launch_id``, ``global_tid``, bounds), the
    op -> launch table (``op_id``, ``launch_id``, ``device_id``, op bounds), on ``_OP_KEY``
    packed into one column (`op_keys.op_key`, computed once for both joins), and whether
    every op has one launch at most (then the op table is in ``op_id`` order)."""
    key = op_key([cuda_api, ops])
    api = (
        cuda_api.select(key, "global_tid", "start_ns", "end_ns")
        .with_row_index("launch_id")
        .with_columns(pl.col("launch_id").cast(pl.Int64))
    )
    op_k = ops.select("op_id", key, "device_id", "start_ns", "end_ns")
    cols = ["launch_id", "global_tid", "start_ns", "end_ns"]
    row = unique_rows(api[KEY], op_k[KEY])
    if row is not None:  # distinct API keys: a binary search per op, no hash joins
        found = row >= 0
        launch = row.filter(found)
        used = np.zeros(api.height, bool)
        used[launch.to_numpy()] = True
        op_launch = op_k.filter(found).select(
            "op_id", launch.alias("launch_id"), "device_id", "start_ns", "end_ns"
        )
        return api.filter(pl.Series(used)).select(cols), op_launch, True
    launches = api.join(op_k.select(KEY), on=KEY, how="semi")
    op_launch = op_k.join(launches.select("launch_id", KEY), on=KEY, how="inner").select(
        "op_id", "launch_id", "device_id", "start_ns", "end_ns"
    )
    return launches.select(cols), op_launch, False


def _owned(op_launch: pl.DataFrame, inner: pl.DataFrame, n_launches: int,
           one_launch: bool) -> pl.DataFrame:
    """``op_id, rix, device_id, start_ns, end_ns``: every op with the innermost range of its
    launch (``inner``: ``launch_id, rix``), in ``op_id`` order."""
    if one_launch:
        # Launch ids are API rows: the innermost range is an array lookup, and ops keep
        # their op_id order (one launch each, so nothing to sort or de-duplicate).
        rix_of = np.full(max(n_launches, 1), -1, np.int64)
        rix_of[inner["launch_id"].to_numpy()] = inner["rix"].to_numpy()
        rix = pl.Series("rix", rix_of[op_launch["launch_id"].to_numpy()])
        return (
            op_launch.with_columns(rix)
            .filter(pl.col("rix") >= 0)
            .select("op_id", pl.col("rix").cast(inner.schema["rix"]),
                    "device_id", "start_ns", "end_ns")
        )
    return (
        op_launch.lazy()
        .join(inner.lazy(), on="launch_id")
        .sort(["op_id", "rix"])
        .unique("op_id", keep="first")  # an op with two identical API rows is owned once
        .select("op_id", "rix", "device_id", "start_ns", "end_ns")
        .collect()
    )


def _layer_ids(ranges: pl.DataFrame, group_numbered: bool) -> tuple[pl.DataFrame, pl.Series]:
    """Layers get a dense id (``lid``) so that strings stay out of the group-bys over
    memberships: the layer table (``lid, domain, name``) and the ``lid`` of every ``rix``."""
    # Names repeat a lot (one per layer call): naming the layer of each distinct name, not
    # of each range, runs the regexes over a few hundred strings instead of millions.
    names = ranges.group_by("domain", "name").agg("rix")
    layer = layer_name(pl.col("name")) if group_numbered else pl.col("name")
    names = names.with_columns(layer.alias("_layer"))
    layer_tab = (
        names.select("domain", pl.col("_layer").alias("name")).unique().with_row_index("lid")
    )
    per_rix = (
        names.join(layer_tab, left_on=["domain", "_layer"], right_on=["domain", "name"],
                   how="left", nulls_equal=True)
        .select("rix", "lid")
        .explode("rix", empty_as_null=False)
    )
    lid = np.zeros(ranges.height, np.uint32)
    lid[per_rix["rix"].to_numpy()] = per_rix["lid"].to_numpy()
    return layer_tab, pl.Series("lid", lid, pl.UInt32)


def _members(pairs: pl.DataFrame, op_launch: pl.DataFrame) -> pl.DataFrame:
    """``pairs`` (``launch_id, rix``) joined with ``op_launch`` on ``launch_id``."""
    # A merge join: launch ids of the ops come nearly sorted (a cheap stable argsort) and
    # each pair's ops are one block of them, found by two binary searches; a hash join over
    # millions of pairs misses the cache at every probe.
    launch = op_launch["launch_id"].to_numpy()
    order = np.argsort(launch, kind="stable")
    ordered = launch[order]
    wanted = pairs["launch_id"].to_numpy()
    lo = np.searchsorted(ordered, wanted, side="left")
    n = np.searchsorted(ordered, wanted, side="right") - lo
    pair_rows = np.repeat(np.arange(len(wanted)), n)
    # Row k of a pair's block: its first row plus k (k counts up from 0 inside each block).
    first = np.repeat(lo - (np.cumsum(n) - n), n)
    op_rows = order[first + np.arange(len(pair_rows))]
    return (
        pairs.select("launch_id", "rix")[pair_rows]
        .hstack(op_launch.select(pl.exclude("launch_id"))[op_rows])
    )


def _busy(members: pl.DataFrame, group: str) -> pl.LazyFrame:
    """``gpu_busy_ns`` per ``group``: the union of its op intervals per device, summed."""
    return (
        iv.total(members, by=[group, "device_id"], name="gpu_busy_ns")
        .group_by(group)
        .agg(pl.col("gpu_busy_ns").sum())
    )


def _unavailable_reason(trace: Trace, ranges: pl.DataFrame, launch_tids: pl.Series) -> str | None:
    if not trace.has("nvtx"):
        return "NVTX was not captured: record with --trace=cuda,nvtx"
    if ranges.is_empty():
        if trace.nvtx.filter(pl.col("style").is_in(RANGE_STYLES)).height:
            return "the profile's NVTX ranges all end on another thread than they start"
        return "the profile has no NVTX ranges"
    if trace.gpu_ops.is_empty():
        return "the profile has no GPU work to attribute"
    if not trace.has("cuda_api") or trace.cuda_api.is_empty():
        return "CUDA API calls were not captured: GPU work cannot be traced to a thread"
    if launch_tids.is_empty() or not ranges["global_tid"].is_in(launch_tids.implode()).any():
        return "no NVTX range is on a thread that launches GPU work"
    return None


def run(trace: Trace, params: AttributionParams, results: Results) -> PassResult:
    trace_id = trace.trace_id
    # ``rix``: a dense range index in range_id order. Every heavy step keys on it (one small
    # integer) and ties broken on range_id break the same way on it.
    ranges = _with_nesting(eligible_ranges(trace.nvtx)).sort("range_id").with_row_index("rix")
    layer_tab, lid_of_rix = _layer_ids(ranges, params.group_numbered)
    # Small eager steps: each intermediate below feeds several results, and materialising it
    # once is cheaper than letting every consumer re-run its plan.
    ops = (
        trace.gpu_ops.select([*_OP_KEY, pl.col("device_id").fill_null(-1), "start_ns", "end_ns"])
        .with_row_index("op_id")
    )
    launches, op_launch, one_launch = _launches(trace.cuda_api, ops)
    rng = ranges.select("rix", "global_tid", "start_ns", "end_ns", "depth")
    pairs = cn.enclosing(
        launches, rng, by=["global_tid"], query_id="launch_id", range_id="rix"
    ).collect()
    # Inclusive membership: (range, op) for every enclosing range.
    inc = _members(pairs, op_launch)
    inc = inc.with_columns(lid=lid_of_rix.gather(inc["rix"]))
    # Exclusive: each op owned by the innermost range of its launch, busy time shared equally.
    # (launch_id and rix are unique across threads: no ``by`` needed.)
    inner = cn.tightest(pairs, rng, query_id="launch_id", range_id="rix", depth="depth")
    owned = _owned(op_launch, inner.collect(), trace.cuda_api.height, one_launch)

    proj = inc.lazy().group_by("rix").agg(
        pl.col("start_ns").min().alias("proj_start_ns"),
        pl.col("end_ns").max().alias("proj_end_ns"),
        pl.col("launch_id").n_unique().cast(pl.Int64).alias("n_gpu_ops"),
    )
    busy = _busy(inc, "rix")
    owned_union = iv.total(owned, by=["device_id"])
    shares = (
        cn.equal_shares(owned, by=["device_id"])
        .group_by("rix", "device_id")
        .agg(pl.col("share_ns").sum().alias("share"))
    )
    exclusive = (
        _largest_remainder(shares, owned_union)
        .group_by("rix")
        .agg(pl.col("exclusive_gpu_ns").sum())
    )
    total_busy = iv.total(ops, by=["device_id"])
    layer_ops = inc.lazy().group_by("lid").agg(
        pl.col("launch_id").n_unique().cast(pl.Int64).alias("n_gpu_ops")
    )
    layer_busy = _busy(inc, "lid")
    (proj_df, busy_df, excl_df, owned_u_df, total_df, lops_df, lbusy_df) = pl.collect_all(
        [proj, busy, exclusive, owned_union, total_busy, layer_ops, layer_busy]
    )
    launch_tids = launches["global_tid"].unique()

    attribution = (
        ranges.select(
            "rix", "range_id", "pid", "tid", "domain", "name", "depth", "parent_range_id",
            pl.col("start_ns").alias("cpu_start_ns"), pl.col("end_ns").alias("cpu_end_ns"),
        )
        .join(proj_df, on="rix", how="left")
        .join(busy_df, on="rix", how="left")
        .join(excl_df, on="rix", how="left")
        .with_columns(
            pl.col("n_gpu_ops").fill_null(0),
            pl.col("gpu_busy_ns").fill_null(0),
            pl.col("exclusive_gpu_ns").fill_null(0),
            pl.lit(trace_id).alias("trace_id"),
        )
        .sort("range_id")
    )
    total_gpu = int(total_df["busy_ns"].sum())
    attributed = int(owned_u_df["busy_ns"].sum())
    layers = (
        attribution.select(lid_of_rix.gather(attribution["rix"]).alias("lid"), "exclusive_gpu_ns")
        .group_by("lid")
        .agg(
            pl.len().cast(pl.Int64).alias("instances"),
            pl.col("exclusive_gpu_ns").sum(),
        )
        .join(layer_tab, on="lid")
        .join(lops_df, on="lid", how="left")
        .join(lbusy_df, on="lid", how="left")
        .with_columns(
            pl.col("n_gpu_ops").fill_null(0),
            pl.col("gpu_busy_ns").fill_null(0),
            (pl.col("exclusive_gpu_ns") / total_gpu if total_gpu else pl.lit(None))
            .cast(pl.Float64).alias("exclusive_frac"),
            pl.lit(trace_id).alias("trace_id"),
        )
        .sort(["exclusive_gpu_ns", "gpu_busy_ns", "domain", "name"],
              descending=[True, True, False, False], nulls_last=True)
    )
    if not params.keep_empty_ranges:
        attribution = attribution.filter(pl.col("n_gpu_ops") > 0)

    reason = _unavailable_reason(trace, ranges, launch_tids)
    # Not captured is not zero (DESIGN principle 4): coverage is unknown without NVTX or API.
    captured = trace.has("nvtx") and trace.has("cuda_api")
    metrics = _metrics(params, reason, ranges, attribution, layers, total_gpu,
                       attributed if captured else None)
    return PassResult(
        tables={
            "attribution": schemas.conform(attribution, schemas.ATTRIBUTION),
            "layers": schemas.conform(layers, schemas.LAYERS),
        },
        metrics=metrics,
    )


def _layer_label(domain: str | None, name: str | None) -> str:
    return f"{domain}:{name}" if domain else str(name)


def _metrics(params: AttributionParams, reason: str | None, ranges: pl.DataFrame,
             attribution: pl.DataFrame, layers: pl.DataFrame, total_gpu: int,
             attributed: int | None) -> dict[str, Any]:
    top = layers.filter(pl.col("exclusive_gpu_ns") > 0).head(params.top_n)
    top_layers = [  # at most top_n rows: rendering, not event processing
        {"layer": _layer_label(r["domain"], r["name"]), "exclusive_gpu_ns": r["exclusive_gpu_ns"],
         "exclusive_frac": r["exclusive_frac"], "instances": r["instances"]}
        for r in top.iter_rows(named=True)
    ]
    return {
        "nvtx_available": reason is None,
        "nvtx_unavailable_reason": reason,
        "n_ranges": ranges.height,
        "n_ranges_with_gpu_ops": int((attribution["n_gpu_ops"] > 0).sum()),
        "n_layers": layers.height,
        "gpu_busy_ns": total_gpu,
        "attributed_gpu_ns": attributed,
        "coverage_frac": attributed / total_gpu if total_gpu and attributed is not None else None,
        "top_layer": top_layers[0]["layer"] if top_layers else None,
        "top_layer_exclusive_frac": top_layers[0]["exclusive_frac"] if top_layers else None,
        "top_layers": top_layers,
    }


SPEC = PassSpec(
    name="attribution",
    description="GPU time per NVTX range instance and per layer (inclusive, busy, exclusive)",
    params=AttributionParams,
    tables={"attribution": schemas.ATTRIBUTION, "layers": schemas.LAYERS},
    run=run,
)
