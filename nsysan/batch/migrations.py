"""Catalog schema: the current tables (for queries) and the migrations that build them.

Each migration is frozen history: it states the DDL of *its* version explicitly and never
refers to the current table objects, so migrating an old catalog gives exactly the schema a
new one gets (a test compares the two). To change the schema, append a migration and update
the current tables below to match.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace

import sqlalchemy as sa
from sqlalchemy.engine import Connection

# Column types shared by the current tables and the migrations.
ID = sa.String(255)
TS = sa.DateTime(timezone=True)
BIG = sa.BigInteger


def _traces_v1(md: sa.MetaData) -> sa.Table:
    return sa.Table(
        "traces", md,
        sa.Column("trace_id", ID, primary_key=True),
        sa.Column("input_path", sa.Text),
        sa.Column("input_format", sa.String(32)),
        sa.Column("sha256", sa.String(64)),
        sa.Column("size_bytes", BIG),
        sa.Column("source_format", sa.String(32)),
        sa.Column("exporter_version", sa.String(64)),
        sa.Column("export_schema_version", sa.String(32)),
        sa.Column("recorded_version", sa.String(64)),
        sa.Column("session_start_utc_ns", BIG),
        sa.Column("duration_ns", BIG),
        sa.Column("first_seen_utc", TS),
        sa.Column("last_seen_utc", TS),
        sa.Column("last_run_id", sa.String(300)),
    )


def _runs_v1(md: sa.MetaData) -> sa.Table:
    return sa.Table(
        "runs", md,
        sa.Column("run_id", sa.String(300), primary_key=True),
        sa.Column("batch_id", sa.String(64), nullable=False, index=True),
        sa.Column("trace_id", ID, sa.ForeignKey("traces.trace_id"), nullable=False, index=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("error_type", sa.String(100)),
        sa.Column("error_message", sa.Text),
        sa.Column("started_utc", TS),
        sa.Column("finished_utc", TS),
        sa.Column("duration_s", sa.Float),
        sa.Column("input_bytes", BIG),
        sa.Column("output_bytes", BIG),
        sa.Column("output_dir", sa.Text),
        sa.Column("sha256", sa.String(64)),
        sa.Column("skip_key", sa.String(64)),
        sa.Column("nsysan_version", sa.String(32)),
        sa.Column("params_json", sa.Text),
        sa.UniqueConstraint("batch_id", "trace_id", name="uq_runs_batch_trace"),
    )


def _findings_v1(md: sa.MetaData) -> sa.Table:
    return sa.Table(
        "findings", md,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("run_id", sa.String(300), sa.ForeignKey("runs.run_id", ondelete="CASCADE"),
                  nullable=False, index=True),
        sa.Column("trace_id", ID, nullable=False, index=True),
        sa.Column("seq", sa.Integer, nullable=False),
        sa.Column("code", sa.String(100), index=True),
        sa.Column("layer", sa.String(32)),
        sa.Column("severity", sa.String(16)),
        sa.Column("title", sa.Text),
        sa.Column("message", sa.Text),
        sa.Column("metric_name", sa.String(100)),
        sa.Column("metric_value", sa.Float),
        sa.Column("metric_unit", sa.String(16)),
        sa.Column("device_id", BIG),
        sa.Column("pid", BIG),
        sa.Column("evidence_json", sa.Text),
        sa.UniqueConstraint("run_id", "seq", name="uq_findings_run_seq"),
    )


def _metrics_v1(md: sa.MetaData) -> sa.Table:
    return sa.Table(
        "metrics", md,
        sa.Column("run_id", sa.String(300), sa.ForeignKey("runs.run_id", ondelete="CASCADE"),
                  primary_key=True),
        sa.Column("trace_id", ID, nullable=False, index=True),
        sa.Column("n_steps", BIG),
        sa.Column("step_mean_ns", BIG),
        sa.Column("step_p50_ns", BIG),
        sa.Column("step_p95_ns", BIG),
        sa.Column("gpu_busy_frac", sa.Float),
        sa.Column("idle_ns", BIG),
        sa.Column("idle_frac", sa.Float),
        sa.Column("nccl_ns", BIG),
        sa.Column("exposed_nccl_ns", BIG),
        sa.Column("n_gaps", BIG),
        sa.Column("gaps_ns", BIG),
        sa.Column("top_layer", sa.Text),
        sa.Column("top_layer_frac", sa.Float),
        sa.Column("verdict", sa.String(64)),
        sa.Column("n_findings", sa.Integer),
    )


def _m1_initial(conn: Connection) -> None:
    md = sa.MetaData()
    for make in (_traces_v1, _runs_v1, _findings_v1, _metrics_v1):
        make(md)
    md.create_all(conn)


# v2: columns added after the first catalog shipped, the baselines table, and a backfill.
_V2_COLUMNS: tuple[tuple[str, str, sa.types.TypeEngine], ...] = (
    ("traces", "group_name", sa.String(255)),
    ("runs", "error_detail", sa.Text()),
    ("runs", "worker", sa.String(255)),
    ("runs", "peak_rss_bytes", sa.BigInteger()),
    ("runs", "timings_json", sa.Text()),
    ("metrics", "hidden_nccl_frac", sa.Float()),
    ("metrics", "h2d_unoverlapped_ns", sa.BigInteger()),
    ("metrics", "n_warning", sa.Integer()),
    ("metrics", "n_critical", sa.Integer()),
    ("metrics", "extra_json", sa.Text()),
)


def _baselines_v2(md: sa.MetaData) -> sa.Table:
    return sa.Table(
        "baselines", md,
        sa.Column("name", sa.String(200), primary_key=True),
        sa.Column("created_utc", TS),
        sa.Column("trace_id", ID),
        sa.Column("run_id", sa.String(300)),
        sa.Column("output_dir", sa.Text),
        sa.Column("metrics_json", sa.Text),
    )


def group_of(trace_id: str) -> str:
    """The directory part of a batch trace id (see nsysan.batch.discover)."""
    head, sep, _ = trace_id.rpartition("__")
    return head if sep else ""


def _m2_provenance(conn: Connection) -> None:
    preparer = conn.dialect.identifier_preparer
    for table, column, type_ in _V2_COLUMNS:
        ddl = type_.compile(dialect=conn.dialect)
        conn.execute(
            sa.text(
                f"ALTER TABLE {preparer.quote(table)} ADD COLUMN {preparer.quote(column)} {ddl}"
            )
        )
    _baselines_v2(sa.MetaData()).create(conn)
    # Backfill the group of traces recorded before v2 (derived from the trace id).
    traces = sa.table("traces", sa.column("trace_id"), sa.column("group_name"))
    ids = conn.execute(sa.select(traces.c.trace_id)).scalars().all()
    for trace_id in ids:
        conn.execute(
            traces.update()
            .where(traces.c.trace_id == trace_id)
            .values(group_name=group_of(trace_id))
        )


# v3: the other forms of a trace's capture (a report and its exports beside it)
_V3_COLUMNS: tuple[tuple[str, str, sa.types.TypeEngine], ...] = (
    ("traces", "aliases_json", sa.Text()),
)


def _m3_aliases(conn: Connection) -> None:
    preparer = conn.dialect.identifier_preparer
    for table, column, type_ in _V3_COLUMNS:
        ddl = type_.compile(dialect=conn.dialect)
        conn.execute(
            sa.text(
                f"ALTER TABLE {preparer.quote(table)} ADD COLUMN {preparer.quote(column)} {ddl}"
            )
        )


Migration = tuple[int, str, Callable[[Connection], None]]
MIGRATIONS: list[Migration] = [
    (1, "traces, runs, findings, metrics", _m1_initial),
    (2, "trace groups, worker/memory/timings of runs, more metrics, baselines", _m2_provenance),
    (3, "aliases of a trace: the other forms of its capture", _m3_aliases),
]
LATEST_VERSION = MIGRATIONS[-1][0]


def current_metadata() -> tuple[sa.MetaData, SimpleNamespace]:
    """The tables as they are after every migration (what queries and writes use)."""
    md = sa.MetaData()
    traces = _traces_v1(md)
    runs = _runs_v1(md)
    findings = _findings_v1(md)
    metrics = _metrics_v1(md)
    by_name = {"traces": traces, "runs": runs, "metrics": metrics, "findings": findings}
    for table, column, type_ in (*_V2_COLUMNS, *_V3_COLUMNS):
        by_name[table].append_column(sa.Column(column, type_))
    baselines = _baselines_v2(md)
    schema_version = sa.Table(
        "schema_version", md,
        sa.Column("version", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("description", sa.Text),
        sa.Column("applied_utc", TS),
    )
    return md, SimpleNamespace(
        traces=traces, runs=runs, findings=findings, metrics=metrics, baselines=baselines,
        schema_version=schema_version,
    )


METADATA, tables = current_metadata()
