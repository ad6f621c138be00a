"""The overlap pass: states against a per-nanosecond oracle, named cases, per-step rows."""

from __future__ import annotations

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_gaps import MS, PLANTED, K, build, steps_result

from nsysan.frames import schemas
from nsysan.passes import overlap
from nsysan.passes.base import PassResult

CLS_OF = schemas.OVERLAP_CLASS_OF_OP_CLASS
ORDER = list(dict.fromkeys(CLS_OF.values()))


def run_overlap(trace, results=None) -> PassResult:
    res = overlap.run(trace, overlap.OverlapParams(), results or {})
    assert res.tables["overlap"].schema == schemas.OVERLAP
    assert res.tables["overlap_summary"].schema == schemas.OVERLAP_SUMMARY
    return res


def states(res: PassResult, step=None) -> dict[tuple[int, str], int]:
    t = res.tables["overlap"]
    t = t.filter(pl.col("step").is_null()) if step is None else t.filter(pl.col("step") == step)
    return {(d, s): n for d, s, n in t.select("device_id", "state", "duration_ns").rows()}


ops_st = st.lists(
    st.tuples(st.integers(0, 1), st.sampled_from(list(CLS_OF)), st.integers(1, 30),
              st.integers(0, 8), st.integers(1, 3)),
    max_size=12,
)


@settings(max_examples=120, deadline=None)
@given(ops_st)
def test_states_match_brute_force_and_tile_the_span(rows):
    ops = [{"s": s, "e": s + n, "dev": d, "cls": c, "stream": stream}
           for d, c, s, n, stream in rows]
    res = run_overlap(build(ops))
    want: dict[tuple[int, str], int] = {}
    for dev in (0, 1):
        live = [(s, s + n, c) for d, c, s, n, _ in rows if d == dev and n > 0]
        if not live:
            continue
        for t in range(min(s for s, _, _ in live), max(e for _, e, _ in live)):
            active = {CLS_OF[c] for s, e, c in live if s <= t < e}
            key = (dev, "+".join(x for x in ORDER if x in active) or "idle")
            want[key] = want.get(key, 0) + 1
    assert states(res) == want
    summ = res.tables["overlap_summary"]
    for row in summ.iter_rows(named=True):
        dev_total = sum(n for (d, _), n in want.items() if d == row["device_id"])
        assert row["span_ns"] == dev_total == row["busy_ns"] + row["idle_ns"]


CASES = {
    # name: (ops, expected states, expected summary fields)
    "empty": ([], {}, None),
    "single_compute": ([K(1, 3)], {"compute": 2 * MS},
                       {"busy_ns": 2 * MS, "exposed_nccl_ns": 0, "hidden_nccl_frac": None}),
    "nccl_half_hidden": (
        [K(1, 5), K(3, 7, cls="nccl", stream=9)],
        {"compute": 2 * MS, "compute+nccl": 2 * MS, "nccl": 2 * MS},
        {"nccl_ns": 4 * MS, "exposed_nccl_ns": 2 * MS, "nccl_only_ns": 2 * MS,
         "hidden_nccl_frac": 0.5, "compute_ns": 4 * MS},
    ),
    "nccl_fully_hidden": (
        [K(1, 9), K(3, 7, cls="nccl", stream=9)],
        {"compute": 4 * MS, "compute+nccl": 4 * MS},
        {"exposed_nccl_ns": 0, "hidden_nccl_frac": 1.0},
    ),
    "nccl_with_copy_is_exposed_not_only": (
        [K(1, 5, cls="nccl"), K(2, 3, cls="memcpy_d2h", stream=9)],
        {"nccl": 3 * MS, "nccl+d2h": 1 * MS},
        {"exposed_nccl_ns": 4 * MS, "nccl_only_ns": 3 * MS, "hidden_nccl_frac": 0.0},
    ),
    "h2d_unoverlapped": (
        [K(1, 4, cls="memcpy_h2d"), K(3, 6, stream=9)],
        {"h2d": 2 * MS, "compute+h2d": 1 * MS, "compute": 2 * MS},
        {"h2d_ns": 3 * MS, "h2d_unoverlapped_ns": 2 * MS},
    ),
    "idle_between": ([K(1, 2), K(4, 5, cls="memset")],
                     {"compute": MS, "idle": 2 * MS, "memset": MS},
                     {"span_ns": 4 * MS, "idle_ns": 2 * MS}),
    "zero_length_and_time_zero_ops_ignored": ([K(1, 2), K(3, 3, cls="nccl"), K(0, 1)],
                                              {"compute": MS}, {"span_ns": MS}),
    "all_classes": (
        [K(1, 2, cls=c, stream=i) for i, c in enumerate(CLS_OF)],
        {"+".join(ORDER): MS}, {"max_stream_concurrency": 7},
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_named_cases(name):
    ops, want_states, want_summary = CASES[name]
    res = run_overlap(build(ops))
    assert states(res) == {(0, s): n for s, n in want_states.items()}
    summ = res.tables["overlap_summary"]
    if want_summary is None:
        assert summ.is_empty()
        return
    row = summ.row(0, named=True)
    for key, value in want_summary.items():
        assert row[key] == (pytest.approx(value) if isinstance(value, float) else value), key


def test_multi_device_is_per_device():
    res = run_overlap(build([K(1, 3), K(2, 4, dev=1, cls="nccl")]))
    assert states(res) == {(0, "compute"): 2 * MS, (1, "nccl"): 2 * MS}
    assert res.tables["overlap_summary"]["device_id"].to_list() == [0, 1]
    assert res.metrics["exposed_nccl_ns"] == 2 * MS
    assert res.metrics["hidden_nccl_frac"] == 0.0


def test_stream_concurrency_is_time_weighted_over_busy_time():
    # streams: 7 on [1, 5), 8 on [3, 5), 9 on [4, 5); idle [5, 6); 7 again [6, 8)
    ops = [K(1, 5), K(3, 5, stream=8), K(4, 5, stream=9), K(6, 8)]
    row = run_overlap(build(ops)).tables["overlap_summary"].row(0, named=True)
    assert row["max_stream_concurrency"] == 3
    # busy 6 ms: 1 stream for 4 ms (2 + 2), 2 for 1 ms, 3 for 1 ms
    assert row["mean_stream_concurrency"] == pytest.approx((4 * 1 + 1 * 2 + 1 * 3) / 6)


def test_same_stream_different_process_counts_twice():
    ops = [K(1, 3), K(1, 3, pid=2)]
    row = run_overlap(build(ops)).tables["overlap_summary"].row(0, named=True)
    assert row["max_stream_concurrency"] == 2


def test_per_step_rows_clip_to_windows_and_sum_to_them():
    ops = [K(2, 6), K(4, 8, cls="nccl", stream=9), K(9, 12)]
    # step 0 starts before the device span, step 1 ends after it.
    res = run_overlap(build(ops), steps_result([(0, 5 * MS), (5 * MS, 14 * MS)]))
    assert states(res, 0) == {(0, "idle"): 2 * MS, (0, "compute"): 2 * MS,
                              (0, "compute+nccl"): 1 * MS}
    assert states(res, 1) == {(0, "compute+nccl"): 1 * MS, (0, "nccl"): 2 * MS,
                              (0, "idle"): 3 * MS, (0, "compute"): 3 * MS}
    whole = states(res)
    assert sum(whole.values()) == 10 * MS


def test_per_step_rows_are_per_device():
    ops = [K(1, 3), K(1, 2, dev=1)]
    res = run_overlap(build(ops), steps_result([(1 * MS, 3 * MS)]))
    assert states(res, 0) == {(0, "compute"): 2 * MS, (1, "compute"): MS, (1, "idle"): MS}


@pytest.mark.parametrize("layout", ["2022.4", "2023.4"])
@pytest.mark.parametrize("name", PLANTED)
def test_planted_states_and_exposed_nccl(name, layout, tmp_path):
    from nsysan.load import open_trace
    from nsysan.testing import scenarios

    path, truth = scenarios.build(name, tmp_path, layout)
    res = run_overlap(open_trace(path))
    dev = truth.devices[0]
    assert states(res) == {(0, s): n for s, n in dev.states.items() if n}
    row = res.tables["overlap_summary"].row(0, named=True)
    for key in ("span_ns", "busy_ns", "compute_ns", "nccl_ns", "exposed_nccl_ns", "h2d_ns",
                "h2d_unoverlapped_ns"):
        assert row[key] == getattr(dev, key), key
    if name in ("exposed_allreduce", "comm_gap_180ms"):
        assert row["exposed_nccl_ns"] == sum(truth.exposed_nccl_per_step_ns[0]) > 0


@pytest.mark.parametrize("devices", [[0], [3, 3, 5, 5, 5, 9], [None, None, 1, 1], [2, 7, 7]])
def test_spans_by_numpy_equal_spans_by_expressions(devices):
    from nsysan.passes.overlap import _spans, _spans_by_exprs

    n = len(devices)
    segs = pl.DataFrame({"device_id": devices, "start_ns": [10 * i for i in range(n)],
                         "end_ns": [10 * i + 10 for i in range(n)]},
                        schema={"device_id": pl.Int64, "start_ns": pl.Int64, "end_ns": pl.Int64})
    assert _spans(segs).equals(_spans_by_exprs(segs))
