"""`SqliteSource`: raw nsys tables from a SQLite export, read-only, into polars.

Reading strategy (measured in ``bench/RESULTS.md``, "Loading" and "Analyze"): INTEGER columns
(nearly everything nsysan reads) go through the ADBC SQLite driver into Arrow buffers, 3-4x
faster than the stdlib on big tables (tables of `BULK_MIN_ROWS` rows or more: every column in
one query through pyarrow's reader, which releases the GIL so that frames load in parallel,
see `SqliteSource._read_bulk`); every other column, and any table where ADBC fails, goes
through the stdlib ``sqlite3`` module (``fetchmany`` in chunks, one typed ``pl.Series`` per
column). ADBC alone is not robust on nsys exports: SQLite is dynamically typed, ADBC fixes a
column's type from its first batch (an NVTX ``text`` column that starts with NULLs fails) and
fails on a stored value of another type; connectorx likewise rejects such values and takes no
SQLite URI options. So the dtype comes from the declared column type and a value that does not
fit becomes null instead of an error, whichever path read it.

Hostile values are bounded in SQL, before Python or polars sees them (docs/data-quality.md):
text longer than `quality.text_limit` bytes is cut in the query (on its bytes, as a BLOB: the
text ``substr`` stops at the first NUL, and real environment strings hold NULs; at a character
boundary: `quality.bounded_sql`), and a value of another type than its column's (text or a
non-integral real in an INTEGER column, a blob in a TEXT one) is read as NULL by a ``CASE`` on
its ``typeof`` (`quality.readable_sql`), so neither a 200 MB name nor a 200 MB text in a
timestamp column is ever materialised. Both are counted per column (`issues`)."""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Mapping
from concurrent.futures import Future
from pathlib import Path

import polars as pl

from nsysan.errors import SchemaError, TraceFormatError
from nsysan.frames.trace import TableCounts
from nsysan.load import sqlite_bulk
from nsysan.load.quality import bounded_sql, readable_sql, text_limit, truncate_text
from nsysan.load.source import RowFilter
from nsysan.load.sqlite_file import (
    NSYS_MARKER_TABLES,
    check_sqlite_header,
    file_uri,
    read_header,
    read_only_file,
)
from nsysan.load.sqlite_sql import (
    declared_dtype,
    decode_replacing,
    quote,
    to_frame,
    where_sql,
)

FORMAT = "sqlite"
#: rows fetched per round trip: bounds the Python objects alive at once on huge tables
CHUNK_ROWS = 1 << 16
#: tables with at least this many rows are read by `SqliteSource._read_bulk` (module attribute so
#: that tests can lower it); below it, importing pyarrow costs more than reading in parallel gains
BULK_MIN_ROWS = 100_000
#: filtered reads of tables this big go through pyarrow's reader (GIL released, as
#: `BULK_MIN_ROWS` for whole tables); they return a fraction of the table, so below this the
#: pyarrow import (~0.05 s) costs more than parallel reading gains
FILTERED_ARROW_MIN_ROWS = 1_000_000


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class SqliteSource:
    """`TableSource` over an nsys SQLite export, opened read-only.

    Construction validates the file (header, size, that it is an nsys export). The connection
    stays open for the lazy frame loads of a `Trace`; `close` (or garbage collection) ends it.
    """

    format: str = FORMAT

    def __init__(self, path: str | Path):
        self.path = Path(path)
        check_sqlite_header(self.path, read_header(self.path))
        self._lock = threading.Lock()
        self._immutable = read_only_file(self.path)
        self._adbc: tuple | bool | None = None  # (database, connection) once opened
        try:
            self._con = sqlite3.connect(
                file_uri(self.path, self._immutable),
                uri=True,
                check_same_thread=False,  # frames may be loaded from a worker thread; see _lock
            )
            names = [
                r[0]
                for r in self._con.execute(
                    "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name"
                )
            ]
        except sqlite3.DatabaseError as exc:
            raise TraceFormatError(
                f"{self.path}: corrupt SQLite file ({_first_line(exc)}); re-export the report"
            ) from None
        self._names = names
        if "StringIds" not in names or not any(t in names for t in NSYS_MARKER_TABLES):
            self._con.close()
            raise TraceFormatError(
                f"{self.path} is a SQLite database but not an Nsight Systems export: no "
                f"StringIds / no nsys tables; pass the .sqlite written by `nsys export`"
            )
        self._columns: dict[str, list[tuple[str, str]]] = {}
        self._counts: TableCounts | None = None
        self._estimates: dict[str, int] = {}
        #: table -> column -> {"nulled" | "truncated": values}, from the last read of it
        self._issues: dict[str, dict[str, dict[str, int]]] = {}

    def __repr__(self) -> str:
        return f"SqliteSource({str(self.path)!r})"

    def __enter__(self) -> SqliteSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _execute(self, sql: str) -> list[tuple]:
        with self._lock:
            try:
                return self._con.execute(sql).fetchall()
            except sqlite3.DatabaseError as exc:
                raise TraceFormatError(
                    f"{self.path}: corrupt SQLite file ({_first_line(exc)}); re-export the report"
                ) from None

    def tables(self) -> TableCounts:
        """Every table present, with its row count. Which tables hold rows is asked at once
        (an ``EXISTS`` per table: one page each); the exact counts are computed in a
        background thread on a connection of its own and waited for only when read (see
        `TableCounts`)."""
        if self._counts is None:
            if not self._names:
                self._counts = TableCounts({})
            else:
                sql = " UNION ALL ".join(f"SELECT {i}, EXISTS (SELECT 1 FROM {quote(t)})"
                                         for i, t in enumerate(self._names))
                found = dict(self._execute(sql))
                nonempty = {t: bool(found[i]) for i, t in enumerate(self._names)}
                self._counts = TableCounts(names=self._names, nonempty=nonempty,
                                           pending=self._count_in_background(),
                                           bounds=self._row_bounds())
        return self._counts

    def adopt_counts(self, counts: Mapping[str, int]) -> bool:
        """Take ``counts`` as this file's table counts instead of counting (they were
        counted in this very version of the file earlier: `nsysan.load.cache.stored_counts`),
        when nothing was counted yet and they name exactly this file's tables."""
        if self._counts is not None or set(counts) != set(self._names):
            return False
        self._counts = TableCounts({t: int(counts[t]) for t in self._names})
        return True

    def _row_bounds(self) -> dict[str, int]:
        """The span of every table's rowids (0 when empty; two page walks each): an upper
        bound of its row count known at once, for decisions that cannot wait for
        ``count(*)``. None at all when a table has no rowid."""
        # (one aggregate per SELECT: SQLite reads min or max alone from the b-tree's edge,
        # but scans the table for both at once)
        sql = " UNION ALL ".join(
            f"SELECT {i}, (SELECT max(rowid) FROM {quote(t)}) - (SELECT min(rowid) FROM "
            f"{quote(t)}) + 1" for i, t in enumerate(self._names))
        try:
            found = dict(self._execute(sql))
        except TraceFormatError:  # (a WITHOUT ROWID table: no bounds, the counts decide)
            return {}
        return {t: int(found[i] or 0) for i, t in enumerate(self._names)}

    def _count_in_background(self) -> Future[dict[str, int]]:
        sql = " UNION ALL ".join(
            f"SELECT {i}, count(*) FROM {quote(t)}" for i, t in enumerate(self._names))
        names, uri, path = list(self._names), file_uri(self.path, self._immutable), self.path
        future: Future[dict[str, int]] = Future()

        def count() -> None:
            try:
                con = sqlite3.connect(uri, uri=True, check_same_thread=False)
                try:
                    counts = dict(con.execute(sql).fetchall())
                finally:
                    con.close()
                future.set_result({t: int(counts[i]) for i, t in enumerate(names)})
            except sqlite3.DatabaseError as exc:
                future.set_exception(TraceFormatError(
                    f"{path}: corrupt SQLite file ({_first_line(exc)}); re-export the report"))
            except BaseException as exc:  # surfaces where the counts are read
                future.set_exception(exc)

        threading.Thread(target=count, name="nsysan-count", daemon=True).start()
        return future

    def rows_estimate(self, table: str) -> int:
        """About how many rows ``table`` has, without counting them: its largest rowid
        (the count itself in a table written once, as nsys writes them). For choosing a
        read path, never for a result."""
        if table not in self._estimates:
            try:
                (top,), = self._execute(f"SELECT max(rowid) FROM {quote(table)}")
            except TraceFormatError:  # e.g. a WITHOUT ROWID table: count it
                top = self.tables().get(table, 0)
            self._estimates[table] = int(top or 0)
        return self._estimates[table]

    def _declared(self, table: str) -> list[tuple[str, str]]:
        if table not in self._columns:
            if table not in self._names:
                return []
            rows = self._execute(f"PRAGMA table_info({quote(table)})")
            self._columns[table] = [(r[1], r[2] or "") for r in rows]
        return self._columns[table]

    def columns(self, table: str) -> list[str]:
        """Column names of ``table`` in export order; empty when the table is absent."""
        return [name for name, _ in self._declared(table)]

    def read(self, table: str, columns: list[str]) -> pl.DataFrame:
        """The given columns of ``table`` in row (rowid) order, dtypes from the declared types:
        INTEGER -> Int64, TEXT -> String, REAL -> Float64. A stored value that does not fit its
        declared type (SQLite allows that) becomes null rather than failing the whole read."""
        return self.read_narrowed(table, columns, {})

    def read_narrowed(self, table: str, columns: list[str],
                      narrow: Mapping[str, pl.DataType]) -> pl.DataFrame:
        """`read`, with each INTEGER column of ``narrow`` in the narrower integer type given
        there when the table is read in bulk and all its values fit that type (Int64
        otherwise): `nsysan.load.source.NarrowingSource`."""
        declared = dict(self._declared(table))
        if not declared:
            raise SchemaError(
                f"table {table} not found in {self.path}; was it captured, and exported without "
                f"--tables?"
            )
        unknown = [c for c in columns if c not in declared]
        if unknown:
            raise SchemaError(
                f"table {table} in {self.path} has no column {', '.join(unknown)}; it has: "
                f"{', '.join(declared)}"
            )
        dtypes = {c: declared_dtype(declared[c]) for c in columns}
        if not columns:
            return pl.DataFrame()
        df = self._read_any(table, columns, dtypes, narrow)
        cut = {}
        for c in columns:
            if dtypes[c] != pl.Int64():
                _, n = truncate_text(df[c], text_limit(table), cut=False)  # cut in SQL
                if n:
                    cut[c] = n
        issues = self._issues.setdefault(table, {})
        for c in columns:
            if c in cut:
                issues.setdefault(c, {})["truncated"] = cut[c]
            elif dtypes[c] != pl.Int64():
                issues.get(c, {}).pop("truncated", None)
        return df

    def not_null(self, table: str) -> set[str]:
        """The columns of ``table`` declared NOT NULL (SQLite enforces the constraint)."""
        if table not in self._names:
            return set()
        return {r[1] for r in self._execute(f"PRAGMA table_info({quote(table)})") if r[3]}

    def read_where(self, table: str, columns: list[str], where: RowFilter, *,
                   expected_rows: int | None = None) -> pl.DataFrame:
        """The given INTEGER columns of the rows of ``table`` that match ``where``
        (`nsysan.load.source.FilteredSource`). The filter runs in SQLite, so only matching
        rows cross into Arrow; a long ``in`` list is sent in chunks of `sqlite_sql.IN_CHUNK`
        values. A value of another type than INTEGER makes the ADBC read fail; the row path
        then reads these rows (such values as NULL) and counts them per column over the whole
        table (`issues`), which tells the caller to read the table whole. ``expected_rows``:
        about how many rows match (a read in one statement sizes its buffers for them,
        `_read_query`)."""
        declared = dict(self._declared(table))
        wrong = [c for c in columns if declared_dtype(declared.get(c, "")) != pl.Int64()]
        if not declared or wrong:
            raise SchemaError(f"table {table} in {self.path}: no INTEGER column "
                              f"{', '.join(wrong or columns)}")
        dtypes: dict[str, pl.DataType | None] = dict.fromkeys(columns, pl.Int64())
        source = quote(table)
        select = ", ".join(quote(c) for c in columns)
        parts = []
        conditions = where_sql(where)
        for condition in conditions:
            sql = f"SELECT {select} FROM {source} WHERE {condition}"
            df = self._read_query(table, sql, columns,
                                  expected_rows if len(conditions) == 1 else None)
            if df is None:
                df = self._read_rows(table, columns, dtypes, where=f"{source} WHERE {condition}")
            parts.append(df)
        if not parts:
            return pl.DataFrame(schema=dict.fromkeys(columns, pl.Int64()))
        return parts[0] if len(parts) == 1 else pl.concat(parts)

    def _read_query(self, table: str, sql: str, columns: list[str],
                    expected_rows: int | None = None) -> pl.DataFrame | None:
        """``sql`` (integer columns only) through ADBC, or None when ADBC is off or fails (a
        value of another type: "Type mismatch"). On a table of `FILTERED_ARROW_MIN_ROWS` rows
        or more through pyarrow's reader, which releases the GIL (see `_read_bulk`); given
        ``expected_rows``, each batch is copied into buffers sized for them and dropped
        (`sqlite_bulk.read_numbers`) instead of holding all batches and their contiguous copy
        at once (the leaf frames of the call chains: 0.37 GB at 10M kernels)."""
        if os.environ.get("NSYSAN_NO_ADBC"):
            return None
        try:
            import adbc_driver_sqlite
            from adbc_driver_manager import AdbcConnection, AdbcStatement

            with adbc_driver_sqlite.connect(file_uri(self.path, self._immutable)) as db, \
                    AdbcConnection(db) as con, AdbcStatement(con) as stmt:
                stmt.set_options(**{"adbc.sqlite.query.batch_rows":
                                    str(sqlite_bulk.BATCH_ROWS)})
                stmt.set_sql_query(sql)
                stream, _ = stmt.execute_query()
                if self.rows_estimate(table) >= FILTERED_ARROW_MIN_ROWS:
                    import pyarrow as pa

                    reader = pa.RecordBatchReader.from_stream(stream)
                    df = (sqlite_bulk.read_numbers(reader, columns, [pl.Int64()] * len(columns),
                                                   expected_rows) if expected_rows
                          else pl.from_arrow(reader.read_all()))
                else:
                    df = pl.DataFrame(stream)
        except Exception:  # any driver failure means: take the row path
            return None
        if not isinstance(df, pl.DataFrame) or df.columns != columns or any(
                dt not in (pl.Int64, pl.Null) for dt in df.dtypes):
            return None
        return df.cast(dict.fromkeys(columns, pl.Int64()))

    def read_blobs(self, table: str, column: str, max_bytes: int) -> pl.Series:
        """``column`` of ``table`` as raw bytes (Binary), in row (rowid) order, as `read`
        returns rows: nsys declares ``NVTX_EVENTS.binaryData`` TEXT but stores blobs, which
        `read` (rightly, for a TEXT column) reads as NULL. Values longer than ``max_bytes``
        and numbers are NULL; the bytes pass as hex text, decoded in polars."""
        q = quote(column)
        if not self._execute(f"SELECT 1 FROM {quote(table)} WHERE {q} IS NOT NULL LIMIT 1"):
            # the column exists but holds nothing (e.g. payload schemas without blobs)
            return pl.Series(column, [None] * self.tables().get(table, 0), dtype=pl.Binary)
        sql = (f"SELECT CASE WHEN typeof({q}) IN ('blob', 'text') AND "
               f"length(CAST({q} AS BLOB)) <= {int(max_bytes)} THEN hex({q}) END "
               f"FROM {quote(table)}")
        rows = self._execute(sql)
        return pl.Series(column, [r[0] for r in rows], dtype=pl.String).str.decode("hex")

    def issues(self, table: str) -> dict[str, dict[str, int]]:
        """Values of ``table`` that its reads could not return as stored: per column,
        ``nulled`` (of another type than the column's, read as NULL) and ``truncated`` (cut
        to `quality.text_limit`)."""
        return {c: dict(v) for c, v in self._issues.get(table, {}).items() if v}

    def _read_any(
        self, table: str, columns: list[str], dtypes: dict[str, pl.DataType | None],
        narrow: Mapping[str, pl.DataType],
    ) -> pl.DataFrame:
        if self.rows_estimate(table) >= BULK_MIN_ROWS:
            bulk = self._read_bulk(table, columns, dtypes, narrow)
            if bulk is not None:
                return bulk
        ints = [c for c in columns if dtypes[c] == pl.Int64()]
        fast = self._read_ints(table, ints) if ints else None
        if fast is not None:
            self._set_nulled(table, dict.fromkeys(ints, 0))  # ADBC found integers only
            rest = [c for c in columns if c not in fast.columns]
            if not rest:
                return fast.select(columns)
            other = self._read_rows(table, rest, dtypes)
            if other.height == fast.height:  # both are plain rowid-order scans of one table
                return fast.hstack(other).select(columns)
        return self._read_rows(table, columns, dtypes)

    def _set_nulled(self, table: str, counts: dict[str, int]) -> None:
        issues = self._issues.setdefault(table, {})
        for c, n in counts.items():
            if n:
                issues.setdefault(c, {})["nulled"] = int(n)
            else:
                issues.get(c, {}).pop("nulled", None)

    def _count_nulled(
        self, table: str, columns: list[str], dtypes: dict[str, pl.DataType | None]
    ) -> None:
        """Count, per column, the values the row path reads as NULL because SQLite stored
        them with another type than the column's (`quality.bounded_sql`): one aggregate scan,
        in C, only on that path."""
        sums = ", ".join(
            f"coalesce(sum(NOT ({readable_sql(quote(c), dtypes[c])})), 0)" for c in columns
        )
        (counts,) = self._con.execute(f"SELECT {sums} FROM {quote(table)}").fetchall()
        self._set_nulled(table, dict(zip(columns, counts, strict=True)))

    def _read_rows(
        self, table: str, columns: list[str], dtypes: dict[str, pl.DataType | None],
        where: str = "",
    ) -> pl.DataFrame:
        """The row path: stdlib cursor, one typed Series per column and chunk (``where``:
        what follows ``FROM`` instead of the table, for `read_where`)."""
        select = ", ".join(
            f"{bounded_sql(table, quote(c), dtypes[c])} AS {quote(c)}" for c in columns
        )
        sql = f"SELECT {select} FROM {where or quote(table)}"
        with self._lock:
            try:
                self._count_nulled(table, columns, dtypes)
                chunks = self._fetch(sql, columns, dtypes)
            except sqlite3.OperationalError as exc:
                if "decode" not in str(exc):
                    raise self._corrupt(table, exc) from None
                # Some text is not valid UTF-8 (seen in TARGET_INFO_SYSTEM_ENV): read it again
                # with replacement characters. Only then, because a Python text factory is slow.
                self._con.text_factory = decode_replacing
                try:
                    chunks = self._fetch(sql, columns, dtypes)
                except sqlite3.DatabaseError as exc2:
                    raise self._corrupt(table, exc2) from None
                finally:
                    self._con.text_factory = str
            except sqlite3.DatabaseError as exc:
                raise self._corrupt(table, exc) from None
        if not chunks:
            return to_frame([], columns, dtypes)
        return chunks[0] if len(chunks) == 1 else pl.concat(chunks, how="vertical_relaxed")

    def _read_ints(self, table: str, columns: list[str]) -> pl.DataFrame | None:
        """INTEGER columns of ``table`` as Int64 through ADBC (`sqlite_bulk.read_ints`), or
        None to take the row path."""
        con = self._adbc_connection()
        if con is None:
            return None
        with self._lock:
            return sqlite_bulk.read_ints(con, table, columns)

    def _read_bulk(
        self, table: str, columns: list[str], dtypes: dict[str, pl.DataType | None],
        narrow: Mapping[str, pl.DataType],
    ) -> pl.DataFrame | None:
        """All ``columns`` of a big table in one ADBC read (`sqlite_bulk.read_bulk`), or None
        to take the per-column paths below."""
        if os.environ.get("NSYSAN_NO_ADBC"):
            return None
        read = sqlite_bulk.read_bulk(file_uri(self.path, self._immutable), table, columns,
                                     dtypes, self.rows_estimate(table), narrow)
        if read is None:
            return None
        df, nulled = read
        self._set_nulled(table, nulled)
        return df

    def _adbc_connection(self):  # -> adbc_driver_manager.AdbcConnection | None
        if self._adbc is None:
            self._adbc = False
            if os.environ.get("NSYSAN_NO_ADBC"):
                return None
            try:
                import adbc_driver_sqlite
                from adbc_driver_manager import AdbcConnection

                db = adbc_driver_sqlite.connect(file_uri(self.path, self._immutable))
                self._adbc = (db, AdbcConnection(db))
            except Exception:  # not installed or cannot open: row path
                return None
        return self._adbc[1] if self._adbc else None

    def _fetch(
        self, sql: str, columns: list[str], dtypes: dict[str, pl.DataType | None]
    ) -> list[pl.DataFrame]:
        cur = self._con.execute(sql)
        chunks = []
        while rows := cur.fetchmany(CHUNK_ROWS):
            chunks.append(to_frame(rows, columns, dtypes))
        return chunks

    def _corrupt(self, table: str, exc: BaseException) -> TraceFormatError:
        return TraceFormatError(
            f"{self.path}: corrupt SQLite file while reading {table} ({_first_line(exc)}); "
            f"re-export the report"
        )

    def close(self) -> None:
        self._con.close()
        if self._adbc:
            for handle in reversed(self._adbc):
                handle.close()
            self._adbc = False
