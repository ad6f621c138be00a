"""`nsysan batch` end to end on small synthetic traces plus a corrupt file: resumability,
failure isolation, kill-and-resume, the Dask executor, the CLI.

One archive is analyzed once in-process (the `reference` fixture); every other mode must
produce identical Parquet tables and catalog rows.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner
from polars.testing import assert_frame_equal

from nsysan.batch import queries, state
from nsysan.batch.catalog import Catalog, catalog_url
from nsysan.batch.run import run_batch
from nsysan.cli_batch import batch as batch_cmd
from nsysan.cli_batch import catalog as catalog_cmd
from nsysan.errors import ConfigError, TraceFormatError
from nsysan.testing.scenarios import build

REPO = Path(__file__).resolve().parent.parent
GOOD = ("a__healthy-2022.4.sqlite", "b__exposed_allreduce-2022.4.sqlite",
        "starved_input-2023.4.sqlite")
BROKEN = "broken.sqlite"


@pytest.fixture(scope="module")
def archive(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("archive")
    build("healthy", root / "a")
    build("exposed_allreduce", root / "b")
    build("starved_input", root, layout="2023.4")
    (root / BROKEN).write_bytes(b"SQLite format 3\x00" + os.urandom(3000))  # corrupt
    return root


@pytest.fixture(scope="module")
def reference(archive, tmp_path_factory):
    """The uninterrupted, in-process batch every other mode is compared with."""
    out = tmp_path_factory.mktemp("reference")
    summary = run_batch([archive], out, jobs=1, progress=False)
    return out, summary


def copy_of(out: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "out"
    shutil.copytree(out, dst)
    return dst


def statuses(summary) -> dict[str, str]:
    return {r.trace_id: r.status for r in summary.records}


def assert_same_outputs(expected: Path, got: Path) -> None:
    """Same trace directories, same Parquet files with equal content, all marked done, and
    nothing half-written left behind."""
    dirs = sorted(p.name for p in expected.iterdir() if p.is_dir())
    assert dirs == sorted(p.name for p in got.iterdir() if p.is_dir()) == sorted(GOOD)
    for d in dirs:
        names = sorted(f.name for f in (expected / d).glob("*.parquet"))
        assert names and names == sorted(f.name for f in (got / d).glob("*.parquet"))
        for name in names:
            assert_frame_equal(
                pl.read_parquet(expected / d / name), pl.read_parquet(got / d / name)
            )
        assert (got / d / state.MARKER).is_file()
    leftovers = [p.name for p in got.iterdir() if p.name.startswith(".tmp") or ".tmp-" in p.name
                 or ".old-" in p.name]
    assert leftovers == []


def catalog_view(out: Path | str) -> tuple[list, list]:
    """Metrics and findings of each trace's ok run, without run ids and timestamps."""
    url = out if isinstance(out, str) else catalog_url(None, out)
    with Catalog(url) as cat:
        metrics = queries.run_sql(
            cat,
            "SELECT r.trace_id, m.n_steps, m.step_mean_ns, m.gpu_busy_frac, m.exposed_nccl_ns, "
            "m.idle_frac, m.top_layer, m.verdict, m.n_findings FROM metrics m "
            "JOIN runs r ON r.run_id = m.run_id WHERE r.status = 'ok' ORDER BY r.trace_id",
        ).rows
        findings = queries.run_sql(
            cat,
            "SELECT f.trace_id, f.seq, f.code, f.severity, f.metric_name, f.metric_value "
            "FROM findings f ORDER BY f.trace_id, f.seq",
        ).rows
    return metrics, findings


def ok_runs_per_trace(out: Path) -> dict[str, int]:
    with Catalog(catalog_url(None, out)) as cat:
        rows = queries.run_sql(
            cat, "SELECT trace_id, COUNT(*) FROM runs WHERE status = 'ok' GROUP BY trace_id"
        ).rows
    return dict(rows)


def test_corrupt_file_fails_alone_and_rerun_skips(reference, archive, tmp_path):
    first = reference[1]
    out = copy_of(reference[0], tmp_path)  # copy2 keeps mtimes
    assert statuses(first) == {**dict.fromkeys(GOOD, "ok"), BROKEN: "failed"}
    assert first.exit_code == 1
    (bad,) = first.failed
    assert bad.error_type == "TraceFormatError"
    assert str(archive / BROKEN) in bad.error_message and "\n" not in bad.error_message
    for rec in first.records:
        if rec.ok:
            assert rec.output_bytes > 0 and rec.input_bytes > 0 and rec.sha256
            assert rec.metrics["n_findings"] == len(rec.findings)
    mtimes = {p: p.stat().st_mtime_ns for p in out.glob("*/*.parquet")}

    second = run_batch([archive], out, jobs=1, progress=False)
    assert statuses(second) == {**dict.fromkeys(GOOD, "skipped"), BROKEN: "failed"}
    assert {p: p.stat().st_mtime_ns for p in out.glob("*/*.parquet")} == mtimes  # not redone
    assert ok_runs_per_trace(out) == dict.fromkeys(GOOD, 1)
    with Catalog(catalog_url(None, out)) as cat:
        by_status = dict(queries.run_sql(
            cat, "SELECT status, COUNT(*) FROM runs GROUP BY status").rows)
    assert by_status == {"ok": 3, "failed": 2, "skipped": 3}


def test_changed_parameters_rerun(reference, archive, tmp_path):
    out = copy_of(reference[0], tmp_path)
    trace = archive / "starved_input-2023.4.sqlite"  # alone: its id is its name, as before
    summary = run_batch([trace], out, jobs=1, progress=False,
                        settings={"gaps.min_gap_ns": "250000"})
    assert statuses(summary) == {trace.name: "ok"}
    marker = state.read_marker(out / trace.name)
    assert marker["record"]["params_json"] != reference[1].records[0].params_json


def test_lost_catalog_is_restored_from_done_markers(reference, archive, tmp_path):
    out = copy_of(reference[0], tmp_path)
    for f in out.glob("catalog.db*"):
        f.unlink()
    summary = run_batch([archive], out, jobs=1, progress=False)
    assert statuses(summary)[GOOD[0]] == "skipped"
    assert ok_runs_per_trace(out) == dict.fromkeys(GOOD, 1)
    assert catalog_view(out) == catalog_view(reference[0])


@pytest.fixture
def pg_url():
    """A fresh database on the test PostgreSQL server (skips locally without one, fails in CI)."""
    import sqlalchemy as sa

    base = os.environ.get("NSYSAN_TEST_PG_URL")
    if not base:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail("NSYSAN_TEST_PG_URL is not set under CI=true: run .ci/start-postgres.sh")
        pytest.skip("NSYSAN_TEST_PG_URL not set")
    name = f"nsysan_b_{os.getpid()}_{time.monotonic_ns()}"
    admin = sa.create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    yield sa.make_url(base).set(database=name).render_as_string(hide_password=False)
    with admin.connect() as conn:
        conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    admin.dispose()


def test_batch_with_a_postgresql_catalog(reference, archive, tmp_path, pg_url):
    out = copy_of(reference[0], tmp_path)
    summary = run_batch([archive], out, jobs=1, progress=False, catalog=pg_url)
    assert statuses(summary) == {**dict.fromkeys(GOOD, "skipped"), BROKEN: "failed"}
    assert "postgresql" in summary.catalog
    # The runs that made the outputs are restored from their markers into the new catalog.
    assert catalog_view(pg_url) == catalog_view(reference[0])


def test_on_error_raise_stops_with_the_error(archive, tmp_path):
    with pytest.raises(TraceFormatError, match=f"^{BROKEN}: .*{BROKEN}"):
        run_batch([archive / BROKEN], tmp_path / "out", jobs=1, progress=False,
                  on_error="raise")


@pytest.mark.slow
def test_killed_batch_resumes_to_identical_outputs(reference, archive, tmp_path):
    psutil = pytest.importorskip("psutil")
    out = tmp_path / "out"
    path = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path}
    proc = subprocess.Popen(
        [sys.executable, "-c", "from nsysan.cli import main; main()", "batch", str(archive),
         "-o", str(out), "--jobs", "2", "--progress", "none"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
    )
    deadline = time.monotonic() + 180
    while not list(out.glob(f"*/{state.MARKER}")):
        if proc.poll() is not None:
            pytest.fail(f"batch exited before it could be killed: {proc.stderr.read()!r}")
        assert time.monotonic() < deadline, "no trace finished within 180 s"
        time.sleep(0.02)
    workers = psutil.Process(proc.pid).children(recursive=True)
    os.kill(proc.pid, signal.SIGKILL)  # the coordinator only: its workers must follow it
    proc.wait()
    proc.stderr.close()
    _, alive = psutil.wait_procs(workers, timeout=30)
    assert alive == [], "worker processes outlived the killed batch"
    done = {p.parent.name for p in out.glob(f"*/{state.MARKER}")}
    assert 1 <= len(done) < len(GOOD)

    resumed = run_batch([archive], out, jobs=2, progress=False)
    got = statuses(resumed)
    assert {t for t, s in got.items() if s == "skipped"} == done
    assert {t for t, s in got.items() if s == "ok"} == set(GOOD) - done
    assert_same_outputs(reference[0], out)
    assert ok_runs_per_trace(out) == dict.fromkeys(GOOD, 1)
    assert catalog_view(out) == catalog_view(reference[0])


@pytest.mark.slow
def test_dask_local_cluster_matches_local(reference, archive, tmp_path):
    pytest.importorskip("distributed")
    out = tmp_path / "out"
    summary = run_batch([archive], out, jobs=2, executor="dask", progress=False)
    assert statuses(summary) == statuses(reference[1])
    assert summary.failed[0].error_message == reference[1].failed[0].error_message
    assert_same_outputs(reference[0], out)
    assert catalog_view(out) == catalog_view(reference[0])


# -- CLI ---------------------------------------------------------------------------------------
def test_cli_batch_exit_code_and_summary(reference, archive, tmp_path):
    out = copy_of(reference[0], tmp_path)
    res = CliRunner().invoke(batch_cmd, [str(archive), "-o", str(out), "--jobs", "1",
                                         "--progress", "plain"])
    assert res.exit_code == 1, res.output
    assert "0 ok, 1 failed, 3 skipped" in res.stdout
    assert f"FAILED {BROKEN}: TraceFormatError: " in res.stdout
    assert "batch: 4/4 traces" in res.stderr  # plain progress lines when not a terminal
    # The same traces named one by one: same common root, same ids, all skipped, exit 0.
    good = [str(archive / "a"), str(archive / "b"), str(archive / "starved_input-2023.4.sqlite")]
    ok = CliRunner().invoke(batch_cmd, [*good, "-o", str(out), "--progress", "none"])
    assert ok.exit_code == 0 and "0 ok, 0 failed, 3 skipped" in ok.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--scheduler", "tcp://127.0.0.1:1"], "--scheduler needs --executor dask"),
        (["--passes", "nope"], "unknown pass 'nope'"),
        (["--set", "gaps.nope=1"], "has no parameter 'nope'"),
        (["--set", "novalue"], "expected PASS.PARAM=VALUE"),
    ],
)
def test_cli_batch_config_errors(archive, tmp_path, args, message):
    res = CliRunner().invoke(batch_cmd, [str(archive), "-o", str(tmp_path / "o"), *args])
    assert res.exit_code == 1
    assert res.stderr.startswith("Error: ") and message in res.stderr
    assert "Traceback" not in res.output


def test_cli_batch_dask_executor_without_dask(archive, tmp_path, monkeypatch):
    """Dask is an extra: without it, ``--executor dask`` says how to install it, and writes
    nothing."""
    monkeypatch.setitem(sys.modules, "distributed", None)  # (its import raises ImportError)
    out = tmp_path / "o"
    res = CliRunner().invoke(batch_cmd, [str(archive), "-o", str(out), "--executor", "dask"])
    assert res.exit_code == 1
    assert res.stderr.startswith("Error: ") and "pip install 'nsysan[dask]'" in res.stderr
    assert "Traceback" not in res.output
    assert not out.exists() or not any(out.iterdir())


def test_cli_catalog_queries(reference):
    out = reference[0]
    res = CliRunner().invoke(catalog_cmd, ["query", "--catalog", str(out), "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert {r["trace_id"]: r["status"] for r in rows}[BROKEN] == "failed"
    codes = {r["code"] for r in json.loads(CliRunner().invoke(
        catalog_cmd, ["query", "--catalog", str(out), "--findings", "*", "--json"]).stdout)}
    assert codes  # the synthetic scenarios have findings
    one = sorted(codes)[0]
    res = CliRunner().invoke(catalog_cmd, ["query", "--catalog", str(out), "--findings", one])
    assert res.exit_code == 0 and one in res.stdout and "rows)" in res.stdout
    res = CliRunner().invoke(catalog_cmd, ["query", "--catalog", str(out), "--regressed",
                                           "exposed_nccl_ns", "--json"])
    assert res.exit_code == 0 and json.loads(res.stdout) == []  # a single run per trace
    res = CliRunner().invoke(catalog_cmd, ["query", "--catalog", str(out), "--sql",
                                           "DELETE FROM runs"])
    assert res.exit_code == 1 and "read-only" in res.stderr
    res = CliRunner().invoke(catalog_cmd, ["info", "--catalog", str(out)])
    assert res.exit_code == 0 and "runs: 4" in res.stdout


def test_bad_executor_arguments(archive, tmp_path):
    with pytest.raises(ConfigError, match="--jobs must be at least 1"):
        run_batch([archive], tmp_path / "o", jobs=0)
    with pytest.raises(ConfigError, match="unknown executor"):
        run_batch([archive], tmp_path / "o", executor="slurm")
    with pytest.raises(ConfigError, match="--on-error"):
        run_batch([archive], tmp_path / "o", on_error="ignore")
