"""One canonical frame in one file that is read back without decoding: the frame cache's format.

Why: a frame read from Parquet is decoded (and decompressed) into fresh memory, then copied
into one chunk per column: on the 10M-kernel copy, reading the cached frames took 4.3 s of
a 27 s warm analysis on 2 cores, half of it the kernel zeroing the new pages. An Arrow IPC
file that is uncompressed and holds one record batch is *memory-mapped* instead: each
numeric column is the file's own pages (the page cache), in one chunk, without a copy.
What is not free is a dictionary column: Arrow stores Categorical and Enum columns as a
dictionary per batch, and polars maps every row of it into its global categories (0.5 s for
the 11.6M names of that copy). So those columns are written as plain integer codes into a
list of their distinct values, kept with their exact dtype in a small second file (not in
the data file's metadata: every one-column read parses that again, and a frame of millions of
distinct NVTX names would pay for it once per column); on load each becomes
``values.gather(codes)``: the values are made categories once, and the rows are one integer
gather.

The price is disk: an uncompressed frame takes about what it takes in memory (2.7 GB for
the 10M-kernel copy against 0.66 GB of LZ4 Parquet; the SQLite export is 9.2 GB).

A mapped file must not be truncated while it is read (the process would get SIGBUS): the
cache only ever replaces a file by renaming a new one over it, which leaves the mapped
inode intact.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

import polars as pl

#: the data file's schema metadata key of the token that pairs it with its values file
TOKEN_KEY = b"nsysan.token"
#: the data file's schema metadata key of its coded columns' names (JSON)
CODED_KEY = b"nsysan.coded"
#: the values file's column of that token; its other columns are ``VALUE_PREFIX + column``
TOKEN_COLUMN = "token"
VALUE_PREFIX = "values:"


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
    # small and dense: the categories of one process); a null id gathers a null code
    top = int(physical.max()) + 1 if len(physical) else 1  # type: ignore[arg-type]
    lookup = pl.Series(column.name, [None], dtype=_code_type(len(values)))
    lookup = lookup.extend_constant(None, top - 1)
    lookup = lookup.scatter(physical, pl.arange(0, len(values), eager=True))
    return lookup.gather(column.to_physical().cast(pl.UInt32)), values


def write_frame(df: pl.DataFrame, path: Path, values_path: Path) -> None:
    """Write ``df`` to ``path`` as an uncompressed Arrow IPC file of one record batch per
    chunk (one, for a contiguous frame), dictionary columns as codes into their distinct
    values, which go to ``values_path`` (written first): a small IPC file of one row, a list
    per column, with the token that pairs the two files. Both are flushed to the disk
    (`make_durable`) before it returns."""
    columns: list[pl.Series] = []
    values: dict[str, list[Any]] = {TOKEN_COLUMN: [uuid.uuid4().hex]}
    for column in df.get_columns():
        if _coded(column.dtype):
            codes, distinct = _encode(column)
            columns.append(codes)
            values[VALUE_PREFIX + column.name] = [distinct]
        else:
            columns.append(column)
    pl.DataFrame(values).write_ipc(values_path)
    import pyarrow as pa  # (here: an analysis without the cache never needs pyarrow)
    import pyarrow.ipc as ipc

    table = pl.DataFrame(columns, height=df.height).to_arrow()
    coded = [c.name for c in df.get_columns() if _coded(c.dtype)]
    table = table.replace_schema_metadata({TOKEN_KEY: values[TOKEN_COLUMN][0].encode(),
                                           CODED_KEY: json.dumps(coded).encode()})
    with pa.OSFile(str(path), "wb") as sink, ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=max(df.height, 1))
    make_durable(values_path, path)


def make_durable(*paths: Path) -> None:
    """Flush the files ``paths`` to the disk (``fsync``): a mapped file is read without
    decoding, so blocks lost in a system crash, or pages the kernel failed to write back,
    would read as wrong values, not as an error: a cache file is mapped or renamed into
    place only once it is on the disk."""
    for path in paths:
        with open(path, "rb+") as written:
            os.fsync(written.fileno())


def read_frame(path: Path, values_path: Path) -> pl.DataFrame:
    """The frame `write_frame` wrote to ``path`` and ``values_path``: mapped, its numeric
    columns not copied, every column in one chunk.

    Raises OSError, ValueError (pyarrow's ArrowInvalid is one), a polars error or polars'
    PanicException on files it did not write together, damaged or replaced while they were
    read (the columns are mapped one at a time, so they could mix two files). The caller
    checks the dtypes against what it expects: a damaged Enum label reads as another Enum.
    """
    import pyarrow as pa
    import pyarrow.ipc as ipc

    before = file_identity(path)
    with pa.memory_map(str(path)) as source:
        schema = ipc.open_file(source).schema
    token = (schema.metadata or {}).get(TOKEN_KEY)
    coded = json.loads((schema.metadata or {}).get(CODED_KEY, b"null"))
    values = pl.read_ipc(values_path)
    if (token is None or values.height != 1 or TOKEN_COLUMN not in values.columns
            or values.get_column(TOKEN_COLUMN)[0] != token.decode(errors="replace")):
        raise ValueError(f"{path}: not a frame file, or not the pair of {values_path}")
    lookups = {}
    for key, dtype in values.schema.items():
        if key == TOKEN_COLUMN:
            continue
        if not (key.startswith(VALUE_PREFIX) and isinstance(dtype, pl.List)
                and _coded(dtype.inner) and values.get_column(key)[0] is not None):
            raise ValueError(f"{values_path}: {key!r} is not a list of dictionary values")
        lookups[key.removeprefix(VALUE_PREFIX)] = values.get_column(key)[0]
    if not isinstance(coded, list) or sorted(lookups) != sorted(coded):
        raise ValueError(f"{path}: its coded columns do not match the values in {values_path}")
    columns = []
    for name in schema.names:
        # one mapping per column: a mapping stays resident (every page read through it)
        # while any of its columns lives, and a pass's result may keep one column of a
        # frame long after the frame is released (e.g. the NVTX ranges' ids and times)
        column = pl.read_ipc(path, columns=[name], memory_map=True).to_series()
        if name in lookups:  # codes into the values: the mapping goes with them
            if not column.dtype.is_unsigned_integer():  # (gather wraps negative indices)
                raise ValueError(f"{path}: codes of {name!r} are {column.dtype}")
            column = lookups.pop(name).alias(name).gather(column)
        if column.n_chunks() > 1:  # (a frame written in several chunks: see `write_frame`)
            column = column.rechunk()
        columns.append(column)
    if lookups:
        raise ValueError(f"{values_path}: values of columns the frame lacks: {sorted(lookups)}")
    if file_identity(path) != before:
        raise ValueError(f"{path}: replaced while it was read")
    return pl.DataFrame(columns)


def file_identity(path: Path) -> list[int] | None:
    """What tells one version of a file from another without reading it: device, inode,
    size, modification and change times (any write changes the change time); None when it
    cannot be read."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
