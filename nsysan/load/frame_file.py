"""One canonical frame in one file that is read back without decoding: the frame cache's format.

Why: a frame read from Parquet is decoded (and decompressed) into fresh memory, then copied
into one chunk per column: on the 10M-kernel copy, reading the cached frames took 4.3 s of
a 27 s warm analysis on 2 cores, half of it the kernel zeroing the new pages. An Arrow IPC
file that is uncompressed and holds one record batch is *memory-mapped* instead: each
numeric column is the file's own pages (the page cache), in one chunk, without a copy.
What is not free is a dictionary column: Arrow stores Categorical and Enum columns as a
dictionary per batch, and polars maps every row of it into its global categories (0.5 s for
the 11.6M names of that copy). So those columns are written as plain integer codes into a
small list of their distinct values, kept in the file's metadata with their exact dtype; on
load each becomes ``values.gather(codes)``: the values are made categories once, and the
rows are one integer gather.

The price is disk: an uncompressed frame takes what it takes in memory (3.4 GB for the 10M
kernel copy against 0.66 GB of LZ4 Parquet; the SQLite export is 9 GB).

A mapped file must not be truncated while it is read (the process would get SIGBUS): the
cache only ever replaces a file by renaming a new one over it, which leaves the mapped
inode intact.
"""

from __future__ import annotations

import io
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.ipc as ipc

#: the schema metadata key of the dictionary columns' values (an IPC stream of one row)
VALUES_KEY = b"nsysan.values"


def _coded(dtype: pl.DataType) -> bool:
    return isinstance(dtype, (pl.Categorical, pl.Enum))


def _code_type(n_values: int) -> pl.DataType:
    """The narrowest unsigned integer that indexes ``n_values`` values."""
    if n_values <= 1 << 8:
        return pl.UInt8()
    return pl.UInt16() if n_values <= 1 << 16 else pl.UInt32()


def _encode(column: pl.Series) -> tuple[pl.Series, pl.Series]:
    """``column`` (Categorical or Enum) as (codes, values): ``values.gather(codes)`` is
    ``column``, nulls included; ``values`` are the distinct non-null values."""
    values = column.unique(maintain_order=True).drop_nulls()
    physical = values.to_physical().cast(pl.UInt32)
    # the code of each physical id present: a lookup as long as the largest id (ids are
    # small and dense: the categories of one process)
    top = int(physical.max()) + 1 if len(physical) else 0  # type: ignore[arg-type]
    lookup = pl.Series(column.name, [None], dtype=_code_type(len(values)))
    lookup = lookup.extend_constant(None, max(top - 1, 0))
    lookup = lookup.scatter(physical, pl.arange(0, len(values), eager=True))
    codes = lookup.gather(column.to_physical().cast(pl.UInt32)) if top else (
        pl.Series(column.name, [None] * len(column), dtype=lookup.dtype))
    return codes, values


def write_frame(df: pl.DataFrame, path: Path) -> None:
    """Write ``df`` to ``path`` as an uncompressed Arrow IPC file of one record batch per
    chunk (one, for a contiguous frame), dictionary columns as codes (module docstring)."""
    columns: list[pl.Series] = []
    values: dict[str, list[pl.Series]] = {}
    for column in df.get_columns():
        if _coded(column.dtype):
            codes, distinct = _encode(column)
            columns.append(codes)
            values[column.name] = [distinct]
        else:
            columns.append(column)
    blob = io.BytesIO()
    pl.DataFrame(values).write_ipc(blob)
    table = pl.DataFrame(columns, height=df.height).to_arrow()
    table = table.replace_schema_metadata({VALUES_KEY: blob.getvalue()})
    with pa.OSFile(str(path), "wb") as sink, ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=max(df.height, 1))


def read_frame(path: Path) -> pl.DataFrame:
    """The frame `write_frame` wrote to ``path``: mapped, its numeric columns not copied,
    every column in one chunk. Raises on a file it did not write (OSError, pyarrow's
    ArrowInvalid (a ValueError), or a polars error)."""
    with pa.memory_map(str(path)) as source:
        schema = ipc.open_file(source).schema
    metadata = schema.metadata or {}
    if VALUES_KEY not in metadata:
        raise ValueError(f"{path}: not a frame file (no {VALUES_KEY!r} metadata)")
    values = pl.read_ipc(io.BytesIO(metadata[VALUES_KEY]))
    columns = []
    for name in schema.names:
        # one mapping per column: a mapping stays resident (every page read through it)
        # while any of its columns lives, and a pass's result may keep one column of a
        # frame long after the frame is released (e.g. the NVTX ranges' ids and times)
        column = pl.read_ipc(path, columns=[name], memory_map=True).to_series()
        if name in values.columns:  # codes into the values: the mapping goes with them
            column = values.get_column(name)[0].alias(name).gather(column)
        if column.n_chunks() > 1:  # (a frame written in several chunks: see `write_frame`)
            column = column.rechunk()
        columns.append(column)
    return pl.DataFrame(columns)
