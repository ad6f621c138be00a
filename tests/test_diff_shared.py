"""`nsysan diff` on the two real captures of the sc22 DDP workload (2021 .qdrep and 2022
.nsys-rep, both exported by nsys 2022.4): comparable, normalised per step, a verdict per
metric."""

from __future__ import annotations

import polars as pl
import pytest

from nsysan.api import analyze
from nsysan.compare import metrics as M
from nsysan.compare.diff import diff

SC22 = "sc22-ddp-4gpu-nccl"
pytestmark = pytest.mark.shared


@pytest.fixture(scope="module")
def sc22(shared_traces):
    old = M.from_result(analyze(shared_traces / SC22 / "4gpu_baseline.qdrep.nsys2022.4.2.sqlite"))
    new = M.from_result(analyze(
        shared_traces / SC22 / "4gpu_baseline.nsys-rep.nsys2022.4.2.sqlite"))
    return old, new


def test_sc22_captures_diff_per_step(sc22):
    old, new = sc22
    res = diff(old, new)
    assert res.comparable, res.check.blockers
    assert res.check.kernel_mix_similarity > 0.6  # the same model, other cuDNN algorithms
    # different numbers of steps, compared per step
    assert (old.info.n_steps, new.info.n_steps) == (23, 59)
    step = res.row("step_time_ns")
    assert step["n_base"] == 23 and step["n_new"] == 59
    assert step["base"] == pytest.approx(50.63e6, rel=1e-3)
    assert step["new"] == pytest.approx(30.74e6, rel=1e-3)
    assert step["verdict"] == "improved" and step["method"] == "bootstrap"
    # a verdict for every run-wide and per-state metric, none of them "not comparable"
    core = res.rows.filter(pl.col("kind").is_null() | (pl.col("kind") == "state"))
    assert core.height >= 17
    assert set(core["verdict"]) <= {"improved", "regressed", "unchanged"}
    assert res.row("nccl_ops_per_step")["verdict"] == "unchanged"  # 8 AllReduce per step, both
    # where the 20 ms per step went: compute, mostly
    states = res.decomposition.filter(pl.col("by") == "state")
    assert states["item"][0] == "compute"
    assert states["delta_ns_per_step"].sum() == pytest.approx(step["delta"], rel=1e-9)
    # every row has a verdict; "not comparable" rows say why (kernels present on one side)
    nc = res.rows.filter(pl.col("verdict") == "not comparable")
    assert nc["reason"].is_not_null().all()
    assert nc["metric"].str.starts_with("kernel[").all()
