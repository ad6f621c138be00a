"""The interval kernel: every pass builds on these few vectorised operations.

All intervals are half-open ``[start, end)`` in Int64 nanoseconds. Zero-length intervals cover
nothing and are dropped. ``by`` names the grouping columns (e.g. ``["device_id"]``); an empty
list means one group. Nothing here loops in Python over events: each function is a handful of
polars expressions, so cost is a sort plus linear scans.

Why no ``.over(by)`` in union / complement / state_segments / overlay: polars window
functions cost about a second per 100k rows when there are tens of thousands of groups (e.g.
evidence per gap in the gaps pass). Instead, rows are sorted so every group is contiguous and
running sums run over the whole frame: +1/-1 event deltas sum to zero within each group, so a
global cumulative sum restarts at 0 at every group boundary by itself, and "next row of the
same group" is a global shift guarded by `_same_group`.
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

START = "start_ns"
END = "end_ns"


def _over(expr: pl.Expr, by: Sequence[str]) -> pl.Expr:
    return expr.over(list(by)) if by else expr


def _same_group(by: Sequence[str], offset: int) -> pl.Expr:
    """True where the row ``offset`` rows away (1: previous, -1: next) exists and has the same
    ``by`` key (nulls equal), in a frame sorted by ``by``."""
    row = pl.int_range(pl.len())
    exists = row >= offset if offset > 0 else row < pl.len() + offset
    same = [pl.col(c).eq_missing(pl.col(c).shift(offset)) for c in by]
    return pl.all_horizontal([exists, *same])


def _events(lf: pl.LazyFrame, by: list[str], start: str, end: str, *extra: str) -> pl.LazyFrame:
    """One +1 row (``_d``) at every start and one -1 row at every end, time in ``_t``."""
    return pl.concat(
        [
            lf.select([*by, *extra, pl.col(start).alias("_t"), pl.lit(1, pl.Int64).alias("_d")]),
            lf.select([*by, *extra, pl.col(end).alias("_t"), pl.lit(-1, pl.Int64).alias("_d")]),
        ]
    )


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
    # Sort the intervals (not 2x as many start/end events: sorting dominates) and start a new
    # block where an interval starts after every earlier one of its group has ended; an
    # interval starting exactly at that reach touches the block and joins it.
    lf = (
        df.lazy().select([*by, start, end]).filter(pl.col(end) > pl.col(start))
        .sort([*by, start])
    )
    reach = _over(pl.col(end).cum_max().shift(1), by)
    return (
        lf.with_columns((pl.col(start) > reach).fill_null(True).cum_sum().alias("_blk"))
        .group_by([*by, "_blk"], maintain_order=True)
        .agg(pl.col(start).first(), pl.col(end).max())
        .select([*by, start, end])
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
    prev_end = pl.when(_same_group(by, 1)).then(pl.col(end).shift(1))
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
    # Per class, deltas sum to zero within each group: the global running sum is the count.
    # The count after all events at one instant is the running sum at its last event, so a
    # sort and a filter do what a group-by per instant plus a sort did, at half the cost.
    last_at_t = ~_same_group([*by, "_t"], -1)
    counts = (
        _events(lf, by, start, end, class_col)
        .with_columns(deltas)
        .sort([*by, "_t"])
        .with_columns(
            [pl.col(f"_d_{i}").cum_sum().alias(f"_n_{i}") for i in range(len(classes))]
        )
        .filter(last_at_t)
    )
    # The state is computed as a bit set (bit i = class i active) and named only at the end:
    # building a label string per sweep event dominated this function on 1M-kernel traces.
    code = pl.sum_horizontal(
        [pl.when(pl.col(f"_n_{i}") > 0).then(1 << i).otherwise(0) for i in range(len(classes))]
    ).cast(pl.Int64)
    segments = (
        counts.with_columns(pl.when(_same_group(by, -1)).then(pl.col("_t").shift(-1))
                            .alias("_next"))
        .filter(pl.col("_next").is_not_null())
        .select([*by, pl.col("_t").alias(start), pl.col("_next").alias(end),
                 code.alias("_code")])
    )
    # Where one interval ends exactly as another of the same class starts, the event times
    # split a constant state in two: merge runs of equal state so segments are maximal. A run
    # is kept as its first segment, extended to the start of the next run (or its own end).
    same_run = _same_group(by, 1) & (pl.col("_code") == pl.col("_code").shift(1))
    last_of_group = ~_same_group(by, -1)
    merged = (
        segments.with_columns(
            (~same_run).alias("_first"),
            pl.when(last_of_group).then(pl.col(end)).alias("_last_end"),
        )
        .filter(pl.col("_first") | pl.col("_last_end").is_not_null())
        .with_columns(
            pl.when(~_same_group(by, -1)).then(pl.col("_last_end"))
            .when(pl.col("_first").shift(-1)).then(pl.col(start).shift(-1))
            .otherwise(pl.col("_last_end").shift(-1)).alias(end)
        )
        .filter(pl.col("_first"))
    )
    names = {
        c: "+".join(n for i, n in enumerate(classes) if c >> i & 1) or idle
        for c in range(1 << len(classes))
    }
    return merged.select(
        [*by, start, end,
         pl.col("_code").replace_strict(names, return_dtype=pl.String).alias("state")]
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
        .with_columns(pl.when(_same_group(by, -1)).then(pl.col("_b").shift(-1)).alias("_b_next"))
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


# ---------------------------------------------------------------------------------------------
# Coverage: how much of each interval another set of intervals covers (exposed time, windows)
# ---------------------------------------------------------------------------------------------


def covered(
    df: pl.LazyFrame | pl.DataFrame,
    cover: pl.LazyFrame | pl.DataFrame,
    by: Sequence[str] = (),
    start: str = START,
    end: str = END,
    name: str = "covered_ns",
) -> pl.LazyFrame:
    """For every interval of ``df``, the length of its intersection with the union of
    ``cover`` in the same ``by`` group (Int64 ns; 0 when nothing covers it).

    How: with ``C(t)`` = covered length before ``t`` (the union's blocks are disjoint and
    sorted, so ``C`` is a prefix sum found by one as-of join per endpoint), an interval's
    coverage is ``C(end) - C(start)``. ``df`` keeps its rows, order and columns; intervals
    of ``df`` may overlap each other. Exposed time = length - coverage.
    """
    by = list(by)
    by_arg = by or None
    blocks = (
        union(cover, by, start, end)
        .with_columns((pl.col(end) - pl.col(start)).alias("_len"))
        .with_columns(
            _over(pl.col("_len").cum_sum().shift(1, fill_value=0), by).alias("_before")
        )
        .select([*by, pl.col(start).alias("_bs"), pl.col(end).alias("_be"), "_before"])
        .sort("_bs")
    )
    lf = df.lazy().with_row_index("_cov_row")

    def cum_at(col: str, alias: str) -> pl.LazyFrame:
        # C(t): everything in blocks that start at or before t, clipped at t.
        pts = lf.select(["_cov_row", *by, pl.col(col).alias("_t")]).sort("_t")
        return pts.join_asof(
            blocks, left_on="_t", right_on="_bs", by=by_arg, strategy="backward",
            check_sortedness=False,
        ).select(
            "_cov_row",
            pl.when(pl.col("_bs").is_null())
            .then(0)
            .otherwise(
                pl.col("_before")
                + pl.min_horizontal(pl.col("_t"), pl.col("_be")) - pl.col("_bs")
            )
            .cast(pl.Int64)
            .alias(alias),
        )

    return (
        lf.join(cum_at(start, "_c_start"), on="_cov_row", how="left")
        .join(cum_at(end, "_c_end"), on="_cov_row", how="left")
        .with_columns(
            pl.when(pl.col(end) > pl.col(start))
            .then(pl.col("_c_end") - pl.col("_c_start"))
            .otherwise(0)
            .cast(pl.Int64)
            .alias(name)
        )
        .sort("_cov_row")
        .drop("_cov_row", "_c_start", "_c_end")
    )
