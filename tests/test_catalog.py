"""The catalog suite, run against SQLite and a real PostgreSQL server.

PostgreSQL: set NSYSAN_TEST_PG_URL (``eval "$(bash .ci/start-postgres.sh)"``). Without it the
postgres variants skip locally and fail under CI=true. Each postgres test gets its own fresh
database, so tests never see each other's rows.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import re
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import sqlalchemy as sa

from nsysan.batch import queries
from nsysan.batch.catalog import Catalog, catalog_url
from nsysan.batch.migrations import LATEST_VERSION, METADATA
from nsysan.batch.worker import RunRecord
from nsysan.errors import ConfigError

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=timezone.utc)


def _pg_base_url() -> str:
    url = os.environ.get("NSYSAN_TEST_PG_URL")
    if not url:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail("NSYSAN_TEST_PG_URL is not set under CI=true: run .ci/start-postgres.sh")
        pytest.skip("NSYSAN_TEST_PG_URL not set (eval \"$(bash .ci/start-postgres.sh)\")")
    return url


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request, tmp_path):
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'catalog.db'}"
        return
    base = sa.make_url(_pg_base_url())
    name = f"nsysan_t_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    try:
        yield base.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


def record(trace_id: str, batch: str, *, status: str = "ok", minutes: int = 0,
           metrics: dict | None = None, findings: list[dict] | None = None,
           **fields) -> RunRecord:
    finished = T0 + timedelta(minutes=minutes)
    base = dict(
        run_id=f"{batch}:{trace_id}",
        batch_id=batch,
        trace_id=trace_id,
        status=status,
        input_path=f"/data/{trace_id}.sqlite",
        input_format="sqlite",
        group=trace_id.rpartition("__")[0],
        sha256="ab" * 32,
        skip_key="cd" * 32,
        input_bytes=1000,
        output_bytes=500 if status == "ok" else None,
        started_utc=finished - timedelta(seconds=3),
        finished_utc=finished,
        duration_s=3.0,
        trace_meta={"exporter_version": "2022.4.2", "schema_version": "3.0.0",
                    "session_start_utc_ns": 1_700_000_000_000_000_000, "duration_ns": 5_000},
        metrics=metrics or {},
        findings=findings or [],
    )
    base.update(fields)
    return RunRecord(**base)


def finding(code: str, value: float = 1.0, seq: int = 0) -> dict:
    return {"seq": seq, "code": code, "layer": "communication", "severity": "warning",
            "title": code.title(), "message": "m", "metric_name": "exposed_ns",
            "metric_value": value, "metric_unit": "ns", "evidence": {"exposed_ns": value}}


def count(cat: Catalog, table: str) -> int:
    return cat.read(lambda c: c.scalar(sa.text(f"SELECT COUNT(*) FROM {table}")))


def columns_by_table(cat: Catalog) -> dict[str, set[str]]:
    def get(conn):
        insp = sa.inspect(conn)
        return {t: {c["name"] for c in insp.get_columns(t)} for t in insp.get_table_names()}

    return cat.read(get)


EXPECTED = {t.name: {c.name for c in t.columns} for t in METADATA.sorted_tables}


def test_fresh_catalog_has_latest_schema(url):
    with Catalog(url) as cat:
        assert cat.schema_version() == LATEST_VERSION
        assert columns_by_table(cat) == EXPECTED
        # Opening again is a no-op (idempotent migrations).
        assert cat.migrate() == LATEST_VERSION


def test_migrate_from_v1_keeps_rows_and_backfills(url):
    with Catalog(url, target_version=1) as old:
        assert old.schema_version() == 1
        assert "baselines" not in columns_by_table(old)
        assert "group_name" not in columns_by_table(old)["traces"]
        with old.engine.begin() as conn:
            conn.execute(sa.text(
                "INSERT INTO traces (trace_id, input_path) VALUES ('grp__a.sqlite', '/x/a')"))
            conn.execute(sa.text(
                "INSERT INTO runs (run_id, batch_id, trace_id, status) "
                "VALUES ('b1:grp__a.sqlite', 'b1', 'grp__a.sqlite', 'ok')"))
            conn.execute(sa.text(
                "INSERT INTO metrics (run_id, trace_id, exposed_nccl_ns) "
                "VALUES ('b1:grp__a.sqlite', 'grp__a.sqlite', 42)"))
    with Catalog(url) as cat:
        assert cat.schema_version() == LATEST_VERSION
        assert columns_by_table(cat) == EXPECTED  # migrated == created fresh
        row = cat.read(lambda c: c.execute(sa.text(
            "SELECT t.group_name, m.exposed_nccl_ns, r.worker FROM traces t "
            "JOIN runs r ON r.trace_id = t.trace_id JOIN metrics m ON m.run_id = r.run_id"
        )).one())
        assert tuple(row) == ("grp", 42, None)
        # The new columns are writable.
        cat.record(record("grp__a.sqlite", "b2", worker="host:1", peak_rss_bytes=10))
        assert count(cat, "runs") == 2


def test_newer_schema_is_refused(url):
    with Catalog(url) as cat, cat.engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO schema_version (version, description) VALUES (99, 'x')"))
    with pytest.raises(ConfigError, match="v99, newer than this nsysan"):
        Catalog(url)


def test_record_is_an_idempotent_upsert(url):
    rec = record("a.sqlite", "b1", metrics={"exposed_nccl_ns": 7, "top_layer": "fwd"},
                 findings=[finding("EXPOSED_COMM", 7, 0), finding("GPU_IDLE", 3, 1)])
    with Catalog(url) as cat:
        cat.record(rec)
        cat.record(rec)  # e.g. recovered from a done marker after a kill
        assert [count(cat, t) for t in ("traces", "runs", "metrics", "findings")] == [1, 1, 1, 2]
        rec.findings = rec.findings[:1]
        cat.record(rec)
        assert count(cat, "findings") == 1
        m = cat.read(lambda c: c.execute(sa.text(
            "SELECT exposed_nccl_ns, top_layer FROM metrics")).one())
        assert tuple(m) == (7, "fwd")


def test_failed_run_keeps_trace_provenance(url):
    with Catalog(url) as cat:
        cat.record(record("a.sqlite", "b1"))
        cat.record(record("a.sqlite", "b2", status="failed", minutes=5, error_type="SchemaError",
                          error_message="no CUDA tables", trace_meta={}))
        rows = queries.latest_runs(cat).records()
        assert [(r["status"], r["error_type"]) for r in rows] == [("failed", "SchemaError")]
        exporter = cat.read(lambda c: c.scalar(sa.text("SELECT exporter_version FROM traces")))
        assert exporter == "2022.4.2"
        assert count(cat, "metrics") == 1  # failed runs have no metrics row


def test_findings_query_latest_and_all_runs(url):
    with Catalog(url) as cat:
        cat.record(record("a.sqlite", "b1", findings=[finding("EXPOSED_COMM", 5)]))
        cat.record(record("a.sqlite", "b2", minutes=1, findings=[finding("EXPOSED_COMM", 9)]))
        cat.record(record("b.sqlite", "b1", findings=[finding("GPU_STARVATION_PERIODIC")]))
        latest = queries.findings_of(cat, "exposed_comm").records()
        assert [(r["trace_id"], r["metric_value"]) for r in latest] == [("a.sqlite", 9.0)]
        assert len(queries.findings_of(cat, "EXPOSED_COMM", all_runs=True).rows) == 2
        assert {r["code"] for r in queries.findings_of(cat, "*").records()} == {
            "EXPOSED_COMM", "GPU_STARVATION_PERIODIC"}
        assert queries.findings_of(cat, "NOPE").rows == []


@pytest.mark.parametrize(
    ("metric", "history", "ratio", "regressed"),
    [
        ("exposed_nccl_ns", [100, 120], 1.05, True),
        ("exposed_nccl_ns", [100, 104], 1.05, False),
        ("exposed_nccl_ns", [120, 100], 1.05, False),  # improved
        ("exposed_nccl_ns", [0, 50], 1.05, True),  # from nothing to something
        ("exposed_nccl_ns", [100], 1.05, False),  # no previous run
        ("gpu_busy_frac", [0.9, 0.8], 1.05, True),  # smaller is worse
        ("gpu_busy_frac", [0.8, 0.9], 1.05, False),
        ("step_mean_ns", [1000, 1100], 1.2, False),
    ],
)
def test_regressed_against_previous(url, metric, history, ratio, regressed):
    with Catalog(url) as cat:
        for i, value in enumerate(history):
            cat.record(record("g__t.sqlite", f"b{i}", minutes=i, metrics={metric: value}))
        # A failed latest run does not hide the comparison of the ok runs.
        cat.record(record("g__t.sqlite", "bx", status="failed", minutes=99))
        rows = queries.regressed(cat, metric, by_ratio=ratio).records()
        assert bool(rows) == regressed
        if rows:
            assert rows[0]["value"] == pytest.approx(history[-1])
            assert rows[0]["reference"] == pytest.approx(history[-2])


def test_regressed_against_group(url):
    values = {"job__r0.sqlite": 100, "job__r1.sqlite": 104, "job__r2.sqlite": 180,
              "other__x.sqlite": 500}
    with Catalog(url) as cat:
        for tid, v in values.items():
            cat.record(record(tid, "b1", metrics={"exposed_nccl_ns": v}))
        rows = queries.regressed(cat, "exposed_nccl_ns", against="group").records()
        assert [(r["trace_id"], r["reference"]) for r in rows] == [("job__r2.sqlite", 102.0)]


def test_regressed_rejects_unknown_metric(url):
    with Catalog(url) as cat, pytest.raises(ConfigError, match="cannot rank"):
        queries.regressed(cat, "top_layer")


@pytest.mark.parametrize(
    ("sql", "error"),
    [
        ("SELECT trace_id FROM runs WHERE trace_id LIKE '%a%' AND ':x' <> ''", None),
        ("with r as (select * from runs) select count(*) as n from r", None),
        ("-- a comment; with a semicolon\nSELECT ';' AS x /* ; */", None),
        ("DELETE FROM runs", "one read-only statement"),
        ("SELECT 1; DELETE FROM runs", "one read-only statement"),
        ("INSERT INTO traces (trace_id) VALUES ('z')", "one read-only statement"),
        ("SELECT * FROM no_such_table", "--sql failed"),
    ],
)
def test_sql_is_read_only(url, sql, error):
    with Catalog(url) as cat:
        cat.record(record("a.sqlite", "b1"))
        if error is None:
            result = queries.run_sql(cat, sql)
            assert len(result.rows) == 1
        else:
            with pytest.raises(ConfigError, match=error):
                queries.run_sql(cat, sql)
        assert count(cat, "runs") == 1
        cat.record(record("b.sqlite", "b1"))  # the connection is still writable afterwards
        assert count(cat, "runs") == 2


def test_sql_write_through_cte_is_blocked_by_the_database(url):
    with Catalog(url) as cat:
        cat.record(record("a.sqlite", "b1"))
        # Starts with WITH, so only the database's own read-only mode can stop it.
        sql = ("WITH gone AS (DELETE FROM runs RETURNING run_id) SELECT COUNT(*) FROM gone"
               if cat.engine.dialect.name == "postgresql" else
               "WITH x AS (SELECT 1) DELETE FROM runs")
        with pytest.raises(ConfigError, match=r"--sql failed: .*read.?only"):
            queries.run_sql(cat, sql)
        assert count(cat, "runs") == 1


def test_baselines(url):
    with Catalog(url) as cat:
        cat.record(record("a.sqlite", "b1", metrics={"exposed_nccl_ns": 5}))
        cat.set_baseline("nightly", "a.sqlite")
        got = cat.baseline("nightly")
        assert got["run_id"] == "b1:a.sqlite" and got["metrics"]["exposed_nccl_ns"] == 5
        assert cat.baseline("missing") is None
        with pytest.raises(ConfigError, match="no successful run"):
            cat.set_baseline("x", "nope.sqlite")


def _writer(url: str, worker: int, n: int) -> None:
    # Each process opens the (possibly not yet created) catalog itself: migrations race too.
    with Catalog(url) as cat:
        for i in range(n):
            tid = f"shared__t{i % 5}.sqlite"  # traces rows are shared between writers
            cat.record(record(tid, f"w{worker}-b{i}", minutes=i,
                              metrics={"exposed_nccl_ns": i},
                              findings=[finding("A", i, 0), finding("B", i, 1)]))


def test_concurrent_writers_lose_nothing(url):
    writers, per = 4, 15
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(url, w, per)) for w in range(writers)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0] * writers
    with Catalog(url) as cat:
        assert cat.schema_version() == LATEST_VERSION
        assert count(cat, "runs") == writers * per
        assert count(cat, "metrics") == writers * per
        assert count(cat, "findings") == 2 * writers * per
        assert count(cat, "traces") == 5
        assert count(cat, "schema_version") == LATEST_VERSION


@pytest.mark.parametrize(
    ("value", "expected_end"),
    [(None, "/out/catalog.db"), ("x.db", "/x.db"), ("postgresql+psycopg://u@h/db", None)],
)
def test_catalog_url_forms(tmp_path, monkeypatch, value, expected_end):
    monkeypatch.chdir(tmp_path)
    got = catalog_url(value, tmp_path / "out")
    if expected_end is None:
        assert got == value
    else:
        assert got.startswith("sqlite:///") and got.endswith(expected_end)


def test_unreachable_catalog_is_a_config_error():
    with pytest.raises(ConfigError, match="cannot open catalog"):
        Catalog("postgresql+psycopg://nobody@127.0.0.1:1/none?connect_timeout=2")


DOCS = Path(__file__).resolve().parent.parent / "docs" / "catalog.md"


def doc_queries() -> dict[str, str]:
    """The ```sql blocks of docs/catalog.md by their ``-- name:`` line."""
    blocks = re.findall(r"```sql\n(.*?)```", DOCS.read_text(), flags=re.DOTALL)
    out = {}
    for block in blocks:
        name = re.match(r"-- name: (\w+)", block)
        assert name, f"sql block without '-- name:' in {DOCS}: {block[:60]!r}"
        out[name.group(1)] = block
    return out


def test_documented_sql_runs_and_answers(url):
    docs = doc_queries()
    assert {"findings_of_code", "regressed_exposed_communication"} <= set(docs)
    with Catalog(url) as cat:
        cat.record(record("g__a.sqlite", "b1", metrics={"exposed_nccl_ns": 100},
                          findings=[finding("EXPOSED_COMMUNICATION", 100)]))
        cat.record(record("g__a.sqlite", "b2", minutes=1, metrics={"exposed_nccl_ns": 130},
                          findings=[finding("EXPOSED_COMMUNICATION", 130)]))
        cat.record(record("g__b.sqlite", "b1", metrics={"exposed_nccl_ns": 0}))
        cat.record(record("g__b.sqlite", "b2", minutes=1, metrics={"exposed_nccl_ns": 0,
                                                                   "verdict": "compute-bound"}))
        cat.record(record("g__c.sqlite", "b2", status="failed", error_type="ExportError",
                          error_message="too new"))
        results = {name: queries.run_sql(cat, sql) for name, sql in docs.items()}
    assert [r[:1] + r[-2:] for r in results["findings_of_code"].rows] == [
        ("g__a.sqlite", 130.0, "ns")]
    regressed = results["regressed_exposed_communication"].records()
    assert [(r["trace_id"], r["before_ns"], r["after_ns"]) for r in regressed] == [
        ("g__a.sqlite", 100, 130)]
    assert results["failures_of_last_batch"].rows == [("g__c.sqlite", "ExportError", "too new")]
