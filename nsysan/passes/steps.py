"""steps: training-step boundaries, projected onto GPU time, with per-step GPU metrics.

Where steps come from, in order:

1. **NVTX ranges** whose name matches `params.range_name` (exact name, or a regex matched
   case-insensitively against the whole name) or, by default, `STEP_NAME_PATTERN`: an optional
   prefix (``train``, ``training``, ``eval``, ``val``, ``valid``, ``validation``, ``test``,
   ``profiler``, ``global``, followed by an optional ``_``/``-``/space), then ``step``, ``iter`` or
   ``iteration``, then an optional number behind optional separators (`` _#:=-``). It matches
   ``step 12``, ``Step#3``, ``iteration 5``, ``train_step``, ``ProfilerStep#7``, ``iter_12`` and
   not ``optimizer.step`` or ``forward``. Only push/pop and start/end ranges that begin and end
   on the same thread count. Matching ranges are grouped by (thread, name with every digit run
   replaced by ``N``); the group with the most instances wins (ties: the earliest). Its
   instances in start order are the steps; where one overlaps the next, its CPU end is clipped
   to the next start.
2. **Periodicity** of the kernel sequence, when no NVTX range matches: take the kernels of the
   busiest (process, device) in start order. For every kernel name with at least
   `min_steps` occurrences, the modal distance (in kernels) between consecutive occurrences is a
   candidate period L when at least 80% of its distances equal it and the sequence holds it
   at least `min_steps` times. A candidate is *consistent* when ``name[i] == name[i + L]``
   holds for a share >= `min_period_match` of kernels. The period is the **longest**
   consistent candidate (layer blocks repeat inside iterations), except one that is a
   multiple of a shorter consistent candidate matching as well (within 0.01): it adds no
   structure. No steps come out (``steps_reason`` says why) when the period's unit is
   trivial (one kernel name repeated back to back, >= 90% of the span busy with it: a stream
   of identical kernels has no steps), or when at least two kernel names recur once per a
   longer distance D (not a multiple of L) that the capture holds fewer than `min_steps`
   times: L is then a block inside an iteration of D kernels, not an iteration.
   ``metrics["step_periods_seen"]`` lists every candidate with its repetitions and match.
   The step anchor is the kernel name
   with that modal distance which follows the longest mean idle time on the device (iterations
   usually begin after the host prepared the next batch). Steps are
   ``[occurrence k start, occurrence k+1 start)``; the last occurrence makes a step only when L
   kernels follow it (it ends at the end of the L-th).
3. Otherwise no steps: an empty table, and ``metrics["steps_reason"]`` says why.

**Projection to GPU time.** An NVTX step is a CPU range; the GPU work it launches runs later.
A step's GPU window is ``[first op start of step k, first op start of step k+1)``, where the ops
of a step are those launched by CUDA API calls that *start* inside the (clipped) CPU range on
the step's thread, joined on ``(global_pid, correlation_id)``. A step that launched nothing
there has no GPU window and is left out (typically the CPU ran ahead past the end of the GPU
capture; ``metrics["steps_without_gpu_work"]`` counts them; step numbers keep their positions).
The last step ends at the latest end of the ops launched during its CPU range by any thread of
the process (backward passes often launch from another thread), or at its CPU end when that is
later. Without any GPU op at all the CPU ranges are the windows
(``metrics["steps_projection"] == "cpu"``).

**Per-step metrics** are those of the *primary device*, the device with the most busy time (the
STEPS table has no device column; ``metrics["steps_device_id"]`` names it): ``gpu_busy_frac`` =
busy time inside the window / window, ``idle_ns``, ``exposed_nccl_ns`` (nccl active, compute
not), ``h2d_unoverlapped_ns`` (h2d active, compute not).

**Warm-up**: with at least 3 steps, the leading run of steps longer than
`warmup_factor` x the median duration of steps 2..n is warm-up (never all steps). Step numbers
are 0-based positions, not the numbers in range names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import polars as pl

from nsysan.errors import ConfigError
from nsysan.frames import intervals as iv
from nsysan.frames import schemas, window_sums
from nsysan.frames.context import Product, product, share
from nsysan.frames.trace import Trace
from nsysan.passes.base import PassResult, PassSpec, Results
from nsysan.passes.step_detect import nvtx_steps, periodic_steps, project

STEP_NAME_PATTERN = (
    r"(?i)^\s*(?:(?:train|training|eval|val|valid|validation|test|profiler|global)[ _\-]?)?"
    r"(?:step|iter|iteration)(?:[\s_#:=\-]*\d+)?\s*$"
)
#: op_class -> overlap class (compute, nccl, h2d, ...) and the classes in state-label order
_CLASS_OF = schemas.OVERLAP_CLASS_OF_OP_CLASS
OVERLAP_CLASSES = tuple(dict.fromkeys(_CLASS_OF.values()))
#: While every overlap class has one op_class, op_class names can stand for the classes in the
#: sweep (same bits, same order): no per-op column of class names is built and mapped again.
_ONE_TO_ONE = len(_CLASS_OF) == len(OVERLAP_CLASSES)
@dataclass(frozen=True)
class StepsParams:
    range_name: str | None = None  # NVTX range name or regex (case-insensitive, whole name)
    name_pattern: str = STEP_NAME_PATTERN  # default step-name regex (Rust regex syntax)
    periodicity: bool = True  # fall back to the kernel-sequence period
    min_steps: int = 3  # fewest repetitions a detected period needs
    min_period_match: float = 0.9  # share of kernels that must repeat after one period
    warmup_factor: float = 1.5

    def __post_init__(self) -> None:
        for label, pat in (("range_name", self.range_name), ("name_pattern", self.name_pattern)):
            if pat is None:
                continue
            try:
                pl.Series([""]).str.contains(pat)
            except pl.exceptions.PolarsError:
                raise ConfigError(f"steps.{label}: invalid regular expression {pat!r}") from None
        if self.min_steps < 2:
            raise ConfigError(f"steps.min_steps must be >= 2, got {self.min_steps}")
        if not 0 < self.min_period_match <= 1:
            raise ConfigError("steps.min_period_match must be in (0, 1]")
        if self.warmup_factor <= 1:
            raise ConfigError(f"steps.warmup_factor must be > 1, got {self.warmup_factor}")


# ---------------------------------------------------------------------------------------------
# Helpers shared with the gaps and overlap passes
# ---------------------------------------------------------------------------------------------
def with_overlap_class(ops: pl.LazyFrame | pl.DataFrame) -> pl.LazyFrame:
    """Add ``cls``: the overlap class (compute, nccl, h2d, ...) of every GPU op."""
    return ops.lazy().with_columns(
        pl.col("op_class").replace_strict(_CLASS_OF, default=None, return_dtype=pl.String)
        .alias("cls")
    )


def _state_segments(ops: pl.LazyFrame | pl.DataFrame, by: list[str]) -> pl.LazyFrame:
    """`intervals.state_code_segments` of ``ops`` over `OVERLAP_CLASSES`."""
    if _ONE_TO_ONE:
        return iv.state_code_segments(ops, list(_CLASS_OF), by=by, class_col="op_class")
    return iv.state_code_segments(with_overlap_class(ops), OVERLAP_CLASSES, by=by,
                                  class_col="cls")


def _device_segments(trace: Trace) -> pl.DataFrame:
    ops = trace.frame("gpu_ops")
    timed = ops.lazy().filter(pl.col("start_ns") > 0)
    dev = ops["device_id"]
    if ops.height and dev.null_count() == 0 and dev.min() == dev.max():
        # One device (a trace per rank): the sweep without a group key, so no group codes
        # to pack into the events and map back to device ids for every segment.
        return _state_segments(timed, []).collect().select(
            pl.lit(dev[0], dev.dtype).alias("device_id"), pl.all())
    return _state_segments(timed, ["device_id"]).collect()


def _step_sweep(trace: Trace, segs: pl.DataFrame, windows: pl.DataFrame) -> pl.DataFrame:
    # The segments come grouped by device and sorted by start: a sweep per device run, which
    # also gives every device's totals (`device_totals`) on the way.
    states, totals = window_sums.run_sums(segs, windows, "device_id", "step", "state_code",
                                     "duration_ns")
    share(trace, DEVICE_TOTALS, totals, segs)
    return states


#: Steps (per-step metrics of one device) and overlap (every device) need the same sweeps,
#: half a second on 1M kernels: the steps pass builds them and the overlap pass, their last
#: user, takes them over (``keep=False``), so they do not outlive it.
DEVICE_SEGMENTS: Product[pl.DataFrame] = Product(
    "steps.device_segments", ("gpu_ops",), _device_segments,
    "the overlap states of the timed GPU ops of every device")
STEP_STATES: Product[pl.DataFrame] = Product(
    "steps.step_states", ("gpu_ops",), _step_sweep,
    "the time of every overlap state of every device in every step window")
DEVICE_TOTALS: Product[pl.DataFrame] = Product(
    "steps.device_totals", (),
    lambda trace, segs: window_sums.run_lengths(segs, "device_id", "state_code", "duration_ns"),
    "the time of every overlap state of every device over its whole span")


def device_segments(trace: Trace, keep: bool = False) -> pl.DataFrame:
    """``device_id, start_ns, end_ns, state_code``: the overlap states
    (`intervals.state_code_segments` over `OVERLAP_CLASSES`) of the timed GPU ops
    (``start_ns > 0``) of every device (the product `DEVICE_SEGMENTS`; ``keep`` false: the
    caller is its last user)."""
    return product(trace, DEVICE_SEGMENTS, keep=keep)


def step_states(trace: Trace, segs: pl.DataFrame, windows: pl.DataFrame,
                keep: bool = False) -> pl.DataFrame:
    """``device_id, step, state_code, duration_ns``: the time of every overlap state of every
    device (``segs``: `device_segments`) inside every step window (``windows``: ``step,
    start_ns, end_ns``), positive times only (the product `STEP_STATES` of ``segs`` and
    ``windows``)."""
    return product(trace, STEP_STATES, segs, windows, keep=keep)


def device_totals(trace: Trace, segs: pl.DataFrame, keep: bool = False) -> pl.DataFrame:
    """``device_id, state_code, duration_ns``: the time of every overlap state of every device
    over its whole span (``segs``: `device_segments`), positive times only (the product
    `DEVICE_TOTALS`; `step_states` finds them on the way)."""
    return product(trace, DEVICE_TOTALS, segs, keep=keep)


def primary_device(ops: pl.DataFrame) -> int | None:
    """The device with the most busy time (union of its ops); ties: the lowest id."""
    return _most_busy(
        iv.total(ops.select("device_id", "start_ns", "end_ns"), by=["device_id"]).collect()
    )


def _primary_of_segments(trace: Trace, segs: pl.DataFrame) -> int | None:
    """`primary_device` of the timed ops of ``trace`` from their `device_segments` ``segs``:
    where every op has an overlap class, a device's busy time is the time of its non-idle
    states (`device_totals`)."""
    ops = trace.frame("gpu_ops").lazy().filter(pl.col("start_ns") > 0)
    classified = ops.select(pl.col("op_class").is_in(list(_CLASS_OF)).fill_null(False).all())
    if not classified.collect().item():
        return primary_device(ops.select("device_id", "start_ns", "end_ns").collect())
    return _most_busy(
        device_totals(trace, segs, keep=True)
        .filter(pl.col("state_code") != 0)
        .group_by("device_id")
        .agg(pl.col("duration_ns").sum().alias("busy_ns"))
    )


def _most_busy(busy: pl.DataFrame) -> int | None:
    if busy.is_empty():
        return None
    return int(busy.sort(["busy_ns", "device_id"], descending=[True, False])["device_id"][0])


def step_windows(results: Results) -> pl.DataFrame | None:
    """``step, start_ns, end_ns, warmup`` of the steps pass, or None when no steps are known."""
    res = results.get("steps")
    if res is None:
        return None
    df = res.tables.get("steps")
    if df is None or df.is_empty():
        return None
    return df.select("step", "start_ns", "end_ns", "warmup")


def state_has(cls: str) -> pl.Expr:
    """True for overlap states (``"compute+nccl"``) in which ``cls`` is active."""
    return pl.col("state").str.split("+").list.contains(cls)


#: per-step metrics: which overlap states count for each (bits of `OVERLAP_CLASSES`)
_BIT = {c: 1 << i for i, c in enumerate(OVERLAP_CLASSES)}
_NOT_COMPUTE = (pl.col("state_code") & _BIT["compute"]) == 0
_METRICS = {
    "busy_ns": pl.col("state_code") != 0,
    "exposed_nccl_ns": ((pl.col("state_code") & _BIT["nccl"]) != 0) & _NOT_COMPUTE,
    "h2d_unoverlapped_ns": ((pl.col("state_code") & _BIT["h2d"]) != 0) & _NOT_COMPUTE,
}


def _metric_sums(per_state: pl.DataFrame, key: str, time: str) -> pl.DataFrame:
    """``key`` + `_METRICS`: sums of the ``time`` of the states each metric counts, per
    ``key`` (a table of windows x states: small)."""
    return per_state.group_by(key).agg(
        pl.col(time).filter(w).sum().alias(name) for name, w in _METRICS.items()
    )


def _warmup(durations: pl.Expr, factor: float) -> pl.Expr:
    """Leading steps longer than ``factor`` x the median of steps 2..n (never all steps)."""
    n = pl.len()
    rest_median = durations.slice(1).median()
    long = (durations > factor * rest_median).fill_null(False)
    leading = long.cast(pl.Int8).cum_min().cast(pl.Boolean)
    not_last = pl.int_range(n) < n - 1
    return pl.when(n >= 3).then(leading & not_last).otherwise(False)


def run(trace: Trace, params: StepsParams, results: Results) -> PassResult:
    tid = trace.trace_id
    # 0: untimed records. Lazy, so every use reads only the columns it needs.
    ops = trace.frame("gpu_ops").lazy().filter(pl.col("start_ns") > 0)
    metrics: dict[str, Any] = {}
    windows: pl.DataFrame | None = None
    source = ""
    nv = nvtx_steps(trace, params)
    if nv is not None:
        cpu, source = nv
        windows, projection = project(trace, cpu)
        metrics["steps_projection"] = projection
        metrics["steps_without_gpu_work"] = cpu.height - windows.height
        metrics["steps_thread"] = int(cpu["global_tid"][0])
    elif params.range_name is not None:
        metrics["steps_reason"] = f"no NVTX range matches range_name {params.range_name!r}"
    elif params.periodicity:
        notes: dict[str, Any] = {}
        per = periodic_steps(
            ops.select("kind", "name", "pid", "device_id", "start_ns", "end_ns").collect(), params,
            notes,
        )
        if "step_periods_seen" in notes:
            metrics["step_periods_seen"] = notes["step_periods_seen"]
        if per is None and "steps_reason" in notes:
            metrics["steps_reason"] = notes["steps_reason"]
        elif per is not None:
            windows, info = per
            source = "periodicity"
            metrics.update(info)
            metrics["steps_projection"] = "gpu"
        else:
            metrics["steps_reason"] = (
                "no NVTX range looks like a step and the kernel sequence has no clear period"
            )
    else:
        metrics["steps_reason"] = "no NVTX range looks like a step (periodicity disabled)"

    if windows is None or windows.is_empty():
        metrics.setdefault("steps_reason", "no steps found")
        metrics.update(n_steps=0, steps_source=None)
        return PassResult(tables={"steps": schemas.empty(schemas.STEPS)}, metrics=metrics)

    segs = device_segments(trace, keep=True)
    # The states first: the primary device's busy time comes with them.
    states = step_states(trace, segs, windows.select("step", "start_ns", "end_ns"), keep=True)
    if "steps_device_id" not in metrics:  # periodicity names the device it used
        metrics["steps_device_id"] = _primary_of_segments(trace, segs)
    dev = metrics["steps_device_id"]
    mine = states.filter(pl.col("device_id") == dev) if dev is not None else states.clear()
    per_step = _metric_sums(mine, "step", "duration_ns").lazy()
    dur = pl.col("end_ns") - pl.col("start_ns")
    table = (
        windows.lazy()
        .join(per_step, on="step", how="left")
        .sort("step")
        .with_columns(dur.alias("duration_ns"), pl.col("busy_ns").fill_null(0))
        .with_columns(
            pl.lit(tid).alias("trace_id"),
            pl.lit(source).alias("source"),
            _warmup(pl.col("duration_ns"), params.warmup_factor).alias("warmup"),
            pl.when(pl.col("duration_ns") > 0)
            .then(pl.col("busy_ns") / pl.col("duration_ns"))
            .alias("gpu_busy_frac"),
            (pl.col("duration_ns") - pl.col("busy_ns")).alias("idle_ns"),
            pl.col("exposed_nccl_ns").fill_null(0),
            pl.col("h2d_unoverlapped_ns").fill_null(0),
        )
        .collect()
    )
    table = schemas.conform(table, schemas.STEPS)
    steady = table.filter(~pl.col("warmup"))["duration_ns"]
    metrics.update(
        n_steps=table.height,
        n_warmup_steps=int(table["warmup"].sum()),
        steps_source=source,
        step_mean_ns=float(steady.mean()),  # type: ignore[arg-type]
        step_p50_ns=float(steady.quantile(0.5, "linear")),  # type: ignore[arg-type]
        step_p95_ns=float(steady.quantile(0.95, "linear")),  # type: ignore[arg-type]
        step_gpu_busy_frac=(
            float(1 - table.filter(~pl.col("warmup"))["idle_ns"].sum() / steady.sum())
            if dev is not None and steady.sum() > 0 else None
        ),
    )
    return PassResult(tables={"steps": table}, metrics=metrics)


SPEC = PassSpec(
    name="steps",
    description="Training-step boundaries from NVTX step ranges or kernel periodicity, on GPU time",
    params=StepsParams,
    tables={"steps": schemas.STEPS},
    run=run,
    default=True,
)
