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
   candidate period L when at least 80% of its distances equal it. The period is the candidate
   for which ``name[i] == name[i + L]`` holds for the largest share of kernels (ties: the
   smallest L), provided that share is >= `min_period_match`. The step anchor is the kernel name
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

import weakref
from dataclasses import dataclass
from typing import Any

import polars as pl

from nsysan.errors import ConfigError
from nsysan.frames import intervals as iv
from nsysan.frames import schemas
from nsysan.frames.packed_keys import Keys
from nsysan.frames.trace import Trace
from nsysan.passes.base import PassResult, PassSpec, Results
from nsysan.passes.op_keys import unique_rows

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
#: trace -> (the gpu_ops frame, `device_segments` of it): kept by steps for the overlap pass
_SEGMENTS: weakref.WeakKeyDictionary[Trace, tuple[pl.DataFrame, pl.DataFrame]] = (
    weakref.WeakKeyDictionary())


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


def device_segments(trace: Trace, keep: bool = False) -> pl.DataFrame:
    """``device_id, start_ns, end_ns, state_code``: the overlap states
    (`intervals.state_code_segments` over `OVERLAP_CLASSES`) of the timed GPU ops
    (``start_ns > 0``) of every device.

    Steps (per-step metrics of one device) and overlap (every device) need the same sweep,
    half a second on 1M kernels: the steps pass builds it with ``keep`` and the overlap pass
    takes it over (it is dropped from the memo then, so it does not outlive its last use).
    Memoised per trace, weakly, and per ``gpu_ops`` frame object (never stale)."""
    ops = trace.frame("gpu_ops")
    hit = _SEGMENTS.get(trace) if keep else _SEGMENTS.pop(trace, None)
    if hit is not None and hit[0] is ops:
        return hit[1]
    segs = _state_segments(ops.lazy().filter(pl.col("start_ns") > 0), ["device_id"]).collect()
    if keep:
        _SEGMENTS[trace] = (ops, segs)
    return segs


def forget_segments(trace: Trace) -> None:
    """Drop the kept `device_segments` of ``trace`` (when the overlap pass did not run)."""
    _SEGMENTS.pop(trace, None)


def primary_device(ops: pl.DataFrame) -> int | None:
    """The device with the most busy time (union of its ops); ties: the lowest id."""
    busy = iv.total(ops.select("device_id", "start_ns", "end_ns"), by=["device_id"]).collect()
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


def window_metrics(ops: pl.DataFrame, windows: pl.DataFrame, by: list[str]) -> pl.LazyFrame:
    """Busy, exposed nccl and unoverlapped h2d inside each window (``by + [step]``, 0 where
    nothing ran).

    ``windows`` holds ``by + [step, start_ns, end_ns]``.
    """
    return _window_sums(_state_segments(ops, by), windows, by)


def _window_sums(segs: pl.LazyFrame | pl.DataFrame, windows: pl.DataFrame, by: list[str],
                 ) -> pl.LazyFrame:
    """`window_metrics` from the state segments (``by + [start_ns, end_ns, state_code]``)."""
    # States as bit sets, and sums of 0/1-weighted segment time per window: no label strings
    # and no cutting two million segments into pieces at the window bounds.
    bit = {c: 1 << i for i, c in enumerate(OVERLAP_CLASSES)}
    code = pl.col("state_code")
    not_compute = (code & bit["compute"]) == 0
    weights = {
        "busy_ns": code != 0,
        "exposed_nccl_ns": ((code & bit["nccl"]) != 0) & not_compute,
        "h2d_unoverlapped_ns": ((code & bit["h2d"]) != 0) & not_compute,
    }
    return iv.segment_sums(
        windows.select([*by, "step", "start_ns", "end_ns"]), segs,
        {name: w.cast(pl.Int64) for name, w in weights.items()}, by=by,
    ).drop("start_ns", "end_ns")


# ---------------------------------------------------------------------------------------------
# Step detection
# ---------------------------------------------------------------------------------------------
def _name_key(col: str = "name") -> pl.Expr:
    return pl.col(col).str.replace_all(r"\d+", "N")


def _nvtx_steps(trace: Trace, params: StepsParams) -> tuple[pl.DataFrame, str] | None:
    """CPU step ranges ``step, start_ns, end_ns, global_tid, global_pid, pid`` from NVTX."""
    nvtx = trace.frame("nvtx")
    if nvtx.is_empty():
        return None
    if params.range_name is not None:
        pat = f"(?i)^(?:{params.range_name})$"
        match = (pl.col("name") == params.range_name) | pl.col("name").str.contains(pat)
    else:
        match = pl.col("name").str.contains(params.name_pattern)
    cand = nvtx.lazy().filter(
        (pl.col("style") != "mark")
        & (pl.col("end_ns") > pl.col("start_ns"))
        & (pl.col("end_global_tid").is_null() | (pl.col("end_global_tid") == pl.col("global_tid")))
        & match.fill_null(False)
    ).with_columns(_name_key().alias("key"))
    groups = (
        cand.group_by("global_tid", "key")
        .agg(pl.len().alias("n"), pl.col("start_ns").min().alias("first"))
        .sort(["n", "first"], descending=[True, False])
        .head(1)
        .collect()
    )
    if groups.is_empty():
        return None
    tid, key = groups["global_tid"][0], groups["key"][0]
    chosen = (
        cand.filter((pl.col("global_tid") == tid) & (pl.col("key") == key))
        .sort("start_ns", "end_ns")
        .unique("start_ns", keep="last", maintain_order=True)
        .with_columns(
            # Consecutive instances must not overlap: clip each CPU end to the next start.
            pl.min_horizontal("end_ns", pl.col("start_ns").shift(-1)).alias("end_ns")
        )
        .select(
            pl.int_range(pl.len(), dtype=pl.Int64).alias("step"),
            "start_ns", "end_ns", "global_tid", "global_pid", "pid",
        )
        .collect()
    )
    return chosen, f"nvtx:{key}"


def _project(trace: Trace, cpu: pl.DataFrame) -> tuple[pl.DataFrame, str]:
    """GPU windows ``step, start_ns, end_ns`` of CPU step ranges (see the module doc)."""
    ops = trace.frame("gpu_ops")
    api = trace.frame("cuda_api")
    if ops.is_empty() or api.is_empty():
        return cpu.select("step", "start_ns", "end_ns"), "cpu"
    tid = cpu["global_tid"][0]
    pid = cpu["pid"][0]
    # Assign each API call of the process to the CPU step whose range holds its start: the
    # ranges are sorted and disjoint, so that is a binary search, not a sort and an as-of join.
    calls = api.lazy().filter((pl.col("pid") == pid) & pl.col("start_ns").is_not_null()).select(
        "global_tid", "global_pid", "correlation_id", "start_ns"
    ).collect()
    row = cpu["start_ns"].search_sorted(calls["start_ns"], side="right").cast(pl.Int64) - 1
    in_range = (row >= 0) & (calls["start_ns"] < cpu["end_ns"].gather(row.clip(0)))
    calls = calls.with_columns(cpu["step"].gather(row.clip(0)).alias("step")).filter(in_range)
    # Join launches on one packed Int64 (global_pid, correlation_id), not on two columns.
    link = pl.col("global_pid").is_not_null() & pl.col("correlation_id").is_not_null()
    calls = calls.filter(link)
    launches = ops.lazy().filter(link).select(
        "global_pid", "correlation_id",
        pl.col("start_ns").alias("_os"), pl.col("end_ns").alias("_oe"),
    ).collect()
    keys = Keys([calls, launches], ["global_pid"], ["correlation_id"])
    ids = calls.select("step", "global_tid", keys.pack(0, "correlation_id").alias("_id"))
    op_ids = launches.select(keys.pack(1, "correlation_id").alias("_id"), "_os", "_oe")
    own = ids.filter(pl.col("global_tid") == tid)
    call = unique_rows(own["_id"], op_ids["_id"])
    if call is None:  # an op key held by two calls: a join lists every pair
        matched = own.join(op_ids, on="_id").select("step", "_os")
    else:  # one call per key: a binary search per op finds it
        found = call >= 0
        matched = op_ids.filter(found).select(own["step"].gather(call.filter(found)), "_os")
    first = matched.group_by("step").agg(pl.col("_os").min().alias("_first"))
    win = cpu.join(first, on="step", how="left").sort("step")
    if win["_first"].null_count() == win.height:
        return cpu.select("step", "start_ns", "end_ns"), "cpu"
    # A step that launched nothing on its thread has no GPU window: typically the CPU ran
    # ahead past the end of GPU capture. It is dropped; step numbers keep their positions.
    win = win.filter(pl.col("_first").is_not_null())
    # Only the last step's end needs the ops launched by every thread: join just its calls.
    last = ids.filter(pl.col("step") == win["step"][-1]).join(op_ids, on="_id")["_oe"].max()
    win = win.with_columns(pl.col("_first").cum_max().alias("_gs")).with_columns(
        pl.col("_gs").shift(-1)
        .fill_null(pl.max_horizontal("_gs", pl.lit(last, pl.Int64), "end_ns"))
        .alias("_ge")
    )
    return win.select("step", pl.col("_gs").alias("start_ns"), pl.col("_ge").alias("end_ns")), "gpu"


def _periodic_steps(
    ops: pl.DataFrame, params: StepsParams
) -> tuple[pl.DataFrame, dict[str, Any]] | None:
    """Steps from the period of the kernel-name sequence of the busiest (pid, device)."""
    kern = ops.filter(pl.col("kind") == "kernel")
    if kern.height < 2 * params.min_steps:
        return None
    busiest = (
        iv.total(kern.select("pid", "device_id", "start_ns", "end_ns"), by=["pid", "device_id"])
        .sort(["busy_ns", "pid", "device_id"], descending=[True, False, False])
        .head(1)
        .collect()
    )
    pid, dev = busiest["pid"][0], busiest["device_id"][0]
    seq = (
        kern.lazy()
        .filter((pl.col("pid") == pid) & (pl.col("device_id") == dev))
        .sort("start_ns", "end_ns")
        .select(
            pl.int_range(pl.len(), dtype=pl.Int64).alias("i"),
            pl.col("name").fill_null(""),
            "start_ns",
            "end_ns",
            # Idle time before each kernel: its start minus the latest end so far.
            (pl.col("start_ns") - pl.col("end_ns").cum_max().shift(1))
            .clip(lower_bound=0).fill_null(0).alias("idle_before"),
        )
        .collect()
    )
    n = seq.height
    diffs = seq.lazy().with_columns(pl.col("i").diff().over("name").alias("d")).filter(
        pl.col("d").is_not_null()
    )
    per_name = (
        diffs.group_by("name", "d")
        .agg(pl.len().alias("k"))
        .with_columns(pl.col("k").sum().over("name").alias("kd"))
        .sort(["name", "k", "d"], descending=[False, True, False])
        .group_by("name", maintain_order=True)
        .first()
        .filter((pl.col("kd") + 1 >= params.min_steps) & (pl.col("k") >= 0.8 * pl.col("kd")))
        .collect()
    )
    periods = sorted(
        int(d) for d in per_name["d"].unique() if d is not None and n // int(d) >= params.min_steps
    )[:64]
    if not periods:
        return None
    names = seq["name"]
    # One vectorised comparison per candidate period (a few dozen at most, not per event).
    match = {
        period: float((names.head(n - period) == names.tail(n - period)).mean() or 0.0)
        for period in periods
    }
    period = max(periods, key=lambda p: (match[p], -p))
    if match[period] < params.min_period_match:
        return None
    anchors = per_name.filter(pl.col("d") == period)["name"]
    anchor_stats = (
        seq.filter(pl.col("name").is_in(anchors.implode()))
        .group_by("name")
        .agg(pl.col("idle_before").mean().alias("idle"), pl.col("i").min().alias("first"))
        .sort(["idle", "first"], descending=[True, False])
    )
    anchor = anchor_stats["name"][0]
    occ = seq.filter(pl.col("name") == anchor).select("i", "start_ns")
    # End of every potential step: the end of the L-th kernel from its anchor occurrence.
    ends_at = seq.select(pl.col("i") - (period - 1), pl.col("end_ns").cum_max().alias("_le"))
    steps = (
        occ.join(ends_at, on="i", how="left")
        .with_columns(pl.col("start_ns").shift(-1).alias("_next"))
        .with_columns(pl.coalesce("_next", "_le").alias("end_ns"))
        .filter(pl.col("end_ns").is_not_null())
        .select(pl.int_range(pl.len(), dtype=pl.Int64).alias("step"), "start_ns", "end_ns")
    )
    if steps.height < params.min_steps:
        return None
    info = {
        "step_anchor_kernel": anchor,
        "step_period_kernels": period,
        "step_period_match": round(match[period], 4),
        "steps_device_id": int(dev),
    }
    return steps, info


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
    nv = _nvtx_steps(trace, params)
    if nv is not None:
        cpu, source = nv
        windows, projection = _project(trace, cpu)
        metrics["steps_projection"] = projection
        metrics["steps_without_gpu_work"] = cpu.height - windows.height
        metrics["steps_thread"] = int(cpu["global_tid"][0])
    elif params.range_name is not None:
        metrics["steps_reason"] = f"no NVTX range matches range_name {params.range_name!r}"
    elif params.periodicity:
        per = _periodic_steps(
            ops.select("kind", "name", "pid", "device_id", "start_ns", "end_ns").collect(), params
        )
        if per is not None:
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

    busy_ops = ops.select("device_id", "op_class", "start_ns", "end_ns").collect()
    dev = primary_device(busy_ops) if not busy_ops.is_empty() else None
    metrics.setdefault("steps_device_id", dev)
    dev = metrics["steps_device_id"]
    segs = device_segments(trace, keep=True)
    dev_segs = (segs.filter(pl.col("device_id") == dev) if dev is not None
                else segs.clear()).drop("device_id")
    per_step = _window_sums(dev_segs, windows.select("step", "start_ns", "end_ns"), by=[])
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
)
