"""attribution: GPU time per NVTX range instance and per layer (range name).

Semantics (DESIGN.md "attribution"):

- **Ranges**: NVTX push/pop and start/end ranges that start and end on one thread
  (``end_global_tid`` null); marks and ranges ended on another thread take no part.
- **Membership** (Nsight Systems ``nvtxgpuproj``): a GPU op (kernel, memcpy, memset) belongs to a
  range when the CUDA API call that launched it (same ``(global_pid, correlation_id)``,
  linked once per analysis by `op_link`) lies inside the range on the same thread,
  inclusively: ``range.start <= api.start`` and ``api.end <= range.end``. Every enclosing
  range gets the op. All kernels of one CUDA graph launch share the launch's correlation id,
  so they all follow that launch (one-to-many).
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
from nsysan.frames.text import as_text, is_encoded
from nsysan.frames.trace import Trace
from nsysan.frames.window_sums import cell_sums
from nsysan.passes import attribution_sums as sums
from nsysan.passes import device_blocks, op_link
from nsysan.passes.base import PassResult, PassSpec, Results

RANGE_STYLES = ("push_pop", "start_end")
#: the columns of the NVTX ranges the pass reads
RANGE_COLUMNS = ("range_id", "global_tid", "pid", "tid", "domain", "name", "depth",
                 "parent_range_id", "start_ns", "end_ns")


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
    """NVTX ranges that take part in attribution: same-thread push/pop and start/end ranges,
    their `RANGE_COLUMNS`.

    (Filtered inside a select of those columns: a filter of the whole frame would expand
    its constant columns, e.g. ``trace_id``, to one value per range first,
    `nsysan.frames.trace`.)"""
    return nvtx.select(pl.col(*RANGE_COLUMNS).filter(
        pl.col("style").is_in(RANGE_STYLES)
        & pl.col("end_global_tid").is_null()
        & pl.col("start_ns").is_not_null()
        & pl.col("end_ns").is_not_null()
        & (pl.col("end_ns") >= pl.col("start_ns"))
    ))


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


def _launches(trace: Trace) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The API calls that launched GPU ops (``launch_id`` = API row, ``global_tid``, bounds)
    and the op -> launch table (``op_id`` = row of ``gpu_ops``, ``launch_id``; one launch
    per op at most, in ``op_id`` order)."""
    rows = op_link.api_rows(trace)  # shared with the other passes: usually found already
    found = rows >= 0  # every op's call is a row number: no hash joins
    op_launch = pl.DataFrame([
        pl.Series("op_id", np.flatnonzero(found), pl.UInt32),
        pl.Series("launch_id", rows[found], pl.Int64),
    ])
    # (the launching calls only, numbered by their row: no row index over every API call)
    launching = op_link.launched(trace, rows)
    api = trace.cuda_api.select("global_tid", "start_ns", "end_ns").filter(launching)
    launch_id = pl.Series("launch_id", np.flatnonzero(launching.to_numpy()), pl.Int64)
    return api.select(launch_id, pl.all()), op_launch


def _op_bounds(trace: Trace, op_ids: pl.Series) -> pl.DataFrame:
    """``device_id, start_ns, end_ns`` of the ``gpu_ops`` rows ``op_ids``, in that order (a
    null device is -1, which no CUDA device id is). Gathered before the cast: only the
    rows asked for are copied."""
    return (
        trace.gpu_ops.select(pl.col("device_id", "start_ns", "end_ns").gather(op_ids))
        .with_columns(pl.col("device_id").cast(pl.Int64).fill_null(-1))
    )


def _owned(trace: Trace, op_launch: pl.DataFrame, inner: pl.DataFrame,
           n_launches: int) -> pl.DataFrame:
    """``op_id, rix, device_id, start_ns, end_ns``: every op with the innermost range of its
    launch (``inner``: ``launch_id, rix``), in ``op_id`` order."""
    # Launch ids are API rows: the innermost range is an array lookup, and ops keep their
    # op_id order (one launch each, so nothing to sort or de-duplicate).
    rix_of = np.full(max(n_launches, 1), -1, np.int64)
    rix_of[inner["launch_id"].to_numpy()] = inner["rix"].to_numpy()
    rix = rix_of[op_launch["launch_id"].to_numpy()]
    kept = rix >= 0
    op_ids = op_launch["op_id"].filter(pl.Series(kept))
    return (
        pl.DataFrame([op_ids, pl.Series("rix", rix[kept], inner.schema["rix"])])
        .hstack(_op_bounds(trace, op_ids))
    )


def _layer_ids(ranges: pl.DataFrame, group_numbered: bool) -> tuple[pl.DataFrame, pl.Series]:
    """Layers get a dense id (``lid``) so that strings stay out of the group-bys over
    memberships: the layer table (``lid, domain, name``) and the ``lid`` of every ``rix``."""
    # Names repeat a lot (one per layer call): naming the layer of each distinct name, not
    # of each range, runs the regexes over a few hundred strings instead of millions.
    nid, rep = _name_ids(ranges)
    names = as_text(ranges.select("domain", "name")[rep])  # one row per distinct name
    layer = layer_name(pl.col("name")) if group_numbered else pl.col("name")
    names = names.with_columns(layer.alias("_layer")).with_row_index("_nid")
    layer_tab = (
        names.select("domain", pl.col("_layer").alias("name")).unique().with_row_index("lid")
    )
    lid_of_name = (
        names.join(layer_tab, left_on=["domain", "_layer"], right_on=["domain", "name"],
                   how="left", nulls_equal=True)
        .sort("_nid")["lid"].to_numpy()
    )
    return layer_tab, pl.Series("lid", lid_of_name[nid].astype(np.uint32), pl.UInt32)


def _name_ids(ranges: pl.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """A dense id of every range's ``(domain, name)`` and one row of every id. The codes of
    the two Categoricals (of a String column: of an Enum of its own values, a hash per
    string; no group-by building lists of rows), packed into one integer and made dense by
    a table of the codes present (or a sort)."""
    if ranges.is_empty():
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    domain, name = (
        (ranges[c] if is_encoded(ranges[c].dtype)
         else ranges[c].cast(pl.Enum(ranges[c].unique().drop_nulls())))
        .to_physical().cast(pl.Int64).fill_null(-1).to_numpy() + 1
        for c in ("domain", "name")
    )
    if (int(domain.max()) + 1) * (int(name.max()) + 1) >= 1 << 62:  # huge codes: rank them
        domain, name = (np.unique(c, return_inverse=True)[1] for c in (domain, name))
    code = domain * (int(name.max()) + 1) + name
    if int(code.max()) < 4 * len(code) + 4096:
        present = np.bincount(code) > 0
        nid = (np.cumsum(present) - 1)[code]
        n_ids = int(present.sum())
    else:
        _, nid = np.unique(code, return_inverse=True)
        n_ids = int(nid.max()) + 1
    rep = np.empty(n_ids, np.int64)
    rep[nid] = np.arange(len(nid))  # any row of an id will do: they all hold its strings
    return nid, rep


def _members(trace: Trace, pairs: pl.DataFrame, op_launch: pl.DataFrame,
             ) -> tuple[pl.DataFrame, np.ndarray]:
    """``rix, device_id, start_ns, end_ns``: ``pairs`` (``launch_id, rix``) joined with
    ``op_launch`` on ``launch_id``, with the ops' devices and bounds; and which pairs found
    an op (their launch launched something)."""
    # A merge join: launch ids of the ops come nearly sorted (a cheap stable argsort) and
    # each pair's ops are one block of them, found by two binary searches; a hash join over
    # millions of pairs misses the cache at every probe.
    launch = op_launch["launch_id"].to_numpy()
    wanted = pairs["launch_id"].to_numpy()
    if len(launch) and launch.min() >= 0 and np.bincount(launch).max() == 1:
        # One op per launch (no graph launches): the op of a launch is an array lookup.
        op_of = np.full(max(int(launch.max()), int(wanted.max(initial=0))) + 1, -1, np.int64)
        op_of[launch] = np.arange(len(launch))
        op_rows = op_of[wanted]
        has_ops = op_rows >= 0
        pair_rows = np.flatnonzero(has_ops)
        op_rows = op_rows[pair_rows]
    else:
        pair_rows, op_rows = _merge_rows(launch, wanted)
        has_ops = np.zeros(len(wanted), bool)
        has_ops[pair_rows] = True
    # (only what the sums read: the range and the op's device and bounds)
    inc = pairs.select("rix")[pair_rows].hstack(
        _op_bounds(trace, op_launch["op_id"].gather(op_rows)))
    return inc, has_ops


def _merge_rows(launch: np.ndarray, wanted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows of ``wanted`` and of ``launch`` that hold the same launch id, every pair once."""
    order = np.argsort(launch, kind="stable")
    ordered = launch[order]
    lo = np.searchsorted(ordered, wanted, side="left")
    n = np.searchsorted(ordered, wanted, side="right") - lo
    pair_rows = np.repeat(np.arange(len(wanted)), n)
    # Row k of a pair's block: its first row plus k (k counts up from 0 inside each block).
    first = np.repeat(lo - (np.cumsum(n) - n), n)
    return pair_rows, order[first + np.arange(len(pair_rows))]


def _total_busy(trace: Trace) -> int:
    """GPU busy time of the trace: the union of all GPU ops per device, summed (ops of a
    null device are one more device). The unions per device are those of the
    other passes, cut from one shared sorted stream (read once here: not kept), summed from
    the blocks' arrays (no frame to build)."""
    if trace.gpu_ops.is_empty():
        return 0
    blocks = device_blocks.blocks(trace, None, timed=False, keep=False)
    return int((blocks.end - blocks.start).sum())


def _unavailable_reason(trace: Trace, ranges: pl.DataFrame, launch_tids: pl.Series) -> str | None:
    if not trace.has("nvtx"):
        return "NVTX was not captured: record with --trace=cuda,nvtx"
    if ranges.is_empty():
        if trace.nvtx.select(pl.col("style").is_in(RANGE_STYLES).any()).item():
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
    ranges = _with_nesting(eligible_ranges(trace.nvtx))
    if not ranges["range_id"].is_sorted():  # loaders emit them in order: checking is cheaper
        ranges = ranges.sort("range_id")
    ranges = ranges.with_row_index("rix")
    layer_tab, lid_of_rix = _layer_ids(ranges, params.group_numbered)
    # Small eager steps: each intermediate below feeds several results, and materialising it
    # once is cheaper than letting every consumer re-run its plan.
    launches, op_launch = _launches(trace)
    total_gpu = _total_busy(trace)
    launch_tids = launches["global_tid"].unique()
    # Memory: the (launch, enclosing range) pairs and the ops joined to them are the pass's
    # largest intermediates (a row per op and enclosing range: several per op). The
    # exclusive shares are computed before the inclusive members are built, and each
    # intermediate is dropped after its last use, so that they are never all alive at once.
    # The ops' devices and bounds are read from ``gpu_ops`` only for the rows each of them
    # needs (`_op_bounds`): no copy of them is held beside the ids.
    rng = ranges.select("rix", "global_tid", "start_ns", "end_ns", "depth")
    # (launch_id and rix are unique across threads: the pairs need no thread column, and
    # the innermost range below no ``by``)
    pairs = cn.enclosing(
        launches, rng, by=["global_tid"], query_id="launch_id", range_id="rix", keep_by=False
    ).collect()
    del launches
    # Exclusive: each op owned by the innermost range of its launch, busy time shared equally.
    inner = cn.tightest(pairs, rng, query_id="launch_id", range_id="rix", depth="depth")
    owned = _owned(trace, op_launch, inner.collect(), trace.cuda_api.height)
    del inner
    owned_union = iv.total(owned, by=["device_id"]).collect()
    shares = (
        cn.equal_shares(owned, by=["device_id"])
        .group_by("rix", "device_id")
        .agg(pl.col("share_ns").sum().alias("share"))
    )
    excl = _largest_remainder(shares, owned_union.lazy()).collect()
    del owned, shares
    n_ranges, n_layers = ranges.height, layer_tab.height
    exclusive = np.zeros(n_ranges, np.int64)
    # (null: a device whose owned ops all have zero length has no union; a sum skips it)
    np.add.at(exclusive, excl["rix"].to_numpy(),
              excl["exclusive_gpu_ns"].fill_null(0).to_numpy())
    del excl

    # Inclusive membership: (range, op) for every enclosing range.
    inc, has_ops = _members(trace, pairs, op_launch)
    del op_launch
    # Per range and per layer: arrays indexed by rix / lid (see `attribution_sums`).
    rix = inc["rix"].to_numpy()
    lid = lid_of_rix.to_numpy()
    proj_start, proj_end = sums.projection(rix, inc["start_ns"], inc["end_ns"], n_ranges)
    # A (launch, range) pair is listed once: distinct launches of a range = pairs with ops.
    launched = pairs.filter(pl.Series(has_ops)).select("launch_id", "rix")
    del pairs
    pair_rix = launched["rix"].to_numpy()
    range_busy, layer_busy = sums.union_busies(inc, [(rix, n_ranges), (lid[rix], n_layers)])
    del inc, rix
    attribution = (
        ranges.select(
            "range_id", "pid", "tid", "domain", "name", "depth", "parent_range_id",
            pl.col("start_ns").alias("cpu_start_ns"), pl.col("end_ns").alias("cpu_end_ns"),
        )
        .with_columns(
            proj_start.alias("proj_start_ns"),
            proj_end.alias("proj_end_ns"),
            pl.Series("n_gpu_ops", np.bincount(pair_rix, minlength=n_ranges).astype(np.int64)),
            pl.Series("gpu_busy_ns", range_busy),
            pl.Series("exclusive_gpu_ns", exclusive),
            pl.lit(trace_id).alias("trace_id"),
        )
    )
    attributed = int(owned_union["busy_ns"].sum())
    per_layer = pl.DataFrame({
        "lid": pl.Series(np.arange(n_layers), dtype=layer_tab.schema["lid"]),
        "instances": np.bincount(lid, minlength=n_layers).astype(np.int64),
        "exclusive_gpu_ns": cell_sums(lid, exclusive, n_layers),
        "n_gpu_ops": sums.distinct_counts(lid[pair_rix], launched["launch_id"].to_numpy(),
                                          n_layers),
        "gpu_busy_ns": layer_busy,
    })
    layers = (
        per_layer.filter(pl.col("instances") > 0)
        .join(layer_tab, on="lid")
        .with_columns(
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
    default=True,
)
