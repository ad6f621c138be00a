"""Text operations on the dictionary-encoded columns of the canonical frames.

The names, domains and labels of the event frames are Categorical or Enum columns
(`nsysan.frames.schemas`, conventions): ``.str`` does not apply to them, and casting a
million-row column to String would copy its text into every row again. A regex, a prefix test
or any other text expression is therefore evaluated once per *distinct* value and mapped back
to the rows (`per_value`); a frame of a few hundred rows may simply be cast (`as_text`).
"""

from __future__ import annotations

import polars as pl

#: dtypes whose values are codes into a dictionary of text
ENCODED = (pl.Categorical, pl.Enum)


def is_encoded(dtype: pl.DataType) -> bool:
    return isinstance(dtype, ENCODED)


def per_value(frame: pl.DataFrame, column: str, expr: pl.Expr) -> pl.Expr:
    """``expr``, written on ``pl.col(column)`` as text (String), as an expression over the rows
    of ``frame``: it is evaluated once per distinct value of ``frame[column]`` (null included)
    and every row takes the result of its value.

    ``expr`` must depend on ``column`` alone. The returned expression is valid on ``frame``
    and on any frame whose ``column`` holds only values of ``frame[column]`` (a filtered or
    joined part of it); on another value it gives null. Works on a String column too (the
    distinct values are then simply the strings).
    """
    values = frame.select(pl.col(column).unique())
    text = values.with_columns(pl.col(column).cast(pl.String))
    lookup = pl.DataFrame([values.to_series().alias("_key"),
                           text.select(expr.alias("_value")).to_series()])
    dtype = lookup.schema["_value"]
    known = lookup.filter(pl.col("_key").is_not_null())
    if dtype == pl.Boolean:
        # Two set tests, one bit per row: a mapping of every row through the lookup
        # (``replace_strict``) held ~20 bytes a row while it ran (+350 MB on the 17M calls of
        # a 10M-kernel trace) and took 3-4x longer.
        col = pl.col(column)
        true, false = (known.filter(pl.col("_value") == v)["_key"].implode() for v in (True, False))
        mapped = (pl.when(col.is_in(true)).then(pl.lit(True))
                  .when(col.is_in(false)).then(pl.lit(False))
                  .otherwise(pl.lit(None, dtype=pl.Boolean)))
    else:
        mapped = pl.col(column).replace_strict(known["_key"], known["_value"], default=None,
                                               return_dtype=dtype)
    at_null = lookup.filter(pl.col("_key").is_null())["_value"]
    if at_null.len() and at_null[0] is not None:
        mapped = pl.when(pl.col(column).is_null()).then(
            pl.lit(at_null[0], dtype=dtype)).otherwise(mapped)
    return mapped


def as_text(df: pl.DataFrame, *columns: str) -> pl.DataFrame:
    """``df`` with ``columns`` (every Categorical or Enum column when none is named) cast to
    String: for frames that are small (a summary, a few hundred ranges), or right before
    text leaves the library (an output table, a JSON document)."""
    names = columns or tuple(c for c, d in df.schema.items() if is_encoded(d))
    return df.with_columns(pl.col(c).cast(pl.String) for c in names if c in df.columns)
