"""report.html's timeline payload in bounded memory (`html_data.timeline_data`: chunked passes
over the ops, a partial selection for the caps, names as dictionary codes until the string
table, a streamed deflate) is, byte for byte, what the polars definition over every op
(`html_data_reference`, the code it replaced) gives: on random frames full of ties, nulls,
untimed and negative-length ops, several devices, pids and streams, in row order and in start
order, with caps and chunk sizes small enough that every cap and chunk boundary is crossed.
Its helpers are checked against their definitions too."""

from __future__ import annotations

import random

import html_data_reference as reference
import numpy as np
import polars as pl
import pytest
from conftest import REPO_ROOT
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nsysan.api import analyze
from nsysan.frames.schemas import OP_CLASSES
from nsysan.frames.trace import Trace
from nsysan.report import html_data, html_encoding, plots

NAMES = ["a", "b", "", "é", None]
CALLS = ["cudaLaunchKernel", "cudaMemcpyAsync", None]

ops_st = st.lists(st.tuples(  # (lanes are few, so that ops of a lane overlap and tie)
    st.sampled_from([0, 0, 0, 1, 2, None]),  # device
    st.sampled_from([1, 1, 1, 2, None]),  # pid
    st.sampled_from([1, 1, 2, 3, None]),  # stream
    st.one_of(st.none(), st.integers(0, 30)),  # start (0: untimed)
    st.one_of(st.none(), st.integers(-2, 8)),  # duration (negative: not drawn)
    st.sampled_from([*OP_CLASSES, None]),
    st.sampled_from(NAMES),
    st.integers(0, 8),  # correlation id (6..8: no API call)
), min_size=8, max_size=60)
api_st = st.lists(st.tuples(st.sampled_from(CALLS), st.sampled_from([10, 11, None])),
                  min_size=6, max_size=6)
nvtx_st = st.lists(st.tuples(
    st.sampled_from([10, 11, 12, None]),  # thread (12 launches nothing)
    st.one_of(st.none(), st.integers(-5, 45)),
    st.one_of(st.none(), st.integers(-1, 20)),
    st.sampled_from(NAMES),
    st.sampled_from([0, 1, 2, 13, None]),  # depth
), min_size=6, max_size=30)


def _trace(ops: list[tuple], api: list[tuple], nvtx: list[tuple], in_order: bool,
           scale: int = 1) -> Trace:
    """(``scale``: times in units of that many ns; at 1 the bins are narrower than a ns)"""
    ops = [(d, p, s, None if t is None else t * scale, None if n is None else n * scale, *x)
           for d, p, s, t, n, *x in ops]
    nvtx = [(g, None if s is None else s * scale, None if n is None else n * scale, *x)
            for g, s, n, *x in nvtx]
    gpu = pl.DataFrame(
        [(d, p, s, t, None if t is None or n is None else t + n, c, name, 1, corr)
         for d, p, s, t, n, c, name, corr in ops],
        schema={"device_id": pl.Int64, "pid": pl.Int64, "stream_id": pl.Int64,
                "start_ns": pl.Int64, "end_ns": pl.Int64, "op_class": pl.String,
                "name": pl.String, "global_pid": pl.Int64, "correlation_id": pl.Int64},
        orient="row")
    if in_order:  # as loaded frames are
        gpu = gpu.sort("start_ns", "end_ns", maintain_order=True)
    calls = pl.DataFrame([(1, k, name, tid) for k, (name, tid) in enumerate(api)],
                         schema={"global_pid": pl.Int64, "correlation_id": pl.Int64,
                                 "name": pl.String, "global_tid": pl.Int64}, orient="row")
    ranges = pl.DataFrame(
        [(g, None if g is None else 1, g, s, None if s is None or n is None else s + n,
          name, depth) for g, s, n, name, depth in nvtx],
        schema={"global_tid": pl.Int64, "pid": pl.Int64, "tid": pl.Int64,
                "start_ns": pl.Int64, "end_ns": pl.Int64, "name": pl.String,
                "depth": pl.Int32}, orient="row")
    return Trace.from_frames("t", {"gpu_ops": gpu, "cuda_api": calls, "nvtx": ranges})


def _gaps() -> pl.DataFrame:
    return pl.DataFrame({
        "scope": ["device", "device", "device", "stream"], "device_id": [0, 0, 1, 0],
        "start_ns": [3, 9, 2, 1], "end_ns": [7, 9, 30, 2],
        "cause": ["sync", "launch", "sync", "x"], "cause_detail": [None, "a", "b", "c"]})


def _both(trace: Trace, tables: dict[str, pl.DataFrame], states=()) -> tuple[dict, dict]:
    return (html_data.timeline_data(trace, tables, list(states)),
            reference.timeline_data(trace, tables, list(states)))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops_st, api_st, nvtx_st, st.booleans(), st.floats(0, 1.1), st.floats(0, 1.1),
       st.integers(1, 9), st.booleans(), st.sampled_from([1, 997]))
def test_payload_is_the_definitions(ops, api, nvtx, in_order, cap_frac, nvtx_frac, chunk,
                                    with_gaps, scale) -> None:
    """(the caps: a share of the rows, so that most examples cut through ties)"""
    trace = _trace(ops, api, nvtx, in_order, scale)
    cap, nvtx_cap = int(cap_frac * len(ops)), int(nvtx_frac * len(nvtx))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(html_data, "MAX_RAW_OPS", cap)
        mp.setattr(html_data, "MAX_NVTX", nvtx_cap)
        mp.setattr(html_encoding, "CHUNK", chunk)
        got, want = _both(trace, {"gaps": _gaps()} if with_gaps else {})
    assert got == want


def _random_case(rng: random.Random) -> tuple[list[tuple], list[tuple], list[tuple]]:
    """What the strategies above draw, bigger and denser: many ops per lane, most drawn."""
    ops = [(rng.choice([0, 0, 1, None]), rng.choice([1, 1, 2, None]), rng.choice([1, 2, None]),
            rng.choice([None, 0, *range(1, 25)]), rng.choice([None, -1, *range(0, 6)]),
            rng.choice([*OP_CLASSES, None]), rng.choice(NAMES), rng.randint(0, 8))
           for _ in range(rng.randint(1, 80))]
    api = [(rng.choice(CALLS), rng.choice([10, 11, None])) for _ in range(6)]
    nvtx = [(rng.choice([10, 11, 12, None]), rng.choice([None, *range(-5, 30)]),
             rng.choice([None, -1, *range(0, 8)]), rng.choice(NAMES),
             rng.choice([0, 1, 2, 13, None])) for _ in range(rng.randint(0, 60))]
    return ops, api, nvtx


@pytest.mark.parametrize("seed", range(4))
def test_payload_is_the_definitions_on_dense_cases(monkeypatch, seed) -> None:
    """Seeded cases with ties on every key (hypothesis draws mostly small frames)."""
    rng = random.Random(seed)
    for _ in range(60):
        ops, api, nvtx = _random_case(rng)
        trace = _trace(ops, api, nvtx, rng.random() < 0.5, rng.choice([1, 997]))
        monkeypatch.setattr(html_data, "MAX_RAW_OPS", rng.randint(0, len(ops) + 1))
        monkeypatch.setattr(html_data, "MAX_NVTX", rng.randint(0, len(nvtx) + 1))
        monkeypatch.setattr(html_encoding, "CHUNK", rng.choice([1, 2, 5, 16, 1 << 20]))
        got, want = _both(trace, {"gaps": _gaps()} if rng.random() < 0.5 else {})
        assert got == want


def test_ties_at_the_cap_are_broken_by_every_column(monkeypatch) -> None:
    """Six ops of the longest duration for a cap of four: the four kept are the first by
    device, pid, stream, start, end, class, name, launching call and thread."""
    ops = [(dev, pid, 1, start, 5, "compute", name, corr)
           for dev, pid, start, name, corr in [(1, 1, 10, "a", 0), (0, 2, 10, "a", 1),
                                               (0, 1, 20, "b", 2), (0, 1, 20, "a", 3),
                                               (0, 1, 20, "a", 4), (1, None, 3, "a", 5)]]
    ops += [(0, 1, 1, 30, 2, "nccl", "c", 0)]  # shorter: never kept
    trace = _trace(ops, [("x", 10), ("x", 10), ("x", 10), ("y", 11), ("x", 11), ("x", 10)], [],
                   in_order=False)
    for chunk in (1, 2, 3, 1 << 20):
        monkeypatch.setattr(html_data, "MAX_RAW_OPS", 4)
        monkeypatch.setattr(html_encoding, "CHUNK", chunk)
        got, want = _both(trace, {})
        assert got == want
        assert any("4 longest of 7" in n for n in got["notes"])


@pytest.fixture(scope="module")
def example():
    r = analyze(REPO_ROOT / "fixtures" / "example_ddp.sqlite")
    return r.trace, {n: df for res in r.results.values() for n, df in res.tables.items()}


@pytest.mark.parametrize(("cap", "nvtx_cap", "chunk"), [
    (html_data.MAX_RAW_OPS, html_data.MAX_NVTX, html_encoding.CHUNK), (50, 20, 7), (1, 1, 100),
    (0, 0, 1000)])
def test_loaded_trace_payload_is_the_definitions(example, monkeypatch, cap, nvtx_cap,
                                                 chunk) -> None:
    """A loaded trace (start order, real names and calls, gaps, steps and the engine-state
    strips of the devices)."""
    trace, tables = example
    states = plots.device_timelines(trace, tables, None, n_bins=html_data.N_BINS)
    monkeypatch.setattr(html_data, "MAX_RAW_OPS", cap)
    monkeypatch.setattr(html_data, "MAX_NVTX", nvtx_cap)
    monkeypatch.setattr(html_encoding, "CHUNK", chunk)
    got, want = _both(trace, tables, states)
    assert got == want


def test_no_op_to_draw() -> None:
    empty = Trace.from_frames("t", {})
    only_untimed = _trace([(0, 1, 1, 0, 3, "compute", "a", 0)], [("x", 10)] * 6, [], True)
    for trace in (empty, only_untimed):
        got, want = _both(trace, {})
        assert got == want
        assert got["notes"] == ["No GPU op to draw."]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(*[st.integers(0, 3)] * 4), max_size=40), st.integers(2, 4))
def test_lex_order_sorts_by_every_key(rows, n_keys) -> None:
    keys = [np.array([r[k] for r in rows], np.int64) for k in range(n_keys)]
    order = html_encoding.lex_order(keys)
    assert sorted(order.tolist()) == list(range(len(rows)))
    got = [tuple(int(k[i]) for k in keys) for i in order]
    assert got == sorted(got)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(-1, 6), max_size=40), st.integers(0, 45), st.integers(1, 9))
def test_longest_is_a_sort_by_duration_then_ties(durations, cap, chunk) -> None:
    """`longest`: the first ``cap`` rows of the drawn ones sorted by duration (longest
    first), then by the tie order (here: row number descending)."""
    d = np.array(durations, np.int64)

    def tie_order(rows: np.ndarray) -> np.ndarray:
        assert (d[rows] == d[rows][0]).all()  # only rows of the cap's duration
        return rows[::-1]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(html_encoding, "CHUNK", chunk)
        rows, total = html_encoding.longest(d.size, lambda a, b: d[a:b].copy(), cap, tie_order)
    drawn = [i for i in range(d.size) if d[i] >= 0]
    want = sorted(sorted(drawn, key=lambda i: (-d[i], -i))[:cap])
    assert total == len(drawn)
    assert rows.tolist() == want
