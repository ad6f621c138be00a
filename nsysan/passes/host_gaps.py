"""``host_gaps``: what each launching thread did during each GPU gap (part of the host pass).

Rows: every device gap of the ``gaps`` pass (``scope == "device"``) times every thread whose
CUDA API calls launched GPU work on that device (``role`` ``launcher``; ``primary_launcher``:
the one that launched most of the device's ops; ties: the smallest global thread id), and
every communication thread of the trace (``role`` ``communication``: a thread that launched
nothing and whose samples are mostly in the communication layer, e.g. NCCL's proxy thread,
an MPI progress thread). Per row:

- ``on_cpu_ns`` / ``on_cpu_frac``: the thread's on-CPU intervals (``sched``) inside the gap;
  ``off_cpu_ns`` the rest (null without scheduling data);
- ``unblocked_off_cpu_ns``: off-CPU time that no blocking call explains, the evidence of
  involuntary descheduling (the thread could run but had no CPU). Which rule is used
  (``metrics["deschedule_rule"]`` of the pass; `deschedule_rule`):
  ``thread_state`` when the export records informative thread states at switch-outs
  (`INFORMATIVE_STATES`; the column exists from about schema 3.13, but may hold only
  ``unknown``): off-CPU time after a switch-out in state ``running`` (preempted);
  ``osrt_uncovered`` otherwise, when OS-runtime calls were traced: off-CPU time not covered
  by a blocking call of that thread (an OS-runtime call such as futex, poll, read, nanosleep,
  or a CUDA synchronization API call). Null when neither is available. nsys records only
  OS-runtime calls longer than its threshold, so short sleeps count here too: read it as an
  upper bound;
- ``n_samples`` and ``<layer>_samples``: the thread's CPU samples inside the gap, per host
  layer (`nsysan.passes.host.sample_layers`); ``top_layer``;
- ``top_symbols``: the most frequent leaf symbols, ``symbol (module file) count``, by count
  then name, ``; ``-separated; ``top_modules`` likewise the leaf modules with their share;
- ``host_detail``: both in one phrase for gap causes where NVTX and OS-runtime evidence is
  silent, e.g. ``on-CPU 97% of the gap; samples: libdali_operators.so 61%, python3.8 30%``;
- ``oversubscribed_ns``: the time in the gap during which more threads of the process tree
  wanted a CPU than it was seen running on (`nsysan.passes.host_demand`; the same for every
  row of a gap; null unless the export records thread states at switches).
"""

from __future__ import annotations

import polars as pl

from nsysan.frames import host_taxonomy as ht
from nsysan.frames import intervals as iv
from nsysan.frames.trace import Trace
from nsysan.passes.base import Results
from nsysan.passes.host_demand import blocking_calls, preempted_off_cpu

I64, F64, STR = pl.Int64, pl.Float64, pl.String
LAYER_SAMPLES = {f"{layer}_samples": I64 for layer in ht.HOST_LAYERS}
HOST_GAPS = pl.Schema(
    {
        "trace_id": STR, "device_id": I64, "gap_start_ns": I64, "gap_end_ns": I64,
        "duration_ns": I64, "step": I64, "pid": I64, "tid": I64, "global_tid": I64,
        "role": STR,  # launcher | communication
        "primary_launcher": pl.Boolean,  # the thread that launched most ops on the device
        "on_cpu_ns": I64, "on_cpu_frac": F64, "off_cpu_ns": I64,
        "unblocked_off_cpu_ns": I64, "n_samples": I64, **LAYER_SAMPLES,
        "top_layer": STR, "top_symbols": STR,
        "top_modules": STR,  # leaf modules by share of the samples: "libdali_operators.so 61%"
        "host_detail": STR,  # one sentence for gap causes: on-CPU share and top modules
        "oversubscribed_ns": I64,  # more runnable threads than CPUs (`host_demand`)
    }
)
#: switch-out states that say why a thread left the CPU (3.13+ exports have the column, but
#: the shared 3.13 / 3.17 exports hold only "unknown" and "terminated" there)
INFORMATIVE_STATES = ("running", "interruptible", "uninterruptible", "stopped", "waiting")


def deschedule_rule(trace: Trace, sched: pl.DataFrame) -> str | None:
    """Which evidence of involuntary descheduling this trace allows (module docstring)."""
    if sched.is_empty():
        return None
    if sched["out_state"].is_in(INFORMATIVE_STATES).any():
        return "thread_state"
    tables = trace.meta.tables
    if tables.has_rows("OSRT_API") or (not tables and not trace.frame("osrt").is_empty()):
        return "osrt_uncovered"
    return None


def _unblocked(trace: Trace, pairs: pl.DataFrame, sched: pl.DataFrame, rule: str | None,
               off_cpu: pl.Series) -> pl.Series:
    if rule is None:
        return pl.Series("unblocked_off_cpu_ns", [None] * pairs.height, dtype=I64)
    by = ["global_tid"]
    if rule == "thread_state":
        off = preempted_off_cpu(sched)
        got = iv.covered(pairs, off.select(*by, "start_ns", "end_ns"), by=by).collect()
        return got["covered_ns"].alias("unblocked_off_cpu_ns")
    blocking = blocking_calls(trace)
    blocked = iv.covered(pairs, blocking, by=by).collect()["covered_ns"]
    on = sched.select(*by, "start_ns", "end_ns")
    both = iv.overlay(on, iv.union(blocking, by=by), by=by, window_cols=()).collect()
    blocked_on = iv.covered(pairs, both, by=by).collect()["covered_ns"]
    return (off_cpu - (blocked - blocked_on)).clip(0).alias("unblocked_off_cpu_ns")


def _sample_counts(pairs: pl.DataFrame, samples: pl.DataFrame, top: int) -> pl.DataFrame:
    """Per (device_id, gap_start_ns, global_tid): samples per layer and top leaf symbols."""
    keys = ["device_id", "gap_start_ns", "global_tid"]
    launch = pairs.select("device_id", "global_tid").unique()
    gaps = pairs.select("device_id", "gap_start_ns", "gap_end_ns").unique().sort("gap_start_ns")
    inside = (
        samples.select("global_tid", "time_ns", "layer", "leaf_symbol", "leaf_module")
        .join(launch, on="global_tid")
        .sort("time_ns")
        .join_asof(gaps, left_on="time_ns", right_on="gap_start_ns", by="device_id",
                   strategy="backward", check_sortedness=False)
        .filter(pl.col("time_ns") < pl.col("gap_end_ns"))
        # text for the few samples inside gaps (cpu_samples holds Categoricals)
        .with_columns(pl.col("leaf_symbol", "leaf_module").cast(pl.String))
    )
    counts = inside.group_by(keys).agg(
        n_samples=pl.len().cast(I64),
        **{f"{layer}_samples": (pl.col("layer") == layer).sum().cast(I64)
           for layer in ht.HOST_LAYERS},
    )
    module = pl.col("leaf_module").str.replace(r"^.*/", "").fill_null("?")
    symbols = (
        inside.group_by(*keys, pl.col("leaf_symbol").fill_null("?"), module)
        .agg(n=pl.len())
        .sort([*keys, "n", "leaf_symbol", "leaf_module"],
              descending=[False, False, False, True, False, False])
        .group_by(keys, maintain_order=True).head(top)
        .group_by(keys, maintain_order=True)
        .agg(top_symbols=pl.format("{} ({}) {}", "leaf_symbol", "leaf_module", "n")
             .str.join("; "))
    )
    modules = (
        inside.group_by(*keys, module).agg(n=pl.len())
        .sort([*keys, "n", "leaf_module"], descending=[False, False, False, True, False])
        .group_by(keys, maintain_order=True).head(top)
        .join(counts.select(*keys, "n_samples"), on=keys)
        .group_by(keys, maintain_order=True)
        .agg(top_modules=pl.format("{} {}%", "leaf_module",
                                   (100 * pl.col("n") / pl.col("n_samples")).round(0)
                                   .cast(I64)).str.join(", "))
    )
    return counts.join(symbols, on=keys, how="left").join(modules, on=keys, how="left")


def table(trace: Trace, results: Results, sched: pl.DataFrame, samples: pl.DataFrame,
          calls: pl.DataFrame | None, top: int, communication: pl.Series,
          over: pl.DataFrame | None) -> pl.DataFrame:
    """The table (module docstring); ``communication``: the global thread ids of the
    communication threads; ``over``: the oversubscribed intervals (`host_demand`)."""
    res = results.get("gaps")
    gaps = res.tables.get("gaps") if res is not None else None
    if gaps is None or calls is None or (sched.is_empty() and samples.is_empty()):
        return pl.DataFrame(schema=HOST_GAPS)
    gaps = gaps.filter(pl.col("scope") == "device").select(
        "device_id", gap_start_ns="start_ns", gap_end_ns="end_ns", duration_ns="duration_ns",
        step="step")
    launchers = (
        calls.group_by("device_id", "global_tid").agg(_n=pl.len())
        .sort(["device_id", "_n", "global_tid"], descending=[False, True, False])
        .with_columns(primary_launcher=pl.int_range(pl.len()).over("device_id") == 0,
                      role=pl.lit("launcher"))
        .drop("_n")
    )
    comm = (launchers.select("device_id").unique()
            .join(pl.DataFrame({"global_tid": communication.cast(I64)}), how="cross")
            .join(launchers, on=["device_id", "global_tid"], how="anti")
            .with_columns(primary_launcher=pl.lit(False), role=pl.lit("communication")))
    threads = pl.concat([launchers, comm.select(launchers.columns)])
    pairs = gaps.join(threads, on="device_id").sort("device_id", "gap_start_ns",
                                                     "global_tid")
    if pairs.is_empty():
        return pl.DataFrame(schema=HOST_GAPS)
    win = pairs.select("global_tid", start_ns="gap_start_ns", end_ns="gap_end_ns")
    has_sched = not sched.is_empty()
    on_cpu = (iv.covered(win, sched.select("global_tid", "start_ns", "end_ns"),
                         by=["global_tid"]).collect()["covered_ns"]
              if has_sched else pl.Series([None] * pairs.height, dtype=I64))
    off_cpu = pairs["duration_ns"] - on_cpu
    rule = deschedule_rule(trace, sched)
    unblocked = _unblocked(trace, win, sched, rule, off_cpu)
    oversubscribed = (iv.covered(win, over).collect()["covered_ns"] if over is not None
                      else pl.Series([None] * pairs.height, dtype=I64))
    pairs = pairs.with_columns(
        on_cpu_ns=on_cpu, off_cpu_ns=off_cpu, unblocked_off_cpu_ns=unblocked,
        oversubscribed_ns=oversubscribed,
    ).with_columns(on_cpu_frac=pl.col("on_cpu_ns") / pl.col("duration_ns"))
    keys = ["device_id", "gap_start_ns", "global_tid"]
    counted = _sample_counts(pairs, samples, top) if not samples.is_empty() else None
    if counted is not None:
        pairs = pairs.join(counted, on=keys, how="left", maintain_order="left")
    else:  # scheduling without sampling
        pairs = pairs.with_columns(
            *(pl.lit(0, dtype=I64).alias(c) for c in ["n_samples", *LAYER_SAMPLES]),
            top_symbols=pl.lit(None, dtype=STR), top_modules=pl.lit(None, dtype=STR))
    pairs = pairs.with_columns(
        pl.col(c).fill_null(0) for c in ["n_samples", *LAYER_SAMPLES] if c in pairs.columns
    )
    if counted is not None:
        order = {layer: i for i, layer in enumerate(ht.HOST_LAYERS)}
        best = pl.concat_list([
            pl.struct(n=pl.col(f"{layer}_samples"), o=pl.lit(-order[layer]), name=pl.lit(layer))
            for layer in ht.HOST_LAYERS])
        pairs = pairs.with_columns(
            top_layer=pl.when(pl.col("n_samples") > 0)
            .then(best.list.eval(pl.element().sort().last()).list.first().struct.field("name")))
    on_part = pl.when(pl.col("on_cpu_frac").is_not_null()).then(
        pl.format("on-CPU {}% of the gap; ", (100 * pl.col("on_cpu_frac")).round(0).cast(I64))
    ).otherwise(pl.lit(""))
    sample_part = (pl.when(pl.col("n_samples") > 0)
                   .then(pl.format("samples: {}", pl.col("top_modules")))
                   .otherwise(pl.lit("no samples")))
    pairs = pairs.with_columns(host_detail=pl.concat_str(on_part, sample_part))
    pairs = pairs.with_columns(
        trace_id=pl.lit(trace.trace_id),
        pid=(pl.col("global_tid") // (1 << 24)) & 0xFFFFFF,
        tid=pl.col("global_tid") & 0xFFFFFF,
    )
    have = set(pairs.columns)
    return pairs.select(
        (pl.col(c) if c in have else pl.lit(None)).cast(t).alias(c) for c, t in HOST_GAPS.items()
    )
