"""`distinct`: the distinct rows of a few integer columns of a million-row frame, fast."""

from __future__ import annotations

import polars as pl

from nsysan.frames.packed_keys import GROUP, Keys

#: `distinct` packs at most this many rows at a time: the packed codes and each column's
#: Int64 copy are arrays of a chunk, not of the frame (18-27 MiB at once on 1M kernels)
CHUNK = 1 << 18
#: a first chunk with more distinct rows than this takes the whole frame at once: chunks
#: would only add work (each chunk's rows are packed again for the last unique)
FEW = CHUNK // 16


def distinct(df: pl.DataFrame) -> pl.DataFrame:
    """``df.unique()`` in no particular order, through one packed Int64 code per row
    (`packed_keys.Keys`, which also keeps nulls apart): a unique on several columns of a
    million rows costs several times the same on one Int64 column.

    A frame of more than `CHUNK` rows (ids of calls or ops: a few distinct rows among
    millions) is taken a chunk at a time, then once more over the chunks' distinct rows;
    one whose first chunk holds many distinct rows (more than `FEW`) at once."""
    if df.height <= CHUNK:
        return _packed_unique(df)
    first = _packed_unique(df.slice(0, CHUNK))
    if first.height > FEW:
        return _packed_unique(df)
    parts = [first, *(_packed_unique(df.slice(at, CHUNK))
                      for at in range(CHUNK, df.height, CHUNK))]
    return _packed_unique(pl.concat(parts))


def _packed_unique(df: pl.DataFrame) -> pl.DataFrame:
    keys = Keys([df], df.columns, [])
    return keys.attach_by(keys.group_code(0).unique().alias(GROUP).to_frame())
