"""gaps: idle time of the GPU, each gap with the host-side activity that explains it.

**Busy time and gaps.** GPU ops with ``start_ns > 0`` (nsys writes 0 for records it could not
time) are busy time. Per scope:

- ``device``: a device is busy when any op of any stream or process runs on it; gaps are the
  complement of the union inside ``[first op start, last op end]``. Gaps >= `min_gap_ns`.
- ``stream``: the same per ``(pid, device, stream)``. Gaps >= `min_gap_ns`.
- ``process_device``: per ``(pid, device)``; busy also includes the process's profiler-overhead
  rows named exactly ``CUDA profiling data flush overhead``, ``CUDA profiling stop overhead`` or
  ``CUDA profiling overhead`` that lie strictly inside the (pid, device) span. Gaps
  *strictly longer* than `min_gap_ns`. This is the definition of ``nsys analyze -r gpu-starv``
  and its rows equal that rule's (Duration, Start, PID, Device ID) row for row. (One
  difference by design: nsys's sorted-starts/sorted-ends query lets a zero-length op split a
  gap; here zero-length ops cover nothing. No shared trace has one.)

**Causes.** The evidence of a gap is the host activity overlapping it, on the processes that
use the gap's device (``device``: every process with an op on it; other scopes: the gap's
process) and, for OS-runtime calls and NVTX ranges, on the *launching threads* (threads whose
CUDA API calls produced ops on that device / (pid, device) / stream). Per category, ``*_ns`` is
the union of its intervals clipped to the gap:

- ``sync_api_ns``: CUDA API calls of class ``sync`` and CUPTI synchronization records, except
  stream-wait-event ones (``cudaStreamWaitEvent`` orders GPU work and never blocks the host);
- ``sync_copy_ns``: memcpy / memset API calls whose name lacks ``Async``, and any API call whose
  copy involves pageable memory (such copies are synchronous whatever the API says);
- ``launch_ns``: launch and graph-launch API calls (the GPU idles while the host launches);
- ``osrt_ns``: OS-runtime calls (poll, futex, read, ...) on the launching threads;
- ``nvtx_ns``: application NVTX ranges on the launching threads that launched no GPU work
  themselves (no API call with a GPU op starts inside them), outside library domains
  (`nvtx_exclude_domains`) and not named like steps. Ranges that launch work (``forward``,
  ``step 3``, ``aten::mm``) are phases of GPU work, not host-side waits, and would otherwise
  "explain" every gap inside them;
- ``overhead_ns``: profiler overhead rows of the processes.

``cause`` is the category with the largest coverage (ties: the order of `schemas.GAP_CAUSES`)
and ``cause_frac`` its share of the gap. When no category covers at least `min_cause_frac` of
the gap, the cause is ``no_cuda_activity`` (host-side work such as Python or I/O that left no
trace) and ``cause_frac`` is the share covered by no evidence at all. ``cause_detail`` names the
three (name, category) pairs covering most of the gap, e.g.
``DataLoader.__next__ (nvtx) 24.1 ms of 25.0 ms; poll (osrt) 20.2 ms``.

**Summary** (``gap_summary``, per scope and device; for ``stream`` and ``process_device`` span,
busy and idle are sums over the device's partitions): gap counts by size (1-10 ms, 10-100 ms,
>= 100 ms). With steps known (the steps pass ran), ``steps_with_gap_frac`` is the share of
non-warm-up steps in which a gap starts and ``recurs_with_steps`` is true when it is >= 0.5.
Without steps, ``recurs_with_steps`` is true when at least 4 gaps start at a regular period
(coefficient of variation of the intervals between gap starts <= 0.1), else null.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import polars as pl

from nsysan.errors import ConfigError
from nsysan.frames import intervals as iv
from nsysan.frames import schemas
from nsysan.frames.trace import Trace
from nsysan.passes import device_blocks, gap_causes
from nsysan.passes.base import PassResult, PassSpec, Results

# CATEGORIES and STEP_NAME_PATTERN are re-exported: they are part of this pass's vocabulary.
from nsysan.passes.gap_causes import CATEGORIES as CATEGORIES
from nsysan.passes.gap_causes import KEY_COLS, MS, SCOPE_KEYS
from nsysan.passes.steps import STEP_NAME_PATTERN as STEP_NAME_PATTERN
from nsysan.passes.steps import step_windows

SCOPES = ("device", "stream", "process_device")
#: PROFILER_OVERHEAD names that nsys's gpu-starv rule counts as GPU busy time
STARV_OVERHEAD_NAMES = (
    "CUDA profiling data flush overhead",
    "CUDA profiling stop overhead",
    "CUDA profiling overhead",
)


@dataclass(frozen=True)
class GapsParams:
    scopes: tuple[str, ...] = ("device",)  # device | stream | process_device
    min_gap_ns: int = 1_000_000
    top_n: int = 10  # gaps quoted as evidence by findings (ranked after all gaps are found)
    min_cause_frac: float = 0.1  # below this coverage by every category: no_cuda_activity
    nvtx_exclude_domains: tuple[str, ...] = ("NCCL", "cuBLAS", "cuBLASLt", "cuDNN", "CUDA")

    def __post_init__(self) -> None:
        bad = [s for s in self.scopes if s not in SCOPES]
        if bad or not self.scopes:
            raise ConfigError(
                f"gaps.scopes: unknown scope {', '.join(map(repr, bad)) or '(none)'}; "
                f"use one or more of {', '.join(SCOPES)}"
            )
        if self.min_gap_ns < 0:
            raise ConfigError(f"gaps.min_gap_ns must be >= 0, got {self.min_gap_ns}")
        if self.top_n < 1:
            raise ConfigError(f"gaps.top_n must be >= 1, got {self.top_n}")
        if not 0 <= self.min_cause_frac <= 1:
            raise ConfigError("gaps.min_cause_frac must be in [0, 1]")


# ---------------------------------------------------------------------------------------------
# Busy time and gaps
# ---------------------------------------------------------------------------------------------
def _busy(ops: pl.LazyFrame, overhead: pl.DataFrame, scope: str) -> pl.LazyFrame:
    """Busy intervals ``pid, device_id, stream_id, start_ns, end_ns`` of one scope."""
    cols = [*KEY_COLS, "start_ns", "end_ns"]
    busy = ops.select(cols)
    if scope != "process_device" or overhead.is_empty():
        return busy
    span = busy.group_by("pid", "device_id").agg(
        pl.col("start_ns").min().alias("_s"), pl.col("end_ns").max().alias("_e")
    )
    ovh = (
        overhead.lazy()
        .filter(pl.col("name").is_in(STARV_OVERHEAD_NAMES))
        .select(pl.col("pid").cast(pl.Int64), "start_ns", "end_ns")
        .join(span, on="pid")
        # Replicated onto every (pid, device) span of its process, strictly inside it.
        .filter((pl.col("start_ns") > pl.col("_s")) & (pl.col("end_ns") < pl.col("_e")))
        .select(
            "pid", "device_id", pl.lit(None, pl.Int64).alias("stream_id"), "start_ns", "end_ns"
        )
    )
    return pl.concat([busy, ovh])


def _scope_gaps(
    busy: pl.LazyFrame, scope: str, min_gap_ns: int, blocks: pl.DataFrame | None = None
) -> tuple[pl.LazyFrame, pl.LazyFrame]:
    """(gaps, per-partition span/busy) of one scope, keyed by ``pid, device_id, stream_id``.

    ``blocks``, when given, is the union of ``busy`` per partition (sorted): the device scope
    takes the union that `device_blocks` shares with the nccl pass, the findings and the
    pictures, instead of sorting the ops for itself."""
    keys = SCOPE_KEYS[scope]
    null_keys = [pl.lit(None, pl.Int64).alias(k) for k in KEY_COLS if k not in keys]
    dur = pl.col("end_ns") - pl.col("start_ns")
    # nsys's rule keeps gaps strictly longer than its threshold; the others keep >= threshold.
    keep = dur > min_gap_ns if scope == "process_device" else dur >= min_gap_ns
    # The union of the ops (its sort dominates) runs once, inside the complement: busy time
    # is the span minus every gap, kept or not.
    if blocks is None:
        every_gap = iv.complement(busy, by=keys).collect()
        spans = busy.filter(pl.col("end_ns") > pl.col("start_ns"))
    else:
        every_gap = device_blocks.gaps_between(blocks)
        spans = blocks.lazy()  # the same first start and last end per partition, fewer rows
    gaps = (
        every_gap.lazy()
        .filter(keep)
        .with_columns(*null_keys, pl.lit(scope).alias("scope"), dur.alias("duration_ns"))
    )
    idle = every_gap.lazy().group_by(keys).agg(dur.sum().alias("_idle"))
    # A partition with a null key gets a null busy time, as it always has: a join on the keys
    # (here, with its gaps) never matches nulls.
    known = pl.all_horizontal(pl.col(k).is_not_null() for k in keys)
    part = (
        spans.group_by(keys)
        .agg(pl.col("start_ns").min().alias("_s"), pl.col("end_ns").max().alias("_e"))
        .join(idle, on=keys, how="left")
        .with_columns(
            pl.when(known).then(pl.col("_e") - pl.col("_s") - pl.col("_idle").fill_null(0))
            .alias("busy_ns"),
            *null_keys,
            pl.lit(scope).alias("scope"),
        )
    )
    return gaps, part


# ---------------------------------------------------------------------------------------------
# The pass
# ---------------------------------------------------------------------------------------------
def _assign_steps(gaps: pl.LazyFrame, steps: pl.DataFrame | None) -> pl.LazyFrame:
    if steps is None:
        return gaps.with_columns(pl.lit(None, pl.Int64).alias("step"))
    win = steps.lazy().select(
        "step", pl.col("start_ns").alias("_ss"), pl.col("end_ns").alias("_se")
    ).sort("_ss")
    return (
        gaps.sort("start_ns")
        .join_asof(win, left_on="start_ns", right_on="_ss", strategy="backward")
        .with_columns(
            pl.when(pl.col("start_ns") < pl.col("_se")).then(pl.col("step")).alias("step")
        )
        .drop("_ss", "_se")
    )


def _summary(
    tid: str, gaps: pl.DataFrame, parts: pl.DataFrame, steps: pl.DataFrame | None
) -> pl.DataFrame:
    dur = pl.col("duration_ns")
    per_dev = parts.group_by("scope", "device_id").agg(
        (pl.col("_e") - pl.col("_s")).sum().alias("span_ns"),
        pl.col("busy_ns").sum().alias("busy_ns"),
    )
    counts = gaps.group_by("scope", "device_id").agg(
        pl.len().alias("n_gaps"),
        dur.sum().alias("gaps_ns"),
        ((dur >= MS) & (dur < 10 * MS)).sum().alias("n_gaps_1_10ms"),
        ((dur >= 10 * MS) & (dur < 100 * MS)).sum().alias("n_gaps_10_100ms"),
        (dur >= 100 * MS).sum().alias("n_gaps_ge_100ms"),
        # Regularity of gap starts, for when steps are unknown.
        (pl.col("start_ns").sort().diff().std() / pl.col("start_ns").sort().diff().mean())
        .alias("_cv"),
    )
    if steps is not None:
        steady = steps.filter(~pl.col("warmup"))["step"]
        with_gap = (
            gaps.filter(pl.col("step").is_in(steady.implode()))
            .group_by("scope", "device_id")
            .agg((pl.col("step").n_unique() / max(steady.len(), 1)).alias("_frac"))
        )
        counts = counts.join(with_gap, on=["scope", "device_id"], how="left")
    else:
        counts = counts.with_columns(pl.lit(None, pl.Float64).alias("_frac"))
    frac = pl.col("_frac").fill_null(0.0) if steps is not None else pl.col("_frac")
    regular = pl.when((pl.col("n_gaps") >= 4) & (pl.col("_cv") <= 0.1)).then(True)
    out = (
        per_dev.join(counts, on=["scope", "device_id"], how="left")
        .with_columns(
            pl.lit(tid).alias("trace_id"),
            (pl.col("span_ns") - pl.col("busy_ns")).alias("idle_ns"),
            *[pl.col(c).fill_null(0) for c in
              ("n_gaps", "gaps_ns", "n_gaps_1_10ms", "n_gaps_10_100ms", "n_gaps_ge_100ms")],
            frac.alias("steps_with_gap_frac"),
        )
        .with_columns(
            pl.when(pl.col("span_ns") > 0).then(pl.col("idle_ns") / pl.col("span_ns"))
            .alias("idle_frac"),
            (pl.col("steps_with_gap_frac") >= 0.5 if steps is not None else regular)
            .alias("recurs_with_steps"),
        )
    )
    order = pl.col("scope").replace_strict({s: i for i, s in enumerate(SCOPES)})
    return schemas.conform(out.sort(order, "device_id"), schemas.GAP_SUMMARY)


def run(trace: Trace, params: GapsParams, results: Results) -> PassResult:
    tid = trace.trace_id
    # (the frames hold OS and CUDA ids as Int32; the gap tables, and the null keys of other
    # scopes, as Int64)
    as_keys = [pl.col(c).cast(pl.Int64) for c in KEY_COLS]
    timed = trace.frame("gpu_ops").lazy().filter(pl.col("start_ns") > 0)
    ops = timed.with_columns(as_keys)
    overhead = trace.frame("overhead")
    found, parts = [], []
    for scope in dict.fromkeys(params.scopes):
        # the device scope's busy time is every timed op: the shared union
        blocks = device_blocks.union(trace) if scope == "device" else None
        g, p = _scope_gaps(_busy(ops, overhead, scope), scope, params.min_gap_ns, blocks)
        found.append(g.select("scope", *as_keys, "start_ns", "end_ns", "duration_ns"))
        parts.append(p.select("scope", *as_keys, "_s", "_e", "busy_ns"))
    order = pl.col("scope").replace_strict({s: i for i, s in enumerate(SCOPES)})
    gaps = (
        pl.concat(found)
        .sort(order, "device_id", "pid", "stream_id", "start_ns", nulls_last=False)
        .with_row_index("gap_id")
        .collect()
    )
    parts_df = pl.concat(parts).collect()
    steps = step_windows(results)

    if gaps.is_empty():
        table = schemas.empty(schemas.GAPS)
    else:
        windows = (
            iv.union(gaps.select("start_ns", "end_ns"))
            .select(pl.col("start_ns").alias("_ws"), pl.col("end_ns").alias("_we"))
            .collect()
        )
        calls = gap_causes.launch_calls(trace)
        proc, thread = gap_causes.evidence(trace, ops, calls, windows, params.nvtx_exclude_domains)
        owners_pid, owners_tid = gap_causes.owners(timed, calls, gaps.lazy(), params.scopes)
        clipped = (gap_causes.explain(gaps.lazy(), owners_pid, owners_tid, proc, thread)
                   .collect().lazy())
        explained = gap_causes.causes(gaps.lazy(), clipped, params.min_cause_frac)
        table = (
            _assign_steps(explained, steps)
            .sort("gap_id")
            .with_columns(pl.lit(tid).alias("trace_id"))
            .collect()
        )
        table = schemas.conform(table, schemas.GAPS)
    summary = _summary(tid, table, parts_df, steps)
    return PassResult(
        tables={"gaps": table, "gap_summary": summary},
        metrics=_metrics(table, summary, params.scopes[0]),
    )


def _metrics(gaps: pl.DataFrame, summary: pl.DataFrame, scope: str) -> dict[str, Any]:
    """Scalars of the first requested scope (normally ``device``)."""
    s = summary.filter(pl.col("scope") == scope)
    g = gaps.filter(pl.col("scope") == scope)
    span, busy = int(s["span_ns"].sum()), int(s["busy_ns"].sum())
    metrics: dict[str, Any] = {
        "gaps_scope": scope,
        "span_ns": span,
        "busy_ns": busy,
        "idle_ns": span - busy,
        "gpu_busy_frac": busy / span if span else None,
        "n_gaps": g.height,
        "gaps_ns": int(g["duration_ns"].sum()),
        "largest_gap_ns": int(g["duration_ns"].max()) if g.height else 0,  # type: ignore[arg-type]
    }
    by_cause = g.group_by("cause").agg(pl.col("duration_ns").sum())
    ns = dict(zip(by_cause["cause"].to_list(), by_cause["duration_ns"].to_list(), strict=True))
    for cause in schemas.GAP_CAUSES:
        metrics[f"gaps_ns_{cause}"] = int(ns.get(cause, 0))
    # the largest; on a tie the first by name (group-by output has no order)
    metrics["main_gap_cause"] = max(sorted(ns), key=lambda c: ns[c]) if ns else None
    return metrics


SPEC = PassSpec(
    name="gaps",
    description="GPU idle gaps per device / stream / (pid, device), each with its host-side cause",
    params=GapsParams,
    tables={"gaps": schemas.GAPS, "gap_summary": schemas.GAP_SUMMARY},
    run=run,
    default=True,
    after=("steps",),
)
