"""Named baselines: the local store, the catalog store, resolution of diff/check inputs, CLI."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import diff_pairs
import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from nsysan.api import write_outputs
from nsysan.batch.catalog import BASELINES, Catalog
from nsysan.batch.worker import RunRecord
from nsysan.cli import cli
from nsysan.compare import baseline as bl
from nsysan.compare import metrics as M
from nsysan.errors import ConfigError


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return diff_pairs.get("exposed_allreduce", tmp_path_factory.getbasetemp() / "diff-pairs")


@pytest.fixture(scope="module")
def analysis(pair, tmp_path_factory) -> Path:
    """``nsysan analyze`` output of the pair's base run."""
    return write_outputs(pair.base_result, tmp_path_factory.mktemp("analysis"))


@pytest.fixture(autouse=True)
def _no_env(monkeypatch):
    monkeypatch.delenv("NSYSAN_CATALOG", raising=False)
    monkeypatch.delenv("NSYSAN_BASELINES", raising=False)


def test_local_save_from_output_dir_copies_the_analysis(analysis, tmp_path):
    store = bl.LocalStore(tmp_path / "bl")
    rec = store.save("main", analysis)
    d = tmp_path / "bl" / "main"
    assert rec.output_dir == str(d.resolve()) and rec.where == "local"
    assert {"steps.parquet", "findings.json", "manifest.json", "baseline.json"} <= {
        p.name for p in d.iterdir()}
    assert not any(p.suffix in (".png", ".html") for p in d.iterdir())  # only what diffs read
    assert rec.trace_id == "exposed_allreduce-base"
    assert rec.headline["step_time_ns"] == pytest.approx(M.from_dir(analysis).value(
        "step_time_ns"))
    assert store.get("main") == rec
    # the stored analysis gives exactly the metrics of the original directory
    a, b = M.from_dir(analysis), bl.load(rec)
    assert {k: m.value for k, m in a.metrics.items()} == {k: m.value for k, m in b.metrics.items()}


def test_local_save_from_trace_replaces_by_name(pair, tmp_path):
    store = bl.LocalStore(tmp_path)
    first = store.save("main", pair.base_path)
    second = store.save("main", pair.new_path)
    assert (first.trace_id, second.trace_id) == ("exposed_allreduce-base", "exposed_allreduce-new")
    assert [b.name for b in store.list()] == ["main"]
    assert store.get("main").trace_id == "exposed_allreduce-new"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp leftovers


@pytest.mark.parametrize("name", ["", "../x", "a b", "-x", "x" * 101, "a/b"])
def test_invalid_names(tmp_path, name, analysis):
    with pytest.raises(ConfigError, match="invalid"):
        bl.LocalStore(tmp_path).save(name, analysis)


def test_save_missing_target(tmp_path):
    with pytest.raises(ConfigError, match="no such trace"):
        bl.LocalStore(tmp_path).save("x", tmp_path / "missing.sqlite")


def test_resolve_order(pair, analysis, tmp_path):
    store = bl.LocalStore(tmp_path / "bl")
    store.save("main", analysis)
    by_name = bl.resolve("main", store=store)
    assert by_name.trace_id == "exposed_allreduce-base" and by_name.source.startswith(
        "baseline main")
    assert bl.resolve(str(analysis), store=store).source == str(analysis)
    assert bl.resolve(str(analysis.parent), store=store).source == str(analysis)  # OUT root
    assert bl.resolve(str(pair.new_path), store=store).trace_id == "exposed_allreduce-new"
    with pytest.raises(ConfigError, match=r"'nope' is not a trace.*baselines: main"):
        bl.resolve("nope", store=store)


def test_baseline_whose_analysis_vanished(analysis, tmp_path):
    store = bl.LocalStore(tmp_path)
    rec = store.save("main", analysis)
    rec.output_dir = str(tmp_path / "gone")
    with pytest.raises(ConfigError, match="is gone"):
        bl.load(rec)


def _catalog_with_run(tmp_path: Path, trace_id: str, out_dir: Path) -> str:
    url = f"sqlite:///{tmp_path / 'catalog.db'}"
    now = datetime.now(timezone.utc)
    with Catalog(url) as cat:
        cat.record(RunRecord(run_id=f"b1:{trace_id}", batch_id="b1", trace_id=trace_id,
                             status="ok", input_path="x.sqlite", input_format="sqlite",
                             output_dir=str(out_dir), started_utc=now, finished_utc=now,
                             metrics={"step_mean_ns": 30.9e6, "gpu_busy_frac": 0.97}))
    return url


def test_catalog_store(analysis, pair, tmp_path):
    url = _catalog_with_run(tmp_path, "exposed_allreduce-base", analysis)
    store = bl.open_store(url, tmp_path / "files")
    assert isinstance(store, bl.CatalogStore)
    # naming a catalog run: its output directory is the baseline, nothing is copied
    rec = store.save("nightly", "exposed_allreduce-base")
    assert rec.where == "catalog" and rec.output_dir == str(analysis)
    assert rec.run_id == "b1:exposed_allreduce-base"
    assert not (tmp_path / "files").exists()
    # saving a trace file stores the analysis locally and records it in the catalog
    rec2 = store.save("pr", pair.new_path)
    assert Path(rec2.output_dir).parent == tmp_path / "files"
    with Catalog(url) as cat:
        rows = cat.read(lambda c: c.execute(sa.select(BASELINES.c.name, BASELINES.c.output_dir)
                                            .order_by(BASELINES.c.name)).all())
    assert [tuple(r) for r in rows] == [("nightly", str(analysis)), ("pr", rec2.output_dir)]
    assert [b.name for b in store.list()] == ["nightly", "pr"]
    assert store.get("nightly").headline["step_time_ns"] == 30.9e6
    assert bl.resolve("pr", store=store).trace_id == "exposed_allreduce-new"
    with pytest.raises(ConfigError, match="no successful run"):
        store.save("x", "unknown-trace")


def test_cli_baseline_commands(analysis, pair, tmp_path, monkeypatch):
    monkeypatch.setenv("NSYSAN_BASELINES", str(tmp_path / "bl"))
    run = CliRunner()
    r = run.invoke(cli, ["baseline", "save", "main", str(analysis)])
    assert r.exit_code == 0 and "saved baseline main (local)" in r.output, r.output
    r = run.invoke(cli, ["baseline", "list"])
    assert r.exit_code == 0 and r.output.startswith("main\t")
    r = run.invoke(cli, ["baseline", "list", "--json"])
    assert json.loads(r.output)[0]["trace_id"] == "exposed_allreduce-base"
    r = run.invoke(cli, ["baseline", "show", "main"])
    assert r.exit_code == 0 and "24 steady of 24" in r.output
    r = run.invoke(cli, ["baseline", "show", "main", "--json"])
    assert json.loads(r.output)["info"]["n_steps"] == 24
    r = run.invoke(cli, ["baseline", "show", "nope"])
    assert r.exit_code == 1 and "no baseline 'nope' (baselines: main)" in r.output
    # the name works as either side of a diff and as the baseline of a check
    r = run.invoke(cli, ["diff", "main", str(pair.new_path), "--fail-on-regression"])
    assert r.exit_code == 3 and "regressed" in r.output, r.output
    budget = tmp_path / "b.toml"
    budget.write_text('baseline = "main"\nrules = ["step_time_ms <= baseline * 1.05"]\n')
    r = run.invoke(cli, ["check", str(pair.new_path), "--budget", str(budget)])
    assert r.exit_code == 3 and r.output.startswith("FAIL"), r.output


def test_cli_baseline_with_catalog(analysis, tmp_path):
    url = _catalog_with_run(tmp_path, "exposed_allreduce-base", analysis)
    r = CliRunner().invoke(cli, ["baseline", "save", "nightly", "exposed_allreduce-base",
                                 "--catalog", url, "--store", str(tmp_path / "files")])
    assert r.exit_code == 0 and "(catalog)" in r.output, r.output
    r = CliRunner().invoke(cli, ["baseline", "list"], env={"NSYSAN_CATALOG": url})
    assert r.exit_code == 0 and r.output.startswith("nightly\t"), r.output
