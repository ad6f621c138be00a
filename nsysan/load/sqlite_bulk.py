"""All the columns of a big SQLite table in one read, through ADBC and pyarrow's stream reader.

Why one ADBC read: polars imports an Arrow stream holding the GIL for the whole read;
pyarrow's reader releases it, for the same CPU time, so frames built in parallel threads
(`Trace.prefetch`) read their tables on separate cores. Each read opens its own connection
for that reason.

Why number columns go batch by batch into their final buffers: reading a table as one Arrow
table and converting it held it twice at the end of the read (the batches and polars' copy),
and the batches' memory, freed into the C heap after the copy, stayed in the process: reading
the kernels of a 10M-kernel trace peaked at 2.6 GB for a 1.3 GB table (bench/RESULTS.md,
"Issue 21: tables read into their final buffers"). Each ADBC batch is now copied into numpy
arrays sized for the whole table (its largest rowid; grown when it has more rows) and dropped
before the next one is read, so the read holds the columns once plus one batch, whose heap
blocks the next batch reuses; polars then takes the arrays without a copy.

Tables with text keep the one-table read: TEXT columns come as ``coalesce(c, '')`` plus an
is-null flag, because ADBC types a column from its first batch and a NULL-first text column
would come out as integers; the Arrow data is fully validated, so text that is not UTF-8 (which
the row path reads with replacement characters) is never handed to polars.

Any surprise — a value stored with another type, a column typed otherwise, no driver —
returns None, and the caller reads the table the per-column way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import polars as pl

from nsysan.load.quality import bounded_sql
from nsysan.load.sqlite_sql import quote

#: rows per ADBC batch: a batch of 20 number columns is ~10 MB, reused by the next one
BATCH_ROWS = 1 << 16
#: the most rows the buffers are sized for before the first batch (nsys numbers rows 1..n,
#: but a file with huge rowids would otherwise reserve memory for rows it does not have)
FIRST_CAPACITY = 1 << 26

_NUMPY = {pl.Int64(): np.int64, pl.Float64(): np.float64}


class UnexpectedColumn(Exception):
    """A batch typed otherwise than its column: read the table another way."""


def read_bulk(
    uri: str, table: str, columns: Sequence[str], dtypes: Mapping[str, pl.DataType | None],
    rows: int,
) -> tuple[pl.DataFrame, dict[str, int]] | None:
    """``columns`` of ``table`` (Int64, Float64 or String, as ``dtypes``; about ``rows``
    rows) in the SQLite file at ``uri``, in rowid order, and the number of values per column
    read as NULL because they were stored with another type (text only: a number column with
    another value fails the read); None to read the table another way."""
    if any(dtypes[c] not in (pl.Int64(), pl.Float64(), pl.String()) for c in columns):
        return None
    select, flags = [], {}
    for i, c in enumerate(columns):
        if dtypes[c] == pl.String():
            flags[c] = f"_nsysan_null_{i}"
            bounded = bounded_sql(table, quote(c), dtypes[c])
            select += [f"coalesce({bounded}, '') AS {quote(c)}",
                       f"CASE typeof({quote(c)}) WHEN 'null' THEN 1 WHEN 'blob' THEN 2 "
                       f"ELSE 0 END AS {flags[c]}"]
        else:
            select.append(quote(c))
    sql = f"SELECT {', '.join(select)} FROM {quote(table)}"
    try:
        import adbc_driver_sqlite
        import pyarrow as pa
        from adbc_driver_manager import AdbcConnection, AdbcStatement

        with adbc_driver_sqlite.connect(uri) as db, AdbcConnection(db) as con, \
                AdbcStatement(con) as stmt:
            stmt.set_options(**{"adbc.sqlite.query.batch_rows": str(BATCH_ROWS)})
            stmt.set_sql_query(sql)
            stream, _ = stmt.execute_query()
            reader = pa.RecordBatchReader.from_stream(stream)
            if not flags:
                df = read_numbers(reader, columns, [dtypes[c] for c in columns], rows)
            else:
                arrow = reader.read_all()
        if flags:
            arrow.validate(full=True)
            # One contiguous copy now, while the batches can be freed right after: sorting
            # a chunked frame would copy it twice (rechunk, then gather).
            df = pl.from_arrow(arrow)
            del arrow
    except Exception:  # any driver or data surprise: the caller takes the other paths
        return None
    if not isinstance(df, pl.DataFrame) or any(
        df.schema[c] not in (dtypes[c], pl.Null()) for c in columns
    ):
        return None
    nulled = {c: int((df[flags[c]] == 2).sum()) if c in flags else 0 for c in columns}
    return df.select(
        pl.when(pl.col(flags[c]) == 0).then(pl.col(c)).alias(c) if c in flags
        else pl.col(c).cast(dtypes[c]) for c in columns
    ), nulled


def read_numbers(reader: Any, columns: Sequence[str], dtypes: Sequence[pl.DataType | None],
                 rows: int) -> pl.DataFrame:
    """The batches of ``reader`` (a pyarrow RecordBatchReader of ``columns``, Int64 or
    Float64 as ``dtypes``, about ``rows`` rows) as one frame, each batch copied into the
    columns' buffers and dropped before the next is read. Raises `UnexpectedColumn` when a
    batch holds another type than its column's."""
    buffers = _Buffers(columns, dtypes, rows)
    for batch in reader:
        buffers.append(batch)
        del batch
    return buffers.frame()


class _Buffers:
    """One numpy array per column, filled batch by batch, plus a validity mask for a column
    once one of its values is NULL."""

    def __init__(self, columns: Sequence[str], dtypes: Sequence[pl.DataType | None],
                 rows: int):
        kinds = [_NUMPY.get(dt) for dt in dtypes]  # type: ignore[call-overload]
        if None in kinds:
            raise UnexpectedColumn(", ".join(columns))
        self.columns = list(columns)
        self.dtypes = list(dtypes)
        self.kinds: list[type] = kinds  # type: ignore[assignment]
        self.capacity = min(max(int(rows), 1), FIRST_CAPACITY)
        self.values = [np.empty(self.capacity, kind) for kind in self.kinds]
        self.valid: list[np.ndarray | None] = [None] * len(self.columns)
        self.rows = 0

    def append(self, batch: Any) -> None:
        import pyarrow as pa

        if batch.num_columns != len(self.columns):
            raise UnexpectedColumn(", ".join(batch.schema.names))
        n = batch.num_rows
        self._reserve(n)
        at = slice(self.rows, self.rows + n)
        for i, array in enumerate(batch.columns):
            if array.null_count == len(array):  # NULLs only (ADBC may type them int64)
                self._mask(i)[at] = False
                continue
            if array.type != pa.from_numpy_dtype(self.kinds[i]):
                raise UnexpectedColumn(self.columns[i])
            if array.null_count:
                self.values[i][at] = array.fill_null(0).to_numpy()
                self._mask(i)[at] = array.is_valid().to_numpy(zero_copy_only=False)
            else:
                self.values[i][at] = array.to_numpy()
                if self.valid[i] is not None:
                    self._mask(i)[at] = True
        self.rows += n

    def _reserve(self, n: int) -> None:
        if self.rows + n <= self.capacity:
            return
        # more rows than the largest rowid: rowids below 1 (SQLite allows them)
        self.capacity = max(self.rows + n, self.capacity * 3 // 2)
        self.values = [np.resize(v, self.capacity) for v in self.values]
        self.valid = [None if m is None else np.resize(m, self.capacity) for m in self.valid]

    def _mask(self, i: int) -> np.ndarray:
        mask = self.valid[i]
        if mask is None:  # every earlier row of the column had a value
            mask = np.ones(self.capacity, dtype=bool)
            self.valid[i] = mask
        return mask

    def frame(self) -> pl.DataFrame:
        """The rows read, as polars columns over the buffers (a buffer much larger than the
        rows read, where rowids have gaps, is copied to its size first)."""
        series = []
        for i, name in enumerate(self.columns):
            values, self.values[i] = self.values[i], np.empty(0, self.kinds[i])
            if self.rows < values.size * 9 // 10:
                values = values[: self.rows].copy()
            s = pl.Series(name, values[: self.rows], dtype=self.dtypes[i])
            mask, self.valid[i] = self.valid[i], None
            if mask is not None:
                s = s.to_frame().select(
                    pl.when(pl.Series(mask[: self.rows])).then(pl.col(name))).to_series()
            series.append(s)
        return pl.DataFrame(series)
