"""Evidence and causes of GPU gaps: the *Causes* part of `nsysan.passes.gaps` (its module
docstring defines the categories, ownership, ``cause``, ``cause_frac`` and ``cause_detail``).

Gaps are few (tens to thousands) while host activity is millions of rows, so every evidence
frame is first cut down to the rows overlapping some gap (`_prune`, a binary search per row, no
sort) and only then filtered on strings, joined and clipped.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import polars as pl

from nsysan.frames import intervals as iv
from nsysan.frames.trace import Trace
from nsysan.passes import op_link
from nsysan.passes.distinct import distinct
from nsysan.passes.op_keys import OP_KEY
from nsysan.passes.steps import STEP_NAME_PATTERN

SCOPE_KEYS = {
    "device": ["device_id"],
    "stream": ["pid", "device_id", "stream_id"],
    "process_device": ["pid", "device_id"],
}
KEY_COLS = ["pid", "device_id", "stream_id"]
#: evidence categories: (cause in GAP_CAUSES, column in GAPS, short label in cause_detail)
CATEGORIES = (
    ("sync_api", "sync_api_ns", "sync_api"),
    ("sync_copy", "sync_copy_ns", "sync_copy"),
    ("launch_bound", "launch_ns", "launch"),
    ("osrt_wait", "osrt_ns", "osrt"),
    ("nvtx_range", "nvtx_ns", "nvtx"),
    ("profiler_overhead", "overhead_ns", "overhead"),
)
MS = 1_000_000
#: start and end of a sentinel window before every other (see `_prune`)
_NEVER = -(2**63)
#: `_prune` bounds the rows to test by binary searches per window from this many rows on
#: (below, a search per row costs less than the extra calls)
_MIN_ROWS = 65_536
#: `_candidates` gives up (every row is tested) beyond this fraction of the rows: the gather
#: of candidates costs more per row than the search per row it saves (about 1.7x, measured)
_MAX_CANDIDATE_FRAC = 0.25
#: rows longer than the `_LONG_ROWS`-th longest are candidates of their own, so that a few
#: run-long rows do not make every row a candidate
_LONG_ROWS = 1024


def launch_calls(trace: Trace) -> pl.DataFrame:
    """``pid, device_id, stream_id`` (Int32, as in the frames) of every timed GPU op
    (the ``gpu_ops`` rows with ``start_ns > 0``) with ``global_tid, start_ns`` of the API call
    that launched it, in no particular order.

    Both the launching threads of each gap (`owners`) and the "did this NVTX range launch
    work" test need this link of the two largest frames: every op's call is known once
    (`op_link.api_rows`, aligned with the whole ``gpu_ops`` frame), so it is a gather. The
    keys keep the frames' type, not the gap tables' Int64 (4 B a column per op: ~140 MB on
    10M kernels): polars joins them with the gaps' keys, keeping the gaps' type on the left.
    """
    api, gpu_ops = trace.frame("cuda_api"), trace.frame("gpu_ops")
    timed = pl.col("start_ns") > 0
    rows = op_link.api_rows(trace)
    linked = (
        gpu_ops.select(*KEY_COLS, "start_ns")
        .with_columns(pl.Series("_row", rows))
        .filter(timed & (pl.col("_row") >= 0))
    )
    return linked.select(
        *KEY_COLS,
        api["global_tid"].gather(linked["_row"]),
        api["start_ns"].gather(linked["_row"]),
    )


def _prune(df: pl.DataFrame, windows: pl.DataFrame) -> pl.LazyFrame:
    """Rows of ``df`` (with positive length) overlapping any of the disjoint, sorted
    ``windows`` (``_ws, _we``); ``df`` keeps its order.

    For an interval [s, e), the last window starting before e is the only candidate: earlier
    windows end before it starts. A binary search of ``e - 1`` in the window starts finds it
    without sorting ``df``; the sentinel window in front (ending before any time) stands for
    "no window starts before e". The search runs in numpy (several times faster than polars'
    on millions of rows) and only the few rows found are gathered, whatever their columns.
    """
    starts = np.concatenate([[_NEVER], windows["_ws"].to_numpy()])
    ends = np.concatenate([[_NEVER], windows["_we"].to_numpy()])
    cand = _candidates(df, windows)
    # a null bound fails `e > s` as 0 > 0 does (the filter's null is false)
    s = df["start_ns"].fill_null(0).to_numpy()
    e = df["end_ns"].fill_null(0).to_numpy()
    if cand is not None:
        s, e = s[cand], e[cand]
    last = np.searchsorted(starts, e - 1, side="right") - 1
    rows = np.flatnonzero((e > s) & (ends[last] > s))
    return df[rows if cand is None else cand[rows]].lazy()


def _candidates(df: pl.DataFrame, windows: pl.DataFrame) -> np.ndarray | None:
    """Rows of ``df`` that may overlap a window, ascending; None (every row is a candidate)
    unless the starts are sorted and no bound is null, or when the candidates would be more
    than `_MAX_CANDIDATE_FRAC` of the rows.

    A row overlapping a window ``[ws, we)`` starts in ``[ws - its length, we)``, so the rows
    starting in ``[ws - bound, we)`` of some window are candidates for every row no longer
    than ``bound``. The bound is the longest length, unless that makes too many candidates
    (one run-long row, say a whole-run NVTX range, would make every row one): then the
    `_LONG_ROWS`-th longest, and the fewer rows longer than it are candidates of their own.

    Why: host frames come sorted by start and gaps are few, so two binary searches per
    window bound the rows to test instead of one binary search per row (millions of calls)."""
    start, end = df["start_ns"], df["end_ns"]
    if (df.height < max(_MIN_ROWS, 1) or start.null_count() or end.null_count()
            or not start.is_sorted()):
        return None
    s = start.to_numpy()
    length = end.to_numpy() - s
    most = int(df.height * _MAX_CANDIDATE_FRAC)
    cand = _bounded(s, windows, int(length.max()), np.empty(0, np.int64), most)
    if cand is not None:
        return cand
    k = min(_LONG_ROWS, df.height)
    bound = int(np.partition(length, df.height - k)[df.height - k])
    return _bounded(s, windows, bound, np.flatnonzero(length > bound), most)


def _bounded(s: np.ndarray, windows: pl.DataFrame, bound: int, long: np.ndarray, most: int,
             ) -> np.ndarray | None:
    """Candidate rows (ascending) of the sorted starts ``s``: those starting in ``[ws -
    bound, we)`` of some window, and ``long``, the rows longer than ``bound``; None when they
    are more than ``most``."""
    # Windows are sorted and disjoint, so both bounds ascend: a range overlaps only the ones
    # before it, and starting it at the previous end makes the ranges disjoint.
    lo = np.searchsorted(s, windows["_ws"].to_numpy() - max(bound, 0), side="left")
    hi = np.searchsorted(s, windows["_we"].to_numpy(), side="left")
    lo = np.maximum(lo, np.concatenate([[0], hi[:-1]]))
    n = np.maximum(hi - lo, 0)
    if n.sum() + long.size > most:
        return None
    ranges = np.repeat(lo - np.cumsum(n) + n, n) + np.arange(n.sum())
    return np.union1d(ranges, long) if long.size else ranges


def evidence(
    trace: Trace,
    ops: pl.LazyFrame,
    calls: pl.DataFrame,
    windows: pl.DataFrame,
    nvtx_exclude_domains: Sequence[str],
) -> tuple[pl.LazyFrame, pl.LazyFrame]:
    """(process-level evidence keyed by pid, thread-level evidence keyed by global_tid).

    Both have ``cat, label, start_ns, end_ns`` plus the key; only rows in some gap window.
    ``calls`` is `launch_calls`.
    """
    api_frame = trace.frame("cuda_api").lazy()
    # Evidence labels are text (they end up in ``cause_detail``): the names of the few rows
    # in gap windows are cast, never a whole frame's.
    api = _prune(trace.frame("cuda_api"), windows).select(
        "pid", "global_pid", "correlation_id", pl.col("name").cast(pl.String), "api_class",
        "start_ns", "end_ns"
    )
    pageable = (
        ops.filter(
            (pl.col("kind") == "memcpy")
            & ((pl.col("src_kind") == "pageable") | (pl.col("dst_kind") == "pageable"))
        )
        .select("global_pid", "correlation_id", pl.lit(True).alias("_pageable"))
        .unique()
    )
    api = api.join(pageable, on=OP_KEY, how="left")
    name = pl.col("name").fill_null("?")
    api_cat = (
        pl.when(pl.col("_pageable").fill_null(False))
        .then(pl.lit("sync_copy"))
        # cudaStreamWaitEvent orders GPU work and returns at once: it never blocks the host.
        .when((pl.col("api_class") == "sync") & ~name.str.contains("WaitEvent"))
        .then(pl.lit("sync_api"))
        .when(pl.col("api_class").is_in(["memcpy", "memset"]) & ~name.str.contains("Async"))
        .then(pl.lit("sync_copy"))
        .when(pl.col("api_class").is_in(["launch", "graph"]))
        .then(pl.lit("launch_bound"))
    )
    api_label = pl.when(pl.col("_pageable").fill_null(False)).then(name + " pageable").otherwise(
        name
    )
    proc_cols = ["pid", "cat", "label", "start_ns", "end_ns"]
    api_ev = api.with_columns(api_cat.alias("cat"), api_label.alias("label")).filter(
        pl.col("cat").is_not_null()
    )
    # CUPTI sync records: labelled with the API that waited when it can be joined. The few
    # records in gaps are found first, so the name join reads only their calls.
    blocking = pl.col("sync_type").ne_missing("stream_wait_event")
    sync = _prune(trace.frame("sync"), windows).filter(blocking).collect()
    waited = api_frame.filter(
        pl.col("correlation_id").is_in(sync["correlation_id"].drop_nulls().implode())
    ).select(*OP_KEY, pl.col("name").cast(pl.String).alias("_api"))
    sync_ev = sync.lazy().join(waited, on=OP_KEY, how="left").select(
        "pid",
        pl.lit("sync_api").alias("cat"),
        pl.coalesce("_api", pl.col("sync_type").cast(pl.String).fill_null("sync")).alias("label"),
        "start_ns",
        "end_ns",
    )
    ovh_ev = _prune(trace.frame("overhead"), windows).select(
        "pid", pl.lit("profiler_overhead").alias("cat"),
        pl.col("name").cast(pl.String).alias("label"),
        "start_ns", "end_ns",
    )
    proc = pl.concat([api_ev.select(proc_cols), sync_ev, ovh_ev], how="vertical_relaxed")
    proc = proc.with_columns(pl.col("pid").cast(pl.Int64))  # the gaps' key (frames: Int32)

    osrt_ev = _prune(trace.frame("osrt"), windows).select(
        "global_tid", pl.lit("osrt_wait").alias("cat"),
        pl.col("name").cast(pl.String).alias("label"),
        "start_ns", "end_ns",
    )
    nvtx_ev = _nvtx_evidence(trace, calls, windows, nvtx_exclude_domains)
    return proc, pl.concat([osrt_ev, nvtx_ev])


def _nvtx_evidence(
    trace: Trace, calls: pl.DataFrame, windows: pl.DataFrame, exclude_domains: Sequence[str]
) -> pl.LazyFrame:
    """Host-only application NVTX ranges in gap windows (see the gaps module doc)."""
    excluded = [d.lower() for d in exclude_domains]
    # Cut to the ranges in gaps first: the string tests below then read a few rows, not all.
    ranges = (
        _prune(trace.frame("nvtx"), windows).select(
            "global_tid", "end_global_tid", "style", pl.col("domain").cast(pl.String),
            pl.col("name").cast(pl.String), "start_ns", "end_ns"
        )
        .collect()
        .filter(
            (pl.col("style") != "mark")
            & (
                pl.col("end_global_tid").is_null()
                | (pl.col("end_global_tid") == pl.col("global_tid"))
            )
            & ~pl.col("domain").fill_null("").str.to_lowercase().is_in(excluded)
            & ~pl.col("name").fill_null("").str.contains(STEP_NAME_PATTERN)
        )
    )
    # A range launched work when a launch call of its thread starts inside it: the first call
    # at or after its start (one forward as-of search) starts before its end. Only calls
    # inside some range can decide that (the first call at or after a start that is not
    # inside its range is at or after its end either way), so the million calls are cut to
    # those before they are sorted.
    spans = iv.union(ranges.select("start_ns", "end_ns")).collect()
    # the sentinel span in front (ending before any time) stands for "no span starts before"
    bounds = np.concatenate([[_NEVER], spans["start_ns"].to_numpy()])
    ends = np.concatenate([[_NEVER], spans["end_ns"].to_numpy()])
    t = calls["start_ns"].fill_null(_NEVER).to_numpy()
    inside = t < ends[np.searchsorted(bounds, t, side="right") - 1]
    first_call = (calls[np.flatnonzero(inside)].lazy()
                  .select("global_tid", pl.col("start_ns").alias("_t")).sort("_t"))
    return (
        ranges.lazy()
        .sort("start_ns")
        .join_asof(first_call, left_on="start_ns", right_on="_t", by="global_tid",
                   strategy="forward", check_sortedness=False)
        .filter(pl.col("_t").is_null() | (pl.col("_t") >= pl.col("end_ns")))
        .select(
            "global_tid", pl.lit("nvtx_range").alias("cat"), pl.col("name").alias("label"),
            "start_ns", "end_ns",
        )
    )


def owners(
    ops: pl.LazyFrame, calls: pl.DataFrame, gaps: pl.LazyFrame, scopes: Sequence[str]
) -> tuple[pl.LazyFrame, pl.LazyFrame]:
    """(gap_id, pid) and (gap_id, global_tid) pairs: whose host activity explains each gap.

    ``ops`` are the timed GPU ops with the frame's key types (Int32): the distinct (device,
    process) pairs are cast to the gaps' Int64, not every op."""
    by_pid, by_tid = [], []
    for scope in scopes:
        keys = SCOPE_KEYS[scope]
        g = gaps.filter(pl.col("scope") == scope).select("gap_id", *keys)
        if "pid" in keys:
            by_pid.append(g.select("gap_id", "pid"))
        else:  # device scope: every process with an op on the device
            procs = distinct(ops.select(*keys, "pid").collect()).cast(pl.Int64)
            by_pid.append(g.join(procs.lazy(), on=keys).select("gap_id", "pid"))
        threads = distinct(calls.select(*keys, "global_tid"))
        by_tid.append(g.join(threads.lazy(), on=keys).select("gap_id", "global_tid"))
    return pl.concat(by_pid).unique(), pl.concat(by_tid).unique()



def explain(
    gaps: pl.LazyFrame,
    owners_pid: pl.LazyFrame,
    owners_tid: pl.LazyFrame,
    proc: pl.LazyFrame,
    thread: pl.LazyFrame,
) -> pl.LazyFrame:
    """Clipped evidence ``gap_id, cat, label, start_ns, end_ns`` of every gap."""
    g = gaps.select("gap_id", pl.col("start_ns").alias("_gs"), pl.col("end_ns").alias("_ge"))

    def hits(ev: pl.LazyFrame, owners: pl.LazyFrame, key: str) -> pl.LazyFrame:
        # IEJoin on time overlap (bounded by evidence x concurrent gaps), then ownership.
        return (
            ev.join_where(g, pl.col("start_ns") < pl.col("_ge"), pl.col("end_ns") > pl.col("_gs"))
            .join(owners, on=["gap_id", key], how="semi")
            .select(
                "gap_id", "cat", "label",
                pl.max_horizontal("start_ns", "_gs").alias("start_ns"),
                pl.min_horizontal("end_ns", "_ge").alias("end_ns"),
            )
        )

    return pl.concat([hits(proc, owners_pid, "pid"), hits(thread, owners_tid, "global_tid")])


def _fmt_ms(ns: pl.Expr) -> pl.Expr:
    ms = ns / MS
    return pl.when(ms >= 1).then(ms.round(1)).otherwise(ms.round(3)).cast(pl.String)


def causes(gaps: pl.LazyFrame, clipped: pl.LazyFrame, min_cause_frac: float) -> pl.LazyFrame:
    """Gaps with their per-category coverage, cause, cause_frac and cause_detail."""
    cols = [col for _, col, _ in CATEGORIES]
    cov = (
        iv.total(clipped, by=["gap_id", "cat"], name="ns")
        .group_by("gap_id")
        .agg(pl.col("ns").filter(pl.col("cat") == cat).sum().alias(col)
             for cat, col, _ in CATEGORIES)
    )
    any_cov = iv.total(clipped, by=["gap_id"], name="_any")
    per_label = (
        iv.total(clipped, by=["gap_id", "cat", "label"], name="ns")
        # The category breaks the last ties (one name in two categories, equal coverage):
        # without it their order, and which of them makes the top three, varied run to run.
        .sort(["gap_id", "ns", "label", "cat"], descending=[False, True, False, False])
        .group_by("gap_id", maintain_order=True)
        .head(3)
        .join(gaps.select("gap_id", "duration_ns"), on="gap_id")
        .with_columns(
            pl.col("cat").replace({c: short for c, _, short in CATEGORIES}).alias("cat"),
            pl.int_range(pl.len()).over("gap_id").alias("_rank"),
        )
        .with_columns(
            pl.when(pl.col("_rank") == 0)
            .then(pl.format("{} ({}) {} ms of {} ms", "label", "cat", _fmt_ms(pl.col("ns")),
                            _fmt_ms(pl.col("duration_ns"))))
            .otherwise(pl.format("{} ({}) {} ms", "label", "cat", _fmt_ms(pl.col("ns"))))
            .alias("_item")
        )
        .group_by("gap_id", maintain_order=True)
        .agg(pl.col("_item").str.join("; ").alias("cause_detail"))
    )
    out = (
        gaps.join(cov, on="gap_id", how="left")
        .with_columns(pl.col(c).fill_null(0).cast(pl.Int64) for c in cols)
        .join(any_cov, on="gap_id", how="left")
        .join(per_label, on="gap_id", how="left")
    )
    # Largest coverage wins; the first column equal to the maximum keeps the GAP_CAUSES order
    # for ties.
    best = pl.max_horizontal(cols)
    pick = pl.when(pl.col(cols[0]) == best).then(pl.lit(CATEGORIES[0][0]))
    for cause, col, _ in CATEGORIES[1:]:
        pick = pick.when(pl.col(col) == best).then(pl.lit(cause))
    dur = pl.col("duration_ns").cast(pl.Float64)
    enough = best >= min_cause_frac * dur
    return out.with_columns(
        pl.when(enough & (best > 0)).then(pick).otherwise(pl.lit("no_cuda_activity"))
        .alias("cause"),
        pl.when(enough & (best > 0)).then(best / dur)
        .otherwise(1 - pl.col("_any").fill_null(0) / dur).alias("cause_frac"),
        pl.col("cause_detail").fill_null(
            "no CUDA API, OS-runtime, NVTX or profiler activity on the device's processes"
        ),
    )
