"""`nsysan.passes.device_blocks`: every union cut from the one sorted stream of GPU ops is the
union `intervals` computes from the selected ops (null devices, untimed and zero-length ops,
ops without an overlap class, times too far apart to pack), coverage equals
`intervals.covered`, and the stream is memoised per gpu_ops frame.

``op_class`` is an Enum of `schemas.OP_CLASSES`, which are the overlap classes: the only op
outside them is one with a null class (a class outside the vocabulary cannot be stored,
`test_an_op_class_outside_the_vocabulary_is_refused`)."""

from __future__ import annotations

import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from nsysan.frames import intervals
from nsysan.frames.context import AnalysisContext, Product, product
from nsysan.frames.trace import Trace
from nsysan.passes import device_blocks

SCHEMA = {"device_id": pl.Int64, "start_ns": pl.Int64, "end_ns": pl.Int64,
          "op_class": pl.String}
OP_CLASSES = ["compute", "nccl", "memcpy_h2d", "memset", None]

ops_st = st.lists(
    st.tuples(st.sampled_from([0, 1, 7, None]), st.integers(-5, 200), st.integers(-3, 40),
              st.sampled_from(OP_CLASSES)).map(lambda t: (t[0], t[1], t[1] + t[2], t[3])),
    max_size=30)


def _trace(rows: list[tuple]) -> Trace:
    ops = pl.DataFrame(rows, schema=SCHEMA, orient="row")
    return Trace.from_frames("t", {"gpu_ops": ops})


def _want(tr: Trace, op_classes: list[str | None] | None, timed: bool) -> pl.DataFrame:
    ops = tr.frame("gpu_ops")
    keep = pl.lit(True)
    if op_classes is not None:
        known = [c for c in op_classes if c is not None]
        keep = pl.col("op_class").is_in(known).fill_null(False)
        if None in op_classes:  # OTHER: any value outside the overlap classes, null included
            keep = keep | ~pl.col("op_class").is_in(list(device_blocks.OP_CLASSES)).fill_null(
                False)
    if timed:
        keep = keep & (pl.col("start_ns") > 0)
    return intervals.union(ops.filter(keep), by=["device_id"]).collect()


SELECTIONS = [(None, True), (None, False), (["compute"], False), (["compute"], True),
              (["compute", device_blocks.OTHER], True), (["nccl", "memcpy_h2d"], True),
              ([device_blocks.OTHER], False)]


@settings(max_examples=120, deadline=None)
@given(ops_st)
def test_union_is_the_union_of_the_selected_ops(rows) -> None:
    tr = _trace(rows)
    for op_classes, timed in SELECTIONS:
        got = device_blocks.union(tr, op_classes, timed)
        assert got.equals(_want(tr, op_classes, timed)), (op_classes, timed)


def test_times_too_far_apart_to_pack_fall_back_to_ranks() -> None:
    far = 1 << 61
    rows = [(0, 1, 5, "compute"), (0, 3, 9, "compute"), (1, far, far + 10, "nccl"),
            (1, far + 10, far + 12, "compute"), (None, 2, 4, "memset"), (1, 1, 2, "compute")]
    tr = _trace(rows)
    for op_classes, timed in SELECTIONS:
        assert device_blocks.union(tr, op_classes, timed).equals(
            _want(tr, op_classes, timed))


@settings(max_examples=120, deadline=None)
@given(ops_st, ops_st)
def test_covered_equals_intervals_covered(cover_rows, rows) -> None:
    tr = _trace(cover_rows)
    blocks = device_blocks.union(tr, None, timed=False)
    df = pl.DataFrame(rows, schema=SCHEMA, orient="row").select(
        "device_id", "start_ns", "end_ns")
    want = intervals.covered(df, tr.frame("gpu_ops"), by=["device_id"]).collect()
    assert device_blocks.covered(blocks, df).to_list() == want["covered_ns"].to_list()


def test_gaps_between_is_the_complement() -> None:
    tr = _trace([(0, 10, 20, "compute"), (0, 15, 30, "nccl"), (0, 40, 50, "compute"),
                 (1, 5, 6, "memset"), (None, 8, 9, "compute"), (None, 12, 19, "compute"),
                 (0, 60, 61, "compute")])
    want = intervals.complement(tr.frame("gpu_ops"), by=["device_id"]).collect()
    assert device_blocks.gaps_between(device_blocks.union(tr, timed=False)).equals(want)


def test_stream_and_unions_are_shared_within_an_analysis_per_frame() -> None:
    tr = AnalysisContext(_trace([(0, 1, 5, "compute"), (0, 7, 9, "nccl")]))
    first, first_blocks = device_blocks.union(tr), device_blocks.blocks(tr)
    assert device_blocks.blocks(tr) is first_blocks  # (its frame is built at each call)
    assert device_blocks.union(tr).equals(first)
    # a replaced gpu_ops frame is never served the old union
    tr2 = AnalysisContext(Trace.from_frames("t", {"gpu_ops": pl.DataFrame(
        [(0, 1, 3, "compute")], schema=SCHEMA, orient="row")}))
    assert device_blocks.union(tr2)["end_ns"].to_list() == [3]
    tr.close()
    again = device_blocks.blocks(tr)
    assert again is not first_blocks and again.frame().equals(first)
    # a plain trace keeps nothing: the same union every time, built each time
    plain = tr.base
    assert device_blocks.blocks(plain) is not device_blocks.blocks(plain)
    assert device_blocks.union(plain).equals(first)


def test_a_union_already_made_is_found_without_a_pass_over_the_ops(monkeypatch) -> None:
    tr = AnalysisContext(_trace([(0, 1, 5, "compute"), (0, 0, 9, "nccl"), (1, 2, 4, None)]))
    compute = device_blocks.blocks(tr, ["compute"], True)
    untimed_nccl = device_blocks.blocks(tr, ["nccl"], False)

    def no_pass(*a, **k):
        raise AssertionError("a pass over the ops for a union already made")

    monkeypatch.setattr(device_blocks.np, "isin", no_pass)
    # no untimed compute op: the timed union, found from the op classes alone
    assert device_blocks.blocks(tr, ["compute"], False) is compute
    assert device_blocks.blocks(tr, ["compute"], True) is compute
    assert device_blocks.blocks(tr, ["nccl"], False) is untimed_nccl
    assert untimed_nccl.frame()["start_ns"].to_list() == [0]


def test_a_value_asked_for_by_two_threads_at_once_is_built_once() -> None:
    import threading
    import time

    tr = AnalysisContext(_trace([(0, 1, 5, "compute")]))
    calls = []

    def build(trace) -> int:
        calls.append(1)
        time.sleep(0.05)  # the other thread asks meanwhile
        return 42

    answer = Product("answer", ("gpu_ops",), build)
    got: list[int] = []
    threads = [threading.Thread(target=lambda: got.append(product(tr, answer)))
               for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == [42, 42] and len(calls) == 1
