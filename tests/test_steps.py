"""The steps pass: NVTX step ranges, their projection to GPU time, kernel periodicity,
warm-up and per-step metrics, on tiny hand-built traces."""

from __future__ import annotations

import polars as pl
import pytest
from test_gaps import MS, PLANTED, TID, K, build

from nsysan.errors import ConfigError
from nsysan.frames import schemas
from nsysan.passes import steps
from nsysan.passes.base import PassResult


def run_steps(trace, **params) -> PassResult:
    res = steps.run(trace, steps.StepsParams(**params), {})
    assert res.tables["steps"].schema == schemas.STEPS
    return res


def windows(res: PassResult) -> list[tuple[int, int]]:
    return res.tables["steps"].select("start_ns", "end_ns").rows()


def R(s, e, name="step", **kw):  # an NVTX range in ms
    return {"s": int(s * MS), "e": int(e * MS), "name": name, **kw}


@pytest.mark.parametrize(
    ("name", "is_step"),
    [
        ("step 12", True), ("Step#3", True), ("iteration 5", True), ("train_step", True),
        ("ProfilerStep#7", True), ("iter_12", True), ("step", True), ("STEP: 4", True),
        ("validation step 2", True), ("eval_iter", True),
        ("optimizer.step", False), ("forward", False), ("stepper", False),
        ("steps per epoch", False), ("data copy in 3", False), ("Optimizer.step#SGD.step", False),
        ("backward_step", False), ("iterator", False),
    ],
)
def test_step_name_pattern(name, is_step):
    matched = pl.Series([name]).str.contains(steps.STEP_NAME_PATTERN)[0]
    assert matched is is_step


def test_nvtx_steps_project_to_gpu_time():
    # CPU step k = [10k, 10k + 10) ms; its kernels are launched at 10k + 1 and run 4 ms later.
    nvtx = [R(10 * k, 10 * k + 10, f"step {k}") for k in range(3)]
    ops = [K(10 * k + 5, 10 * k + 8, api_s=(10 * k + 1) * MS) for k in range(3)]
    res = run_steps(build(ops, nvtx=nvtx))
    assert windows(res) == [(5 * MS, 15 * MS), (15 * MS, 25 * MS), (25 * MS, 30 * MS)]
    t = res.tables["steps"]
    assert t["source"].unique().to_list() == ["nvtx:step N"]
    assert t["step"].to_list() == [0, 1, 2]
    assert t["duration_ns"].to_list() == [10 * MS, 10 * MS, 5 * MS]
    assert t["gpu_busy_frac"].to_list() == pytest.approx([0.3, 0.3, 0.6])
    assert t["idle_ns"].to_list() == [7 * MS, 7 * MS, 2 * MS]
    assert res.metrics["steps_projection"] == "gpu"
    assert res.metrics["n_steps"] == 3


def test_last_step_ends_with_work_launched_from_other_threads():
    nvtx = [R(0, 10, "step 0"), R(10, 20, "step 1")]
    ops = [K(2, 4, api_s=MS), K(12, 14, api_s=11 * MS),
           # the backward pass of step 1, launched by another thread of the process
           K(14, 40, api_s=15 * MS, tid=77)]
    assert windows(run_steps(build(ops, nvtx=nvtx))) == [(2 * MS, 12 * MS), (12 * MS, 40 * MS)]


def test_steps_without_gpu_work_are_left_out():
    # The CPU runs ahead: steps 2 and 3 launched nothing that the capture recorded.
    nvtx = [R(10 * k, 10 * k + 10, f"step {k}") for k in range(4)]
    ops = [K(15, 18, api_s=MS), K(25, 27, api_s=11 * MS)]
    res = run_steps(build(ops, nvtx=nvtx))
    assert windows(res) == [(15 * MS, 25 * MS), (25 * MS, 27 * MS)]
    assert res.tables["steps"]["step"].to_list() == [0, 1]
    assert res.metrics["steps_without_gpu_work"] == 2


def test_without_gpu_ops_steps_are_cpu_ranges():
    res = run_steps(build(nvtx=[R(1, 5, "iter 1"), R(5, 9, "iter 2")]))
    assert windows(res) == [(1 * MS, 5 * MS), (5 * MS, 9 * MS)]
    assert res.metrics["steps_projection"] == "cpu"


def test_most_frequent_thread_and_name_wins_and_overlaps_are_clipped():
    nvtx = [
        R(0, 12, "train_step"), R(10, 20, "train_step"), R(20, 30, "train_step"),
        R(0, 30, "iteration 1", tid=50), R(30, 60, "iteration 2", tid=50),
        R(0, 1, "forward"), R(1, 2, "forward"), R(2, 3, "forward"), R(3, 4, "forward"),
    ]
    res = run_steps(build(nvtx=nvtx))
    assert windows(res) == [(0, 10 * MS), (10 * MS, 20 * MS), (20 * MS, 30 * MS)]
    assert res.tables["steps"]["source"][0] == "nvtx:train_step"
    assert res.metrics["steps_thread"] == (1 << 24) | TID


def test_marks_and_cross_thread_ranges_are_not_steps():
    nvtx = [R(0, 0, "step 1", style="mark"), R(5, 5, "step 2", style="mark")]
    res = run_steps(build(nvtx=nvtx), periodicity=False)
    assert res.tables["steps"].is_empty()
    assert "no NVTX range" in res.metrics["steps_reason"]


@pytest.mark.parametrize(
    ("range_name", "n"),
    [("data copy in \\d+", 2), ("Batch", 2), ("batch", 2), ("nope", 0)],
)
def test_user_range_name(range_name, n):
    nvtx = [R(0, 1, "data copy in 1"), R(1, 2, "data copy in 2"), R(2, 3, "batch"),
            R(3, 4, "batch"), R(5, 6, "step 1"), R(6, 7, "step 2"), R(7, 8, "step 3")]
    res = run_steps(build(nvtx=nvtx), range_name=range_name)
    assert res.tables["steps"].height == n
    if n == 0:
        assert "range_name" in res.metrics["steps_reason"]


def _sequence(names: list[str], idle_before: str) -> list[dict]:
    """Kernels back to back (1 ms each), with 2 ms of idle before every ``idle_before``."""
    ops, t = [], 1.0
    for name in names:
        if name == idle_before:
            t += 2
        ops.append(K(t, t + 1, name=name))
        t += 1
    return ops


def test_periodicity_finds_iterations_not_layers():
    iteration = ["emb", *(["qkv", "attn", "mlp"] * 4), "loss", "bwd", "opt"]
    ops = _sequence(iteration * 5 + ["emb", "qkv"], idle_before="emb")
    res = run_steps(build(ops))
    t = res.tables["steps"]
    assert t["source"].unique().to_list() == ["periodicity"]
    assert res.metrics["step_period_kernels"] == len(iteration)
    assert res.metrics["step_anchor_kernel"] == "emb"
    # five whole iterations; the cut-off sixth is not a step
    per = (len(iteration) + 2) * MS
    assert windows(res) == [(3 * MS + k * per, 3 * MS + (k + 1) * per) for k in range(5)]


def test_periodicity_last_step_ends_after_one_period():
    iteration = ["a", "b", "c", "d"]
    res = run_steps(build(_sequence(iteration * 4, idle_before="a")))
    per = 6 * MS
    assert windows(res) == [(3 * MS + k * per, 3 * MS + (k + 1) * per) for k in range(3)] + [
        (3 * MS + 3 * per, 3 * MS + 3 * per + 4 * MS)
    ]


def test_no_period_no_steps():
    ops = _sequence([f"k{i % 7}{i % 5}{i % 3}" for i in range(40)], idle_before="")
    res = run_steps(build(ops))
    assert res.tables["steps"].is_empty()
    assert res.metrics["n_steps"] == 0 and "period" in res.metrics["steps_reason"]


def test_empty_trace():
    res = run_steps(build())
    assert res.tables["steps"].is_empty() and res.metrics["n_steps"] == 0


@pytest.mark.parametrize(
    ("durations", "warm"),
    [
        ([30, 10, 10, 11], [True, False, False, False]),
        ([30, 25, 10, 10, 10], [True, True, False, False, False]),
        ([12, 10, 10], [False, False, False]),  # 1.2x the median: not warm-up
        ([30, 10], [False, False]),  # fewer than 3 steps
        ([10, 30, 10, 10], [False, False, False, False]),  # only a leading run counts
    ],
)
def test_warmup(durations, warm):
    starts = [sum(durations[:i]) for i in range(len(durations))]
    nvtx = [R(s, s + d, f"step {i}") for i, (s, d) in enumerate(zip(starts, durations,
                                                                     strict=True))]
    res = run_steps(build(nvtx=nvtx))
    assert res.tables["steps"]["warmup"].to_list() == warm
    steady = [d for d, w in zip(durations, warm, strict=True) if not w]
    assert res.metrics["n_warmup_steps"] == sum(warm)
    assert res.metrics["step_mean_ns"] == pytest.approx(sum(steady) / len(steady) * MS)


@pytest.mark.parametrize("cls", [None, "weird"])
def test_primary_device_counts_ops_without_an_overlap_class(cls):
    # Device 1 is the busiest only through ops with no overlap class (null or unknown): the
    # state segments do not see them, so the primary device comes from the ops themselves.
    nvtx = [R(0, 10, "step 0"), R(10, 20, "step 1")]
    ops = [K(1, 4, api_s=0), K(11, 12, api_s=10 * MS),
           K(1, 9, dev=1, cls=cls, api_s=0), K(11, 19, dev=1, cls=cls, api_s=10 * MS)]
    tr = build(ops, nvtx=nvtx)
    res = run_steps(tr)
    timed = tr.frame("gpu_ops").filter(pl.col("start_ns") > 0)
    assert res.metrics["steps_device_id"] == steps.primary_device(timed) == 1


def test_per_step_metrics_use_the_primary_device():
    nvtx = [R(0, 10, "step 0"), R(10, 20, "step 1")]
    ops = [
        K(1, 5, api_s=0), K(4, 8, cls="nccl", stream=9, api_s=0),
        K(8.5, 9, cls="memcpy_h2d", kind="memcpy", stream=3, api_s=0),
        K(11, 19, api_s=10 * MS),
        K(1, 2, dev=1, cls="nccl", api_s=0),  # a less busy device: not in the metrics
    ]
    res = run_steps(build(ops, nvtx=nvtx))
    t = res.tables["steps"]
    assert res.metrics["steps_device_id"] == 0
    assert windows(res) == [(1 * MS, 11 * MS), (11 * MS, 20 * MS)]
    assert t["exposed_nccl_ns"].to_list() == [3 * MS, 0]
    assert t["h2d_unoverlapped_ns"].to_list() == [MS // 2, 0]
    assert t["idle_ns"].to_list() == [int(2.5 * MS), 1 * MS]
    assert t["gpu_busy_frac"].to_list() == pytest.approx([0.75, 8 / 9])


@pytest.mark.parametrize(
    "kwargs",
    [{"range_name": "("}, {"min_steps": 1}, {"warmup_factor": 1.0}, {"min_period_match": 0}],
)
def test_bad_params_raise_config_error(kwargs):
    with pytest.raises(ConfigError):
        steps.StepsParams(**kwargs)


@pytest.mark.parametrize("layout", ["2022.4", "2023.4"])
@pytest.mark.parametrize("name", PLANTED)
def test_planted_steps_and_exposed_nccl_per_step(name, layout, tmp_path):
    from nsysan.load import open_trace
    from nsysan.testing import scenarios

    path, truth = scenarios.build(name, tmp_path, layout)
    res = run_steps(open_trace(path))
    t = res.tables["steps"]
    assert t.height == len(truth.steps)
    assert t["source"].unique().to_list() == ["nvtx:step N"]
    # Each GPU window starts with the first kernel its CPU "step N" range launched.
    cpu_starts = [s for s, _ in truth.steps]
    assert all(g >= c for g, c in zip(t["start_ns"], cpu_starts, strict=True))
    assert t["end_ns"].to_list()[:-1] == t["start_ns"].to_list()[1:]
    if truth.exposed_nccl_per_step_ns:
        assert t["exposed_nccl_ns"].to_list() == truth.exposed_nccl_per_step_ns[0]
    busy = sum(d - i for d, i in zip(t["duration_ns"], t["idle_ns"], strict=True))
    assert busy == truth.devices[0].busy_ns  # the windows tile the device's busy time


def test_state_segments_are_shared_with_overlap_and_not_kept_after_analyze(monkeypatch):
    """Steps and overlap need the same state sweep: it runs once, and nothing holds it once
    `analyze` is done (also when overlap, which takes it over, did not run)."""
    from nsysan.api import analyze

    nvtx = [R(10 * k, 10 * k + 10, f"step {k}") for k in range(3)]
    ops = [K(10 * k + 5, 10 * k + 8, api_s=(10 * k + 1) * MS) for k in range(3)]
    calls = []
    sweep = steps._state_segments
    monkeypatch.setattr(steps, "_state_segments", lambda *a: calls.append(1) or sweep(*a))
    for passes, sweeps in ((["steps", "overlap"], 1), (["steps"], 1)):
        calls.clear()
        trace = build(ops, nvtx=nvtx)
        analyze(trace, passes=passes, findings=False)
        assert len(calls) == sweeps, passes
