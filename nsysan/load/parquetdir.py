"""`ParquetDirSource`: raw nsys tables from a ``nsys export --type parquetdir`` directory.

A parquetdir export is a directory holding one ``<TABLE>.parquet`` file per nsys table, with the
same table and column names as the SQLite export of the same report. Files are scanned lazily
with polars, so a read touches only the requested columns (projection pushdown) and filters on
the returned LazyFrame of `scan` reach the Parquet reader (predicate pushdown).

The point of this module is that a frame read here is *identical* to the same frame read from the
SQLite export, so no adapter or pass knows which form a trace came in. The exporter writes Arrow
types that SQLite does not have; they are normalised to what the SQLite source returns:

- unsigned integers (``globalTid``, ``globalPid``, ``contextId``, ids as ``uint64``): SQLite has
  only signed 64-bit integers, so nsys stores values >= 2**63 (e.g. sampled kernel-space
  instruction pointers) as their two's-complement negative. ``UInt64`` is therefore
  *reinterpreted* bit for bit as ``Int64`` (a numeric cast would fail on those values); narrower
  unsigned and signed ints are cast to ``Int64``;
- booleans (``isSchedIn``, ``kernelMode``): SQLite stores 0/1 integers -> ``Int64``;
- ``float`` (``floatValue``): SQLite REAL is a double -> ``Float64`` (widening is exact);
- dictionary-encoded / categorical text -> ``String``.

Measured on the sc22 and ViT captures (nsys 2023.4.4): after this normalisation every column of
every table shared with the SQLite export of the same report is equal value for value, nulls
included; only ``META_DATA_EXPORT`` rows that name the output file and the export time differ.
The 2023.4.4 parquetdir does not write ``META_DATA_CAPTURE`` or ``CUPTI_ACTIVITY_KIND_CUDA_EVENT``.
"""

from __future__ import annotations

import re
from pathlib import Path

import polars as pl

from nsysan.errors import SchemaError, TraceFormatError
from nsysan.frames.trace import TableCounts
from nsysan.load.quality import text_limit, truncate_text
from nsysan.load.source import Cond, RowFilter
from nsysan.load.sqlite_file import NSYS_MARKER_TABLES

FORMAT = "parquetdir"
SUFFIX = ".parquet"
#: the table every nsys export has (all names and strings live there); with it, one of the
#: SQLite source's marker tables must be present too, the same rule as for SQLite exports
REQUIRED_TABLE = "StringIds"
#: nsys table names are plain identifiers (``CUPTI_ACTIVITY_KIND_KERNEL``, ``StringIds``)
_TABLE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

_EXPORT_HINT = "re-export the report with `nsys export --type parquetdir` (nsys 2023.4 or newer)"


def is_parquetdir(path: Path) -> bool:
    """True when ``path`` looks like a parquetdir export: a directory holding
    ``StringIds.parquet`` or a ``CUPTI_ACTIVITY_KIND_*.parquet`` (batch discovery uses this
    rule too). Cheap, for form detection; `ParquetDirSource` validates fully.
    """
    if not path.is_dir():
        return False
    try:
        names = [p.name for p in path.iterdir()]
    except OSError:
        return False
    return any(
        n == f"{REQUIRED_TABLE}{SUFFIX}"
        or (n.startswith("CUPTI_ACTIVITY_KIND_") and n.endswith(SUFFIX))
        for n in names
    )


def _normalised(name: str, dtype: pl.DataType) -> pl.Expr:
    """The expression that turns a Parquet column into what the SQLite source returns."""
    col = pl.col(name)
    if dtype == pl.UInt64:
        return col.reinterpret(signed=True)
    if dtype == pl.Int64:
        return col
    if dtype.is_integer() or dtype == pl.Boolean:
        return col.cast(pl.Int64)
    if dtype == pl.Float32:
        return col.cast(pl.Float64)
    if isinstance(dtype, (pl.Categorical, pl.Enum)):
        return col.cast(pl.String)
    return col


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class ParquetDirSource:
    """`TableSource` over a parquetdir export.

    Construction validates the directory and reads every file's row count from its footer (one
    batch of metadata-only scans; a file without a valid footer fails here, naming the file).
    Schemas are read from the footers of the tables actually used, on first use.
    """

    format: str = FORMAT

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not self.path.exists():
            raise TraceFormatError(f"{self.path}: no such file or directory")
        if not self.path.is_dir():
            raise TraceFormatError(
                f"{self.path}: not a directory; a parquetdir export is a directory of "
                f"<TABLE>{SUFFIX} files"
            )
        try:
            entries = list(self.path.iterdir())
        except OSError as exc:
            raise TraceFormatError(f"{self.path}: cannot be read ({exc.strerror or exc})") from None
        if not entries:
            raise TraceFormatError(f"{self.path}: directory is empty; {_EXPORT_HINT}")
        files = sorted(
            p for p in entries if p.suffix == SUFFIX and p.is_file() and _TABLE_NAME.match(p.stem)
        )
        if not files:
            raise TraceFormatError(
                f"{self.path}: no <TABLE>{SUFFIX} files in this directory, so it is not an nsys "
                f"parquetdir export; {_EXPORT_HINT}"
            )
        self._files: dict[str, Path] = {p.stem: p for p in files}
        self._schemas: dict[str, pl.Schema] = {}
        #: table -> column -> {"truncated": values}, from the last read of it
        self._issues: dict[str, dict[str, dict[str, int]]] = {}
        self._counts = self._count_rows()
        if REQUIRED_TABLE not in self._files or not any(
            t in self._files for t in NSYS_MARKER_TABLES
        ):
            raise TraceFormatError(
                f"{self.path} is a Parquet directory but not an Nsight Systems export: no "
                f"{REQUIRED_TABLE}{SUFFIX} / no nsys tables; pass the directory written by "
                f"`nsys export --type parquetdir`"
            )

    def __repr__(self) -> str:
        return f"ParquetDirSource({str(self.path)!r})"

    def __enter__(self) -> ParquetDirSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _scan(self, table: str) -> pl.LazyFrame:
        # `glob=False`: the directory may contain `*`, `?` or `[`; `hive_partitioning=False`: a
        # parent directory named like `key=value` must not add columns; `cache=False`: every
        # frame is read once and cached by Trace.
        return pl.scan_parquet(self._files[table], glob=False, hive_partitioning=False, cache=False)

    def _corrupt(self, table: str, exc: BaseException, doing: str = "") -> TraceFormatError:
        return TraceFormatError(
            f"{self._files[table]}: corrupt Parquet file{doing} ({_first_line(exc)}); "
            f"re-export the report"
        )

    def _count_rows(self) -> dict[str, int]:
        """Row counts of every file, answered from the footers (no data page is read)."""
        try:
            counts = pl.collect_all([self._scan(t).select(pl.len()) for t in self._files])
            return {t: int(c.item()) for t, c in zip(self._files, counts, strict=True)}
        except Exception:  # polars raises several error types for a bad footer: find the file
            for table in self._files:
                try:
                    self._scan(table).select(pl.len()).collect()
                except Exception as exc:
                    raise self._corrupt(table, exc) from None
            raise

    def _schema(self, table: str) -> pl.Schema | None:
        if table not in self._files:
            return None
        if table not in self._schemas:
            try:
                self._schemas[table] = self._scan(table).collect_schema()
            except Exception as exc:
                raise self._corrupt(table, exc) from None
        return self._schemas[table]

    def tables(self) -> TableCounts:
        """Every table present, with its row count from the Parquet footer."""
        return TableCounts(self._counts)

    def columns(self, table: str) -> list[str]:
        """Column names of ``table`` in export order; empty when the table is absent."""
        schema = self._schema(table)
        return list(schema.names()) if schema is not None else []

    def scan(self, table: str, columns: list[str]) -> pl.LazyFrame:
        """The given columns of ``table`` as a LazyFrame with the SQLite source's dtypes.

        Columns that need no conversion are passed through untouched, so a filter on them (e.g.
        ``start``, ``end``, ``deviceId``) is pushed down into the Parquet scan.
        """
        schema = self._schema(table)
        if schema is None:
            raise SchemaError(
                f"table {table} not found in {self.path} (no {table}{SUFFIX}); "
                f"was it captured, and exported without --tables?"
            )
        unknown = [c for c in columns if c not in schema]
        if unknown:
            raise SchemaError(
                f"table {table} in {self.path} has no column {', '.join(unknown)}; "
                f"it has: {', '.join(schema.names())}"
            )
        return self._scan(table).select([_normalised(c, schema[c]) for c in columns])

    def read(self, table: str, columns: list[str]) -> pl.DataFrame:
        """The given columns of ``table``, in file (= export) order, SQLite-source dtypes.

        Text longer than `nsysan.load.quality.text_limit` bytes is cut as the SQLite source
        cuts it; a Parquet page is decoded whole, so here the long value is read once, then
        cut before any frame copies it."""
        lf = self.scan(table, columns)
        try:
            df = lf.collect()
        except pl.exceptions.PolarsError as exc:  # bad data pages behind a valid footer
            raise self._corrupt(table, exc, f" while reading {table}") from None
        issues = self._issues.setdefault(table, {})
        for c in columns:
            series, n = truncate_text(df[c], text_limit(table), cut=True)
            if n:
                df = df.with_columns(series)
                issues[c] = {"truncated": n}
            else:
                issues.pop(c, None)
        return df

    def read_where(self, table: str, columns: list[str], where: RowFilter, *,
                   expected_rows: int | None = None) -> pl.DataFrame:
        """The given integer columns of the rows of ``table`` that match ``where``
        (`nsysan.load.source.FilteredSource`): a filter on the lazy scan, which reads only
        these columns (into buffers of the result's size: ``expected_rows`` is not needed)."""

        def cond(c: Cond) -> pl.Expr:
            col = pl.col(c.column)
            if c.op == "is_null":
                return col.is_null()
            if c.op == "in":
                return col.is_in(pl.Series(list(c.value), dtype=pl.Int64).implode())
            return col == c.value if c.op == "==" else col > c.value

        match = pl.any_horizontal(pl.all_horizontal(cond(c) for c in alt) for alt in where) \
            if where else pl.lit(False)
        lf = self.scan(table, columns).filter(match)
        try:
            df = lf.collect()
        except pl.exceptions.PolarsError as exc:
            raise self._corrupt(table, exc, f" while reading {table}") from None
        wrong = [c for c, dt in df.schema.items() if dt not in (pl.Int64, pl.Null)]
        if wrong:
            raise SchemaError(f"table {table} in {self.path}: no integer column "
                              f"{', '.join(wrong)}")
        return df.cast(dict.fromkeys(columns, pl.Int64()))

    def not_null(self, table: str) -> set[str]:
        """None: a Parquet field may be declared required, but nsys' files are not relied on
        for that (a NULL check is cheap in a Parquet scan)."""
        return set()

    def issues(self, table: str) -> dict[str, dict[str, int]]:
        """Values of ``table`` its reads cut to `quality.text_limit` (per column: ``truncated``);
        Parquet columns are typed, so no value is ever of another type than its column."""
        return {c: dict(v) for c, v in self._issues.get(table, {}).items()}

    def close(self) -> None:
        """Nothing to release: every scan opens and closes its own file."""
