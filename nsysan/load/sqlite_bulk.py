"""SQLite tables through ADBC: all the columns of a big table in one read, through pyarrow's
stream reader (`read_bulk`), and the integer columns of the others (`read_ints`).

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

Why some integer columns go into narrower buffers (``narrow``): a frame build holds its raw
columns until its last step, and most ids of an activity table (device, stream, context,
correlation, grid sizes) end up in a 16- or 32-bit frame column. Stored 64 bits wide as
read, they were most of a build's transient memory (the gpu_ops build of 1M kernels peaked
~300 MB above the frame it made). A column the caller names is stored in its narrow type
while every value read so far fits it, checked batch by batch; the first batch with a value
that does not fit widens the column back to Int64, so no value is ever cut, and the caller's
own conversion reports it as it always did.

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
#: the integer types a column read as Int64 may be stored in while its values fit
NARROW_NUMPY = {pl.Int8(): np.int8, pl.Int16(): np.int16, pl.Int32(): np.int32,
                pl.UInt8(): np.uint8, pl.UInt16(): np.uint16, pl.UInt32(): np.uint32}


class UnexpectedColumn(Exception):
    """A batch typed otherwise than its column: read the table another way."""


def read_bulk(
    uri: str, table: str, columns: Sequence[str], dtypes: Mapping[str, pl.DataType | None],
    rows: int, narrow: Mapping[str, pl.DataType] | None = None,
) -> tuple[pl.DataFrame, dict[str, int]] | None:
    """``columns`` of ``table`` (Int64, Float64 or String, as ``dtypes``; about ``rows``
    rows) in the SQLite file at ``uri``, in rowid order, and the number of values per column
    read as NULL because they were stored with another type (text only: a number column with
    another value fails the read); None to read the table another way. The Int64 columns
    of ``narrow`` come in the type it gives (one of `NARROW_NUMPY`) when all their values
    fit it, as Int64 otherwise; only in tables without text (module docstring)."""
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
                df = read_numbers(reader, columns, [dtypes[c] for c in columns], rows,
                                  narrow)
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
    if not isinstance(df, pl.DataFrame):
        return None
    # (only `read_numbers` narrows: the one-table read of a text table gives Int64)
    narrowed = {c for c in columns
                if df.schema[c] != dtypes[c] and df.schema[c] == (narrow or {}).get(c)}
    if any(df.schema[c] not in (dtypes[c], pl.Null()) for c in columns if c not in narrowed):
        return None
    nulled = {c: int((df[flags[c]] == 2).sum()) if c in flags else 0 for c in columns}
    return df.select(
        pl.when(pl.col(flags[c]) == 0).then(pl.col(c)).alias(c) if c in flags
        else pl.col(c) if c in narrowed else pl.col(c).cast(dtypes[c]) for c in columns
    ), nulled


def read_numbers(reader: Any, columns: Sequence[str], dtypes: Sequence[pl.DataType | None],
                 rows: int, narrow: Mapping[str, pl.DataType] | None = None) -> pl.DataFrame:
    """The batches of ``reader`` (a pyarrow RecordBatchReader of ``columns``, Int64 or
    Float64 as ``dtypes``, about ``rows`` rows) as one frame, each batch copied into the
    columns' buffers and dropped before the next is read; the Int64 columns of ``narrow`` in
    the type it gives while their values fit (`read_bulk`). Raises `UnexpectedColumn` when a
    batch holds another type than its column's."""
    buffers = _Buffers(columns, dtypes, rows, narrow)
    for batch in reader:
        buffers.append(batch)
        del batch
    return buffers.frame()


class _Buffers:
    """One numpy array per column, filled batch by batch, plus a validity mask for a column
    once one of its values is NULL. ``kinds`` are the arrays' types, ``read_kinds`` the
    batches' (they differ for a column stored narrow)."""

    def __init__(self, columns: Sequence[str], dtypes: Sequence[pl.DataType | None],
                 rows: int, narrow: Mapping[str, pl.DataType] | None = None):
        narrow = narrow or {}
        kinds = [_NUMPY.get(dt) for dt in dtypes]  # type: ignore[call-overload]
        if None in kinds:
            raise UnexpectedColumn(", ".join(columns))
        self.columns = list(columns)
        self.read_kinds: list[type] = kinds  # type: ignore[assignment]
        self.dtypes = [narrow[c] if dt == pl.Int64() and narrow.get(c) in NARROW_NUMPY else dt
                       for c, dt in zip(columns, dtypes, strict=True)]
        self.kinds = [NARROW_NUMPY.get(dt, kind)  # type: ignore[call-overload]
                      for dt, kind in zip(self.dtypes, self.read_kinds, strict=True)]
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
            if array.type != pa.from_numpy_dtype(self.read_kinds[i]):
                raise UnexpectedColumn(self.columns[i])
            values = array.fill_null(0).to_numpy() if array.null_count else array.to_numpy()
            if self.kinds[i] is not self.read_kinds[i] and not _fits(values, self.kinds[i]):
                self._widen(i)
            self.values[i][at] = values
            if array.null_count:
                self._mask(i)[at] = array.is_valid().to_numpy(zero_copy_only=False)
            elif self.valid[i] is not None:
                self._mask(i)[at] = True
        self.rows += n

    def _reserve(self, n: int) -> None:
        if self.rows + n <= self.capacity:
            return
        # more rows than the largest rowid: rowids below 1 (SQLite allows them)
        self.capacity = max(self.rows + n, self.capacity * 3 // 2)
        self.values = [np.resize(v, self.capacity) for v in self.values]
        self.valid = [None if m is None else np.resize(m, self.capacity) for m in self.valid]

    def _widen(self, i: int) -> None:
        """Store column ``i`` as read from now on: a value does not fit its narrow type."""
        self.kinds[i] = self.read_kinds[i]
        self.dtypes[i] = pl.Int64()
        self.values[i] = self.values[i].astype(self.kinds[i])

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


def _fits(values: np.ndarray, kind: type) -> bool:
    """True when every value of ``values`` (integers) is within the range of ``kind``."""
    if not values.size:
        return True
    bounds = np.iinfo(kind)
    return bool(values.min() >= bounds.min and values.max() <= bounds.max)


def read_ints(con: Any, table: str, columns: Sequence[str]) -> pl.DataFrame | None:
    """INTEGER ``columns`` of ``table`` as Int64 over the open ADBC connection ``con`` (the
    caller serialises its use), or None to take the row path.

    Why: the row path builds one Python object per value (about 1 us each: 90% of loading
    a 1M-kernel trace); ADBC's SQLite driver fills Arrow buffers in C, 4x faster (see
    bench/RESULTS.md). It is used only where it cannot change a result: integer columns,
    and any error — a value SQLite stored with another type (ADBC then fails with "Type
    mismatch"), a first batch typed otherwise — falls back to the row path, which turns
    such values into nulls.
    """
    from adbc_driver_manager import AdbcStatement

    sql = f"SELECT {', '.join(quote(c) for c in columns)} FROM {quote(table)}"
    try:
        stmt = AdbcStatement(con)
        try:
            stmt.set_sql_query(sql)
            stream, _ = stmt.execute_query()
            df = pl.DataFrame(stream)  # Arrow C stream: no pyarrow import needed
        finally:
            stmt.close()
    except Exception:  # any driver failure means: use the row path
        return None
    if df.columns != list(columns) or any(dt not in (pl.Int64, pl.Null) for dt in df.dtypes):
        return None
    return df.cast(dict.fromkeys(columns, pl.Int64()))
