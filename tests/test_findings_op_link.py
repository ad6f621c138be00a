"""`nsysan.passes.op_link`: the API row of every GPU op is what the op-key join finds, and
every consumer (kernels and gaps passes, short gaps, bad copies, CAPTURE_TRUNCATED) gives the
same result through the link as through its join (the path taken when API keys repeat)."""

from __future__ import annotations

import numpy as np
import polars as pl
from findings_cases import scenario
from hypothesis import given, settings
from hypothesis import strategies as st

from nsysan.findings import rules_capture
from nsysan.findings.context import Context
from nsysan.frames.context import AnalysisContext
from nsysan.frames.trace import Trace
from nsysan.passes import op_link


def _with_lost_launches(name: str) -> tuple[Trace, dict]:
    """A scenario whose every fifth GPU op lost its record (CAPTURE_TRUNCATED fires)."""
    tr, res = scenario(name)
    frames = {n: tr.frame(n) for n in ("gpu_ops", "cuda_api", "nvtx") if tr.has(n)}
    ops = frames["gpu_ops"]
    frames["gpu_ops"] = ops.filter(pl.int_range(pl.len()) % 5 != 3)
    return Trace.from_frames(tr.trace_id, frames), res


def test_api_rows_are_the_join() -> None:
    tr, _ = scenario("pageable_copies")
    ops = tr.frame("gpu_ops").with_row_index("_op")
    api = tr.frame("cuda_api").with_row_index("_api")
    want = ops.join(api.select("global_pid", "correlation_id", "_api"),
                    on=["global_pid", "correlation_id"], how="left").sort("_op")["_api"]
    got = op_link.api_rows(AnalysisContext(tr))
    assert got is not None
    assert got.tolist() == want.fill_null(-1).cast(pl.Int64).to_list()
    ctx = AnalysisContext(tr)
    assert op_link.api_rows(ctx) is op_link.api_rows(ctx)  # shared within an analysis


def test_repeated_api_keys_link_each_op_to_the_first_call() -> None:
    """Loading keeps one call per key (docs/data-quality.md); frames built in memory may
    hold a key twice: the link never declines, it names the first call of the key."""
    tr, _ = scenario("healthy")
    api = tr.frame("cuda_api")
    dup = Trace.from_frames("dup", {"gpu_ops": tr.frame("gpu_ops"),
                                    "cuda_api": pl.concat([api.head(1), api])})
    want = op_link.api_rows(tr)
    got = op_link.api_rows(dup)
    # the copy of call 0 is row 0, the original call k is row k + 1
    assert got.tolist() == [0 if r == 0 else (r + 1 if r > 0 else -1) for r in want.tolist()]


def test_consumers_see_the_lost_launches() -> None:
    for name in ("healthy", "launch_bound", "pageable_copies", "sync_in_loop"):
        tr, res = _with_lost_launches(name)
        assert [f.message for f in rules_capture.truncated(Context(tr, res))], name


class _Frames:
    """The two frames `op_link._link` reads, as a trace hands them out."""

    def __init__(self, ops: pl.DataFrame, api: pl.DataFrame) -> None:
        self._frames = {"gpu_ops": ops, "cuda_api": api}

    def frame(self, name: str) -> pl.DataFrame:
        return self._frames[name]


_pids = st.one_of(st.just(7), st.sampled_from([7, 7, 7, 9, None]))
_keys = st.tuples(_pids, st.one_of(st.integers(0, 30), st.none()))


def _frame(keys: list[tuple[int | None, int | None]]) -> pl.DataFrame:
    return pl.DataFrame(keys, schema={"global_pid": pl.Int64, "correlation_id": pl.UInt32},
                        orient="row")


def _first_call_join(ops: pl.DataFrame, api: pl.DataFrame) -> list[int]:
    calls = (api.with_row_index("_api").drop_nulls(["global_pid", "correlation_id"])
             .unique(["global_pid", "correlation_id"], keep="first", maintain_order=True))
    return (ops.with_row_index("_op").join(calls, on=["global_pid", "correlation_id"],
                                           how="left").sort("_op")["_api"]
            .cast(pl.Int64).fill_null(-1).to_list())


@settings(max_examples=200, deadline=None)
@given(st.lists(_keys, max_size=30), st.lists(_keys, max_size=30), st.booleans())
def test_the_link_is_the_first_call_join(ops_keys, api_keys, one_process) -> None:
    """Whichever path links them (the correlation ids of one process, or the packed keys),
    every op gets the first call with its (process, correlation id), -1 when none."""
    if one_process:  # the common case: one process, no null key
        ops_keys = [(7, c if c is not None else 0) for _, c in ops_keys]
        api_keys = [(7, c) for _, c in api_keys if c is not None]
    ops, api = _frame(ops_keys), _frame(api_keys)
    got = op_link._link(_Frames(ops, api))
    assert got.dtype == np.int64
    assert got.tolist() == _first_call_join(ops, api)
    # the correlation path is taken exactly where it applies
    keys = [*ops_keys, *api_keys]
    applies = (bool(ops_keys) and bool(api_keys) and len({p for p, _ in keys}) == 1
               and None not in {p for p, _ in keys} and None not in {c for _, c in keys})
    assert (op_link._by_correlation(ops, api) is not None) == applies


def test_the_correlation_path_declines_nulls_and_processes() -> None:
    ops = _frame([(7, 1), (7, 2)])
    assert op_link._by_correlation(ops, _frame([(7, 2), (7, 1)])).tolist() == [1, 0]
    # an id held by several calls: the first of them, as the join links it (also among
    # many, where an unstable sort would reorder them)
    assert op_link._by_correlation(ops, _frame([(7, 2), (7, 1), (7, 1)])).tolist() == [1, 0]
    many = _frame([(7, (i * 7919) % 10) for i in range(500)])
    assert op_link._by_correlation(_frame([(7, c) for c in range(12)]), many).tolist() == \
        _first_call_join(_frame([(7, c) for c in range(12)]), many)
    assert op_link._by_correlation(ops, _frame([(7, 1), (7, None)])) is None
    assert op_link._by_correlation(ops, _frame([(7, 1), (None, 2)])) is None
    assert op_link._by_correlation(ops, _frame([(7, 1), (9, 2)])) is None
    assert op_link._by_correlation(_frame([(9, 1)]), _frame([(7, 1)])) is None
    wide = _frame([(7, 1), (7, 2)]).with_columns(pl.col("correlation_id").cast(pl.UInt64))
    assert op_link._by_correlation(ops, wide) is None  # ids of two types
