"""`nsysan.passes.op_link`: the API row of every GPU op is what the op-key join finds, and
every consumer (kernels and gaps passes, short gaps, bad copies, CAPTURE_TRUNCATED) gives the
same result through the link as through its join (the path taken when API keys repeat)."""

from __future__ import annotations

import polars as pl
import pytest
from findings_cases import scenario

from nsysan.findings import rules_capture
from nsysan.findings.context import Context
from nsysan.frames.context import AnalysisContext
from nsysan.frames.trace import Trace
from nsysan.passes import gaps, kernels, op_link
from nsysan.passes.gap_causes import launch_calls


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


def test_repeated_api_keys_give_no_link() -> None:
    tr, _ = scenario("healthy")
    api = tr.frame("cuda_api")
    dup = Trace.from_frames("dup", {"gpu_ops": tr.frame("gpu_ops"),
                                    "cuda_api": pl.concat([api, api.head(1)])})
    assert op_link.api_rows(dup) is None


@pytest.fixture
def no_link(monkeypatch: pytest.MonkeyPatch):
    """Run the join fallbacks: as when some API key repeats."""
    def run(fn):
        with monkeypatch.context() as m:
            m.setattr(op_link, "api_rows", lambda trace: None)
            return fn()
    return run


def _canon(df: pl.DataFrame) -> pl.DataFrame:
    return df.sort(df.columns, nulls_last=True)


@pytest.mark.parametrize("name", ["healthy", "launch_bound", "pageable_copies",
                                  "sync_in_loop"])
def test_consumers_agree_with_their_joins(name: str, no_link) -> None:
    tr, res = _with_lost_launches(name)

    def outputs() -> tuple:
        ctx = Context(tr, res)
        ctx.can_classify_short_gaps()
        return (
            kernels.run(tr, kernels.KernelsParams(), {}).tables["kernels"],
            gaps.run(tr, gaps.GapsParams(), res).tables["gaps"],
            _canon(launch_calls(tr)),
            ctx.bad_copies,
            ctx.short_gaps,
            [f.message for f in rules_capture.truncated(Context(tr, res))],
        )

    linked = outputs()
    joined = no_link(outputs)
    for a, b in zip(linked, joined, strict=True):
        assert a.equals(b) if isinstance(a, pl.DataFrame) else a == b
    assert linked[-1], "launches without GPU records are reported"
