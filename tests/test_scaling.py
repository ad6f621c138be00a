"""``nsysan scaling``: the planted 8 -> 64 GPU case of issue 22, recovered exactly, and the
runs that cannot be compared."""

from __future__ import annotations

import json
from dataclasses import replace

import polars as pl
import pytest
from click.testing import CliRunner

from nsysan.cli import cli
from nsysan.compare.scaling import ScalingParams, scaling
from nsysan.compare.scaling_measure import LinkParams, measure_run
from nsysan.errors import ConfigError
from nsysan.testing._model import KernelName
from nsysan.testing.scaling_job import ScalingJob, write_scaling_job

LINK = LinkParams(inter_node_gbps=25.0)
COMM_8, COMM_64, CONTENTION, LATE = 20_000_000, 170_000_000, 10_000_000, 37
# 10 GB/s of bus bandwidth over the 170 ms transfer on 64 ranks: 40% of a 25 GB/s link
BYTES = 863_492_064


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    d = tmp_path_factory.mktemp("scaling")
    t8 = write_scaling_job(d / "g8", ScalingJob(n_gpus=8, comm_ns=COMM_8,
                                                message_bytes=BYTES, payload_layout="json"))
    t64 = write_scaling_job(d / "g64", ScalingJob(
        n_gpus=64, comm_ns=COMM_64, contended_rank=LATE, contention_ns=CONTENTION,
        message_bytes=BYTES, layout="2023.4", payload_layout="binary"))
    runs = [measure_run(str(d / "g8"), label="8gpu", link=LINK),
            measure_run(str(d / "g64"), label="64gpu", link=LINK)]
    return d, t8, t64, runs, scaling(runs, ScalingParams(weak=True, link=LINK))


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """A 4- and a 16-GPU job (6 steps) for the command-line tests."""
    d = tmp_path_factory.mktemp("small")
    write_scaling_job(d / "g4", ScalingJob(n_gpus=4, n_steps=6))
    write_scaling_job(d / "g16", ScalingJob(n_gpus=16, n_steps=6, comm_ns=COMM_64,
                                            layout="2023.4", payload_layout="binary"))
    return d


def test_gpu_counts_from_the_data(case):
    _, _, _, runs, _ = case
    assert [(r.n_gpus, r.n_ranks, r.n_nodes) for r in runs] == [(8, 8, 1), (64, 64, 8)]


def test_weak_efficiency_is_the_step_time_ratio_with_an_interval(case):
    _, t8, t64, _, res = case
    e = res.efficiency.row(0, named=True)
    assert e["base_step_ns"] == pytest.approx(t8.mean("duration_ns"), rel=1e-12)
    assert e["new_step_ns"] == pytest.approx(t64.mean("duration_ns"), rel=1e-12)
    want = t8.mean("duration_ns") / t64.mean("duration_ns")
    assert e["efficiency"] == pytest.approx(want, rel=1e-12)
    assert 0.52 < want < 0.54
    assert e["ci_low"] <= e["efficiency"] <= e["ci_high"]
    assert e["ci_high"] - e["ci_low"] < 0.01  # steps barely vary


def test_efficiency_from_work_per_step_is_throughput_per_gpu(case):
    _, t8, t64, runs, _ = case
    res = scaling(runs, ScalingParams(work_per_step=(256.0, 256.0), link=LINK))  # strong
    e = res.efficiency.row(0, named=True)
    want = (256 / (t64.mean("duration_ns") * 64)) / (256 / (t8.mean("duration_ns") * 8))
    assert e["efficiency"] == pytest.approx(want, rel=1e-12)
    assert e["mode"] == "work"
    assert e["base_throughput_per_gpu"] == pytest.approx(
        256 / 8 / t8.mean("duration_ns") * 1e9, rel=1e-12)


def test_step_time_growth_decomposes_exactly(case):
    _, t8, t64, _, res = case
    e = res.efficiency.row(0, named=True)
    delta = e["new_step_ns"] - e["base_step_ns"]
    d = res.decomposition
    for by in ("state", "layer"):
        assert d.filter(pl.col("by") == by)["delta_ns_per_step"].sum() == pytest.approx(
            delta, abs=1e-3)
    states = {r["item"]: r for r in d.filter(pl.col("by") == "state").iter_rows(named=True)}
    for item in ("compute", "communication", "idle"):
        assert states[item]["base_ns_per_step"] == pytest.approx(t8.mean(item), abs=1e-6)
        assert states[item]["new_ns_per_step"] == pytest.approx(t64.mean(item), abs=1e-6)
    assert states["communication"]["share_of_delta"] > 0.99
    layers = {r["item"]: r["delta_ns_per_step"]
              for r in d.filter(pl.col("by") == "layer").iter_rows(named=True)}
    assert layers["NCCL:ncclAllReduce"] == pytest.approx(
        t64.mean("communication") - t8.mean("communication"), abs=1e-6)
    assert layers["forward"] == 0 and layers["backward"] == 0


def test_end_of_step_gap_per_step_and_rank(case):
    _, t8, t64, runs, res = case
    for truth, run in ((t8, runs[0]), (t64, runs[1])):
        got = {(r["rank"], r["step"]): r["end_gap_ns"] for r in run.steps.iter_rows(named=True)}
        assert got == {k: v["end_gap_ns"] for k, v in truth.steps.items()}
    e = res.efficiency.row(0, named=True)
    assert e["base_end_gap_comm_ns"] == pytest.approx(COMM_8)
    # 63 ranks wait 10 ms for the late one, then 170 ms of transfer; the late rank only 170
    assert e["new_end_gap_comm_ns"] == pytest.approx((63 * 180e6 + 170e6) / 64)


def test_planted_bus_bandwidth_and_its_share_of_the_link(case):
    _, _, t64, runs, res = case
    row = runs[1].collectives.row(0, named=True)
    assert row["op"] == "AllReduce" and row["message_bytes"] == BYTES
    assert row["transfer_ns"] == COMM_64
    assert row["transfer_busbw_gbps"] == pytest.approx(t64.busbw_gbps, rel=1e-9)
    assert row["transfer_busbw_gbps"] == pytest.approx(10.0, rel=1e-6)
    assert row["scope"] == "inter-node" and row["rated_gbps"] == 25.0
    assert row["link_share"] == pytest.approx(0.4, rel=1e-6)
    low = [f for f in res.findings if f.evidence["run"] == "64gpu"]
    assert [f.code for f in low] == ["NCCL_LOW_BANDWIDTH"]
    assert low[0].severity == "warning" and low[0].evidence["link_share"] == pytest.approx(0.4)


def test_the_contended_rank_is_named(case):
    _, _, _, _, res = case
    late = res.ranks.sort("wait_imposed_ns_per_step", descending=True).row(0, named=True)
    assert late["rank"] == LATE and late["n_last"] == 8
    assert late["wait_imposed_ns_per_step"] == pytest.approx(63 * CONTENTION)
    assert late["idle_growth_ns"] == pytest.approx(CONTENTION, rel=0.02)
    others = res.ranks.filter(pl.col("rank") != LATE)
    assert others["n_last"].sum() == 0 and others["wait_imposed_ns_per_step"].sum() == 0
    assert others["wait_ns_per_step"].to_list() == pytest.approx([CONTENTION] * 63)
    # at 8 GPUs everyone arrives together: nobody is last (skew under the threshold)
    assert case[3][0].ranks["n_last"].sum() == 0


def test_verdict_names_exposed_communication(case):
    v = case[4].verdict
    assert v.startswith("8gpu → 64gpu (8 → 64 GPUs): scaling efficiency 53.0%")
    assert "The loss is exposed communication" in v
    assert "ends with 179.8 ms of exposed AllReduce" in v and "was 20.0 ms" in v
    assert "40% of the rated 25 GB/s inter-node link" in v
    assert f"Rank {LATE} arrived last" in v


def test_cli_writes_every_output_and_refuses_a_foreign_folder(small, tmp_path):
    d = small
    out = tmp_path / "out"
    args = ["scaling", str(d / "g4"), str(d / "g16"), "--weak", "--inter-node-gbps", "25",
            "-o", str(out)]
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 0, r.output
    names = {p.name for p in out.iterdir()}
    assert {"scaling.md", "scaling.json", "scaling.parquet", "scaling_decomposition.parquet",
            "scaling_steps.parquet", "scaling_ranks.parquet", "scaling_collectives.parquet",
            "scaling.png"} <= names
    doc = json.loads((out / "scaling.json").read_text())
    assert doc["comparable"] and [r["n_gpus"] for r in doc["runs"]] == [4, 16]
    e = doc["efficiency"][0]
    assert e["efficiency"] == pytest.approx(e["base_step_ns"] / e["new_step_ns"], rel=1e-12)
    assert pl.read_parquet(out / "scaling_steps.parquet").height == 4 * 6 + 16 * 6
    assert CliRunner().invoke(cli, args).exit_code == 0  # its own files: replaced
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "scaling.md").write_text("mine")
    r = CliRunner().invoke(cli, [*args[:-1], str(foreign)])
    assert r.exit_code == 1 and "not written by nsysan" in r.output
    assert (foreign / "scaling.md").read_text() == "mine"


@pytest.mark.parametrize("extra, message", [
    ([], "--weak"),
    (["--samples-per-step", "8"], "one per RUN"),
    (["--weak", "--samples-per-step", "8", "--samples-per-step", "8"], "exclude"),
])
def test_cli_usage_errors(small, extra, message):
    r = CliRunner().invoke(cli, ["scaling", str(small / "g4"), str(small / "g16"), *extra])
    assert r.exit_code == 2 and message in r.output


def test_different_workloads_exit_4(small, tmp_path):
    other = KernelName("void conv_fwd<half>(half const*, half*)", "conv_fwd")
    write_scaling_job(tmp_path / "other", ScalingJob(n_gpus=8, compute_kernel=other,
                                                     n_steps=6))
    r = CliRunner().invoke(cli, ["scaling", str(small / "g4"), str(tmp_path / "other"),
                                 "--weak"])
    assert r.exit_code == 4, r.output
    assert "different workloads" in r.output


def test_missing_steps_exit_4(small, tmp_path):
    write_scaling_job(tmp_path / "nosteps", ScalingJob(n_gpus=8, n_steps=1, step_name=None))
    r = CliRunner().invoke(cli, ["scaling", str(small / "g4"), str(tmp_path / "nosteps"),
                                 "--weak", "--json"])
    assert r.exit_code == 4, r.output
    doc = json.loads(r.output)
    assert not doc["comparable"] and "missing steps" in doc["not_comparable"][0]


def test_same_scale_is_not_comparable(case):
    runs = case[3]
    res = scaling([runs[0], runs[0]], ScalingParams(weak=True))
    assert not res.comparable and "both use 8 GPUs" in res.blockers[0]
    # among other scales, a same-scale pair is left out with a note
    res = scaling([runs[0], runs[1], runs[1]], ScalingParams(weak=True))
    assert res.comparable and res.efficiency.height == 2
    assert any("both use 64 GPUs" in n for n in res.notes)


def test_params_are_checked():
    with pytest.raises(ConfigError):
        ScalingParams()
    with pytest.raises(ConfigError):
        ScalingParams(work_per_step=(0.0, 1.0))
    with pytest.raises(ConfigError):
        LinkParams(inter_node_gbps=-1)


def test_output_folders_as_runs(small, tmp_path):
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "manifest.json").write_text("{}")
    with pytest.raises(ConfigError, match="names no input profile"):
        measure_run(str(tmp_path / "bad"))
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "ranks.parquet").write_bytes(b"")
    with pytest.raises(ConfigError, match="job or comparison output folder"):
        measure_run(str(tmp_path / "job"))
    # an analyze output root stands for the profile it analysed, read again
    import shutil

    src = tmp_path / "g4"
    shutil.copytree(small / "g4", src)
    out = tmp_path / "analysed"
    assert CliRunner().invoke(cli, ["analyze", str(src / "node00.sqlite"), "-o",
                                    str(out)]).exit_code == 0
    got = measure_run(str(out), label="x")
    want = measure_run(str(src), label="x")
    assert got.steps.equals(want.steps) and got.n_gpus == 4
    (src / "node00.sqlite").write_bytes((src / "node00.sqlite").read_bytes() + b"\0")
    with pytest.raises(ConfigError, match="changed since it was analysed"):
        measure_run(str(out))
    (src / "node00.sqlite").unlink()
    r = CliRunner().invoke(cli, ["scaling", str(out), str(small / "g16"), "--weak"])
    assert r.exit_code == 1 and "is not there any more" in r.output


def test_real_multirank_traces_analyse_with_sizes_unknown(shared_traces):
    h100 = measure_run(str(shared_traces / "nsysai-h100-2gpu" / "mfu_2gpu_before.sqlite"))
    assert (h100.n_gpus, h100.n_ranks) == (2, 2) and h100.steps.height > 0
    assert h100.collectives["message_bytes"].null_count() == h100.collectives.height
    assert any("message sizes unknown" in n for n in h100.notes)
    boot = sorted((shared_traces / "gpubootcamp-jacobi-multigpu").glob("*.sqlite"))
    mpi = measure_run(",".join(map(str, boot)))
    assert mpi.n_ranks == 2 and mpi.steps.height > 0
    res = scaling([h100, mpi], ScalingParams(weak=True))
    assert not res.comparable  # a training job and a Jacobi solver


def test_outputs_are_deterministic(small, tmp_path):
    from polars.testing import assert_frame_equal

    files = sorted((small / "g16").glob("*.sqlite"))
    one, two = (measure_run(f, label="16gpu", link=LINK) for f in
                (",".join(map(str, files)), list(reversed(files))))
    for name in ("steps", "layers", "collectives", "ranks"):
        assert_frame_equal(getattr(one, name), getattr(two, name))
    outs = []
    for k in range(2):
        out = tmp_path / f"o{k}"
        args = ["scaling", str(small / "g4"), str(small / "g16"), "--weak", "-o", str(out)]
        assert CliRunner().invoke(cli, args).exit_code == 0
        outs.append({p.name: p.read_bytes() for p in out.iterdir()})
    assert outs[0].keys() == outs[1].keys()
    for name in outs[0]:
        assert outs[0][name] == outs[1][name], name


def test_cli_bad_input_is_one_error_line(small, tmp_path):
    r = CliRunner().invoke(cli, ["scaling", str(tmp_path / "absent"), str(small / "g4"),
                                 "--weak"])
    assert r.exit_code == 1 and r.output.startswith("Error: ") and "absent" in r.output


def test_real_mpi_ranks_without_nccl_compare(shared_traces):
    """Rank 3 alone vs ranks 3 and 7 of the gpubootcamp Jacobi job: same work per GPU, no
    NCCL (CUDA-aware MPI copies), so no collectives table and no sizes."""
    boot = sorted((shared_traces / "gpubootcamp-jacobi-multigpu").glob("*.sqlite"))
    one, two = measure_run(str(boot[0]), label="r3"), measure_run(",".join(map(str, boot)),
                                                                  label="r3+r7")
    res = scaling([one, two], ScalingParams(weak=True))
    assert res.comparable, res.blockers
    e = res.efficiency.row(0, named=True)
    assert e["ci_low"] <= e["efficiency"] <= e["ci_high"]
    assert e["efficiency"] == pytest.approx(e["base_step_ns"] / e["new_step_ns"], rel=1e-12)
    for by in ("state", "layer"):
        got = res.decomposition.filter(pl.col("by") == by)["delta_ns_per_step"].sum()
        assert got == pytest.approx(e["new_step_ns"] - e["base_step_ns"], abs=1e-3)
    assert "No NCCL kernels" in res.verdict


def test_cli_work_per_step_per_run(small):
    r = CliRunner().invoke(cli, ["scaling", str(small / "g4"), str(small / "g16"),
                                 "--samples-per-step", "128", "--samples-per-step", "1024",
                                 "--json"])
    assert r.exit_code == 0, r.output
    e = json.loads(r.output)["efficiency"][0]
    want = (1024 / (e["new_step_ns"] * 16)) / (128 / (e["base_step_ns"] * 4))
    assert e["mode"] == "work" and e["efficiency"] == pytest.approx(want, rel=1e-12)
    assert e["new_throughput_per_gpu"] == pytest.approx(1024 / 16 / e["new_step_ns"] * 1e9)


def test_host_evidence_of_the_rank_profiles(case, tmp_path):
    """A rank profile with CPU sampling and context switches is analysed with the host pass:
    a descheduled launcher (planted, nsysan.testing.host_scenarios) is named as CPU contention;
    a GPU-bound profile with host data is not; profiles without host data say so."""
    from nsysan.compare.scaling import _host_evidence
    from nsysan.compare.scaling_measure import host_evidence
    from nsysan.multirank.job import analyze_job
    from nsysan.testing import host_scenarios as hs

    contended, _ = hs.descheduled_launcher(tmp_path / "contended.sqlite")
    healthy, _ = hs.gpu_bound_driver_wait(tmp_path / "healthy.sqlite")
    captured, hits = host_evidence(analyze_job([contended]))
    assert captured and hits == ["CPU_CONTENTION (contended)"]
    captured, hits = host_evidence(analyze_job([healthy]))
    assert captured and hits == []
    run8 = case[3][0]
    assert (run8.host_captured, run8.host_findings) == (False, [])
    assert "no host evidence in these profiles" in _host_evidence(run8)
    named = _host_evidence(replace(run8, host_findings=["CPU_CONTENTION (r3)"],
                                   host_captured=True))
    assert "CPU_CONTENTION (r3)" in named and "--bind-to core" in named
    quiet = _host_evidence(replace(run8, host_captured=True))
    assert "show no CPU contention" in quiet
