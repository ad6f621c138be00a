"""`conform`, the edge every frame and table passes through (`nsysan.frames.schemas`): the
declared column order and dtypes, with the checks that keep a damaged export from being
wrapped or truncated silently (integers narrowed to 16 or 32 bits; labels cast to a small
vocabulary), and the small vocabularies themselves. Re-exported by `nsysan.frames.schemas`.
"""

from __future__ import annotations

import polars as pl

from nsysan.errors import TraceFormatError

#: the most labels a `small_vocabulary` holds (one-byte codes: polars keeps 255)
SMALL_VOCABULARY_MAX = 255
#: the most labels one trace may bring to a small vocabulary (`fit_small_vocabulary`)
SMALL_LABELS_PER_TRACE = 64


def small_vocabulary(name: str) -> pl.Categorical:
    """The Categorical of an open vocabulary of a few labels (memory kinds, copy kinds, thread
    states: CUDA's and the kernel's enums, a few dozen at most, plus the number of a code
    nsysan does not know): its own categories with one-byte codes, instead of the global
    categories' four bytes per row. Labels sort, compare and take min/max by their text like
    any Categorical; a frame's column joins only a column of the same vocabulary."""
    return pl.Categorical(pl.Categories(f"nsysan_{name}", physical=pl.UInt8))


#: `gpu_ops.copy_kind` (HtoD, DtoH, ...)
COPY_KIND = small_vocabulary("copy_kind")
#: `gpu_ops.src_kind` and ``dst_kind`` (pageable, pinned, device, ...)
MEMORY_KIND = small_vocabulary("memory_kind")
#: `cpu_samples.thread_state` and `sched.out_state` (running, sleeping, ...)
THREAD_STATE = small_vocabulary("thread_state")
SMALL_VOCABULARIES = (COPY_KIND, MEMORY_KIND, THREAD_STATE)


def fit_small_vocabulary(values: pl.Series, dtype: pl.Categorical, column: str) -> None:
    """Check that the labels of ``values`` (the column ``column`` of one trace) fit the small
    vocabulary ``dtype``, before any of them is added to it: nsys writes a few dozen labels
    at most there, so more than `SMALL_LABELS_PER_TRACE` is a damaged export, and so is a
    vocabulary that they would fill (`SMALL_VOCABULARY_MAX` with the labels of the frames
    this process holds: the vocabulary is shared by every trace, and one damaged export
    must not leave it full). Raises `TraceFormatError`."""
    labels = values.drop_nulls().unique().cast(pl.String)
    if labels.len() > SMALL_LABELS_PER_TRACE:
        why = f"holds {labels.len()} distinct labels"
    else:
        known = dtype.categories.to_series()
        new = int((~labels.is_in(known.implode())).sum())
        if known.len() + new <= SMALL_VOCABULARY_MAX:
            return
        why = (f"brings the labels of the traces this process holds to more than "
               f"{SMALL_VOCABULARY_MAX}")
    raise TraceFormatError(
        f"column {column} {why}, where nsys writes a few dozen: the export is damaged or was "
        "not written by nsys; export the report again (nsys export --type sqlite)")


def conform(df: pl.DataFrame | pl.LazyFrame, schema: pl.Schema):
    """Select and cast ``df`` to ``schema`` (columns missing from ``df`` become nulls).

    Used at every edge where a frame is produced, so that a frame always has its declared
    column order and dtypes whatever the source. An integer column of a `pl.DataFrame` that
    narrows to a 16- or 32-bit type is checked first: a value outside that range raises
    `TraceFormatError` (nsys writes no such value there: the input is damaged), never an
    overflow or a polars error; so are the labels cast to a small vocabulary
    (`fit_small_vocabulary`).
    """
    if isinstance(df, pl.DataFrame):
        _check_narrowing(df, schema)
        for name, dtype in schema.items():
            if (dtype in SMALL_VOCABULARIES and name in df.columns
                    and df.schema[name] != dtype):
                fit_small_vocabulary(df[name], dtype, name)
    have = set(df.collect_schema().names())
    exprs = [
        (pl.col(name) if name in have else pl.lit(None)).cast(dtype).alias(name)
        for name, dtype in schema.items()
    ]
    return df.select(exprs)


#: per narrow type: its range, the integer types it takes without a check, and what a value
#: of that column is (for the error message)
_NARROW = {
    pl.Int32: ((-(1 << 31), (1 << 31) - 1), (pl.Int8, pl.Int16, pl.Int32, pl.UInt8, pl.UInt16),
               "a 32-bit number in every export nsys writes"),
    pl.UInt32: ((0, (1 << 32) - 1), (pl.UInt8, pl.UInt16, pl.UInt32),
                "a CUDA id, which CUPTI records as an unsigned 32-bit number (its "
                "not-applicable marker 0xFFFFFFFF reads as null)"),
    pl.UInt16: ((0, (1 << 16) - 1), (pl.UInt8, pl.UInt16),
                "a launch dimension, which CUDA limits to 65535"),
    pl.Int16: ((-(1 << 15), (1 << 15) - 1), (pl.Int8, pl.Int16, pl.UInt8),
               "a CPU number, a 16-bit number in every export nsys writes"),
}


def _check_narrowing(df: pl.DataFrame, schema: pl.Schema) -> None:
    for name, dtype in schema.items():
        have = df.schema.get(name)
        if dtype not in _NARROW or have is None or not have.is_integer():
            continue
        (low, high), fits, what = _NARROW[dtype]
        if have in fits:
            continue
        lo, hi = df[name].min(), df[name].max()
        bad = [v for v in (lo, hi) if v is not None and not
               low <= v <= high]  # type: ignore[operator]
        if bad:
            raise TraceFormatError(
                f"column {name} holds {bad[0]}, outside the range of {what}: the export is "
                "damaged or was not written by nsys; export the report again (nsys export "
                "--type sqlite)")



def select_narrowed(df: pl.DataFrame, exprs: dict[str, pl.Expr | str], schema: pl.Schema
                    ) -> pl.DataFrame:
    """``df.select(**exprs)`` with each column that ``schema`` declares already conformed to
    its dtype (`conform`'s checks included), made one column at a time from a frame the
    caller owns: ``df``'s columns are dropped here.

    Why: a frame build's last select held the raw integer frame, the selected frame (Int64
    ids, widths as read) and, in `conform`, its narrowed copy at once. Here each output
    column is narrowed as soon as it is made, and each input column is dropped after the
    last expression that reads it, so the build holds the raw frame and the narrow columns
    made so far; the `conform` that finishes the frame then casts nothing. Expressions of no
    column (literals) are broadcast to the frame's height, as ``select`` does beside others,
    and cast to their declared dtype; every other expression must name the columns it reads
    (``pl.first()`` or a regex would read what is left of ``df``: ValueError).
    """
    wanted = {name: pl.col(e) if isinstance(e, str) else e for name, e in exprs.items()}
    last_use: dict[str, str] = {}
    for name, expr in wanted.items():
        for root in expr.meta.root_names():
            last_use[root] = name
    made: dict[str, pl.Series | pl.Expr] = {}
    for name, expr in wanted.items():
        if not expr.meta.root_names():
            if not expr.meta.is_literal(allow_aliasing=True):  # (pl.first(), a regex...)
                raise ValueError(f"select_narrowed: {name} must name the columns it reads")
            made[name] = expr.cast(schema[name]) if name in schema else expr
            continue
        column = df.select(expr.alias(name))
        if name in schema:
            column = conform(column, pl.Schema({name: schema[name]}))
        made[name] = column.to_series()
        del column
        for root, last in last_use.items():
            if last == name and root in df.columns:
                df.drop_in_place(root)
    series = [s for s in made.values() if isinstance(s, pl.Series)]
    out = pl.DataFrame(series, height=df.height)
    literals = {n: e for n, e in made.items() if isinstance(e, pl.Expr)}
    if literals:  # (polars keeps a literal a constant column)
        out = out.with_columns(**literals).select(list(made))
    return out
