"""Step detection for the steps pass: NVTX step ranges and their projection onto GPU time,
and the period of the kernel sequence (the rules are in `nsysan.passes.steps`' docstring)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl

from nsysan.frames import intervals as iv
from nsysan.frames.text import per_value
from nsysan.frames.trace import Trace
from nsysan.passes import op_link

if TYPE_CHECKING:
    from nsysan.passes.steps import StepsParams


def _name_key(col: str = "name") -> pl.Expr:
    return pl.col(col).str.replace_all(r"\d+", "N")


def nvtx_steps(trace: Trace, params: StepsParams) -> tuple[pl.DataFrame, str] | None:
    """CPU step ranges ``step, start_ns, end_ns, global_tid, global_pid, pid`` from NVTX."""
    nvtx = trace.frame("nvtx")
    if nvtx.is_empty():
        return None
    if params.range_name is not None:
        pat = f"(?i)^(?:{params.range_name})$"
        match = (pl.col("name") == params.range_name) | pl.col("name").str.contains(pat)
    else:
        match = pl.col("name").str.contains(params.name_pattern)
    # the regexes run once per distinct name (`text.per_value`)
    cand = nvtx.lazy().filter(
        (pl.col("style") != "mark")
        & (pl.col("end_ns") > pl.col("start_ns"))
        & (pl.col("end_global_tid").is_null() | (pl.col("end_global_tid") == pl.col("global_tid")))
        & per_value(nvtx, "name", match.fill_null(False))
    ).select("global_tid", "global_pid", "pid", "start_ns", "end_ns",
             per_value(nvtx, "name", _name_key()).alias("key"))
    # Collected once: both the choice of the group and its instances read it.
    cand = cand.collect().lazy()
    groups = (
        cand.group_by("global_tid", "key")
        .agg(pl.len().alias("n"), pl.col("start_ns").min().alias("first"))
        # the most instances, the earliest first; then by thread and name (a total order:
        # group-by output comes in no particular order)
        .sort(["n", "first", "global_tid", "key"], descending=[True, False, False, False])
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


def _range_of(cpu: pl.DataFrame, start: pl.Series) -> tuple[np.ndarray, np.ndarray]:
    """The ``cpu`` row (step range) that holds each ``start`` and whether one does: the
    ranges are sorted and disjoint, so that is a binary search, not a sort and an as-of join."""
    nulls = start.null_count() > 0
    t = (start.fill_null(0) if nulls else start).to_numpy()
    row = np.searchsorted(cpu["start_ns"].to_numpy(), t, side="right") - 1
    row_ = row.clip(0)
    inside = (row >= 0) & (t < cpu["end_ns"].to_numpy()[row_])
    if nulls:
        inside &= start.is_not_null().to_numpy()
    return row_, inside


def _call_steps(cpu: pl.DataFrame, start: pl.Series) -> np.ndarray | None:
    """For every call (``start``: the ``cuda_api`` starts), the row of ``cpu`` whose range
    holds its start, -1 where none does; None unless the starts are sorted and not null.

    What `_range_of` finds with a binary search per call, but the few step bounds are
    searched among the sorted call starts instead: the ranges are sorted and disjoint, so the
    calls of range k are the rows ``[lo_k, hi_k)``, and a running sum of +(k+1) at ``lo_k``
    and -(k+1) at ``hi_k`` labels every row in one linear pass (tens of times cheaper than
    a million binary searches)."""
    if start.null_count() or not start.is_sorted():
        return None
    t = start.to_numpy()
    lo = np.searchsorted(t, cpu["start_ns"].to_numpy(), side="left")
    hi = np.searchsorted(t, cpu["end_ns"].to_numpy(), side="left")
    # (Int32: the rows of the few step ranges; one entry per call, 17M on 10M kernels)
    label = np.arange(1, cpu.height + 1, dtype=np.int32)
    marks = np.zeros(t.size + 1, np.int32)
    np.add.at(marks, lo, label)  # (a range's hi may be the next one's lo)
    np.add.at(marks, hi, -label)
    rows = np.cumsum(marks[:-1], dtype=np.int32)
    rows -= 1
    return rows


def _launched(trace: Trace, cpu: pl.DataFrame, pid: Any
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(cpu_row, op_row, call_row)``: every GPU op launched by an API call of process
    ``pid`` that starts inside a CPU step range, as the ``cpu`` row of that range, the op's
    row of ``gpu_ops`` and its call's row of ``cuda_api``, in op row order (one per op:
    `op_link.api_rows` gives each op its call). Arrays, not a frame of the ops' columns:
    `project` gathers the few columns it needs for the ops it keeps (a frame of every op's
    step, thread and bounds, and its filtered copy, held ~0.75 GB on 10M kernels)."""
    api = trace.frame("cuda_api")
    rows = op_link.api_rows(trace)
    of_call = _call_steps(cpu, api["start_ns"])
    if of_call is not None:
        # Every op's call is known and every call's step too: a gather per op (ops without
        # a call, row -1, read the last call's slot and are masked).
        of_call[~(api["pid"] == pid).fill_null(False).to_numpy()] = -1
        k = of_call[rows]
        k[rows < 0] = -1
        op_rows = np.flatnonzero(k >= 0)
        return k[op_rows], op_rows, rows[op_rows]
    # Some call's step is not one array lookup (`_call_steps`): gather the calls and find
    # their steps by a binary search.
    # Only the call's process and start decide whether an op counts. The process test
    # runs once per call and is gathered as a flag, so the binary search for the step
    # reads only the ops of the process.
    linked = np.flatnonzero(rows >= 0)
    call = rows[linked]
    same = (api["pid"] == pid).fill_null(False).to_numpy()[call]
    linked, call = linked[same], call[same]
    row, inside = _range_of(cpu, api["start_ns"].gather(call))
    return row[inside], linked[inside], call[inside]


def project(trace: Trace, cpu: pl.DataFrame) -> tuple[pl.DataFrame, str]:
    """GPU windows ``step, start_ns, end_ns`` of CPU step ranges (see the module doc)."""
    ops = trace.frame("gpu_ops")
    api = trace.frame("cuda_api")
    if ops.is_empty() or api.is_empty():
        return cpu.select("step", "start_ns", "end_ns"), "cpu"
    tid = cpu["global_tid"][0]
    row, op_rows, call_rows = _launched(trace, cpu, cpu["pid"][0])
    mine = (api["global_tid"] == tid).fill_null(False).to_numpy()[call_rows]
    first = (
        pl.DataFrame([pl.Series("_row", row[mine]),
                      ops["start_ns"].gather(op_rows[mine]).alias("_os")])
        .group_by("_row").agg(pl.col("_os").min().alias("_first"))
    )
    del mine
    win = cpu.with_row_index("_row").join(first, on="_row", how="left").sort("step")
    if win["_first"].null_count() == win.height:
        return cpu.select("step", "start_ns", "end_ns"), "cpu"
    # A step that launched nothing on its thread has no GPU window: typically the CPU ran
    # ahead past the end of GPU capture. It is dropped; step numbers keep their positions.
    win = win.filter(pl.col("_first").is_not_null())
    # The last step's end counts the ops launched by every thread of the process.
    last = ops["end_ns"].gather(op_rows[row == win["_row"][-1]]).max()
    win = win.with_columns(pl.col("_first").cum_max().alias("_gs")).with_columns(
        pl.col("_gs").shift(-1)
        .fill_null(pl.max_horizontal("_gs", pl.lit(last, pl.Int64), "end_ns"))
        .alias("_ge")
    )
    return win.select("step", pl.col("_gs").alias("start_ns"), pl.col("_ge").alias("end_ns")), "gpu"


def periodic_steps(
    ops: pl.DataFrame, params: StepsParams, notes: dict[str, Any] | None = None
) -> tuple[pl.DataFrame, dict[str, Any]] | None:
    """Steps from the period of the kernel-name sequence of the busiest (pid, device).

    ``notes`` (when given) receives ``step_periods_seen`` (every candidate period) and, when
    no steps come out, ``steps_reason``."""
    notes = {} if notes is None else notes
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
        # eq_missing: the busiest group may have a null pid or device (an export without
        # process ids), and its kernels must still match it
        .filter(pl.col("pid").eq_missing(pid) & pl.col("device_id").eq_missing(dev))
        # stable: kernels with the same start and end keep the frame's content order
        .sort("start_ns", "end_ns", maintain_order=True)
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
    modal = (  # per name: its most common distance, and whether most distances are that one
        diffs.group_by("name", "d")
        .agg(pl.len().alias("k"))
        .with_columns(pl.col("k").sum().over("name").alias("kd"))
        .sort(["name", "k", "d"], descending=[False, True, False])
        .group_by("name", maintain_order=True)
        .first()
        .filter(pl.col("k") >= 0.8 * pl.col("kd"))
        .collect()
    )
    per_name = modal.filter(pl.col("kd") + 1 >= params.min_steps)
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
    notes["step_periods_seen"] = "; ".join(
        f"{p} kernels ({n // p}x, match {match[p]:.2f})" for p in periods)
    consistent = [p for p in periods if match[p] >= params.min_period_match]
    # Among consistent periods the longest is the iteration (layer blocks repeat inside
    # it), except a multiple of a shorter one that matches as well: it adds no structure.
    cands = [p for p in consistent
             if not any(p % q == 0 and match[q] >= match[p] - 0.01 for q in consistent if q < p)]
    if not cands:
        return None
    period = max(cands)
    longer = _longer_period(modal, period, n, params.min_steps)
    if longer is not None:
        d, k, example = longer
        notes["step_periods_seen"] += f"; {d} kernels ({n // d}x, fewer than min_steps)"
        notes["steps_reason"] = (
            f"the kernel sequence repeats every {period} kernels, but inside a longer period "
            f"of {d} kernels ({k} kernels such as {example!r} occur once per {d}) that the "
            f"capture holds only {n // d} times (< min_steps={params.min_steps}): a repeated "
            "block (e.g. a layer), not an iteration. Capture more iterations or mark them "
            "with NVTX ranges")
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
    if _trivial(seq, int(occ["i"][0]), period):
        notes["steps_reason"] = (
            f"the kernel sequence is one kernel ({anchor!r}) repeated back to back: a stream "
            "of identical kernels has no step structure")
        return None
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


def _trivial(seq: pl.DataFrame, first: int, period: int) -> bool:
    """Whether a period's unit is a trivially repeating one: one kernel name whose
    repetitions follow each other with nothing between them (>= 90% of the sequence's span
    is that kernel running). One kernel between copies or host work (an MPI halo exchange)
    is an iteration."""
    if seq["name"].slice(first, period).n_unique() > 1:
        return False
    span = int(seq["end_ns"].max()) - int(seq["start_ns"].min())
    busy = int((seq["end_ns"] - seq["start_ns"]).sum())
    return span > 0 and busy >= 0.9 * span


def _longer_period(modal: pl.DataFrame, period: int, n: int,
                   min_steps: int) -> tuple[int, int, str] | None:
    """``(distance, names, example)`` when at least two kernel names recur at one distance
    longer than ``period`` (and not a multiple of it) that the sequence holds fewer than
    ``min_steps`` times: the period is a block nested in a longer iteration."""
    long = (modal.filter((pl.col("d") > period) & (pl.col("d") % period != 0)
                         & (pl.lit(n) // pl.col("d") < min_steps))
            .group_by("d").agg(pl.len().alias("names"), pl.col("name").min().alias("ex"))
            .filter(pl.col("names") >= 2)
            .sort(["names", "d"], descending=[True, False]))
    if long.is_empty():
        return None
    return int(long["d"][0]), int(long["names"][0]), str(long["ex"][0])
