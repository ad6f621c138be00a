"""The run catalog: a SQL database (SQLAlchemy 2 Core) of traces, runs, findings and metrics.

Default: an embedded SQLite file ``OUT/catalog.db``; any SQLAlchemy URL works (PostgreSQL is
tested: ``postgresql+psycopg://user@host/db``, ``pip install 'nsysan[postgres]'``). The schema
is documented in docs/catalog.md.

Safety with several writers (workers, or several batches sharing one catalog):

* every write is one transaction; SQLite uses WAL, ``busy_timeout`` and ``BEGIN IMMEDIATE``
  (writers queue instead of failing half way); PostgreSQL relies on row locks;
* rows have natural unique keys (``runs.run_id`` = ``<batch_id>:<trace_id>``, one
  ``metrics`` row per run, ``findings`` unique on ``(run_id, seq)``) and writes are upserts,
  so recording the same run twice replaces it instead of duplicating it;
* transient errors (SQLite "database is locked", PostgreSQL serialization failures and
  deadlocks, a unique race) are retried with jittered back-off.

Migrations: `MIGRATIONS` is an ordered list of ``(version, description, function)``. Opening a
catalog applies the missing ones in one transaction (serialised by ``BEGIN IMMEDIATE`` on
SQLite and an advisory lock on PostgreSQL) and records each in ``schema_version``.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine

from nsysan.batch.migrations import LATEST_VERSION, MIGRATIONS, tables
from nsysan.batch.summary import METRIC_COLUMNS
from nsysan.batch.worker import RunRecord
from nsysan.errors import ConfigError

T = TypeVar("T")
_PG_LOCK_KEY = 0x6E73797361  # "nsysa": serialises migrations between processes
TRACES, RUNS, FINDINGS, METRICS, BASELINES, SCHEMA_VERSION = (
    tables.traces,
    tables.runs,
    tables.findings,
    tables.metrics,
    tables.baselines,
    tables.schema_version,
)


def catalog_url(value: str | None, out_dir: str | Path | None = None) -> str:
    """A SQLAlchemy URL from ``--catalog``: a URL as is, a file path or a directory (its
    ``catalog.db``) as SQLite; None means ``OUT/catalog.db``."""
    if value is None:
        if out_dir is None:
            raise ConfigError("no catalog given: pass --catalog URL or a batch output directory")
        return f"sqlite:///{(Path(out_dir) / 'catalog.db').resolve()}"
    if "://" in value:
        return value
    path = Path(value).expanduser()
    if path.is_dir():
        path = path / "catalog.db"
    return f"sqlite:///{path.resolve()}"


def _sqlite_engine(url: sa.URL) -> Engine:
    if url.database and url.database != ":memory:":
        Path(url.database).parent.mkdir(parents=True, exist_ok=True)
    engine = sa.create_engine(url, connect_args={"timeout": 60})

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Take transaction control away from the sqlite3 module so BEGIN IMMEDIATE works.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")  # readers never block the writer
        cur.execute("PRAGMA busy_timeout=60000")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        # Writers take the write lock up front: no upgrade deadlocks between writers.
        mode = conn.get_execution_options().get("nsysan_begin", "IMMEDIATE")
        conn.exec_driver_sql(f"BEGIN {mode}")

    return engine


def create_engine(url: str) -> Engine:
    """An engine for a catalog URL, with the SQLite settings above; errors are ConfigError."""
    try:
        parsed = sa.make_url(url)
        if parsed.get_backend_name() == "sqlite":
            return _sqlite_engine(parsed)
        return sa.create_engine(parsed, pool_pre_ping=True)
    except sa.exc.ArgumentError as exc:
        raise ConfigError(f"invalid catalog URL {url!r}: {exc}") from None
    except (sa.exc.NoSuchModuleError, ModuleNotFoundError) as exc:
        hint = " (pip install 'nsysan[postgres]')" if url.startswith("postgres") else ""
        raise ConfigError(f"cannot use catalog URL {url!r}: {exc}{hint}") from None


def _transient(exc: sa.exc.DBAPIError) -> bool:
    orig = getattr(exc, "orig", None)
    code = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
    if code in ("40001", "40P01", "55P03", "23505"):  # serialization, deadlock, lock, unique race
        return True
    text = str(orig).lower()
    return "database is locked" in text or "database table is locked" in text or "busy" in text


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class Catalog:
    """One catalog database. Cheap to open; migrates the schema on open."""

    def __init__(self, url: str, *, migrate: bool = True, target_version: int | None = None):
        self.url = url
        self.engine = create_engine(url)
        self.display_url = sa.make_url(url).render_as_string(hide_password=True)
        try:
            self.engine.connect().close()
        except sa.exc.DBAPIError as exc:
            first = str(getattr(exc, "orig", exc)).strip().splitlines()[0]
            raise ConfigError(f"cannot open catalog {self.display_url}: {first}") from None
        if migrate:
            self.migrate(target_version)

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> Catalog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- transactions ------------------------------------------------------------------------
    def transaction(self, fn: Callable[[Connection], T], *, attempts: int = 15) -> T:
        """Run ``fn(conn)`` in one transaction, retrying transient lock/serialization errors."""
        delay = 0.02
        for attempt in range(attempts):
            try:
                with self.engine.begin() as conn:
                    return fn(conn)
            except sa.exc.DBAPIError as exc:
                if attempt == attempts - 1 or not _transient(exc):
                    raise
                time.sleep(delay * (1 + random.random()))
                delay = min(delay * 2, 1.0)
        raise AssertionError("unreachable")

    def read(self, fn: Callable[[Connection], T]) -> T:
        """A read-only unit of work (plain BEGIN on SQLite: it does not block writers)."""
        with self.engine.connect() as conn:
            conn = conn.execution_options(nsysan_begin="DEFERRED")
            with conn.begin():
                return fn(conn)

    # -- schema ------------------------------------------------------------------------------
    def schema_version(self) -> int:
        def get(conn: Connection) -> int:
            if not sa.inspect(conn).has_table(SCHEMA_VERSION.name):
                return 0
            return int(conn.scalar(sa.select(sa.func.max(SCHEMA_VERSION.c.version))) or 0)

        return self.read(get)

    def migrate(self, target: int | None = None) -> int:
        """Apply missing migrations up to ``target`` (default: latest); returns the version."""
        target = LATEST_VERSION if target is None else target

        def run(conn: Connection) -> int:
            if conn.dialect.name == "postgresql":
                conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_LOCK_KEY})
            SCHEMA_VERSION.create(conn, checkfirst=True)
            current = int(conn.scalar(sa.select(sa.func.max(SCHEMA_VERSION.c.version))) or 0)
            if current > LATEST_VERSION:
                raise ConfigError(
                    f"catalog {self.display_url} has schema v{current}, newer than this nsysan "
                    f"understands (v{LATEST_VERSION}): upgrade nsysan"
                )
            for version, description, apply in MIGRATIONS:
                if current < version <= target:
                    apply(conn)
                    conn.execute(
                        SCHEMA_VERSION.insert().values(
                            version=version, description=description, applied_utc=utcnow()
                        )
                    )
                    current = version
            return current

        return self.transaction(run)

    # -- writes ------------------------------------------------------------------------------
    def record(self, rec: RunRecord) -> None:
        """Insert or replace one run with its trace, metrics and findings (one transaction)."""
        self.transaction(lambda conn: _write_record(conn, rec))

    def has_ok_run(self, trace_id: str, skip_key: str) -> bool:
        q = sa.select(sa.func.count()).where(
            RUNS.c.trace_id == trace_id, RUNS.c.skip_key == skip_key, RUNS.c.status == "ok"
        )
        return bool(self.read(lambda conn: conn.scalar(q)))

    def set_baseline(self, name: str, trace_id: str, run_id: str | None = None) -> dict[str, Any]:
        """Name a run (default: the trace's latest ok run) as a baseline for later diffs."""

        def run(conn: Connection) -> dict[str, Any]:
            q = (
                sa.select(RUNS.c.run_id, RUNS.c.output_dir)
                .where(RUNS.c.trace_id == trace_id, RUNS.c.status == "ok")
                .order_by(RUNS.c.finished_utc.desc(), RUNS.c.run_id.desc())
            )
            if run_id is not None:
                q = q.where(RUNS.c.run_id == run_id)
            row = conn.execute(q.limit(1)).first()
            if row is None:
                raise ConfigError(f"no successful run of trace {trace_id!r} in the catalog")
            mrow = conn.execute(sa.select(METRICS).where(METRICS.c.run_id == row.run_id)).first()
            metrics = {k: getattr(mrow, k) for k in METRIC_COLUMNS} if mrow is not None else {}
            values = {
                "name": name,
                "created_utc": utcnow(),
                "trace_id": trace_id,
                "run_id": row.run_id,
                "output_dir": row.output_dir,
                "metrics_json": json.dumps(metrics, sort_keys=True, default=str),
            }
            _upsert(conn, BASELINES, values, ["name"])
            return values

        return self.transaction(run)

    def baseline(self, name: str) -> dict[str, Any] | None:
        row = self.read(
            lambda conn: conn.execute(sa.select(BASELINES).where(BASELINES.c.name == name)).first()
        )
        if row is None:
            return None
        out = dict(row._mapping)
        out["metrics"] = json.loads(out.pop("metrics_json") or "{}")
        return out


def _upsert(conn: Connection, table: sa.Table, values: dict[str, Any], keys: list[str],
            *, keep: tuple[str, ...] = ()) -> None:
    """INSERT, or UPDATE the non-key columns (except ``keep``) when the key exists."""
    update = {k: v for k, v in values.items() if k not in keys and k not in keep}
    name = conn.dialect.name
    if name in ("sqlite", "postgresql"):
        if name == "sqlite":
            from sqlalchemy.dialects.sqlite import insert
        else:
            from sqlalchemy.dialects.postgresql import insert
        stmt = insert(table).values(**values)
        if update:
            stmt = stmt.on_conflict_do_update(index_elements=keys, set_=update)
        else:
            stmt = stmt.on_conflict_do_nothing(index_elements=keys)
        conn.execute(stmt)
        return
    where = sa.and_(*(table.c[k] == values[k] for k in keys))
    done = conn.execute(table.update().where(where).values(**update)).rowcount if update else 0
    if not done and not conn.execute(sa.select(sa.func.count()).where(where).select_from(table)
                                     ).scalar():
        conn.execute(table.insert().values(**values))


def _write_record(conn: Connection, rec: RunRecord) -> None:
    now = utcnow()
    trace = {
        "trace_id": rec.trace_id,
        "group_name": rec.group,
        "input_path": rec.input_path,
        "input_format": rec.input_format,
        "sha256": rec.sha256,
        "size_bytes": rec.input_bytes,
        "first_seen_utc": now,
        "last_seen_utc": now,
        "last_run_id": rec.run_id,
        "aliases_json": json.dumps(rec.aliases) if rec.aliases else None,
    }
    if rec.status == "ok":
        meta = rec.trace_meta
        trace.update(
            exporter_version=meta.get("exporter_version"),
            export_schema_version=meta.get("schema_version"),
            recorded_version=meta.get("recorded_version"),
            source_format=meta.get("source_format"),
            session_start_utc_ns=meta.get("session_start_utc_ns"),
            duration_ns=meta.get("duration_ns"),
        )
    _upsert(conn, TRACES, trace, ["trace_id"], keep=("first_seen_utc",))
    conn.execute(FINDINGS.delete().where(FINDINGS.c.run_id == rec.run_id))
    conn.execute(METRICS.delete().where(METRICS.c.run_id == rec.run_id))
    run = {
        "run_id": rec.run_id,
        "batch_id": rec.batch_id,
        "trace_id": rec.trace_id,
        "status": rec.status,
        "error_type": rec.error_type,
        "error_message": rec.error_message,
        "error_detail": rec.error_detail,
        "started_utc": rec.started_utc,
        "finished_utc": rec.finished_utc,
        "duration_s": rec.duration_s,
        "input_bytes": rec.input_bytes,
        "output_bytes": rec.output_bytes,
        "output_dir": rec.output_dir,
        "sha256": rec.sha256,
        "skip_key": rec.skip_key,
        "nsysan_version": rec.nsysan_version,
        "params_json": rec.params_json,
        "worker": rec.worker,
        "peak_rss_bytes": rec.peak_rss_bytes,
        "timings_json": json.dumps(rec.timings_s, sort_keys=True) if rec.timings_s else None,
    }
    _upsert(conn, RUNS, run, ["run_id"])
    if rec.status != "ok":
        return
    metrics = {k: rec.metrics.get(k) for k in METRIC_COLUMNS}
    conn.execute(
        METRICS.insert().values(
            run_id=rec.run_id,
            trace_id=rec.trace_id,
            extra_json=json.dumps(rec.extra_metrics, sort_keys=True) if rec.extra_metrics else None,
            **metrics,
        )
    )
    if rec.findings:
        conn.execute(
            FINDINGS.insert(),
            [
                {
                    "run_id": rec.run_id,
                    "trace_id": rec.trace_id,
                    "seq": f["seq"],
                    "code": f.get("code"),
                    "layer": f.get("layer"),
                    "severity": f.get("severity"),
                    "title": f.get("title"),
                    "message": f.get("message"),
                    "metric_name": f.get("metric_name"),
                    "metric_value": f.get("metric_value"),
                    "metric_unit": f.get("metric_unit"),
                    "device_id": f.get("device_id"),
                    "pid": f.get("pid"),
                    "evidence_json": json.dumps(f.get("evidence") or {}, sort_keys=True),
                }
                for f in rec.findings
            ],
        )
