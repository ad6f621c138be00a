"""Runnable demand and oversubscription (`nsysan.passes.host_demand`) against brute force;
communication threads in host_gaps; what the starvation finding quotes of host evidence."""

from __future__ import annotations

import random
from pathlib import Path

import polars as pl
import pytest

from nsysan import api
from nsysan.load import open_trace
from nsysan.passes import host_demand as hd
from nsysan.testing import host_scenarios as hs


def _brute_over(sched: list[tuple], waiting: list[tuple], cpus: int) -> set[int]:
    """Every integer instant t at which more intervals hold [s, e) than ``cpus``."""
    times = range(min(s for _, s, _ in sched + waiting), max(e for _, _, e in sched + waiting))
    return {t for t in times
            if sum(s <= t < e for _, s, e in sched + waiting) > cpus}


@pytest.mark.parametrize("seed", range(8))
def test_oversubscribed_equals_brute_force(seed: int) -> None:
    rng = random.Random(seed)
    sched, waiting = [], []
    for tid in range(5):
        t = rng.randrange(0, 20)
        for _ in range(rng.randrange(1, 5)):
            on = rng.randrange(1, 15)
            sched.append((tid, t, t + on))
            t += on
            off = rng.randrange(0, 10)
            if off and rng.random() < 0.6:
                waiting.append((tid, t, t + off))
            t += off
    cpus = rng.randrange(1, 4)
    frame = pl.DataFrame(sched, schema=["global_tid", "start_ns", "end_ns"], orient="row")
    frame = frame.with_columns(cpu=(pl.col("global_tid") % cpus).cast(pl.Int64))
    wait = pl.DataFrame(waiting, schema=["global_tid", "start_ns", "end_ns"], orient="row") \
        if waiting else pl.DataFrame(schema={"global_tid": pl.Int64, "start_ns": pl.Int64,
                                             "end_ns": pl.Int64})
    seen, over = hd.oversubscribed(frame, wait)
    assert seen == min(cpus, 5)
    got = {t for s, e in over.iter_rows() for t in range(s, e)}
    assert got == _brute_over(sched, waiting, seen)
    # disjoint, sorted, merged
    starts, ends = over["start_ns"].to_list(), over["end_ns"].to_list()
    assert all(e > s for s, e in zip(starts, ends, strict=True))
    assert all(ends[i] < starts[i + 1] for i in range(len(starts) - 1))


def test_no_demand_without_thread_states(tmp_path: Path) -> None:
    path, _ = hs.descheduled_launcher(tmp_path / "t.sqlite")
    sched = open_trace(path, frame_cache=False).frame("sched")
    assert hd.runnable_off_cpu(sched, "osrt_uncovered") is None
    assert hd.oversubscribed(sched, None) == (None, None)
    res = api.analyze(path, passes=["steps", "gaps", "host"])
    assert res.metrics["host.cpus_seen"] is None
    assert res.table("host_gaps")["oversubscribed_ns"].null_count() == res.table(
        "host_gaps").height


def test_thread_states_at_switches_are_read(tmp_path: Path) -> None:
    path, truth = hs.oversubscribed_loader(tmp_path / "t.sqlite")
    trace = open_trace(path, frame_cache=False)
    sched = trace.frame("sched")
    states = sched.group_by("out_state").len().sort("out_state")
    assert set(states["out_state"].to_list()) == {"interruptible", "running"}
    res = api.analyze(path, passes=["steps", "gaps", "host"])
    assert res.metrics["host.deschedule_rule"] == "thread_state"
    assert res.metrics["host.cpus_seen"] == truth["cpus"]
    gaps = res.table("host_gaps")
    # six loaders runnable for two CPUs through every gap (but the first and last instants)
    assert (gaps["oversubscribed_ns"] == gaps["duration_ns"]).all()


def test_communication_threads_get_their_rows(tmp_path: Path) -> None:
    path, _ = hs.descheduled_comm_thread(tmp_path / "t.sqlite")
    res = api.analyze(path, passes=["steps", "gaps", "host"])
    threads = res.table("host_threads")
    assert threads.filter(pl.col("name") == "gloo-comm")["role"].to_list() == ["communication"]
    gaps = res.table("host_gaps")
    comm = gaps.filter(pl.col("role") == "communication")
    launcher = gaps.filter(pl.col("role") == "launcher")
    assert comm.height == launcher.height == 11
    assert not comm["primary_launcher"].any() and launcher["primary_launcher"].all()
    # 3 ms on-CPU at the end of each 6.55 ms gap, the rest without a blocking call
    assert comm["on_cpu_ns"].to_list() == [3_000_000] * 11
    assert comm["unblocked_off_cpu_ns"].to_list() == [3_550_000] * 11
    # the launcher blocks on purpose (a traced pthread_cond_wait)
    assert launcher["unblocked_off_cpu_ns"].max() == 0


def test_starvation_quotes_host_evidence_where_the_host_trace_is_silent(tmp_path: Path) -> None:
    path, _ = hs.cpu_bound_input(tmp_path / "t.sqlite")
    with_host = api.analyze(path).diagnosis
    f = next(f for f in with_host.findings if f.code == "GPU_STARVATION_PERIODIC")
    assert "main cause: no_cuda_activity" in f.message
    assert ("Host evidence for the longest gap (15.2 ms): its launching thread (tid 4242) was "
            "on-CPU 100% of the gap; samples: libdali_operators.so 40%") in f.message
    without = api.analyze(path, passes=["steps", "gaps", "overlap", "attribution", "kernels",
                                        "nccl"]).diagnosis
    g = next(f for f in without.findings if f.code == "GPU_STARVATION_PERIODIC")
    assert "Host evidence" not in g.message
