"""memory: device memory in use over time, its peak, growth per step and pool reserve, from
CUDA memory-usage events (``nsys profile --cuda-memory-usage=true``).

Semantics:

- The **level** of a key (device, process, memory kind) at time ``t`` is the sum of the bytes
  of its allocations minus its frees with ``start_ns <= t`` (events at one timestamp apply
  together, so their row order never matters). It starts at 0: memory allocated before the
  capture began is unknown to the trace.
- ``memory`` (the curve): the session ``[0, duration)`` (or the events' span when the export
  has no duration) cut into ``bins`` equal bins; one row per key and bin from the key's first
  event on. ``in_use_bytes_max`` is the highest level inside the bin, exactly (the level the
  bin starts with, or after any of its events); ``in_use_bytes_end`` the level at its end.
  ``pool_*_max`` is the highest total over the key's local pools of the reserved / utilized
  sizes the events report (each pool counts with its latest report), null without pools.
- ``memory_summary``, per (device, process), over the **device-resident** kinds
  (``device_kinds``: device, array, device_static; pinned and pageable memory is host memory
  and managed memory can be oversubscribed): ``peak_bytes`` / ``peak_ns`` (first time
  reached), the same for all processes of the device together (``device_peak_*``), the
  margin to ``TARGET_INFO_GPU.totalMemory``.
- Per step (the steady steps of the steps pass: non-warm-up, all when every step is warm-up):
  ``growth_bytes_per_step`` = (level at the end of the last steady step - level at the start
  of the first) / steps, where the level "at" a step boundary ``b`` counts the events with
  ``start_ns < b`` (steps are half-open); ``steps_grown_frac`` the share of steady steps
  whose level at the end exceeds that at the start; ``steps_allocating_frac`` the share of
  steady steps with an allocation (the repetition of churn); allocations and frees whose
  start lies in a steady step, per step, with their bytes and the host time of the distinct
  API calls that made them. Without steps these columns are null and ``n_steps`` is 0.
- Pools: ``pool_reserved_peak_bytes`` is the peak of the total reserved size, with the
  utilized size at that moment. A **pool growth** is an event after which its pool reserves
  more than at its previous event; it has **slack** when the pool's free bytes before it
  (reserved - utilized) could have held the allocation: the pool grew although, in total, it
  had room — the fragmentation proxy. Counted inside the steady window (the span of the
  steady steps; the whole trace without steps).
- ``memory_sites``: per (device, process) and allocation site, the device-resident allocations
  whose call is known, by the innermost NVTX range around the call on its thread (inclusive,
  the attribution pass's rule; null: outside every range): count and bytes, in the whole trace
  and in the steady steps, and the share of the process's allocated bytes. `linked_events`
  gives every event its call and range.

A trace whose export holds no memory-usage events gets no tables and no metrics: the pass
is then only run when asked for (see `nsysan.passes.registry.auto_passes`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import polars as pl

from nsysan.frames import schemas
from nsysan.frames.containment import enclosing, tightest
from nsysan.frames.context import Product, product, share
from nsysan.frames.trace import Trace
from nsysan.passes import memory_levels as ml
from nsysan.passes.base import PassResult, PassSpec, Results
from nsysan.passes.memory_schemas import MEMORY, MEMORY_SITES, MEMORY_SUMMARY, TABLES
from nsysan.passes.op_keys import KEY as KEY_COL
from nsysan.passes.op_keys import OP_KEY, op_key, unique_rows

KEY = ["device_id", "pid", "mem_kind"]
DP = ["device_id", "pid"]
DeviceLevels = dict[int, tuple[np.ndarray, np.ndarray]]


@dataclass(frozen=True)
class MemoryParams:
    #: bins of the in-use curve over the session
    bins: int = 200
    #: memory kinds that live in device memory (count against the device's total)
    device_kinds: tuple[str, ...] = ("device", "array", "device_static")
    #: build memory_sites (the NVTX range around every allocation call: about half the
    #: pass's time on a million events; off, the findings name no allocation site)
    sites: bool = True
    # The thresholds of this pass's findings live here, not in the findings params: a trace
    # without memory events then keeps its findings params (and bytes) exactly as before.
    #: MEMORY_NEAR_OOM: warning when the device peak leaves less than this share free ...
    near_oom_warn_frac: float = 0.05
    #: ... critical under this share
    near_oom_crit_frac: float = 0.02
    #: MEMORY_GROWTH: at least this many steady steps, this share of them growing, and ...
    growth_min_steps: int = 4
    growth_min_step_frac: float = 0.75
    #: ... at least this growth per step (bytes)
    growth_min_bytes_per_step: int = 1 << 20
    #: MEMORY_GROWTH is critical when the steady window's growth would exhaust the margin
    #: within this many more steps
    growth_crit_steps_to_oom: int = 1000
    #: POOL_FRAGMENTATION: at least this many pool growths with slack in the steady window,
    #: while the pool uses at most this share of what it reserves
    frag_min_growths: int = 3
    frag_max_utilized_frac: float = 0.5

    def __post_init__(self) -> None:
        if self.bins < 1:
            raise ValueError(f"bins must be >= 1, got {self.bins}")
        for name in ("near_oom_warn_frac", "near_oom_crit_frac", "growth_min_step_frac",
                     "frag_max_utilized_frac"):
            v = getattr(self, name)
            if not 0 <= v <= 1:
                raise ValueError(f"{name} must be in [0, 1], got {v}")


def has_events(trace: Trace) -> bool:
    """True when the export holds memory-usage rows (a cheap probe of the raw table count;
    in-memory traces are asked for their frame)."""
    tables = trace.meta.tables
    if "CUDA_GPU_MEMORY_USAGE_EVENTS" in tables:
        return tables.has_rows("CUDA_GPU_MEMORY_USAGE_EVENTS")
    if trace.meta.source_format == "memory":
        return trace.frame("memory_events").height > 0
    return False


def _no_events(trace: Trace) -> PassResult:
    """Asked for on a trace without memory events (`--passes memory`): its tables, empty
    with their schemas, and a metric that says why (not auto-selected then: `has_events`)."""
    return PassResult(
        tables={name: schemas.empty(schema).with_columns(pl.lit(trace.trace_id).alias(
            "trace_id")) for name, schema in SPEC.tables.items()},
        metrics={"n_events": 0, "note": "no CUDA memory-usage events in this trace (record "
                 "with `nsys profile --cuda-memory-usage=true`)"})


def run(trace: Trace, params: MemoryParams, results: Results) -> PassResult:
    if not has_events(trace):
        return _no_events(trace)
    ev = trace.memory_events.filter(pl.col("op").is_not_null() & pl.col("bytes").is_not_null()
                                    & pl.col("device_id").is_not_null())
    if ev.is_empty():
        return _no_events(trace)
    lo, hi = _span(trace, ev)
    arrays = _arrays(ev)
    keys, kid = ml.key_ids(ev, KEY)
    lv = ml.levels_of(keys, kid, arrays[0], arrays[3])
    curve = _curve(ev, lv, arrays, lo, hi, params.bins, trace.trace_id)
    steady = _steady_steps(results)
    summary, sites = _summary(trace, ev, arrays, lv, params, steady)
    metrics: dict[str, Any] = {
        "thresholds": asdict(params),
        "n_events": ev.height,
    }
    if summary.height:
        dev = summary.filter(pl.col("device_peak_bytes").is_not_null())
        if dev.height:
            metrics["peak_memory_bytes"] = int(dev["device_peak_bytes"].max())  # type: ignore[arg-type]
    return PassResult(
        tables={"memory": schemas.conform(curve, MEMORY),
                "memory_summary": schemas.conform(summary, MEMORY_SUMMARY),
                "memory_sites": schemas.conform(sites, MEMORY_SITES)},
        metrics=metrics,
    )


# ---------------------------------------------------------------------------------------------
def _span(trace: Trace, ev: pl.DataFrame) -> tuple[int, int]:
    first, last = ev.select(pl.col("start_ns").min().alias("a"),
                            pl.col("start_ns").max().alias("b")).row(0)
    dur = trace.meta.duration_ns
    if dur is not None and first >= 0 and last < dur:
        return 0, int(dur)
    return int(first), int(last) + 1


def _arrays(ev: pl.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Start times, allocation flags, bytes and signed bytes of the rows of ``ev``."""
    t = ev["start_ns"].to_numpy()
    alloc = (ev["op"] == "alloc").to_numpy()
    nbytes = ev["bytes"].to_numpy()
    return t, alloc, nbytes, np.where(alloc, nbytes, -nbytes)


def _pool_totals(ev: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """Per ``by`` key and timestamp of pool events: the total over the key's pools of each
    pool's latest reserved and utilized size (columns ``reserved``, ``utilized``)."""
    pools = ev.filter(pl.col("pool_address").is_not_null()
                      & pl.col("pool_size_bytes").is_not_null())
    if pools.is_empty():
        return pl.DataFrame(schema={**{c: ev.schema[c] for c in by}, "start_ns": pl.Int64,
                                    "reserved": pl.Int64, "utilized": pl.Int64})
    pk = [*by, "pool_address"]
    # a pool's report at one timestamp: the last of its events there in content order
    last = (pools.sort([*pk, "start_ns", "pool_size_bytes", "pool_utilized_bytes"],
                       nulls_last=True)
            .group_by([*pk, "start_ns"], maintain_order=True)
            .agg(pl.col("pool_size_bytes").last(),
                 pl.col("pool_utilized_bytes").fill_null(0).last()))
    deltas = last.sort([*pk, "start_ns"]).with_columns(
        (pl.col("pool_size_bytes") - pl.col("pool_size_bytes").shift(1).over(pk).fill_null(0))
        .alias("_dr"),
        (pl.col("pool_utilized_bytes")
         - pl.col("pool_utilized_bytes").shift(1).over(pk).fill_null(0)).alias("_du"))
    return (deltas.group_by([*by, "start_ns"]).agg(pl.col("_dr").sum(), pl.col("_du").sum())
            .sort([*by, "start_ns"])
            .select(*by, "start_ns", pl.col("_dr").cum_sum().over(by).alias("reserved"),
                    pl.col("_du").cum_sum().over(by).alias("utilized")))


Arrays = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def _curve(ev: pl.DataFrame, lv: ml.Levels, arrays: Arrays, lo: int, hi: int, bins: int,
           trace_id: str) -> pl.DataFrame:
    width = max(-(-(hi - lo) // bins), 1)
    n_bins = -(-(hi - lo) // width)
    t, alloc, nbytes, _ = arrays
    got = ml.binned(lv, lo, width, n_bins, t, alloc, nbytes)
    live = got.pop("live")
    at = np.flatnonzero(live)
    bin_no = at % n_bins
    df = lv.keys[at // n_bins].with_columns(
        pl.Series("bin", bin_no, pl.Int64),
        pl.Series("start_ns", lo + bin_no * width, pl.Int64),
        pl.Series("end_ns", np.minimum(lo + (bin_no + 1) * width, hi), pl.Int64),
        pl.Series("in_use_bytes_max", got["max"][at], pl.Int64),
        pl.Series("in_use_bytes_end", got["end"][at], pl.Int64),
        *(pl.Series(c, got[c][at], pl.Int64)
          for c in ("alloc_bytes", "free_bytes", "n_allocs", "n_frees")),
        pl.lit(trace_id).alias("trace_id"),
    )
    bin_of = ((pl.col("start_ns") - lo) // width).clip(0, n_bins - 1).alias("bin")
    pools = _pool_totals(ev.filter(pl.col("pool_address").is_not_null()), KEY)
    if pools.height:
        per_bin = pools.with_columns(bin_of).group_by([*KEY, "bin"]).agg(
            pl.col("reserved").max().alias("pool_size_bytes_max"),
            pl.col("utilized").max().alias("pool_utilized_bytes_max"))
        df = df.join(per_bin, on=[*KEY, "bin"], how="left", maintain_order="left")
    return df


def _steady_steps(results: Results) -> pl.DataFrame | None:
    r = results.get("steps")
    steps = r.tables.get("steps") if r is not None else None
    if steps is None or steps.is_empty():
        return None
    steady = steps.filter(~pl.col("warmup").fill_null(False))
    return (steady if not steady.is_empty() else steps).sort("start_ns", "step")


def _summary(trace: Trace, ev: pl.DataFrame, arrays: Arrays, klv: ml.Levels,
             params: MemoryParams, steady: pl.DataFrame | None
             ) -> tuple[pl.DataFrame, pl.DataFrame]:
    # the device-resident events, found per key (no string test per event)
    keys, kid = klv.keys, klv.kid_raw
    device_key = keys["mem_kind"].is_in(list(params.device_kinds)).fill_null(False).to_numpy()
    mask = device_key[kid]
    if not mask.any():
        return schemas.empty(MEMORY_SUMMARY), schemas.empty(MEMORY_SITES)
    every = bool(device_key.all())
    t, alloc, nbytes, signed = arrays if every else tuple(a[mask] for a in arrays)
    dp_keys, dp_kid = ml.coarser(keys, kid if every else kid[mask], DP)
    # (levels by (device, process) and by device are those of the finer keys when the
    # coarsening merges none: one memory kind per process, one process per device)
    lv = (ml.regrouped(klv, dp_keys, dp_kid) if every else None) \
        or ml.levels_of(dp_keys, dp_kid, t, signed)
    peak, peak_ns = lv.peaks()
    d_keys, d_kid = ml.coarser(dp_keys, dp_kid, ["device_id"])
    dlv = ml.regrouped(lv, d_keys, d_kid) or ml.levels_of(d_keys, d_kid, t, signed)
    dpeak, dpeak_ns = dlv.peaks()
    if tuple(params.device_kinds) == MemoryParams().device_kinds:  # what the picture draws
        share(trace, DEVICE_LEVELS, _by_device(dlv))  # the picture reads them (no rebuild)
    gpus = trace.frame("gpus") if trace.has("gpus") else schemas.empty(schemas.GPUS)
    totals = (gpus.select("device_id", pl.col("total_memory_bytes").alias("device_total_bytes"))
              .unique("device_id", keep="first").sort("device_id"))
    out = lv.keys.with_columns(
        pl.Series("peak_bytes", peak, pl.Int64), pl.Series("peak_ns", peak_ns, pl.Int64),
        pl.Series("n_events", np.bincount(lv.kid_raw, minlength=lv.n_keys), pl.Int64))
    out = (out.join(dlv.keys.with_columns(pl.Series("device_peak_bytes", dpeak, pl.Int64),
                                          pl.Series("device_peak_ns", dpeak_ns, pl.Int64)),
                    on="device_id", how="left", maintain_order="left")
           .join(totals, on="device_id", how="left", maintain_order="left")
           .with_columns((pl.col("device_total_bytes") - pl.col("device_peak_bytes"))
                         .alias("margin_bytes")))
    out = out.with_columns(
        (pl.col("margin_bytes") / pl.col("device_total_bytes")).clip(0, 1).alias("margin_frac"))
    rows = call_rows(trace, ev) if every else call_rows(trace, ev)[mask]
    step = np.zeros(t.size, np.int64)  # (without steps, every event counts as steady)
    if steady is not None:
        step = ml.in_steps(t, steady["start_ns"].to_numpy(), steady["end_ns"].to_numpy())
        out = out.with_columns(**_per_step(trace, lv, steady, step, alloc, nbytes, rows))
    else:
        out = out.with_columns(pl.lit(0, pl.Int64).alias("n_steps"))
    sites = (_sites(trace, ev if every else ev.filter(pl.Series(mask)), rows, alloc, step >= 0)
             if params.sites else schemas.empty(MEMORY_SITES))
    pooled = ev.filter(pl.col("pool_address").is_not_null()
                       & pl.col("mem_kind").is_in(list(params.device_kinds)))
    out = out.join(_pools(pooled, steady), on=DP, how="left", maintain_order="left")
    return (out.with_columns(pl.lit(trace.trace_id).alias("trace_id")).sort(DP),
            sites.with_columns(pl.lit(trace.trace_id).alias("trace_id")))


def _sites(trace: Trace, dev: pl.DataFrame, rows: np.ndarray, alloc: np.ndarray,
           steady: np.ndarray) -> pl.DataFrame:
    """Per (device, process, allocation site): the allocations whose call is known, by the
    innermost NVTX range around the call on its thread (null: outside every range)."""
    take = alloc & (rows >= 0)
    if not take.any():
        return schemas.empty(MEMORY_SITES)
    api = trace.cuda_api
    idx = pl.Series(rows[take])
    calls = pl.DataFrame({"global_tid": api["global_tid"].gather(idx),
                          "api_start_ns": api["start_ns"].gather(idx),
                          "api_end_ns": api["end_ns"].gather(idx)})
    named = (dev.filter(pl.Series(take)).select(*DP, "bytes")
             .with_columns(_innermost_ranges(trace, calls)["nvtx_name"],
                           pl.Series("_steady", steady[take])))
    got = named.group_by([*DP, "nvtx_name"]).agg(
        pl.len().cast(pl.Int64).alias("n_allocs"), pl.col("bytes").sum().alias("alloc_bytes"),
        pl.col("_steady").sum().cast(pl.Int64).alias("steady_n_allocs"),
        pl.col("bytes").filter(pl.col("_steady")).sum().alias("steady_alloc_bytes"))
    return got.with_columns(
        (pl.col("alloc_bytes") / pl.col("alloc_bytes").sum().over(DP)).fill_nan(None)
        .alias("alloc_bytes_frac"),
    ).sort([*DP, "alloc_bytes", "nvtx_name"], descending=[False, False, True, False],
           nulls_last=True)


def _per_step(trace: Trace, lv: ml.Levels, steady: pl.DataFrame, step: np.ndarray,
              alloc: np.ndarray, nbytes: np.ndarray, rows: np.ndarray
              ) -> dict[str, pl.Series]:
    """The per-step columns of every key of ``lv`` (``step``: each event's steady step)."""
    n, n_keys = steady.height, lv.n_keys
    starts, ends = steady["start_ns"].to_numpy(), steady["end_ns"].to_numpy()
    growth = np.zeros(n_keys)
    grown = np.zeros(n_keys)
    for k in range(n_keys):  # one iteration per key, each a vectorised search of its events
        at_start, at_end = lv.before(k, starts), lv.before(k, ends)
        span = lv.before(k, np.array([starts.min(), ends.max()]))
        growth[k] = (span[1] - span[0]) / n
        grown[k] = (at_end > at_start).sum() / n
    inside = step >= 0
    kid = lv.kid_raw[inside]
    a, b = alloc[inside], nbytes[inside]

    def per(values: np.ndarray) -> np.ndarray:
        return np.bincount(kid, weights=values, minlength=n_keys) / n

    stepped = np.zeros(n_keys * n, bool)
    stepped[kid[a] * n + step[inside][a]] = True
    allocating = stepped.reshape(n_keys, n).sum(axis=1) / n
    # host time of the distinct calls (one call can make several events): each call counts
    # once, with the first of its events
    row = rows[inside]
    linked = np.flatnonzero(row >= 0)
    api_ns = np.zeros(n_keys)
    if linked.size:
        api = trace.cuda_api
        first = np.full(api.height, -1, np.int64)
        first[row[linked][::-1]] = linked[::-1]
        own = linked[first[row[linked]] == linked]
        at = pl.Series(row[own])
        dur = (api["end_ns"].gather(at) - api["start_ns"].gather(at)).fill_null(0).to_numpy()
        api_ns = np.bincount(kid[own], weights=dur.astype(np.float64), minlength=n_keys)
    api = api_ns / n
    return {
        "n_steps": pl.Series([n] * n_keys, dtype=pl.Int64),
        "growth_bytes_per_step": pl.Series(growth), "steps_grown_frac": pl.Series(grown),
        "steps_allocating_frac": pl.Series(allocating),
        "allocs_per_step": pl.Series(per(a.astype(np.float64))),
        "frees_per_step": pl.Series(per((~a).astype(np.float64))),
        "alloc_bytes_per_step": pl.Series(per(np.where(a, b, 0).astype(np.float64))),
        "free_bytes_per_step": pl.Series(per(np.where(a, 0, b).astype(np.float64))),
        "api_ns_per_step": pl.Series(api),
    }


def _pools(dev: pl.DataFrame, steady: pl.DataFrame | None) -> pl.DataFrame:
    tot = _pool_totals(dev, DP)
    peak = (tot.sort([*DP, "reserved", "start_ns"], descending=[False, False, True, False])
            .group_by(DP, maintain_order=True).first()
            .select(*DP, pl.col("reserved").alias("pool_reserved_peak_bytes"),
                    pl.col("utilized").alias("pool_utilized_at_peak_bytes"))
            .with_columns(pl.when(pl.col("pool_reserved_peak_bytes") > 0)
                          .then(pl.col("pool_utilized_at_peak_bytes")
                                / pl.col("pool_reserved_peak_bytes")).clip(0, 1)
                          .alias("pool_utilized_frac")))
    pk = [*DP, "pool_address"]
    pools = dev.filter(pl.col("pool_address").is_not_null()
                       & pl.col("pool_size_bytes").is_not_null())
    order = [*pk, "start_ns", "pool_size_bytes", "pool_utilized_bytes", "op", "bytes",
             "correlation_id"]
    grew = pools.sort(order, nulls_last=True).with_columns(
        pl.col("pool_size_bytes").shift(1).over(pk).alias("_prev_size"),
        pl.col("pool_utilized_bytes").fill_null(0).shift(1).over(pk).alias("_prev_used"),
    ).filter(pl.col("pool_size_bytes") > pl.col("_prev_size"))
    if steady is not None:
        lo, hi = int(steady["start_ns"].min()), int(steady["end_ns"].max())
        grew = grew.filter((pl.col("start_ns") >= lo) & (pl.col("start_ns") < hi))
    slack = (pl.col("op") == "alloc") & (pl.col("_prev_size") - pl.col("_prev_used")
                                         >= pl.col("bytes"))
    counts = grew.group_by(DP).agg(pl.len().cast(pl.Int64).alias("pool_growths"),
                                   slack.sum().cast(pl.Int64).alias("pool_growths_with_slack"))
    return peak.join(counts, on=DP, how="full", coalesce=True)



def _by_device(lv: ml.Levels) -> DeviceLevels:
    out = {}
    for k, dev in enumerate(lv.keys["device_id"].to_list()):
        lo, hi = int(lv.seg[k]), int(lv.seg[k + 1])
        out[int(dev)] = (lv.t[lo:hi], lv.level[lo:hi])
    return out


def _build_device_levels(trace: Trace) -> DeviceLevels:
    ev = trace.memory_events.filter(
        pl.col("op").is_not_null() & pl.col("bytes").is_not_null()
        & pl.col("device_id").is_not_null()
        & pl.col("mem_kind").is_in(list(MemoryParams().device_kinds)))
    if ev.is_empty():
        return {}
    t, _, _, signed = _arrays(ev)
    return _by_device(ml.levels(ev, ["device_id"], t, signed))


#: per device, the times and levels of its device-resident memory in use (default kinds):
#: made by the pass on the way, read by the timeline picture (`device_levels`)
DEVICE_LEVELS: Product[DeviceLevels] = Product(
    name="memory.device_levels", frames=("memory_events",), build=_build_device_levels,
    description="per device: event times and device memory in use after each")


def device_levels(trace: Trace) -> DeviceLevels:
    """Per device: the distinct event times and the device memory in use after each (the
    default device-resident kinds, every process; events at one time applied together)."""
    return product(trace, DEVICE_LEVELS)


def call_rows(trace: Trace, ev: pl.DataFrame) -> np.ndarray:
    """For every event, the row of ``cuda_api`` of the call that made it (-1 when unknown):
    a binary search on the packed op key (`op_keys`), the service the GPU ops use."""
    if not trace.has("cuda_api") or trace.cuda_api.is_empty():
        return np.full(ev.height, -1, np.int64)
    api = trace.cuda_api
    key = op_key([ev, api])
    rows = unique_rows(api.select(key)[KEY_COL], ev.select(key)[KEY_COL])
    if rows is not None:
        return rows.to_numpy()
    # (several calls on one key: cuda_api keeps one per key, so only a hand-made frame)
    got = ev.select(OP_KEY).with_row_index("_ev").join(
        api.select(OP_KEY).with_row_index("_api"), on=OP_KEY, how="left").group_by(
        "_ev").agg(pl.col("_api").min()).sort("_ev")
    return got["_api"].fill_null(-1).cast(pl.Int64).to_numpy()


def linked_events(trace: Trace) -> pl.DataFrame:
    """``memory_events`` with the call that made each event (``global_tid``, ``tid``,
    ``api_name``, ``api_start_ns``, ``api_end_ns``; null when the call is unknown) and the
    innermost NVTX range on that thread around the call (``nvtx_range_id``, ``nvtx_name``:
    the allocation site, by the attribution pass's rule: inclusive, same thread)."""
    ev = trace.memory_events
    rows = pl.Series(call_rows(trace, ev))
    api = trace.cuda_api if trace.has("cuda_api") else schemas.empty(schemas.CUDA_API)
    idx = rows.set(rows < 0, None)
    ev = ev.with_columns(
        *(api[c].gather(idx).alias(a) for c, a in (
            ("global_tid", "global_tid"), ("tid", "tid"), ("name", "api_name"),
            ("start_ns", "api_start_ns"), ("end_ns", "api_end_ns"))))
    site = _innermost_ranges(trace, ev)
    return ev.with_columns(site["nvtx_range_id"], site["nvtx_name"])


def _innermost_ranges(trace: Trace, calls: pl.DataFrame) -> pl.DataFrame:
    """Per row of ``calls`` (``global_tid``, ``api_start_ns``, ``api_end_ns``): the innermost
    NVTX range of that thread that contains the call (nulls when none)."""
    none = pl.DataFrame({"nvtx_range_id": pl.Series([None] * calls.height, dtype=pl.Int64),
                         "nvtx_name": pl.Series([None] * calls.height, dtype=schemas.CAT)})
    if not trace.has("nvtx") or trace.nvtx.is_empty() or calls.is_empty():
        return none
    # (the columns read, filtered inside the select: a filter of the whole frame would
    # expand its constant columns to every row, `nsysan.frames.trace`)
    ranges = trace.nvtx.select(pl.col("global_tid", "range_id", "start_ns", "end_ns", "depth",
                                      "name").filter(
        (pl.col("style") != "mark") & pl.col("end_ns").is_not_null()
        & (pl.col("end_global_tid").is_null()
           | (pl.col("end_global_tid") == pl.col("global_tid")))))
    if ranges.is_empty():
        return none
    queries = calls.select(
        pl.int_range(pl.len(), dtype=pl.Int64).alias("_row"), "global_tid",
        pl.col("api_start_ns").alias("start_ns"), pl.col("api_end_ns").alias("end_ns"),
    ).filter(pl.col("global_tid").is_not_null())
    rng = ranges.select("global_tid", "range_id", "start_ns", "end_ns", "depth")
    pairs = enclosing(queries, rng, by=["global_tid"], query_id="_row",
                      range_id="range_id").collect()
    # (query rows and range ids are unique across threads: the tightest range needs no
    # ``by``, which lets it rank the ranges once; the attribution pass does the same)
    site = tightest(pairs, rng, query_id="_row", range_id="range_id", depth="depth").collect()
    # scatter the found ranges to their queries, and their names by a binary search of the
    # (unique) range ids: no joins of the query rows
    at = np.full(calls.height, -1, np.int64)
    ids = ranges["range_id"].to_numpy()
    order = np.argsort(ids, kind="stable")
    at[site["_row"].to_numpy()] = order[np.searchsorted(ids[order], site["range_id"].to_numpy())]
    idx = pl.Series(at)
    idx = idx.set(idx < 0, None)
    return pl.DataFrame({"nvtx_range_id": ranges["range_id"].gather(idx),
                         "nvtx_name": ranges["name"].gather(idx)})


SPEC = PassSpec(
    name="memory",
    description="device memory in use (curve, peak, growth per step, pools) from CUDA "
                "memory-usage events",
    params=MemoryParams,
    tables=TABLES,
    run=run,
    after=("steps",),
    auto=has_events,
)
