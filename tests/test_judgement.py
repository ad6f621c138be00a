"""Issue 19's cases: no false alarms on small and odd traces, start-up costs, step detection
that knows what an iteration is, and a verdict that agrees with the findings.

Each trace is planted (nsysan.testing.eval_traces); the expectations follow from how it was
built (see the builders' docstrings), not from nsysan's output."""

from __future__ import annotations

from dataclasses import replace

import polars as pl
import pytest

import nsysan.api as api
from nsysan.findings import diagnose
from nsysan.findings.params import FindingParams
from nsysan.testing import eval_traces as E
from tests import findings_cases
from tests.findings_cases import US, scenario


@pytest.fixture(scope="module")
def analysed(tmp_path_factory):
    root = tmp_path_factory.mktemp("judge")
    cache: dict = {}

    def get(name: str, **kw):
        key = (name, tuple(sorted(kw.items())))
        if key not in cache:
            path = getattr(E, name)(root / f"{name}-{len(cache)}.sqlite", **kw)
            cache[key] = api.analyze(path)
        return cache[key]

    return get


def _sev(result, code: str) -> str | None:
    found = [f.severity for f in result.diagnosis.findings if f.code == code]
    return found[0] if found else None


def test_one_host_alloc_is_not_churn_and_a_first_launch_is_start_up(analysed) -> None:
    r = analysed("tiny_first_launch")
    d = r.diagnosis
    assert _sev(r, "MEMORY_CHURN") == "info"
    churn = next(f for f in d.findings if f.code == "MEMORY_CHURN")
    assert churn.message.startswith("Not churn")
    assert _sev(r, "LAUNCH_BOUND") is None  # the 17 ms launch is module loading
    start = next(f for f in d.findings if f.code == "STARTUP_COST")
    assert start.severity == "info"
    idle = {m["name"]: m["value"] for m in start.evidence["metrics"]}["startup_idle_ns"]
    # planted: the first launch call takes 17 ms, the GPU idles from the upload's end
    assert idle >= 17_000_000
    assert start.evidence["offenders"][0]["name"] == "cudaLaunchKernel"
    assert d.verdict.label == "insufficient-data"
    assert "capture" in d.verdict.reason.lower()
    assert d.codes("warning") == []


def test_a_microbenchmark_raises_nothing_above_info(analysed) -> None:
    r = analysed("microbench")
    assert r.diagnosis.codes("warning") == []
    assert r.diagnosis.verdict.label == "insufficient-data"
    # the capped finding says what it measured and why it is held
    held = [f for f in r.diagnosis.findings if "Held at info" in f.message]
    assert held and all(f.severity == "info" for f in held)


def test_identical_kernels_have_no_steps(analysed) -> None:
    r = analysed("identical_kernels")
    m = r.results["steps"].metrics
    assert m["n_steps"] == 0 and r.tables["steps"].is_empty()
    assert "identical kernels" in m["steps_reason"]
    assert r.diagnosis.verdict.label == "compute-bound"
    assert r.diagnosis.codes("warning") == []


def test_a_layer_block_inside_too_few_iterations_is_not_a_step(analysed) -> None:
    r = analysed("nested_layers", iterations=2)
    m = r.results["steps"].metrics
    assert m["n_steps"] == 0
    assert "longer period of 99 kernels" in m["steps_reason"]
    assert "4 kernels" in m["step_periods_seen"]
    base = r.diagnosis.baseline
    step_item = next(i for i in base.items if i.key == "step_time_mean_ns")
    assert "layer" in step_item.note


def test_the_longest_consistent_period_is_the_iteration(analysed) -> None:
    r = analysed("nested_layers", iterations=4)
    m = r.results["steps"].metrics
    # planted: 1 + 12*4 + 1 + 12*4 + 1 = 99 kernels per iteration, 4 iterations
    assert m["step_period_kernels"] == 99
    assert m["n_steps"] == 3
    assert r.tables["steps"]["duration_ns"].min() > 30_000_000


def test_nvtx_steps_win_over_periodicity(analysed) -> None:
    r = analysed("starved_below_verdict")
    assert r.results["steps"].metrics["steps_source"].startswith("nvtx:")


def test_a_warning_stall_is_reflected_in_the_verdict(analysed) -> None:
    r = analysed("starved_below_verdict")
    d = r.diagnosis
    assert _sev(r, "GPU_STARVATION_PERIODIC") == "warning"
    share = d.verdict.shares["input"]
    assert 0.10 <= share < 0.20  # under the old 20% bar: it used to say compute-bound
    assert d.verdict.label == "input-bound"
    assert "GPU_STARVATION_PERIODIC" in d.verdict.reason


def test_a_small_warning_stall_is_named_in_a_compute_bound_verdict() -> None:
    trace, results = scenario("starved_input")
    p = FindingParams(verdict_finding_min_share=0.5, verdict_min_share=0.5)
    d = diagnose(trace, results, params=p)
    assert d.verdict.label == "compute-bound"
    assert "Also reported: GPU_STARVATION_PERIODIC" in d.verdict.reason


def test_steady_compute_with_one_percent_dispatch_idle_is_healthy(analysed) -> None:
    r = analysed("compute_steady")
    d = r.diagnosis
    assert d.verdict.label == "compute-bound"
    assert d.codes("warning") == []
    assert r.results["steps"].metrics["step_period_kernels"] == 20


def test_activity_caps_are_settable() -> None:
    trace, results = scenario("starved_input")
    d = diagnose(trace, results)
    assert "GPU_STARVATION_PERIODIC" in d.codes("critical")
    held = diagnose(trace, results, params=replace(FindingParams(), judge_crit_min_ns=10**12))
    f = next(f for f in held.findings if f.code == "GPU_STARVATION_PERIODIC")
    assert f.severity == "warning" and "Held at warning (measured critical)" in f.message


def test_churn_needs_allocations_across_steps() -> None:
    trace, results = scenario("memory_churn")
    f = next(f for f in diagnose(trace, results).findings if f.code == "MEMORY_CHURN")
    assert f.severity in ("warning", "critical")
    # the same 32 allocation calls packed into one step are a one-off, not churn
    c = findings_cases.healthy()
    s0 = findings_cases._steps()[3][0]
    for i in range(32):
        c.api("cudaMalloc", "malloc", s0 + i * 200 * US, s0 + i * 200 * US + 150 * US)
    trace, results = c.build(findings_cases._steps())
    f = next(f for f in diagnose(trace, results).findings if f.code == "MEMORY_CHURN")
    assert f.severity == "info" and f.message.startswith("Not churn (allocations in 1 of")


def test_finding_thresholds_are_settable_from_the_api(tmp_path) -> None:
    path = E.microbench(tmp_path / "m.sqlite")
    relaxed = {"findings.judge_warn_min_ops": "1", "findings.judge_warn_min_ns": "0",
               "findings.judge_warn_min_ops_without_steps": "1"}
    r = api.analyze(path, settings=relaxed)
    assert r.diagnosis.params.judge_warn_min_ops == 1
    assert r.diagnosis.verdict.label != "insufficient-data"
    assert "NO_TENSOR_CORES" in r.diagnosis.codes("warning")  # no longer held at info
    from nsysan.errors import ConfigError

    with pytest.raises(ConfigError, match="no finding threshold 'nope'"):
        api.analyze(path, settings={"findings.nope": "1"})
    with pytest.raises(ConfigError, match="cannot read"):
        api.analyze(path, settings={"findings.top_n": "many"})


def test_cli_lists_thresholds_and_refuses_unknown_ones(tmp_path) -> None:
    import json

    from click.testing import CliRunner

    from nsysan.cli import cli

    out = CliRunner().invoke(cli, ["findings"])
    assert out.exit_code == 0
    assert "--set findings.judge_warn_min_ops=20" in out.output
    assert "STARTUP_COST" in out.output
    data = json.loads(CliRunner().invoke(cli, ["findings", "--json"]).output)
    assert {"name": "verdict_min_share", "default": 0.2} in data["thresholds"]
    path = E.microbench(tmp_path / "m.sqlite")
    bad = CliRunner().invoke(cli, ["analyze", str(path), "-o", str(tmp_path / "o"),
                                   "--set", "findings.nope=1"])
    assert bad.exit_code == 1 and "Error: --set findings.nope" in bad.output
    ok = CliRunner().invoke(cli, ["analyze", str(path), "-o", str(tmp_path / "o"),
                                  "--set", "findings.judge_warn_min_ops=1"])
    assert ok.exit_code == 0, ok.output
    got = json.loads(next((tmp_path / "o").glob("*/findings.json")).read_text())
    assert got["params"]["judge_warn_min_ops"] == 1


def _ops(names: list[str], starts: list[int], dur: int) -> pl.DataFrame:
    return pl.DataFrame({"kind": ["kernel"] * len(names), "pid": [1] * len(names),
                         "device_id": [0] * len(names), "name": names,
                         "start_ns": starts, "end_ns": [s + dur for s in starts]})


def test_one_kernel_between_copies_is_an_iteration_but_back_to_back_is_not() -> None:
    """A Jacobi solver runs one kernel per iteration between halo copies (kernel 0.46 ms
    every 3.5 ms): those are steps. The same kernel back to back is no step structure."""
    from nsysan.passes import step_detect
    from nsysan.passes.steps import StepsParams

    n = 50
    spaced = _ops(["jacobi"] * n, [i * 3_500_000 for i in range(n)], 460_000)
    found = step_detect.periodic_steps(spaced, StepsParams())
    assert found is not None and found[0].height == n  # the last ends with its kernel
    notes: dict = {}
    packed = _ops(["jacobi"] * n, [i * 1_001_000 for i in range(n)], 1_000_000)
    assert step_detect.periodic_steps(packed, StepsParams(), notes) is None
    assert "identical kernels" in notes["steps_reason"]
    assert notes["step_periods_seen"] == f"1 kernels ({n}x, match 1.00)"


def test_start_up_calls_by_kind(tmp_path) -> None:
    import nsysan
    from nsysan.findings.startup import covered_ns, startup_calls
    from nsysan.testing import kernels as K
    from nsysan.testing._common import MS, start

    b, g = start()
    b.add_api(g, 1 * MS, 4 * MS, "cuCtxCreate_v2")  # first call of the process, and context
    b.add_api(g, 5 * MS, 7 * MS, "cuModuleLoadData")
    b.add_api(g, 8 * MS, 8 * MS + 500 * US, "cuModuleLoadData")  # too short: not counted
    b.add_nvtx_range(g, 9 * MS, 12 * MS, "ncclCommInitRank", domain="NCCL")
    b.add_kernel(g, 16 * MS, 17 * MS, K.ADD, api_start=13 * MS, api_ns=2 * MS)  # first launch
    b.add_kernel(g, 20 * MS, 21 * MS, K.ADD, api_start=18 * MS, api_ns=1_500 * US)  # 2nd: no
    b.add_kernel(g, 23 * MS, 24 * MS, K.SGEMM, api_start=21 * MS, api_ns=10 * US)  # fast: no
    trace = nsysan.open_trace(b.write(tmp_path / "s.sqlite"))
    got = startup_calls(trace, 1 * MS).select("why", "start_ns").rows()
    assert got == [("context", 1 * MS), ("module_load", 5 * MS), ("nccl_init", 9 * MS),
                   ("first_launch", 13 * MS)]
    calls = startup_calls(trace, 1 * MS)
    s = pl.Series([0, 2 * MS, 6 * MS, 14 * MS]).cast(pl.Int64)
    e = pl.Series([1 * MS, 6 * MS, 10 * MS, 40 * MS]).cast(pl.Int64)
    # brute force: per ns covered by any call
    spans = list(zip(calls["start_ns"], calls["end_ns"], strict=True))
    want = [sum(max(0, min(b1, e1) - max(a1, s1)) for a1, b1 in spans)
            for s1, e1 in zip(s, e, strict=True)]
    assert covered_ns(calls, s, e).tolist() == want


def test_a_first_launch_is_the_first_of_its_kernel_name_in_its_process(tmp_path) -> None:
    import nsysan
    from nsysan.findings.startup import startup_calls
    from nsysan.testing import kernels as K
    from nsysan.testing._common import MS, start

    b, g = start()
    g2 = b.add_process(4343, "python", main_thread="python")
    b.add_api(g, 1 * MS, 1 * MS + 10 * US, "cudaSetDevice")
    b.add_api(g2, 1 * MS, 1 * MS + 10 * US, "cudaSetDevice")
    b.add_kernel(g, 4 * MS, 5 * MS, K.SGEMM, api_start=3 * MS, api_ns=10 * US)  # fast first
    b.add_kernel(g, 8 * MS, 9 * MS, K.SGEMM, api_start=6 * MS, api_ns=2 * MS)  # slow, not 1st
    b.add_kernel(g2, 12 * MS, 13 * MS, K.SGEMM, api_start=10 * MS, api_ns=2 * MS)  # 1st in g2
    b.add_kernel(g2, 16 * MS, 17 * MS, K.ADD, api_start=14 * MS, api_ns=1 * MS)  # 1st ADD
    b.add_kernel(g, 20 * MS, 21 * MS, K.ADD, api_start=18 * MS, api_ns=3 * MS)  # 1st in g
    trace = nsysan.open_trace(b.write(tmp_path / "s.sqlite"))
    got = startup_calls(trace, 1 * MS).filter(pl.col("why") == "first_launch")
    assert got.select("pid", "start_ns").rows() == [(4343, 10 * MS), (4343, 14 * MS),
                                                    (4242, 18 * MS)]


@pytest.mark.parametrize("builder", ["tiny_first_launch", "nested_layers", "microbench"])
def test_judgement_ignores_row_order(tmp_path, builder: str) -> None:
    from nsysan.findings.rules import finding_dict
    from tests.row_order import shuffled_copy

    src = getattr(E, builder)(tmp_path / "a.sqlite")
    assert shuffled_copy(src, tmp_path / "b.sqlite", seed=7)
    got = []
    for p in (src, tmp_path / "b.sqlite"):
        r = api.analyze(p)
        d = r.diagnosis
        got.append(([finding_dict(f) for f in d.findings], d.verdict.to_dict(),
                     {k: v for k, v in r.results["steps"].metrics.items()
                      if k.startswith("step")}))
    assert got[0] == got[1]


def test_a_stall_verdict_without_a_finding_says_so() -> None:
    trace, results = scenario("starved_input")  # 4 of every 10 ms idle in data loading
    quiet = FindingParams(starvation_warn_frac=0.9, starvation_crit_frac=0.95)
    d = diagnose(trace, results, params=quiet)
    assert "GPU_STARVATION_PERIODIC" not in d.codes("info")
    assert d.verdict.label == "input-bound"
    assert "No finding reports this stall at warning level" in d.verdict.reason
    loud = diagnose(trace, results)
    assert "No finding reports" not in loud.verdict.reason
