"""host: what the CPU threads were doing, from nsys' CPU sampling and context switches.

Inputs are the optional frames ``sched`` and ``cpu_samples`` (empty when the
profile was recorded without ``--sample=cpu --cpuctxsw=process-tree``; every table is then
empty with its schema and ``metrics["host_evidence"]`` says what was not captured).

**Sample layers.** Each sample gets the host layer of `nsysan.frames.host_taxonomy`
(its ``stack_layer``: the leaf frame's module; an OS leaf counts in its nearest known caller's
layer). One more rule, by time: an OS-layer sample taken while its thread was inside a CUDA
API call (``cuda_api``, same thread) is a driver wait (``runtime_driver``): the driver polls
``clock_gettime`` in ``[vdso]`` or sleeps in the kernel, and the stack often stops there.
Samples of nsys' own threads (`host_taxonomy.PROFILER_THREAD_PATTERN`) are ``profiler``.

**Sampling period** (``metrics["sampling_period_ns"]``): the median time between consecutive
samples of one thread, over all threads (a thread that sleeps has longer gaps; the median is
the period of the busy ones). Estimated time = samples x period.

**Tables** (column names are part of the contract):

- ``host_threads``: per thread seen in ``sched`` or ``cpu_samples``: ``role`` (``launcher``
  when its CUDA API calls launched GPU work, ``profiler`` for nsys' threads,
  ``communication`` for another thread whose samples (at least
  `COMMUNICATION_MIN_SAMPLES`) are mostly in the communication layer (NCCL's proxy thread,
  an MPI progress thread), else ``other``); ``window_ns``: from its
  first to its last switch (or sample) inside the session;
  ``on_cpu_ns`` (on-CPU intervals clipped to that window), ``off_cpu_ns`` (the rest of it;
  null for a thread without switches), ``n_switches`` (switch-ins), ``n_migrations``
  (switch-ins on another CPU than the previous one), ``n_samples``, its own median sampling
  period, the sample share of every host layer (``<layer>_frac``) and ``top_layer`` (most
  samples; ties: `HOST_LAYERS` order);
- ``host_layers``: per thread, layer and step (null: the whole trace; with steps known, also
  per step, a sample counting in the step whose window holds its time): ``n_samples``,
  ``est_ns`` and ``frac`` (share of that thread's samples in that scope);
- ``host_gaps``: `host_gaps` (per device gap of the ``gaps`` pass and launching or
  communication thread).

**Demand** (`nsysan.passes.host_demand`): where the export records thread states at
switches, ``metrics["cpus_seen"]`` (the CPUs the process tree ran on) and
``metrics["oversubscribed_ns"]`` (the time, in the session, during which more of its threads
wanted a CPU than that); None otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from nsysan.errors import ConfigError
from nsysan.frames import host_taxonomy as ht
from nsysan.frames import schemas, schemas_host
from nsysan.frames.context import Product, product, share
from nsysan.frames.trace import Trace
from nsysan.passes import host_gaps
from nsysan.passes.base import PassResult, PassSpec, Results
from nsysan.passes.gap_causes import launch_calls
from nsysan.passes.host_demand import oversubscribed, runnable_off_cpu
from nsysan.passes.steps import step_windows

I64, F64, STR = pl.Int64, pl.Float64, pl.String
#: a sample's host layer while the pass works (one byte per sample); the tables print names
LAYER = pl.Enum(ht.HOST_LAYERS)
LAYER_FRACS = {f"{layer}_frac": F64 for layer in ht.HOST_LAYERS}
HOST_THREADS = pl.Schema(
    {
        "trace_id": STR, "pid": I64, "tid": I64, "global_tid": I64, "name": STR,
        "role": STR,  # launcher | profiler | communication | other
        "window_ns": I64, "on_cpu_ns": I64, "off_cpu_ns": I64,
        "n_switches": I64, "n_migrations": I64, "n_samples": I64,
        "sampling_period_ns": I64, **LAYER_FRACS, "top_layer": STR,
    }
)
HOST_LAYERS = pl.Schema(
    {
        "trace_id": STR, "pid": I64, "tid": I64, "global_tid": I64,
        "step": I64,  # null: the whole trace
        "layer": STR, "n_samples": I64, "est_ns": I64, "frac": F64,
    }
)
TABLES = {"host_threads": HOST_THREADS, "host_layers": HOST_LAYERS,
          "host_gaps": host_gaps.HOST_GAPS}
HOW_TO_RECORD = "nsys profile --sample=cpu --cpuctxsw=process-tree"
#: samples a thread needs before its top layer names its role (one stray sample in libmpi
#: does not make a communication thread)
COMMUNICATION_MIN_SAMPLES = 10
#: `_layer_counts`: samples packed and counted at a time, and the most (thread, step, layer)
#: keys it counts in one dense array (32 MB) rather than by hashing
COUNT_CHUNK = 1 << 21
DENSE_KEYS = 1 << 22
#: launching threads the timeline draws a host lane for (most samples first)
LANE_THREADS = 3


@dataclass(frozen=True)
class HostParams:
    top_symbols: int = 3  # leaf symbols quoted per gap and thread

    def __post_init__(self) -> None:
        if self.top_symbols < 0:
            raise ConfigError(f"host.top_symbols must be >= 0, got {self.top_symbols}")


def _empty(tid: str, reason: str) -> PassResult:
    tables = {name: pl.DataFrame(schema=schema) for name, schema in TABLES.items()}
    return PassResult(tables=tables, metrics={"host_evidence": reason,
                                              "taxonomy_version": ht.TAXONOMY_VERSION})


def captured(trace: Trace) -> tuple[bool, bool]:
    """(scheduling captured, sampling captured): the raw tables are in the export (or, for
    in-memory traces, the frames have rows)."""
    tables = trace.meta.tables
    if tables:  # opened from an export: its tables say
        return tables.has_rows("SCHED_EVENTS"), tables.has_rows("COMPOSITE_EVENTS")
    return not trace.frame("sched").is_empty(), not trace.frame("cpu_samples").is_empty()


def frames_to_read(trace: Trace) -> list[str]:
    """The host-evidence frames this trace can build (for prefetching), samples first (they
    read the call stacks too)."""
    tables = trace.meta.tables
    wanted = {"cpu_samples": "COMPOSITE_EVENTS", "sched": "SCHED_EVENTS"}
    return [frame for frame, table in wanted.items() if tables.has_rows(table)]


def _thread_names(trace: Trace) -> pl.DataFrame:
    return trace.frame("threads").select("global_tid", "name")


def _in_cuda_call(trace: Trace, os_samples: pl.DataFrame) -> pl.Series:
    """For each row of ``os_samples`` (``global_tid, time_ns``): was its thread inside a CUDA
    API call at that time? Only the threads of these samples are looked at."""
    api = trace.frame("cuda_api")
    if api.is_empty() or os_samples.is_empty():
        return pl.Series("in_call", [False] * os_samples.height, dtype=pl.Boolean)
    threads = os_samples.select("global_tid").unique()
    # time-covered by a CUDA call of the same thread: running max of call ends, per thread
    calls = (api.select("global_tid", "start_ns", "end_ns")
             .join(threads, on="global_tid", how="semi")
             .sort("global_tid", "start_ns")
             .with_columns(pl.col("end_ns").cum_max().over("global_tid").alias("_until"))
             # calls starting at one instant: the furthest reach, whatever their order
             .group_by("global_tid", "start_ns").agg(pl.col("_until").max())
             .select("global_tid", pl.col("start_ns").alias("time_ns"), "_until"))
    covered = (
        os_samples.select("global_tid", "time_ns").with_row_index("_row").sort("time_ns")
        .join_asof(calls.sort("time_ns"), on="time_ns", by="global_tid",
                   strategy="backward", check_sortedness=False)
        .sort("_row")
    )
    return (covered["_until"] > covered["time_ns"]).fill_null(False).alias("in_call")


def sample_layers(trace: Trace, samples: pl.DataFrame) -> pl.DataFrame:
    """``samples`` (cpu_samples, in its order) with ``layer`` (see the module docstring), an
    Enum of `HOST_LAYERS`: the rules work on its one-byte codes, the tables print names."""
    # the layer its call stack gives (`host_taxonomy`); no call chain: unknown. The frame's
    # Enum lists the layers alphabetically (it sorts like their names), the pass's in
    # `HOST_LAYERS` order (the tables' order): codes are translated through a table.
    frame_layers = schemas.STACK_LAYER.categories.to_list()
    to_pass = pl.Series([ht.HOST_LAYERS.index(x) for x in frame_layers], dtype=pl.UInt8)
    code = to_pass.gather(samples["stack_layer"].to_physical()).fill_null(
        ht.HOST_LAYERS.index("unknown"))
    is_os = code == ht.HOST_LAYERS.index("os")
    in_call = _in_cuda_call(trace, samples.select("global_tid", "time_ns").filter(is_os))
    driver_wait = pl.Series([False] * samples.height, dtype=pl.Boolean).scatter(
        is_os.arg_true(), in_call)
    names = _thread_names(trace)
    profiler_tids = names.filter(
        pl.col("name").str.contains(ht.PROFILER_THREAD_PATTERN).fill_null(False))["global_tid"]
    code = samples.select(
        pl.when(pl.col("global_tid").is_in(profiler_tids.implode()))
        .then(pl.lit(ht.HOST_LAYERS.index("profiler"), dtype=pl.UInt8))
        .when(driver_wait).then(pl.lit(ht.HOST_LAYERS.index("runtime_driver"), dtype=pl.UInt8))
        .otherwise(code).alias("layer")).to_series()
    # cpu_samples' order (time, thread, id): every consumer aggregates, or needs only each
    # thread's samples in time order, which it already is
    return samples.with_columns(pl.Series(ht.HOST_LAYERS, dtype=LAYER).gather(code)
                                .alias("layer"))


def sampling_period(samples: pl.DataFrame) -> tuple[int | None, pl.DataFrame]:
    """Trace-wide median inter-sample gap, and per thread (``global_tid, period``)."""
    gaps = samples.select(
        "global_tid",
        gap=pl.col("time_ns").diff().over("global_tid"),
    ).filter(pl.col("gap") > 0)
    per = gaps.group_by("global_tid").agg(period=pl.col("gap").median().round().cast(I64))
    whole = gaps["gap"].median() if gaps.height else None
    return (None if whole is None else round(whole)), per


def session_window(trace: Trace, sched: pl.DataFrame, samples: pl.DataFrame) -> tuple[int, int]:
    """[0, session end], or the span of the host events when the duration is unknown."""
    end = trace.meta.duration_ns
    if end is None:
        ends = [int(x) for x in (sched["end_ns"].max(), samples["time_ns"].max())
                if x is not None]
        end = max(ends, default=0)
    return 0, end


def _threads(trace: Trace, sched: pl.DataFrame, samples: pl.DataFrame, launchers: pl.Series,
             window: tuple[int, int], per_period: pl.DataFrame,
             counts: pl.DataFrame) -> pl.DataFrame:
    w0, w1 = window
    # (only the columns read: the sort below copies what it is given)
    s = sched.select(
        "global_tid", "start_ns", "cpu", "open_start",
        _s=pl.col("start_ns").clip(w0, w1), _e=pl.col("end_ns").clip(w0, w1),
    )
    sw = s.sort("global_tid", "start_ns").group_by("global_tid", maintain_order=True).agg(
        on_cpu_ns=(pl.col("_e") - pl.col("_s")).sum(),
        n_switches=(~pl.col("open_start")).sum().cast(I64),
        n_migrations=(pl.col("cpu") != pl.col("cpu").shift(1)).sum().cast(I64),
        _first=pl.col("_s").min(), _last=pl.col("_e").max(),
    )
    # per thread: its samples' span, and the share of each layer (from the whole-trace
    # counts of `_layer_counts`)
    n = pl.col("n_samples")
    per_layer = counts.filter(pl.col("step").is_null()).group_by("global_tid").agg(
        n_samples=n.sum().cast(I64),
        **{f"{layer}_frac": n.filter(pl.col("layer") == layer).sum() / n.sum()
           for layer in ht.HOST_LAYERS})
    sm = samples.group_by("global_tid").agg(
        _sfirst=pl.col("time_ns").min().clip(w0, w1), _slast=pl.col("time_ns").max().clip(w0, w1),
    ).join(per_layer, on="global_tid")
    ids = pl.concat([sw.select("global_tid"), sm.select("global_tid")]).unique()
    df = ids.join(sw, on="global_tid", how="left").join(sm, on="global_tid", how="left")
    first = pl.min_horizontal("_first", "_sfirst")
    last = pl.max_horizontal("_last", "_slast")
    order = {layer: i for i, layer in enumerate(ht.HOST_LAYERS)}
    fracs = [f"{layer}_frac" for layer in ht.HOST_LAYERS]
    top = pl.concat_list([pl.struct(f=pl.col(c), o=pl.lit(-order[c[:-5]]), n=pl.lit(c[:-5]))
                          for c in fracs])
    df = df.with_columns(window_ns=(last - first)).with_columns(
        off_cpu_ns=pl.when(pl.col("on_cpu_ns").is_not_null())
        .then(pl.col("window_ns") - pl.col("on_cpu_ns")),
        n_samples=pl.col("n_samples").fill_null(0),
        top_layer=pl.when(pl.col("n_samples") > 0)
        .then(top.list.eval(pl.element().sort().last()).list.first().struct.field("n")),
    )
    names = _thread_names(trace)
    df = df.join(names, on="global_tid", how="left").join(
        per_period.rename({"period": "sampling_period_ns"}), on="global_tid", how="left")
    role = (pl.when(pl.col("name").str.contains(ht.PROFILER_THREAD_PATTERN).fill_null(False))
            .then(pl.lit("profiler"))
            .when(pl.col("global_tid").is_in(launchers.implode())).then(pl.lit("launcher"))
            .when((pl.col("top_layer") == "communication")
                  & (pl.col("n_samples") >= COMMUNICATION_MIN_SAMPLES))
            .then(pl.lit("communication"))
            .otherwise(pl.lit("other")))
    df = df.with_columns(
        trace_id=pl.lit(trace.trace_id), pid=(pl.col("global_tid") // (1 << 24)) & 0xFFFFFF,
        tid=pl.col("global_tid") & 0xFFFFFF, role=role,
    )
    return df.select(HOST_THREADS.names()).cast(dict(HOST_THREADS)).sort("pid", "tid",
                                                                         "global_tid")


def _layer_counts(samples: pl.DataFrame, steps: pl.DataFrame | None) -> pl.DataFrame:
    """``global_tid, step, layer, n_samples``: samples per thread and layer over the whole
    trace (``step`` null) and, with steps known, per step (a sample counts in the step whose
    window holds its time). A count of packed integer keys (thread, step, layer code), made
    `COUNT_CHUNK` samples at a time into one array of every key when there are at most
    `DENSE_KEYS` of them (the temporary keys of 11M samples, packed and counted at once,
    were 0.65 GB), else by one hash count."""
    if samples.is_empty():
        return pl.DataFrame(schema={"global_tid": I64, "step": I64, "layer": LAYER,
                                    "n_samples": I64})
    threads = samples["global_tid"].unique().sort()
    n_layers = len(ht.HOST_LAYERS)
    win = (steps.select("step", "start_ns", "end_ns").sort("start_ns", maintain_order=True)
           if steps is not None else None)
    slots = 1 + (win.height if win is not None else 0)  # 0: the whole trace
    tid = samples["global_tid"].to_numpy()
    code = samples["layer"].to_physical().to_numpy()
    time = samples["time_ns"].to_numpy()
    bounds = ((win["start_ns"].to_numpy(), win["end_ns"].to_numpy())
              if win is not None and win.height else None)

    ids = threads.to_numpy()

    def keys(lo: int, hi: int) -> list[np.ndarray]:
        thread = np.searchsorted(ids, tid[lo:hi])
        c = code[lo:hi].astype(np.int64)
        out = [thread * slots * n_layers + c]
        if bounds is not None:
            # the last window starting at or before the sample, if the sample is before its end
            t = time[lo:hi]
            at = np.searchsorted(bounds[0], t, side="right") - 1
            inside = at >= 0
            inside[inside] = t[inside] < bounds[1][at[inside]]
            out.append((thread[inside] * slots + 1 + at[inside]) * n_layers + c[inside])
        return out

    size = threads.len() * slots * n_layers
    if size <= DENSE_KEYS and not threads.has_nulls():
        dense = np.zeros(size, np.int64)
        for lo in range(0, samples.height, COUNT_CHUNK):
            for k in keys(lo, min(lo + COUNT_CHUNK, samples.height)):
                dense += np.bincount(k, minlength=size)
        key = np.flatnonzero(dense)
        n = pl.Series("n", dense[key])
    else:
        counted = pl.Series("key", np.concatenate(keys(0, samples.height))).value_counts(
            name="n").sort("key")
        key, n = counted["key"].to_numpy(), counted["n"]
    slot = (key // n_layers) % slots
    step_of = (pl.Series([None], dtype=I64).append(win["step"].cast(I64))
               if win is not None else pl.Series([None], dtype=I64))
    return pl.DataFrame({
        "global_tid": threads.gather(key // n_layers // slots),
        "step": step_of.gather(slot),
        "layer": pl.Series(ht.HOST_LAYERS, dtype=LAYER).gather(key % n_layers),
        "n_samples": n.cast(I64),
    })


def _layers(trace: Trace, counts: pl.DataFrame, period: int | None) -> pl.DataFrame:
    df = counts.with_columns(
        frac=pl.col("n_samples") / pl.col("n_samples").sum().over("global_tid", "step"),
        est_ns=pl.col("n_samples") * pl.lit(period, dtype=I64),
        trace_id=pl.lit(trace.trace_id),
        pid=(pl.col("global_tid") // (1 << 24)) & 0xFFFFFF,
        tid=pl.col("global_tid") & 0xFFFFFF,
    )
    order = pl.col("layer").to_physical()  # `HOST_LAYERS` order
    return (df.sort("pid", "tid", "global_tid", "step", order, nulls_last=False)
            .select(HOST_LAYERS.names()).cast(dict(HOST_LAYERS)))


def lane_threads(threads: pl.DataFrame) -> pl.DataFrame:
    """The ``host_threads`` rows of the launching threads the timeline draws: those with
    context switches, most samples first (ties: thread id), at most `LANE_THREADS`."""
    return (threads.filter((pl.col("role") == "launcher") & pl.col("on_cpu_ns").is_not_null())
            .sort(["n_samples", "global_tid"], descending=[True, False])
            .head(LANE_THREADS))


def _lanes_of(sched: pl.DataFrame, samples: pl.DataFrame,
              drawn: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    tids = drawn["global_tid"].implode()
    # (columns first: a filter of a whole frame expands its constant columns, `Trace`)
    on_cpu = (sched.select("global_tid", "start_ns", "end_ns")
              .filter(pl.col("global_tid").is_in(tids)).sort("global_tid", "start_ns"))
    layered = samples.select("global_tid", "time_ns", code=pl.col("layer").to_physical()
                             ).filter(pl.col("global_tid").is_in(tids))
    return on_cpu, layered


def _host_frames(trace: Trace, tids: pl.Series | None = None) -> tuple[pl.DataFrame, pl.DataFrame]:
    """``sched`` and the samples with their ``layer`` (`sample_layers`; only the threads
    ``tids`` when given), empty with their schemas when not captured: frames not captured
    are not built at all (no data-quality entry, nothing read)."""
    has_sched, has_samples = captured(trace)
    sched = trace.frame("sched") if has_sched else schemas.empty(schemas_host.SCHED)
    if not has_samples:
        return sched, schemas.empty(schemas_host.CPU_SAMPLES).with_columns(
            layer=pl.lit(None, dtype=LAYER))
    raw = trace.frame("cpu_samples")
    if tids is not None:
        # (inside a select: a filter of the whole frame would expand its constant columns)
        raw = raw.select(pl.all().filter(pl.col("global_tid").is_in(tids.implode())))
    return sched, sample_layers(trace, raw)


def _build_lanes(trace: Trace, drawn: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    sched, samples = _host_frames(trace, drawn["global_tid"])
    return _lanes_of(sched, samples, drawn)


#: The evidence of the timeline's host lanes: for the threads of ``drawn`` (`lane_threads`,
#: ``global_tid``), their on-CPU intervals (``global_tid, start_ns, end_ns``, per thread in
#: time order) and their samples with their layer (``global_tid, time_ns, code``: the
#: `HOST_LAYERS` index). The host pass shares it, so that its frames (``sched``,
#: ``cpu_samples``: `SPEC.releases`) can be freed once it ends; it names no frames, which
#: would make every lookup build them again (a picture drawn without the pass builds it).
LANES = Product("host.lanes", (), _build_lanes,
                "on-CPU intervals and layered samples of the threads drawn as host lanes")


def lanes(trace: Trace, drawn: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """`LANES` of the threads ``drawn`` (`lane_threads` of the ``host_threads`` table)."""
    return product(trace, LANES, drawn.select("global_tid"))


def run(trace: Trace, params: HostParams, results: Results) -> PassResult:
    has_sched, has_samples = captured(trace)
    if not has_sched and not has_samples:
        return _empty(trace.trace_id, f"not captured: record with `{HOW_TO_RECORD}`")
    sched, samples = _host_frames(trace)
    window = session_window(trace, sched, samples)
    period, per_period = sampling_period(samples)
    calls = launch_calls(trace) if not trace.frame("gpu_ops").is_empty() else None
    launchers = (calls["global_tid"].unique() if calls is not None
                 else pl.Series("global_tid", [], dtype=I64))
    counts = _layer_counts(samples, step_windows(results))
    threads = _threads(trace, sched, samples, launchers, window, per_period, counts)
    drawn = lane_threads(threads).select("global_tid")
    share(trace, LANES, _lanes_of(sched, samples, drawn), drawn)
    layers = _layers(trace, counts, period)
    rule = host_gaps.deschedule_rule(trace, sched)
    cpus, over = oversubscribed(sched, runnable_off_cpu(sched, rule))
    communication = threads.filter(pl.col("role") == "communication")["global_tid"]
    gaps = host_gaps.table(trace, results, sched, samples, calls, params.top_symbols,
                           communication, over)
    missing = [what for what, ok in (("scheduling", has_sched), ("sampling", has_samples))
               if not ok]
    metrics: dict[str, Any] = {
        "host_evidence": "captured" if not missing else
        f"partly captured: no {' or '.join(missing)} (record with `{HOW_TO_RECORD}`)",
        "taxonomy_version": ht.TAXONOMY_VERSION,
        "sampling_period_ns": period,
        "deschedule_rule": rule,
        "cpus_seen": cpus,
        "oversubscribed_ns": (int((over["end_ns"] - over["start_ns"]).sum())
                              if over is not None else None),
    }
    return PassResult(tables={"host_threads": threads, "host_layers": layers,
                              "host_gaps": gaps}, metrics=metrics)


SPEC = PassSpec(
    name="host",
    description="host threads from CPU sampling and context switches: on-CPU time, layers, "
                "what the launching threads did during GPU gaps",
    params=HostParams,
    tables=TABLES,
    run=run,
    requires=("gaps",),
    after=("steps",),
    default=True,
    # nothing after the passes reads them (the pictures' host lanes come from `LANES`)
    releases=("sched", "cpu_samples"),
)
