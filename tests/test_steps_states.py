"""The per-step state times are computed once, by the steps pass, and taken over by overlap:
the overlap table is the same as when overlap computes them itself, and nothing holds them
once `analyze` is done."""

from __future__ import annotations

from test_gaps import MS, K, build
from test_steps import R

from nsysan.api import analyze
from nsysan.frames import window_sums
from nsysan.frames.context import AnalysisContext
from nsysan.passes import overlap, steps


def _trace():
    nvtx = [R(10 * k, 10 * k + 10, f"step {k}") for k in range(4)]
    ops = [K(10 * k + 5, 10 * k + 8, api_s=(10 * k + 1) * MS) for k in range(4)]
    ops += [K(10 * k + 6, 10 * k + 12, cls="nccl", stream=9, api_s=(10 * k + 2) * MS)
            for k in range(4)]
    ops += [K(10 * k + 1, 10 * k + 3, dev=1, api_s=(10 * k + 1) * MS) for k in range(4)]
    return build(ops, nvtx=nvtx)


def test_overlap_per_step_rows_equal_with_and_without_the_shared_states(monkeypatch):
    calls = []
    run_sums = window_sums.run_sums
    monkeypatch.setattr(window_sums, "run_sums", lambda *a: calls.append(1) or run_sums(*a))
    trace = AnalysisContext(_trace())
    res = {"steps": steps.run(trace, steps.StepsParams(), {})}
    assert steps.STEP_STATES.name in trace.products()
    shared = overlap.run(trace, overlap.OverlapParams(), res).tables["overlap"]
    taken = {steps.DEVICE_SEGMENTS.name, steps.STEP_STATES.name, steps.DEVICE_TOTALS.name}
    assert not taken & set(trace.products())  # overlap, their last user, took them over
    assert len(calls) == 1  # ... without computing them again
    fresh = overlap.run(trace, overlap.OverlapParams(), res).tables["overlap"]
    assert len(calls) == 2
    assert shared.equals(fresh)
    assert shared["step"].drop_nulls().n_unique() == 4


def test_the_context_of_an_analysis_is_closed_when_it_ends(monkeypatch):
    """Whatever the entry point, nothing the passes shared outlives the analysis."""
    opened: list[AnalysisContext] = []
    real = AnalysisContext.close

    def spy(self):
        opened.append(self)
        real(self)

    monkeypatch.setattr(AnalysisContext, "close", spy)
    for passes in (["steps", "overlap"], ["steps"]):
        opened.clear()
        analyze(_trace(), passes=passes, findings=False)
        assert len(opened) == 1
        assert opened[0].products() == ()
        # a product asked for after the end is built, not kept
        steps.device_segments(opened[0], keep=True)
        assert opened[0].products() == ()
