"""Stragglers: ranks that arrive last at collectives, how regularly, and why.

An instance counts when its arrival skew is at least ``min_skew_ns`` (smaller skews are
noise: somebody is always last by a few microseconds). Per rank: how often it arrived last,
how long it made the others wait (``wait_imposed_ns``) and how long it waited itself.

A rank is a **straggler** when it imposed at least ``straggler_share`` of all the waiting
(and more than 1.5 / n_ranks of it, so that with two ranks one of them is not a straggler
merely by arriving last more often than not), arrived last at least
``min_straggler_events`` times, and the waiting it imposed is at least
``min_wait_frac`` of its GPU span.

**Period**: the modal distance between the straggler's late instances, counted in steps of
that rank when its steps are known, else in occurrences of the collective; reported when at
least ``period_min_match`` of the distances equal it.

**Cause**: for each late instance, the window from the rank's previous collective end to its
arrival, on every rank. Inside it: GPU compute (union of compute kernels), data loading (NVTX
ranges matching ``data_pattern``), host stall (synchronising CUDA API calls and OS-runtime
waits). The cause is the category where the straggler spent the most time *more* than the
median of the other ranks, summed over its late instances; when that excess is below
``min_cause_frac`` of the waiting it imposed, the cause is ``unknown``. The finding is a
warning when the imposed waiting is at least ``warn_wait_frac`` of the straggler's GPU span,
else info.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import polars as pl

from nsysan.escape import md_code
from nsysan.frames import intervals as iv
from nsysan.frames import schemas
from nsysan.frames.text import per_value
from nsysan.frames.trace import Trace
from nsysan.passes.base import Finding

CAUSES = ("compute", "data_loading", "host_stall")
_CAUSE_LAYER = {"compute": "operator_library", "data_loading": "framework",
                "host_stall": "runtime_driver", "unknown": "communication"}
_CAUSE_WORDS = {"compute": "GPU compute", "data_loading": "data loading",
                "host_stall": "host stalls (sync APIs / OS waits)", "unknown": "nothing measured"}


INTERVALS = {"cat": pl.String, "name": schemas.CAT, "start_ns": pl.Int64, "end_ns": pl.Int64,
             "rank": pl.Int64}


def local_intervals(trace: Trace, pids: pl.Series, data_pattern: str) -> pl.DataFrame:
    """``pid, cat, name, start_ns, end_ns`` in the profile's own time: the activity
    categories (see the module doc) of its processes ``pids``."""
    sel = ["pid", "name", "start_ns", "end_ns"]
    compute = trace.frame("gpu_ops").lazy().filter(pl.col("op_class") == "compute").select(
        *sel[:1], pl.lit("compute").alias("cat"), *sel[1:])
    nvtx = trace.frame("nvtx")
    data = nvtx.lazy().filter(
        (pl.col("style") != "mark")
        & per_value(nvtx, "name", pl.col("name").str.contains(data_pattern)).fill_null(False)
    ).select(*sel[:1], pl.lit("data_loading").alias("cat"), *sel[1:])
    sync = trace.frame("cuda_api").lazy().filter(pl.col("api_class") == "sync").select(
        *sel[:1], pl.lit("host_stall").alias("cat"), *sel[1:])
    osrt = trace.frame("osrt").lazy().select(*sel[:1], pl.lit("host_stall").alias("cat"),
                                              *sel[1:])
    return (pl.concat([compute, data, sync, osrt])
            .filter(pl.col("pid").is_in(pids.implode())).collect())


def to_job_time(parts: Sequence[tuple[int, pl.DataFrame]], ranks: pl.DataFrame,
                offsets: pl.DataFrame) -> pl.DataFrame:
    """``rank, cat, name, start_ns, end_ns`` in job time from each profile's
    (``trace_index``, `local_intervals`)."""
    out = []
    for t_index, local in parts:  # one per profile
        rows = ranks.filter(pl.col("trace_index") == t_index).select("pid", "rank")
        if rows.is_empty():
            continue
        off = offsets.filter(pl.col("trace_index") == t_index)["offset_ns"][0]
        out.append(local.with_columns(pl.col("start_ns") + off, pl.col("end_ns") + off)
                   .join(rows, on="pid").drop("pid"))
    if not out:
        return pl.DataFrame(schema=INTERVALS)
    return pl.concat(out).select("rank", "cat", "name", "start_ns", "end_ns")


def windows_before(coll: pl.DataFrame, first_activity: pl.DataFrame) -> pl.DataFrame:
    """``instance, rank, start_ns, end_ns``: from the rank's previous collective end (or its
    first activity) to its arrival."""
    return (
        coll.sort("rank", "arrival_ns", "instance")
        .with_columns(pl.col("end_ns").shift(1).over("rank").alias("_prev"))
        .join(first_activity, on="rank", how="left")
        .select(
            "instance", "rank",
            pl.min_horizontal(pl.coalesce("_prev", "first_activity_ns"), pl.col("arrival_ns"))
            .alias("start_ns"),
            pl.col("arrival_ns").alias("end_ns"),
        )
    )


def per_rank_stats(coll: pl.DataFrame, min_skew_ns: int) -> pl.DataFrame:
    """``rank, n_collectives, n_last, wait_ns, wait_imposed_ns``."""
    sig = pl.col("skew_ns") >= min_skew_ns
    is_last = (pl.col("rank") == pl.col("last_rank")) & sig
    return coll.group_by("rank").agg(
        pl.col("instance").n_unique().cast(pl.Int64).alias("n_collectives"),
        is_last.sum().cast(pl.Int64).alias("n_last"),
        pl.col("wait_ns").sum().alias("wait_ns"),
        pl.col("wait_imposed_ns").filter(is_last).sum().alias("wait_imposed_ns"),
    )


def _period(positions: pl.Series, min_match: float) -> tuple[int | None, int | None, float]:
    """Modal distance between sorted positions, its phase, and the share of distances equal
    to it (period None when below ``min_match``)."""
    pos = positions.drop_nulls().unique().sort()
    if pos.len() < 3:
        return None, None, 0.0
    d = pos.diff().drop_nulls()
    counts = d.value_counts(sort=True)
    period = int(counts[d.name][0])
    share = float(counts["count"][0] / d.len())
    if share < min_match or period <= 0:
        return None, None, share
    phase = int((pos % period).mode().sort()[0])
    return period, phase, share


def find_stragglers(
    coll: pl.DataFrame,
    ranks: pl.DataFrame,
    intervals: pl.DataFrame,
    steps: pl.DataFrame,
    *,
    min_skew_ns: int,
    straggler_share: float,
    min_straggler_events: int,
    min_wait_frac: float,
    period_min_match: float,
    min_cause_frac: float = 0.25,
    warn_wait_frac: float = 0.05,
) -> tuple[list[Finding], dict[str, Any]]:
    """Straggler findings and metrics. ``ranks`` holds ``rank, first_activity_ns, span_ns``;
    ``steps`` holds ``rank, step, start_ns`` in job time (may be empty)."""
    n_ranks = coll["rank"].n_unique() if not coll.is_empty() else 0
    metrics: dict[str, Any] = {"stragglers": []}
    if n_ranks < 2:
        return [], metrics
    stats = per_rank_stats(coll, min_skew_ns)
    total = int(stats["wait_imposed_ns"].sum())
    if total <= 0:
        return [], metrics
    stats = stats.join(ranks.select("rank", "span_ns"), on="rank", how="left").with_columns(
        (pl.col("wait_imposed_ns") / total).alias("share")
    )
    cand = stats.filter(
        (pl.col("share") >= straggler_share)
        & (pl.col("share") > 1.5 / n_ranks)
        & (pl.col("n_last") >= min_straggler_events)
        & (pl.col("wait_imposed_ns") >= min_wait_frac * pl.col("span_ns").fill_null(0))
    )
    findings: list[Finding] = []
    windows = windows_before(coll, ranks.select("rank", "first_activity_ns"))
    for row in cand.iter_rows(named=True):  # at most a few ranks
        r = row["rank"]
        late = coll.filter((pl.col("rank") == r) & (pl.col("last_rank") == r)
                           & (pl.col("skew_ns") >= min_skew_ns))
        key = late.group_by("key").len().sort(["len", "key"], descending=[True, False])["key"][0]
        late_key = late.filter(pl.col("key") == key)
        rank_steps = steps.filter(pl.col("rank") == r).sort("start_ns")
        unit = f"{md_code(late_key['name'][0], 80)} calls"  # a name from the trace
        positions = late_key["seq"]
        if not rank_steps.is_empty():
            positions = (
                late_key.sort("arrival_ns")
                .join_asof(rank_steps.select("step", "start_ns"), left_on="arrival_ns",
                           right_on="start_ns", strategy="backward")["step"]
            )
            unit = "steps"
        period, phase, share = _period(positions, period_min_match)
        cause, excess, top = _cause(r, late["instance"], windows, intervals)
        if excess < min_cause_frac * row["wait_imposed_ns"]:
            explained = (f"Nothing measured explains it: the largest difference to the other "
                         f"ranks before those collectives is {excess / 1e6:.1f} ms of "
                         f"{_CAUSE_WORDS[cause]}.")
            cause = "unknown"
        else:
            top_txt = f" (e.g. {', '.join(md_code(t, 80) for t in top)})" if top else ""
            explained = (f"Before those collectives it spent {excess / 1e6:.1f} ms more than "
                         f"the other ranks in {_CAUSE_WORDS[cause]}{top_txt}.")
        if period == 1:
            every = f"in most {unit}"
        elif period:
            every = f"every {period} {unit} (phase {phase})"
        else:
            every = f"irregularly (the most common spacing covers {share:.0%})"
        span = row["span_ns"] or 0
        material = span > 0 and row["wait_imposed_ns"] >= warn_wait_frac * span
        findings.append(Finding(
            code="STRAGGLER_RANK", severity="warning" if material else "info",
            layer=_CAUSE_LAYER[cause],
            title=f"Rank {r} is a straggler",
            message=(
                f"Rank {r} arrived last at {row['n_last']} of {row['n_collectives']} "
                f"collectives, {every}, making the other ranks wait "
                f"{row['wait_imposed_ns'] / 1e6:.1f} ms in total ({row['share']:.0%} of all "
                f"waiting). {explained}"
            ),
            evidence={"rank": r, "n_last": row["n_last"], "n_collectives": row["n_collectives"],
                      "wait_imposed_ns": row["wait_imposed_ns"], "wait_share": row["share"],
                      "key": key, "period": period, "period_unit": unit if period else None,
                      "phase": phase, "period_match": share, "cause": cause,
                      "cause_excess_ns": excess, "cause_ranges": top},
        ))
        metrics["stragglers"].append(
            {"rank": r, "period": period, "period_unit": unit, "phase": phase, "cause": cause,
             "cause_excess_ns": excess, "n_last": row["n_last"],
             "wait_imposed_ns": row["wait_imposed_ns"]}
        )
    return findings, metrics


def _cause(rank: int, late_instances: pl.Series, windows: pl.DataFrame,
           intervals: pl.DataFrame) -> tuple[str, int, list[str]]:
    """Category with the largest excess over the other ranks' median, its excess (ns), and
    the top data-loading range names in the straggler's windows."""
    win = windows.filter(pl.col("instance").is_in(late_instances.implode()))
    if win.is_empty():
        return "unknown", 0, []
    measured = win
    for cat in CAUSES:
        cover = intervals.filter(pl.col("cat") == cat).select("rank", "start_ns", "end_ns")
        measured = iv.covered(measured, cover, by=["rank"], name=cat).collect()
    mine = measured.filter(pl.col("rank") == rank).drop("rank", "start_ns", "end_ns")
    others = (
        measured.filter(pl.col("rank") != rank)
        .group_by("instance").agg([pl.col(c).median() for c in CAUSES])
    )
    excess = (
        mine.join(others, on="instance", how="left", suffix="_o")
        .select([(pl.col(c) - pl.col(f"{c}_o").fill_null(0)).sum().alias(c) for c in CAUSES])
    )
    values = {c: float(excess[c][0] or 0) for c in CAUSES}
    cause = max(CAUSES, key=lambda c: values[c])
    if values[cause] <= 0:
        return "unknown", 0, []
    top: list[str] = []
    data = intervals.filter((pl.col("rank") == rank) & (pl.col("cat") == "data_loading"))
    if not data.is_empty():
        mine_win = win.filter(pl.col("rank") == rank).select(
            pl.col("start_ns").alias("_ws"), pl.col("end_ns").alias("_we")).sort("_ws")
        hits = (
            data.sort("start_ns")
            .join_asof(mine_win, left_on="start_ns", right_on="_ws", strategy="backward")
            .filter(pl.col("start_ns") < pl.col("_we"))
            .group_by("name")
            .agg((pl.col("end_ns") - pl.col("start_ns")).sum().alias("_t"))
            .sort(["_t", "name"], descending=[True, False])
        )
        top = hits["name"].head(3).to_list()
    return cause, int(values[cause]), top
