"""`nsysan.passes.op_link`: the API row of every GPU op is what the op-key join finds, and
every consumer (kernels and gaps passes, short gaps, bad copies, CAPTURE_TRUNCATED) gives the
same result through the link as through its join (the path taken when API keys repeat)."""

from __future__ import annotations

import polars as pl
from findings_cases import scenario

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
