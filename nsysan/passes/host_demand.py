"""Runnable demand of the traced process tree: how many of its threads wanted a CPU at once.

Part of the host pass. A thread *wants a CPU* while it is on-CPU (``sched``) or runnable but
off-CPU. Runnable off-CPU time is known only where the export records the thread state at
each switch-out (the host pass's ``deschedule_rule`` ``thread_state``,
`nsysan.passes.host_gaps.deschedule_rule`): the time after a switch-out in a preempted state
(``running``: the thread could have run on), until its next switch-in. Otherwise the demand
is unknown (None): the other rule, off-CPU time that no OS-runtime or CUDA synchronization
call covers, is an upper bound good enough for one thread in one gap but not for every
thread at once, since each thread that waits in an untraced way would count. On the MNIST
capture (OS-runtime calls, no thread states) it put more threads than CPUs over the whole
run of a job that was not CPU-bound.

**Oversubscription**: the times at which more threads wanted a CPU than the number of CPUs
the process tree was seen running on (``cpus_seen``: distinct ``cpu`` values of ``sched``;
the threads' affinity is not recorded, and CPUs used by other processes are not seen, so
this counts contention among the tree's own threads). Then some thread that could run had
to wait, whatever the scheduler chose.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from nsysan.frames import intervals as iv
from nsysan.frames.trace import Trace

#: a thread switched out while still running was preempted: it could have run on
PREEMPTED_STATES = ("running",)
_EMPTY = pl.DataFrame(schema={"start_ns": pl.Int64, "end_ns": pl.Int64})


def blocking_calls(trace: Trace) -> pl.DataFrame:
    """``global_tid, start_ns, end_ns`` of the calls in which a thread blocks on purpose:
    OS-runtime calls and CUDA synchronization calls."""
    osrt = trace.frame("osrt").select("global_tid", "start_ns", "end_ns")
    sync = trace.frame("cuda_api").select(
        pl.col("global_tid", "start_ns", "end_ns").filter(pl.col("api_class") == "sync"))
    return pl.concat([osrt, sync])


def preempted_off_cpu(sched: pl.DataFrame) -> pl.DataFrame:
    """``global_tid, out_state, start_ns, end_ns``: from each switch-out in a preempted state
    to the thread's next switch-in (the thread could run but had no CPU)."""
    # (its columns first: a sort of the whole frame would expand its constant columns to
    # every row, `nsysan.frames.trace`)
    return (sched.select("global_tid", "out_state", "start_ns", "end_ns")
            .sort("global_tid", "start_ns", maintain_order=True)
            .select("global_tid", "out_state", start_ns="end_ns",
                    end_ns=pl.col("start_ns").shift(-1).over("global_tid"))
            .filter(pl.col("out_state").is_in(PREEMPTED_STATES)
                    & pl.col("end_ns").is_not_null()))


def runnable_off_cpu(sched: pl.DataFrame, rule: str | None) -> pl.DataFrame | None:
    """``global_tid, start_ns, end_ns``: each thread's runnable off-CPU time (disjoint per
    thread); None unless the export records thread states (module docstring)."""
    if rule != "thread_state" or sched.is_empty():
        return None
    return preempted_off_cpu(sched).select("global_tid", "start_ns", "end_ns")


def oversubscribed(sched: pl.DataFrame, waiting: pl.DataFrame | None
                   ) -> tuple[int | None, pl.DataFrame | None]:
    """(``cpus_seen``, ``start_ns, end_ns`` of the disjoint, sorted intervals in which more
    threads wanted a CPU than ``cpus_seen``); (None, None) without a rule."""
    if waiting is None or sched.is_empty():
        return None, None
    cpus = int(sched["cpu"].drop_nulls().n_unique())
    if cpus == 0:
        return None, None
    starts = np.concatenate([sched["start_ns"].to_numpy(), waiting["start_ns"].to_numpy()])
    ends = np.concatenate([sched["end_ns"].to_numpy(), waiting["end_ns"].to_numpy()])
    keep = ends > starts
    times = np.concatenate([starts[keep], ends[keep]])
    steps = np.concatenate([np.ones(keep.sum(), np.int64), -np.ones(keep.sum(), np.int64)])
    order = np.argsort(times, kind="stable")
    times, demand = times[order], np.cumsum(steps[order])
    # demand[i] holds on [times[i], times[i + 1]); only the last event of an instant counts
    last = np.append(times[1:] != times[:-1], True)
    times, demand = times[last], demand[last]
    over = demand[:-1] > cpus
    if not over.any():
        return cpus, _EMPTY
    # (segments of distinct instants: sorted, disjoint, never empty; touching ones merge)
    start, end = iv.merge_sorted(times[:-1][over], times[1:][over])
    return cpus, pl.DataFrame({"start_ns": start, "end_ns": end},
                              schema={"start_ns": pl.Int64, "end_ns": pl.Int64})
