"""Canned catalog queries behind ``nsysan catalog query`` (SQL equivalents in docs/catalog.md).

Every query returns a `QueryResult` (column names + rows of plain Python values), which the CLI
renders as a table or JSON.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import polars as pl
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from nsysan.batch.catalog import FINDINGS, METRICS, RUNS, TRACES, Catalog
from nsysan.batch.summary import WORSE_WHEN
from nsysan.errors import ConfigError
from nsysan.escape import LIKE_ESCAPE, like_glob

AGAINST = ("previous", "group")
_READ_ONLY_START = re.compile(r"^\s*(select|with|explain|values)\b", re.IGNORECASE)
_STRINGS = re.compile(r"'(?:[^']|'')*'")
_COMMENTS = re.compile(r"--[^\n]*|/\*.*?\*/", re.DOTALL)


@dataclass
class QueryResult:
    columns: list[str]
    rows: list[tuple[Any, ...]]

    def records(self) -> list[dict[str, Any]]:
        return [dict(zip(self.columns, row, strict=True)) for row in self.rows]


def _result(res: sa.CursorResult[Any]) -> QueryResult:
    return QueryResult(list(res.keys()), [tuple(r) for r in res.all()])


def _latest_ok_runs() -> sa.Subquery:
    """One row per trace: its most recent successful run (ties broken by run id)."""
    rank = (
        sa.func.row_number()
        .over(
            partition_by=RUNS.c.trace_id,
            order_by=(RUNS.c.finished_utc.desc(), RUNS.c.run_id.desc()),
        )
        .label("rank")
    )
    ranked = sa.select(RUNS.c.run_id, RUNS.c.trace_id, rank).where(RUNS.c.status == "ok")
    sub = ranked.subquery("ranked")
    return sa.select(sub.c.run_id, sub.c.trace_id).where(sub.c.rank == 1).subquery("latest")


def latest_runs(catalog: Catalog) -> QueryResult:
    """Each trace's most recent analysis (ok or failed; skips only confirm an earlier one)
    with its key metrics."""
    rank = (
        sa.func.row_number()
        .over(
            partition_by=RUNS.c.trace_id,
            order_by=(RUNS.c.finished_utc.desc(), RUNS.c.run_id.desc()),
        )
        .label("rank")
    )
    sub = sa.select(RUNS.c.run_id, rank).where(RUNS.c.status != "skipped").subquery("r")
    q = (
        sa.select(
            RUNS.c.trace_id,
            RUNS.c.status,
            RUNS.c.finished_utc,
            RUNS.c.duration_s,
            METRICS.c.step_mean_ns,
            METRICS.c.gpu_busy_frac,
            METRICS.c.exposed_nccl_ns,
            METRICS.c.idle_frac,
            METRICS.c.top_layer,
            METRICS.c.n_findings,
            RUNS.c.error_type,
            RUNS.c.error_message,
        )
        .join(sub, sa.and_(sub.c.run_id == RUNS.c.run_id, sub.c.rank == 1))
        .outerjoin(METRICS, METRICS.c.run_id == RUNS.c.run_id)
        .order_by(RUNS.c.trace_id)
    )
    return catalog.read(lambda conn: _result(conn.execute(q)))


def findings_of(catalog: Catalog, code: str, *, all_runs: bool = False) -> QueryResult:
    """Findings whose code is ``code`` (case-insensitive; ``*`` matches any run of characters,
    every other character only itself: ``%`` and ``_`` are not wildcards), from each trace's
    latest successful run, or from every run with ``all_runs``."""
    pattern = code.strip().upper()
    if not pattern:
        raise ConfigError("--findings needs a finding code or a pattern such as GPU_*")
    if "*" in pattern:
        cond = sa.func.upper(FINDINGS.c.code).like(like_glob(pattern), escape=LIKE_ESCAPE)
    else:
        cond = sa.func.upper(FINDINGS.c.code) == pattern
    q = (
        sa.select(
            FINDINGS.c.trace_id,
            FINDINGS.c.code,
            FINDINGS.c.severity,
            FINDINGS.c.layer,
            FINDINGS.c.title,
            FINDINGS.c.metric_name,
            FINDINGS.c.metric_value,
            FINDINGS.c.metric_unit,
            FINDINGS.c.run_id,
            RUNS.c.finished_utc,
        )
        .join(RUNS, RUNS.c.run_id == FINDINGS.c.run_id)
        .where(cond)
        .order_by(FINDINGS.c.trace_id, RUNS.c.finished_utc, FINDINGS.c.seq)
    )
    if not all_runs:
        latest = _latest_ok_runs()
        q = q.join(latest, latest.c.run_id == FINDINGS.c.run_id)
    return catalog.read(lambda conn: _result(conn.execute(q)))


def regressed(
    catalog: Catalog,
    metric: str,
    *,
    by_ratio: float = 1.05,
    against: str = "previous",
    min_delta: float = 0.0,
) -> QueryResult:
    """Traces whose latest successful run is worse than its reference by more than
    ``by_ratio`` (and by more than ``min_delta`` in absolute terms).

    ``against="previous"``: the reference is the trace's previous successful run.
    ``against="group"``: the median of the latest values of the *other* traces of its group
    (traces that share a directory). "Worse" is larger for times and counts and smaller for
    ``gpu_busy_frac`` / ``hidden_nccl_frac`` (see `summary.WORSE_WHEN`).
    """
    if metric not in WORSE_WHEN:
        raise ConfigError(
            f"cannot rank regressions on {metric!r}; metrics: {', '.join(sorted(WORSE_WHEN))}"
        )
    if not (math.isfinite(by_ratio) and by_ratio >= 1.0):
        raise ConfigError(f"--by-ratio must be a finite number >= 1 (1.05 = 5% worse), got "
                          f"{by_ratio}")
    if not math.isfinite(min_delta):
        raise ConfigError(f"--min-delta must be a finite number, got {min_delta}")
    if against not in AGAINST:
        raise ConfigError(f"--against must be one of {', '.join(AGAINST)}, got {against!r}")
    direction = WORSE_WHEN[metric]
    q = (
        sa.select(
            RUNS.c.trace_id,
            sa.func.coalesce(TRACES.c.group_name, "").label("group"),
            RUNS.c.run_id,
            RUNS.c.finished_utc,
            METRICS.c[metric].label("value"),
        )
        .join(METRICS, METRICS.c.run_id == RUNS.c.run_id)
        .join(TRACES, TRACES.c.trace_id == RUNS.c.trace_id)
        .where(RUNS.c.status == "ok", METRICS.c[metric].is_not(None))
    )

    def fetch(conn: Connection) -> list[tuple[Any, ...]]:
        return [(*r[:3], _naive_utc(r[3]), r[4]) for r in conn.execute(q).all()]

    rows = catalog.read(fetch)
    schema = {"trace_id": pl.String, "group": pl.String, "run_id": pl.String,
              "finished_utc": pl.Datetime("us"), "value": pl.Float64}
    df = pl.DataFrame(rows, schema=schema, orient="row")
    df = df.sort(
        ["trace_id", "finished_utc", "run_id"], descending=[False, True, True]
    ).with_columns(pl.int_range(pl.len()).over("trace_id").alias("age"))
    latest = df.filter(pl.col("age") == 0).drop("age")
    if against == "previous":
        ref = df.filter(pl.col("age") == 1).select(
            "trace_id", pl.col("value").alias("reference"), pl.col("run_id").alias("reference_run")
        )
        joined = latest.join(ref, on="trace_id", how="inner")
    else:
        # Median of the other traces of the group: for each trace, drop itself from its group.
        pairs = latest.join(latest, on="group", suffix="_peer").filter(
            pl.col("trace_id") != pl.col("trace_id_peer")
        )
        ref = pairs.group_by("trace_id").agg(
            pl.col("value_peer").median().alias("reference"),
            pl.len().cast(pl.String).alias("reference_run"),
        ).with_columns(("median of " + pl.col("reference_run") + " peers").alias("reference_run"))
        joined = latest.join(ref, on="trace_id", how="inner")
    worse, better = (
        (pl.col("value"), pl.col("reference")) if direction > 0
        else (pl.col("reference"), pl.col("value"))
    )
    out = (
        joined.with_columns(
            pl.when(better > 0).then(worse / better)
            .when(worse > better).then(float("inf"))
            .otherwise(1.0)
            .alias("ratio")
        )
        .filter(
            (pl.col("ratio") > by_ratio) & ((worse - better) > min_delta)
        )
        .sort(["ratio", "trace_id"], descending=[True, False])
        .select(
            "trace_id", "group", pl.lit(metric).alias("metric"), "reference", "value", "ratio",
            "run_id", "reference_run",
        )
    )
    return QueryResult(out.columns, out.rows())


def _naive_utc(value: datetime | None) -> datetime | None:
    """SQLite gives naive datetimes (stored in UTC), PostgreSQL aware ones: compare in UTC."""
    if value is None or value.tzinfo is None:
        return value
    return value.astimezone(timezone.utc).replace(tzinfo=None)


def run_sql(catalog: Catalog, sql: str) -> QueryResult:
    """Run one read-only statement (SELECT / WITH / EXPLAIN / VALUES).

    Enforced twice: by the statement's first keyword, and by the database itself (PostgreSQL
    ``SET TRANSACTION READ ONLY``, SQLite ``PRAGMA query_only``), and the transaction is
    rolled back whatever happens.
    """
    text = sql.strip().rstrip(";").strip()
    # Check the first keyword and stray ";" with comments and string literals blanked out.
    bare = _COMMENTS.sub(" ", _STRINGS.sub("''", text))
    if not _READ_ONLY_START.match(bare) or ";" in bare:
        raise ConfigError("--sql takes one read-only statement (SELECT / WITH / EXPLAIN)")
    with catalog.engine.connect() as conn:
        conn = conn.execution_options(nsysan_begin="DEFERRED")
        sqlite = conn.dialect.name == "sqlite"
        if sqlite:
            # On the raw sqlite3 connection (autocommit): a connection setting, not a statement
            # of the transaction below.
            conn.connection.driver_connection.execute("PRAGMA query_only = ON")
        trans = conn.begin()
        try:
            if conn.dialect.name == "postgresql":
                conn.exec_driver_sql("SET TRANSACTION READ ONLY")
            # The raw DB-API cursor, without parameters: neither SQLAlchemy (":name") nor
            # psycopg ("%") parses placeholders, so the SQL runs exactly as written.
            cur = conn.connection.driver_connection.cursor()
            try:
                cur.execute(text)
                cols = [d[0] for d in cur.description or ()]
                return QueryResult(cols, [tuple(r) for r in cur.fetchall()])
            except conn.dialect.loaded_dbapi.Error as exc:
                first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                raise ConfigError(f"--sql failed: {first}") from None
            finally:
                cur.close()
        finally:
            trans.rollback()
            if sqlite:
                conn.connection.driver_connection.execute("PRAGMA query_only = OFF")
