"""`nsysan diff` on synthetic pairs with planted changes: decomposition, verdicts, noise,
identical metrics from a result and from its output directory, explicit "not comparable"."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import diff_pairs
import numpy as np
import polars as pl
import pytest
from click.testing import CliRunner

from nsysan.api import analyze, write_outputs
from nsysan.cli import cli
from nsysan.compare import metrics as M
from nsysan.compare.decompose import DECOMPOSITION
from nsysan.compare.diff import DIFF, diff
from nsysan.compare.render import DIFF_FILES, write_diff
from nsysan.testing.scenarios import build

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.getbasetemp() / "diff-pairs"


def _decomp(res, by: str) -> dict[str, float]:
    d = res.decomposition.filter(pl.col("by") == by)
    return dict(zip(d["item"].to_list(), d["delta_ns_per_step"].to_list(), strict=True))


def _largest(parts: dict[str, float]) -> str:
    return max(parts, key=lambda k: abs(parts[k]))


@pytest.mark.parametrize(
    ("kind", "state", "layer"),
    [("exposed_allreduce", "communication", "NCCL:ncclAllReduce"),
     ("data_loader", "idle", "DataLoader.__next__")],
)
def test_decomposition_finds_the_planted_change(root, kind, state, layer):
    pair = diff_pairs.get(kind, root)
    truth = pair.truth
    assert (truth.state, truth.layer) == (state, layer)
    planted = truth.delta_ns_per_step
    assert planted > 1e6  # the pair really plants a change of milliseconds per step
    assert truth.state_delta_ns_per_step[state] == pytest.approx(planted, rel=1e-3)
    res = diff(pair.base, pair.new)
    step = res.row("step_time_ns")
    assert step["delta"] == pytest.approx(planted, rel=0.01)
    states, layers = _decomp(res, "state"), _decomp(res, "layer")
    # exact partitions: the parts add up to the change of mean step time
    assert sum(states.values()) == pytest.approx(step["delta"], rel=1e-9)
    assert sum(layers.values()) == pytest.approx(step["delta"], rel=1e-9)
    assert _largest(states) == state
    assert states[state] == pytest.approx(planted, rel=0.01)
    assert _largest(layers) == layer
    assert layers[layer] == pytest.approx(planted, rel=0.01)
    for other, v in states.items():
        if other != state:
            assert abs(v) < 0.01 * planted, other


def test_exposed_allreduce_verdicts(root):
    res = diff(diff_pairs.get("exposed_allreduce", root).base,
               diff_pairs.get("exposed_allreduce", root).new)
    verdict = {(r["metric"], r["stat"]): r["verdict"] for r in res.rows.iter_rows(named=True)}
    assert res.verdict() == "regressed"
    for key in [("step_time_ns", "mean"), ("step_time_ns", "p50"), ("step_time_ns", "p95"),
                ("steps_per_s", "mean"), ("exposed_nccl_ns_per_step", "mean"),
                ('state["communication"].ns_per_step', "mean"),
                ('layer["NCCL:ncclAllReduce"].exclusive_ns_per_step', "mean"),
                ('nccl["AllReduce"].exposed_ns_per_step', "mean")]:
        assert verdict[key] == "regressed", key
    for key in [('state["compute"].ns_per_step', "mean"), ("idle_ns_per_step", "mean"),
                ('layer["forward"].exclusive_ns_per_step', "mean"),
                ("kernels_per_step", "value"), ('nccl["AllReduce"].count_per_step', "mean")]:
        assert verdict[key] == "unchanged", key
    row = res.row("exposed_nccl_ns_per_step")
    assert row["ci_low"] <= 3e6 <= row["ci_high"] and row["method"] == "bootstrap"


def test_data_loader_stalls_move_mean_and_p95_not_p50(root):
    pair = diff_pairs.get("data_loader", root)
    res = diff(pair.base, pair.new)
    assert res.row("step_time_ns", "mean")["verdict"] == "regressed"
    assert res.row("step_time_ns", "p95")["verdict"] == "regressed"
    assert res.row("step_time_ns", "p50")["verdict"] == "unchanged"  # 3 steps in 4 are as fast
    assert res.row('idle["DataLoader.__next__"].ns_per_step')["verdict"] == "regressed"


def test_jitter_alone_is_unchanged_on_every_metric(root):
    pair = diff_pairs.get("jitter", root)
    a, b = pair.base, pair.new
    # the runs really differ step by step (+-2 % per step, independently)
    sa, sb = a.get("step_time_ns").samples, b.get("step_time_ns").samples
    assert np.ptp(sa / sb) > 0.02
    res = diff(a, b)
    assert res.rows.height > 40
    bad = res.rows.filter(pl.col("verdict") != "unchanged")
    assert bad.is_empty(), bad.select("metric", "stat", "rel_delta", "verdict")
    assert res.verdict() == "unchanged"


def _assert_same(x: M.MetricSet, y: M.MetricSet) -> None:
    assert x.metrics.keys() == y.metrics.keys()
    for key, m in x.metrics.items():
        n = y.metrics[key]
        assert (m.value, m.window, m.note) == (n.value, n.window, n.note), key
        for a, b in ((m.samples, n.samples), (m.weights, n.weights)):
            assert (a is None) == (b is None), key
            if a is not None:
                assert np.array_equal(a, b), key
    assert dataclasses.asdict(x.info) == dataclasses.asdict(y.info)


def test_metrics_identical_from_result_and_from_output_dir(root, tmp_path):
    pair = diff_pairs.get("data_loader", root)
    for result in (pair.base_result, pair.new_result):
        out = write_outputs(result, tmp_path / "out")
        _assert_same(M.from_result(result), M.from_dir(out))
    dirs = [tmp_path / "out" / r.trace_id for r in (pair.base_result, pair.new_result)]
    from_dirs = diff(M.from_dir(dirs[0]), M.from_dir(dirs[1]))
    from_results = diff(pair.base, pair.new)
    assert from_dirs.rows.equals(from_results.rows)
    assert from_dirs.decomposition.equals(from_results.decomposition)


# -- not comparable ------------------------------------------------------------------------------
def _with(run, **changes):
    return dataclasses.replace(run, **changes)


def _reasons(res, pattern: str) -> pl.DataFrame:
    return res.rows.filter(pl.col("reason").fill_null("").str.contains(pattern, literal=True))


def test_different_workload_makes_everything_not_comparable(root):
    pair = diff_pairs.get("jitter", root)
    new = pair.new_run()
    renamed = new.tables["kernels"].with_columns(pl.format("other_{}", "short_name")
                                                 .alias("short_name"))
    res = diff(pair.base, M.extract(_with(new, tables={**new.tables, "kernels": renamed})))
    assert not res.comparable and res.verdict() == "not comparable"
    assert res.check.kernel_mix_similarity == 0.0
    assert set(res.rows["verdict"]) == {"not comparable"}
    assert res.rows["reason"].str.contains("different workloads").all()


def test_nvtx_on_one_side_only_blocks_layer_metrics(root):
    pair = diff_pairs.get("jitter", root)
    new = pair.new_run()
    tables = {k: v for k, v in new.tables.items() if k != "attribution"}
    res = diff(pair.base, M.extract(_with(new, tables=tables,
                                          not_captured={**new.not_captured, "nvtx": "absent"})))
    assert res.comparable
    layer_rows = res.rows.filter(pl.col("kind") == "layer")
    assert set(layer_rows["verdict"]) == {"not comparable"}
    assert layer_rows["reason"].str.contains("nvtx traced in BASE only").all()
    assert res.row("step_time_ns")["verdict"] == "unchanged"  # run-wide metrics still compare


def test_traced_domains_from_capture_settings(root):
    pair = diff_pairs.get("jitter", root)
    base = M.extract(_with(pair.base_run(), capture={
        "CAPTURE_EVENT_TYPE": ["Cuda", "NvtxEvents", "OSRuntime"]}))
    new = M.extract(_with(pair.new_run(), capture={"CAPTURE_EVENT_TYPE": ["Cuda", "OSRuntime"]}))
    res = diff(base, new)
    assert res.comparable
    assert "different capture: traced domains differ (NvtxEvents)" in res.check.notes
    for kind in ("layer", "idle"):
        rows = res.rows.filter(pl.col("kind") == kind)
        assert set(rows["verdict"]) == {"not comparable"}, kind
    assert res.row('state["compute"].ns_per_step')["verdict"] == "unchanged"


def test_cuda_graph_mode_blocks_kernel_metrics(root):
    pair = diff_pairs.get("jitter", root)
    key = "PROCESS_0:CUDA_GRAPH_TRACE_OPTIONS:MODE"
    base = M.extract(_with(pair.base_run(), capture={key: ["Graph"]}))
    new = M.extract(_with(pair.new_run(), capture={key: ["Node"]}))
    res = diff(base, new)
    kernel_rows = res.rows.filter(pl.col("kind") == "kernel")
    assert not kernel_rows.is_empty()
    assert set(kernel_rows["verdict"]) == {"not comparable"}
    assert not _reasons(res, "CUDA graph trace mode graph vs node").is_empty()
    assert res.row("kernels_per_step")["verdict"] == "not comparable"
    assert res.row("step_time_ns")["verdict"] == "unchanged"


def test_missing_steps_on_one_side(root):
    pair = diff_pairs.get("jitter", root)
    new = pair.new_run()
    tables = {k: v for k, v in new.tables.items() if k != "steps"}
    res = diff(pair.base, M.extract(_with(new, tables=tables)))
    step = res.row("step_time_ns")
    assert step["verdict"] == "not comparable" and "missing steps in NEW" in step["reason"]
    assert res.row("gpu_busy_frac")["verdict"] == "not comparable"
    # whole-trace kernel statistics do not need steps
    assert res.row('kernel["reduce_kernel"].mean_ns')["verdict"] == "unchanged"
    assert res.decomposition.filter(pl.col("by") == "state")["new_ns_per_step"].sum() == 0


def test_step_sources_must_match(root):
    pair = diff_pairs.get("jitter", root)
    new = pair.new_run()
    steps = new.tables["steps"].with_columns(pl.lit("periodicity").alias("source"))
    res = diff(pair.base, M.extract(_with(new, tables={**new.tables, "steps": steps})))
    assert "step boundaries differ" in res.row("step_time_ns")["reason"]


# -- files and CLI -------------------------------------------------------------------------------
def test_write_diff_files(root, tmp_path):
    pair = diff_pairs.get("exposed_allreduce", root)
    res = diff(pair.base, pair.new)
    write_diff(res, tmp_path)
    assert all((tmp_path / f).is_file() for f in DIFF_FILES)
    assert pl.read_parquet(tmp_path / "diff.parquet").schema == DIFF
    assert pl.read_parquet(tmp_path / "diff_decomposition.parquet").schema == DECOMPOSITION
    doc = json.loads((tmp_path / "diff.json").read_text())
    assert doc["verdict"] == "regressed" and doc["comparable"] is True
    assert len(doc["metrics"]) == res.rows.height
    md = (tmp_path / "diff.md").read_text()
    assert "![decomposition of the step-time change](diff_decomposition.png)" in md
    assert "NCCL:ncclAllReduce" in md and "**regressed**" in md
    assert (tmp_path / "diff_decomposition.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(
    ("kind", "code", "headline"),
    [("exposed_allreduce", 3, "regressed"), ("jitter", 0, "unchanged")],
)
def test_cli_diff_exit_codes(root, tmp_path, kind, code, headline):
    pair = diff_pairs.get(kind, root)
    out = tmp_path / "d"
    r = CliRunner().invoke(cli, ["diff", str(pair.base_path), str(pair.new_path), "-o", str(out),
                                 "--fail-on-regression"])
    assert r.exit_code == code, r.output
    assert f": {headline} (" in r.output.splitlines()[0]
    assert (out / "diff.md").is_file()


def test_cli_diff_not_comparable_exit_4(root, tmp_path):
    pair = diff_pairs.get("jitter", root)
    other, _ = build("launch_bound", tmp_path)  # another workload: tiny kernels
    r = CliRunner().invoke(cli, ["diff", str(pair.base_path), str(other), "--fail-on-regression"])
    assert r.exit_code == 4, r.output
    assert "not comparable: different workloads" in r.output


def test_cli_diff_json_and_dirs(root, tmp_path):
    pair = diff_pairs.get("exposed_allreduce", root)
    out = write_outputs(pair.base_result, tmp_path / "an")
    # an analyze output root holding one trace works as well as the trace directory itself
    r = CliRunner().invoke(cli, ["diff", str(tmp_path / "an"), str(pair.new_path), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["base"]["source"] == str(out) and doc["verdict"] == "regressed"


def test_cli_diff_unknown_input(tmp_path, monkeypatch):
    monkeypatch.setenv("NSYSAN_BASELINES", str(tmp_path / "none"))
    monkeypatch.delenv("NSYSAN_CATALOG", raising=False)
    r = CliRunner().invoke(cli, ["diff", "no-such-baseline", str(tmp_path)])
    assert r.exit_code == 1
    assert "BASE 'no-such-baseline' is not a trace, an analyze output directory or a baseline" \
        in r.output


def test_docs_list_every_metric():
    doc = (REPO / "docs" / "diff.md").read_text()
    for spec in M.CATALOGUE:
        assert re.search(rf"\b{re.escape(spec.name)}\b", doc), spec.name


def test_analyze_is_deterministic_input(root):
    # the pairs are deterministic: rebuilding gives the same planted amount
    pair = diff_pairs.get("exposed_allreduce", root)
    again = analyze(pair.new_path)
    assert M.from_result(again).value("step_time_ns") == pair.new.value("step_time_ns")


def test_per_step_layers_are_the_layers_of_the_layers_table(root):
    pair = diff_pairs.get("exposed_allreduce", root)
    layers = pair.new_result.table("layers").select(
        pl.when(pl.col("domain").fill_null("") == "").then(pl.col("name"))
        .otherwise(pl.format("{}:{}", "domain", "name")))
    labels = set(layers.to_series().to_list())
    per_step = set(pair.new.selectors("layer", "exclusive_ns_per_step")) - {"(outside NVTX ranges)"}
    assert "step N" in per_step and "NCCL:ncclAllReduce" in per_step
    assert per_step <= labels
