"""Each finding rule fires on a hand-built input that has its symptom, stays silent on a
healthy one, names a layer, carries evidence, and says "not evaluated" when inputs are missing.
Inputs are canonical frames + pass tables built directly (tests/findings_cases.py)."""

from __future__ import annotations

import dataclasses

import polars as pl
import pytest
from findings_cases import MS, N_STEPS, SCENARIOS, STEP, US, Case, _steps, healthy, scenario

from nsysan.errors import ConfigError
from nsysan.findings import FindingParams, diagnose
from nsysan.frames import schemas
from nsysan.passes.base import LAYERS, Finding, PassResult


def _by_code(d, code: str) -> Finding:
    hits = [f for f in d.findings if f.code == code]
    assert len(hits) == 1, [f.code for f in d.findings]
    return hits[0]


def _metric(f: Finding, name: str):
    return {m["name"]: m["value"] for m in f.evidence["metrics"]}[name]


@pytest.mark.parametrize("with_steps", [True, False], ids=["steps", "no-steps"])
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_scenario_yields_exactly_its_finding(name: str, with_steps: bool) -> None:
    _, expected = SCENARIOS[name]
    d = diagnose(*scenario(name, with_steps))
    assert set(d.codes("warning")) == expected
    for f in d.findings:
        assert f.layer in LAYERS
        assert f.message and f.evidence["metrics"], f.code
        assert all(m["unit"] for m in f.evidence["metrics"])


@pytest.mark.parametrize(
    ("name", "verdict"),
    [("healthy", "compute-bound"), ("starved_input", "input-bound"),
     ("exposed_allreduce", "communication-bound"), ("launch_bound", "launch-bound"),
     ("pageable_copies", "input-bound")],
)
def test_verdict(name: str, verdict: str) -> None:
    d = diagnose(*scenario(name))
    assert d.verdict.label == verdict, d.verdict.reason
    assert d.verdict.reason
    assert sum(d.verdict.shares.values()) == pytest.approx(1.0, abs=1e-9)


def test_starvation_evidence_points_at_the_planted_gaps() -> None:
    d = diagnose(*scenario("starved_input"))
    f = _by_code(d, "GPU_STARVATION_PERIODIC")
    assert f.layer == "framework" and f.severity == "critical"
    n = N_STEPS - 1  # the last step's stall is trailing idle, not a gap
    assert _metric(f, "n_gaps") == n
    assert _metric(f, "starved_ns") == n * 4 * MS
    assert _metric(f, "steps_with_gap_frac") == n / N_STEPS
    for w in f.evidence["windows"]:
        assert (w["start_ns"] - MS) % STEP == STEP - 4 * MS
        assert w["end_ns"] - w["start_ns"] == 4 * MS
    assert f.evidence["offenders"][0] == {"kind": "cause", "name": "nvtx_range",
                                          "value": n * 4 * MS, "unit": "ns",
                                          "count": n, "detail": None}
    assert "DataLoader.__next__" in f.message


def test_starvation_needs_recurrence() -> None:
    """One long stall is not periodic starvation."""
    c = Case()
    for i, (s, e) in enumerate(_steps()):
        if i == 3:
            c.cause(s, e, "nvtx_range", "DataLoader")
            s += 6 * MS
        t = s
        while t + 500 * US <= e:
            c.kernel(t, 500 * US)
            t += 500 * US
    d = diagnose(*c.build(_steps()))
    assert "GPU_STARVATION_PERIODIC" in d.not_found


def test_exposed_communication_numbers() -> None:
    d = diagnose(*scenario("exposed_allreduce"))
    f = _by_code(d, "EXPOSED_COMMUNICATION")
    assert f.layer == "communication"
    assert _metric(f, "exposed_nccl_ns") == N_STEPS * 4 * MS
    assert _metric(f, "exposed_nccl_ns_per_step") == 4 * MS
    assert _metric(f, "hidden_nccl_frac") == 0.0
    assert len(f.evidence["windows"]) == 5
    assert all(w["end_ns"] - w["start_ns"] == 4 * MS for w in f.evidence["windows"])
    assert f.evidence["offenders"][0]["name"].startswith("ncclKernel_AllReduce")


def test_launch_bound_evidence() -> None:
    f = _by_code(diagnose(*scenario("launch_bound")), "LAUNCH_BOUND")
    assert f.layer == "runtime_driver"
    assert _metric(f, "median_kernel_ns") == 5 * US
    assert _metric(f, "launch_idle_frac") > 0.7
    assert f.evidence["offenders"][0]["name"] == "vectorized_elementwise_kernel"


def test_pageable_copies_are_the_root_cause_not_h2d_overlap() -> None:
    d = diagnose(*scenario("pageable_copies"))
    f = _by_code(d, "PAGEABLE_OR_SYNC_COPIES")
    assert _metric(f, "n_pageable") == N_STEPS
    assert _metric(f, "cost_ns") >= N_STEPS * 3 * MS
    assert "H2D_NOT_OVERLAPPED" in d.not_found  # suppressed: pageable copies explain it
    assert "pageable" in f.evidence["offenders"][0]["name"]


def test_small_sync_h2d_copies_are_ignored() -> None:
    """nsys's rule: synchronous H2D copies <= 64000 bytes are fine."""
    c = healthy()
    for s, _ in _steps():
        c.copy(s + 3 * MS, 2 * US, nbytes=1024, api="cudaMemcpy")
    d = diagnose(*c.build(_steps()))
    assert "PAGEABLE_OR_SYNC_COPIES" in d.not_found


def test_host_sync_evidence() -> None:
    f = _by_code(diagnose(*scenario("sync_in_loop")), "HOST_SYNC_IN_STEP")
    assert _metric(f, "syncs_per_step") == 1.0
    assert _metric(f, "sync_idle_ns") == (N_STEPS - 1) * MS  # the last drain is trailing
    assert f.evidence["offenders"][0]["name"] == "cudaDeviceSynchronize"


def test_memory_churn_counts_per_step_and_ignores_async_pools() -> None:
    f = _by_code(diagnose(*scenario("memory_churn")), "MEMORY_CHURN")
    assert f.severity == "warning" and _metric(f, "calls_per_step") == 2.0
    c = healthy()
    for s, _ in _steps():
        c.api("cudaMallocAsync", "malloc", s + 2 * MS, s + 2 * MS + US)
    assert "MEMORY_CHURN" in diagnose(*c.build(_steps())).not_found


@pytest.mark.parametrize(("tc", "expected"), [(False, "critical"), (True, None), (None, None)])
def test_no_tensor_cores(tc: bool | None, expected: str | None) -> None:
    c = healthy()
    c.tensor_core = {"ampere_sgemm_128x64_nn": tc}
    d = diagnose(*c.build(_steps()))
    if expected is None:
        assert "NO_TENSOR_CORES" in d.not_found
    else:
        f = _by_code(d, "NO_TENSOR_CORES")
        assert f.severity == expected and f.layer == "operator_library"
        assert f.evidence["offenders"][0]["name"] == "ampere_sgemm_128x64_nn"


def _layers(rows: list[tuple[str, int]]) -> pl.DataFrame:
    total = sum(ns for _, ns in rows)
    return pl.DataFrame({"domain": [""] * len(rows), "name": [n for n, _ in rows],
                         "instances": [N_STEPS] * len(rows), "n_gpu_ops": [10] * len(rows),
                         "gpu_busy_ns": [ns for _, ns in rows],
                         "exclusive_gpu_ns": [ns for _, ns in rows],
                         "exclusive_frac": [ns / total for _, ns in rows]})


def test_dominant_layer_is_info_and_ignores_the_step_range() -> None:
    c = healthy()
    c.layers = _layers([("step", 900), ("attention", 600), ("mlp", 300)])
    d = diagnose(*c.build(_steps()))
    assert "DOMINANT_LAYER" in d.not_found  # "step" is the step range, attention is 33%
    c.layers = _layers([("attention", 700), ("mlp", 300)])
    f = _by_code(diagnose(*c.build(_steps())), "DOMINANT_LAYER")
    assert f.severity == "info" and "attention" in f.message


def test_nvtx_low_coverage() -> None:
    c = healthy()
    c.layers = _layers([("a", 100)]).with_columns(pl.lit(0.2).alias("exclusive_frac"))
    f = _by_code(diagnose(*c.build(_steps())), "NVTX_LOW_COVERAGE")
    assert _metric(f, "coverage_frac") == pytest.approx(0.2)


def _nccl_table(busbw_gbps: float, nbytes: int | None = 64 << 20) -> pl.DataFrame:
    return schemas.conform(pl.DataFrame({
        "op": ["AllReduce"] * 8, "bytes": [nbytes] * 8, "n_ranks": [4] * 8,
        "start_ns": [i * MS for i in range(8)], "end_ns": [i * MS + 500 * US for i in range(8)],
        "busbw_gbps": [busbw_gbps] * 8}), schemas.NCCL)


@pytest.mark.parametrize(("busbw", "expected"), [(1.0, "critical"), (5.0, "warning"),
                                                 (100.0, None)])
def test_nccl_low_bandwidth_from_the_nccl_table(busbw: float, expected: str | None) -> None:
    d = diagnose(*healthy().build(_steps(), extra={"nccl": _nccl_table(busbw)}))
    if expected is None:
        assert "NCCL_LOW_BANDWIDTH" in d.not_found
    else:
        f = _by_code(d, "NCCL_LOW_BANDWIDTH")
        assert f.severity == expected
        assert _metric(f, "median_busbw") == pytest.approx(busbw * 1e9)


def test_nccl_bandwidth_not_evaluated_without_sizes() -> None:
    d = diagnose(*healthy().build(_steps(), extra={"nccl": _nccl_table(1.0, None)}))
    assert "NCCL_LOW_BANDWIDTH" in d.unavailable
    assert "message sizes" in d.reasons["NCCL_LOW_BANDWIDTH"]


def test_nccl_bandwidth_from_nvtx_payloads() -> None:
    """Without the nccl pass: NCCL NVTX payload sizes over the ranges' GPU projection."""
    c = healthy()
    rids = [c.range("ncclAllReduce", s, s + 10 * US, domain="NCCL",
                    payload='{"Message size [bytes]": 8388608, "No. of ranks": 2}')
            for s, _ in _steps()]
    att = schemas.conform(pl.DataFrame({
        "range_id": rids, "proj_start_ns": [s + 6 * MS for s, _ in _steps()],
        "proj_end_ns": [s + 8 * MS for s, _ in _steps()]}), schemas.ATTRIBUTION)
    f = _by_code(diagnose(*c.build(_steps(), extra={"attribution": att})), "NCCL_LOW_BANDWIDTH")
    # 8 MiB in 2 ms, AllReduce bus factor 2(n-1)/n = 1 for n = 2
    assert _metric(f, "median_busbw") == pytest.approx(8388608 / 2e-3)


@pytest.mark.parametrize(("first_kernel_s", "expected"), [(40, "warning"), (8, "info"), (1, None)])
def test_slow_start(first_kernel_s: int, expected: str | None) -> None:
    c = Case()
    c.api("cudaFree", "malloc", 0, 2 * 10**9)  # context creation
    t0 = first_kernel_s * 10**9
    for i in range(5):
        c.kernel(t0 + i * MS, MS)
    d = diagnose(*c.build())
    if expected is None:
        assert "SLOW_START" in d.not_found
    else:
        f = _by_code(d, "SLOW_START")
        assert f.severity == expected
        assert _metric(f, "time_to_first_kernel_ns") == t0
        assert f.evidence["offenders"][0]["name"] == "cudaFree"


def test_capture_findings() -> None:
    c = healthy()
    c.range("never closed", 5 * MS, 200 * MS, unterminated=True)
    c.api("cudaGraphLaunch", "graph", 2 * MS, 2 * MS + 5 * US)
    c.api("cudaLaunchKernel", "launch", 50 * MS, 50 * MS + 5 * US)  # lost mid-capture
    for i in range(400):  # ... many of them: records were dropped
        c.api("cudaLaunchKernel", "launch", 60 * MS + i * US, 60 * MS + i * US + 500)
    d = diagnose(*c.build(_steps()))
    assert _by_code(d, "NVTX_UNTERMINATED").severity == "info"
    assert _by_code(d, "CUDA_GRAPH_NO_NODES").severity == "warning"
    f = _by_code(d, "CAPTURE_TRUNCATED")
    assert f.severity == "warning" and _metric(f, "n_lost") == 401
    assert _by_code(d, "CAPTURE_MISSING_TABLES").severity == "info"  # osrt


def test_launches_lost_at_the_end_are_info() -> None:
    c = healthy()
    end = _steps()[-1][1]
    c.api("cudaLaunchKernel", "launch", end + MS, end + MS + 5 * US)
    f = _by_code(diagnose(*c.build(_steps())), "CAPTURE_TRUNCATED")
    assert f.severity == "info" and _metric(f, "n_lost_at_end") == 1


def test_lost_launches_count_only_successful_kernel_launches() -> None:
    """A failed launch and a graph launch without GPU records are not lost launches (a call
    without a return value is taken as successful); a lost launch between found ones counts
    as lost before the end, one after the last found launch (a later copy notwithstanding)
    as lost at the end, and the evidence window spans the lost calls, start to end."""
    c = healthy()
    first, last = _steps()[0][0], _steps()[-1][1]
    c.api("cudaLaunchKernel", "launch", first + 10 * US, first + 12 * US, rv=98)  # failed
    c.api("cudaGraphLaunch", "launch", first + 20 * US, first + 21 * US)  # a graph: not here
    c.api("cudaLaunchKernel", "launch", first + 30 * US, first + 33 * US)  # lost
    c.api("cudaLaunchKernel", "launch", first + 40 * US, first + 41 * US, rv=None)  # lost too
    c.api("cuLaunchKernel", "launch", last + MS, last + MS + 7 * US)  # lost at the end
    # (a copy recorded after it: only launches decide what was in flight at the stop)
    c.copy(last + 3 * MS, 10 * US, copy_kind="DtoH", api_start=last + 2 * MS)
    f = _by_code(diagnose(*c.build(_steps())), "CAPTURE_TRUNCATED")
    n_found = sum(op["kind"] == "kernel" for op in c.ops)
    assert _metric(f, "n_launches") == n_found + 3
    assert (_metric(f, "n_lost"), _metric(f, "n_lost_at_end")) == (3, 1)
    assert _metric(f, "lost_frac") == pytest.approx(2 / (n_found + 3))
    (win,) = f.evidence["windows"]
    assert (win["start_ns"], win["end_ns"]) == (first + 30 * US, last + MS + 7 * US)
    assert {o["name"]: o["count"] for o in f.evidence["offenders"]} == {
        "cudaLaunchKernel": 2, "cuLaunchKernel": 1}


def test_missing_gpu_activity_is_critical_and_nothing_is_silently_zero() -> None:
    d = diagnose(*healthy().build(_steps(), skip=("gpu_ops", "cuda_api")))
    f = _by_code(d, "CAPTURE_MISSING_TABLES")
    assert f.severity == "critical"
    assert {o["name"] for o in f.evidence["offenders"]} == {"gpu_ops", "cuda_api", "osrt"}
    for code in ("LAUNCH_BOUND", "HOST_SYNC_IN_STEP", "PAGEABLE_OR_SYNC_COPIES", "SLOW_START"):
        assert code in d.unavailable and d.reasons[code]


@pytest.mark.parametrize(
    ("skip", "codes", "reason"),
    [(("overlap",), ("EXPOSED_COMMUNICATION", "H2D_NOT_OVERLAPPED"), "overlap pass"),
     (("kernels",), ("NO_TENSOR_CORES",), "kernels pass"),
     (("gaps",), ("GPU_STARVATION_PERIODIC", "LAUNCH_BOUND", "HOST_SYNC_IN_STEP",
                  "PAGEABLE_OR_SYNC_COPIES"), "gaps pass"),
     (("cuda_api",), ("LAUNCH_BOUND", "HOST_SYNC_IN_STEP", "MEMORY_CHURN"), "cuda_api")],
)
def test_missing_inputs_are_not_evaluated(skip, codes, reason) -> None:
    d = diagnose(*_build_skipping("exposed_allreduce", skip))
    for code in codes:
        assert code in d.unavailable and reason in d.reasons[code], (code, d.reasons)
        assert code not in d.not_found


def _build_skipping(name: str, skip: tuple[str, ...]):
    make, _ = SCENARIOS[name]
    return make().build(_steps(), skip=skip)


def test_baseline_without_overlap_says_why() -> None:
    d = diagnose(*_build_skipping("healthy", ("overlap",)))
    items = {i.key: i for i in d.baseline.items if i.device_id is None}
    assert items["gpu_busy_frac"].value is None
    assert "overlap pass did not run" in items["gpu_busy_frac"].note
    assert d.verdict.label == "undetermined"


def test_baseline_numbers() -> None:
    d = diagnose(*scenario("exposed_allreduce"), samples_per_step=32, tokens_per_step=4096)
    b = d.baseline
    assert b.get("n_steps") == N_STEPS
    assert b.get("step_time_mean_ns") == b.get("step_time_p50_ns") == STEP
    assert b.get("samples_per_s") == pytest.approx(3200.0)
    assert b.get("tokens_per_s") == pytest.approx(4096 * 100.0)
    assert b.get("exposed_comm_frac") == pytest.approx(0.4)
    assert b.get("exposed_comm_ns_per_step") == 4 * MS
    assert b.get("gpu_busy_frac") == 1.0
    assert (b.window_start_ns, b.window_end_ns) == (MS, MS + N_STEPS * STEP)


def test_baseline_without_steps_or_options() -> None:
    b = diagnose(*scenario("healthy", with_steps=False)).baseline
    missing = {i.key: i.note for i in b.items if i.value is None}
    assert "steps" in missing["step_time_mean_ns"] or "step" in missing["step_time_mean_ns"]
    assert "--samples-per-step" in missing["samples_per_s"]


def test_bad_options_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="samples-per-step"):
        diagnose(*scenario("healthy"), samples_per_step=0)


def test_thresholds_are_parameters() -> None:
    tr, res = scenario("exposed_allreduce")
    strict = diagnose(tr, res, params=FindingParams(comm_warn_frac=0.5, comm_crit_frac=0.9))
    assert "EXPOSED_COMMUNICATION" in strict.not_found
    assert dataclasses.asdict(strict.params)["comm_warn_frac"] == 0.5


def test_pass_findings_are_kept_once_and_normalised() -> None:
    tr, res = scenario("exposed_allreduce")
    extra = [Finding("EXPOSED_COMMUNICATION", "warning", "communication", "dup", "dup"),
             Finding("RANK_SKEW", "warning", "communication", "Rank skew", "rank 1 late",
                     evidence={"skew_ns": 5_000_000, "rank": "1"})]
    res = {**res, "nccl": PassResult(findings=extra)}
    d = diagnose(tr, res)
    assert d.codes().count("EXPOSED_COMMUNICATION") == 1
    f = _by_code(d, "RANK_SKEW")
    assert f.evidence["metrics"] == [{"name": "skew_ns", "label": "skew ns",
                                      "value": 5_000_000, "unit": "ns"}]
    assert f.evidence["extra"] == {"rank": "1"}


@pytest.mark.parametrize("bad", [{"comm_warn_frac": 1.5}, {"short_gap_max_ns": -1},
                                 {"top_n": 0}])
def test_bad_thresholds_are_config_errors(bad: dict) -> None:
    with pytest.raises(ConfigError, match=next(iter(bad))):
        FindingParams(**bad)
