"""The interval kernel: every pass builds on these few vectorised operations.

All intervals are half-open ``[start, end)`` in Int64 nanoseconds. Zero-length intervals cover
nothing and are dropped. ``by`` names the grouping columns (e.g. ``["device_id"]``); an empty
list means one group. Nothing here loops in Python over events: each function is a handful of
polars expressions, so cost is a sort plus linear scans.
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

START = "start_ns"
END = "end_ns"


def _over(expr: pl.Expr, by: Sequence[str]) -> pl.Expr:
    return expr.over(list(by)) if by else expr


def union(
    df: pl.LazyFrame | pl.DataFrame,
    by: Sequence[str] = (),
    start: str = START,
    end: str = END,
) -> pl.LazyFrame:
    """Merge overlapping or touching intervals per group.

    Returns ``by + [start, end]``, sorted by group then start, disjoint and non-touching.
    """
    by = list(by)
    lf = (
        df.lazy()
        .select([*by, start, end])
        .filter(pl.col(end) > pl.col(start))
        .sort([*by, start, end])
    )
    # A new block starts where the interval begins after every earlier interval has ended.
    prev_max_end = _over(pl.col(end).cum_max().shift(1), by)
    new_block = prev_max_end.is_null() | (pl.col(start) > prev_max_end)
    return (
        lf.with_columns(_over(new_block.cum_sum(), by).alias("_block"))
        .group_by([*by, "_block"], maintain_order=True)
        .agg(pl.col(start).min(), pl.col(end).max())
        .drop("_block")
        .sort([*by, start])
    )


def total(df: pl.LazyFrame | pl.DataFrame, by: Sequence[str] = (),
          start: str = START, end: str = END, name: str = "busy_ns") -> pl.LazyFrame:
    """Length of the union per group (``by + [name]``)."""
    u = union(df, by, start, end)
    length = (pl.col(end) - pl.col(start)).sum().alias(name)
    if by:
        return u.group_by(list(by), maintain_order=True).agg(length)
    return u.select(length)


def complement(
    df: pl.LazyFrame | pl.DataFrame,
    by: Sequence[str] = (),
    start: str = START,
    end: str = END,
) -> pl.LazyFrame:
    """Gaps between the union's blocks, inside ``[first start, last end)`` of each group.

    Returns ``by + [start, end]`` of every gap (strictly positive length), sorted.
    """
    by = list(by)
    u = union(df, by, start, end)
    prev_end = _over(pl.col(end).shift(1), by)
    return (
        u.with_columns(prev_end.alias("_prev_end"))
        .filter(pl.col("_prev_end").is_not_null())
        .select([*by, pl.col("_prev_end").alias(start), pl.col(start).alias(end)])
    )


def state_segments(
    df: pl.LazyFrame | pl.DataFrame,
    classes: Sequence[str],
    by: Sequence[str] = (),
    class_col: str = "cls",
    start: str = START,
    end: str = END,
    idle: str = "idle",
) -> pl.LazyFrame:
    """k-way sweep: split each group's span ``[first start, last end)`` into maximal segments
    with a constant set of active classes.

    ``classes`` fixes the vocabulary and the order of names in the state label; a segment's
    ``state`` is the active class names joined with ``+`` in that order, or ``idle``. The
    segments of a group tile its span exactly. Returns ``by + [start, end, state]``.
    Intervals whose class is not in ``classes`` are ignored.
    """
    by = list(by)
    classes = list(classes)
    lf = (
        df.lazy()
        .select([*by, class_col, start, end])
        .filter((pl.col(end) > pl.col(start)) & pl.col(class_col).is_in(classes))
    )
    # One +1 event at every start and one -1 at every end, with a delta column per class.
    deltas = [
        pl.when(pl.col(class_col) == c).then(pl.col("_d")).otherwise(0).alias(f"_d_{i}")
        for i, c in enumerate(classes)
    ]
    events = pl.concat(
        [
            lf.select([*by, class_col, pl.col(start).alias("_t"), pl.lit(1, pl.Int64).alias("_d")]),
            lf.select([*by, class_col, pl.col(end).alias("_t"), pl.lit(-1, pl.Int64).alias("_d")]),
        ]
    ).with_columns(deltas)
    per_t = (
        events.group_by([*by, "_t"])
        .agg([pl.col(f"_d_{i}").sum() for i in range(len(classes))])
        .sort([*by, "_t"])
    )
    counts = per_t.with_columns(
        [_over(pl.col(f"_d_{i}").cum_sum(), by).alias(f"_n_{i}") for i in range(len(classes))]
    )
    parts = [
        pl.when(pl.col(f"_n_{i}") > 0).then(pl.lit(c)).otherwise(None)
        for i, c in enumerate(classes)
    ]
    state = pl.concat_str(parts, separator="+", ignore_nulls=True)
    return (
        counts.with_columns(_over(pl.col("_t").shift(-1), by).alias("_next"))
        .filter(pl.col("_next").is_not_null())
        .select(
            [
                *by,
                pl.col("_t").alias(start),
                pl.col("_next").alias(end),
                pl.when(state == "").then(pl.lit(idle)).otherwise(state).alias("state"),
            ]
        )
        .filter(pl.col(end) > pl.col(start))
    )


def overlay(
    segments: pl.LazyFrame | pl.DataFrame,
    windows: pl.LazyFrame | pl.DataFrame,
    by: Sequence[str] = (),
    window_cols: Sequence[str] = ("step",),
    start: str = START,
    end: str = END,
) -> pl.LazyFrame:
    """Intersect two sets of *disjoint* intervals per group.

    ``segments`` and ``windows`` each hold non-overlapping intervals (within a group). Every
    piece of a segment that lies inside a window is returned with the segment's other columns
    and the window's ``window_cols``; pieces outside every window are dropped.
    """
    by = list(by)
    window_cols = list(window_cols)
    seg = segments.lazy().filter(pl.col(end) > pl.col(start))
    win = (
        windows.lazy()
        .select([*by, *window_cols, pl.col(start).alias("_ws"), pl.col(end).alias("_we")])
        .filter(pl.col("_we") > pl.col("_ws"))
    )
    bps = (
        pl.concat(
            [
                seg.select([*by, pl.col(start).alias("_b")]),
                seg.select([*by, pl.col(end).alias("_b")]),
                win.select([*by, pl.col("_ws").alias("_b")]),
                win.select([*by, pl.col("_we").alias("_b")]),
            ]
        )
        .unique()
        .sort([*by, "_b"])
        .with_columns(_over(pl.col("_b").shift(-1), by).alias("_b_next"))
        .filter(pl.col("_b_next").is_not_null())
    )
    seg_cols = [c for c in seg.collect_schema().names() if c not in (*by, start, end)]
    seg_renamed = seg.rename({start: "_ss", end: "_se"})
    pieces = (
        bps.join_asof(
            seg_renamed.sort("_ss"), left_on="_b", right_on="_ss", by=by or None,
            strategy="backward", check_sortedness=False,
        )
        .filter(pl.col("_se").is_not_null() & (pl.col("_b") < pl.col("_se")))
        .join_asof(
            win.sort("_ws"), left_on="_b", right_on="_ws", by=by or None, strategy="backward",
            check_sortedness=False,
        )
        .filter(pl.col("_we").is_not_null() & (pl.col("_b") < pl.col("_we")))
    )
    return pieces.select(
        [*by, *window_cols, *seg_cols, pl.col("_b").alias(start), pl.col("_b_next").alias(end)]
    )
