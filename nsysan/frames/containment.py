"""Containment and sharing: which NVTX ranges enclose which intervals, range nesting, and
equal sharing of concurrent busy time. Same conventions as `nsysan.frames.intervals`
(half-open Int64 ns intervals, ``by`` grouping columns, no Python loops over events).
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from nsysan.frames.intervals import END, START, _over

# ---------------------------------------------------------------------------------------------
# Containment: which ranges enclose which intervals (NVTX ranges around CUDA API calls)
# ---------------------------------------------------------------------------------------------


def enclosing(
    queries: pl.LazyFrame | pl.DataFrame,
    ranges: pl.LazyFrame | pl.DataFrame,
    by: Sequence[str] = (),
    query_id: str = "query_id",
    range_id: str = "range_id",
    start: str = START,
    end: str = END,
) -> pl.LazyFrame:
    """Every (query, range) pair on the same ``by`` key where the range contains the query,
    inclusively: ``range.start <= query.start and query.end <= range.end``.

    This is the rule of Nsight Systems' ``nvtxgpuproj``. It is exact for any family of ranges:
    ranges that overlap without nesting (start/end ranges) need no special case. How: sort the
    queries by ``(by, start)``; the queries whose start lies in ``[range.start, range.end]``
    are then one contiguous block of rows, found with two as-of joins; the blocks are expanded
    and filtered on the query end. The work is proportional to the number of (query, range)
    pairs whose query *starts* inside the range, i.e. output-sensitive (queries × nesting
    depth for NVTX around API calls), never queries × ranges.

    Zero-length queries and ranges take part (a mark-like query at a range boundary is inside).
    Returns ``by + [query_id, range_id]``, one row per pair, in no particular order.
    """
    if query_id == range_id:
        raise ValueError("enclosing: query_id and range_id must be different column names")
    by = list(by)
    by_arg = by or None
    q = (
        queries.lazy()
        .select([*by, query_id, pl.col(start).alias("_qs"), pl.col(end).alias("_qe")])
        .sort([*by, "_qs"])
        .with_row_index("_qi")
        .with_columns(pl.col("_qi").cast(pl.Int64))
    )
    # One row per distinct (key, start): the first and last row index with that start, so the
    # as-of joins never depend on which of several equal starts they land on.
    starts = q.group_by([*by, "_qs"]).agg(
        pl.col("_qi").min().alias("_lo"), pl.col("_qi").max().alias("_hi")
    )
    r = (
        ranges.lazy()
        .select([*by, range_id, pl.col(start).alias("_rs"), pl.col(end).alias("_re")])
        .filter(pl.col("_re") >= pl.col("_rs"))
    )
    # First query starting at or after the range start; last query starting at or before its end.
    lo = r.sort("_rs").join_asof(
        starts.select([*by, "_qs", "_lo"]).sort("_qs"), left_on="_rs", right_on="_qs",
        by=by_arg, strategy="forward", check_sortedness=False,
    )
    blocks = lo.drop("_qs").sort("_re").join_asof(
        starts.select([*by, "_qs", "_hi"]).sort("_qs"), left_on="_re", right_on="_qs",
        by=by_arg, strategy="backward", check_sortedness=False,
    )
    pairs = (
        blocks.filter(pl.col("_lo").is_not_null() & pl.col("_hi").is_not_null()
                      & (pl.col("_lo") <= pl.col("_hi")))
        .select([range_id, "_re", pl.int_ranges("_lo", pl.col("_hi") + 1).alias("_qi")])
        .explode("_qi", empty_as_null=False)  # lo <= hi: lists are never empty
    )
    return (
        pairs.join(q, on="_qi", how="inner")
        .filter(pl.col("_qe") <= pl.col("_re"))
        .select([*by, query_id, range_id])
    )


def innermost_enclosing(
    queries: pl.LazyFrame | pl.DataFrame,
    ranges: pl.LazyFrame | pl.DataFrame,
    by: Sequence[str] = (),
    query_id: str = "query_id",
    range_id: str = "range_id",
    start: str = START,
    end: str = END,
    depth: str | None = None,
) -> pl.LazyFrame:
    """For each query, the tightest range (same ``by`` key) that contains it (`enclosing`).

    Every other enclosing range of a query is, for properly nested ranges, an ancestor of this
    one; ``enclosing`` lists them all. Queries inside no range are absent.
    Returns ``by + [query_id, range_id]``.
    """
    pairs = enclosing(queries, ranges, by, query_id, range_id, start, end)
    return tightest(pairs, ranges, by, query_id, range_id, start, end, depth)


def tightest(
    pairs: pl.LazyFrame | pl.DataFrame,
    ranges: pl.LazyFrame | pl.DataFrame,
    by: Sequence[str] = (),
    query_id: str = "query_id",
    range_id: str = "range_id",
    start: str = START,
    end: str = END,
    depth: str | None = None,
) -> pl.LazyFrame:
    """Keep, per query, the tightest range among its ``pairs`` (the output of `enclosing`).

    Tightest = shortest range (which, among ranges that all contain the query, is the one
    closest to it on both sides, Nsight Systems' parent rule); ties go to the later start,
    then to the greater ``depth`` (when given), then to the greater ``range_id``. For properly
    nested ranges this is the innermost one; for ranges that overlap without nesting it is
    still well defined. Returns ``by + [query_id, range_id]``.
    """
    by = list(by)
    extra = [depth] if depth else []
    rng = ranges.lazy().select(
        [*by, range_id, pl.col(start).alias("_rs"), pl.col(end).alias("_re"), *extra]
    )
    ranked = pairs.lazy().join(rng, on=[*by, range_id], how="inner").with_columns(
        (pl.col("_re") - pl.col("_rs")).alias("_len")
    )
    order = ["_len", "_rs", *extra, range_id]
    descending = [False, True, *([True] * len(extra)), True]
    return (
        ranked.sort([*by, query_id, *order], descending=[*([False] * (len(by) + 1)), *descending])
        .group_by([*by, query_id], maintain_order=True)
        .first()
        .select([*by, query_id, range_id])
    )


def equal_shares(
    df: pl.LazyFrame | pl.DataFrame,
    by: Sequence[str] = (),
    start: str = START,
    end: str = END,
    name: str = "share_ns",
) -> pl.LazyFrame:
    """Split the union of each group's intervals among the intervals, equally at every instant.

    At an instant where k intervals of the group are active, each of them is credited 1/k of
    that instant. The shares (Float64 nanoseconds) of a group therefore sum to the length of
    its union, and an interval that never overlaps another gets exactly its own length. This
    is how concurrent GPU ops share busy time without double counting.

    How: with ``F(t) = ∫ 1/k`` over the sorted breakpoints of the group, an interval's share is
    ``F(end) - F(start)`` (it is active, so k >= 1, throughout). Returns ``df`` with ``name``
    appended (zero-length intervals get 0).
    """
    by = list(by)
    lf = df.lazy()
    events = pl.concat(
        [
            lf.select([*by, pl.col(start).alias("_t"), pl.lit(1, pl.Int64).alias("_d")]),
            lf.select([*by, pl.col(end).alias("_t"), pl.lit(-1, pl.Int64).alias("_d")]),
        ]
    )
    per_t = (
        events.group_by([*by, "_t"])
        .agg(pl.col("_d").sum())
        .sort([*by, "_t"])
        .with_columns(_over(pl.col("_d").cum_sum(), by).alias("_k"))
        .with_columns(_over(pl.col("_t").shift(-1), by).alias("_next"))
    )
    # Weight of the segment [t, next): its length divided by how many intervals are active.
    weight = (
        pl.when((pl.col("_k") > 0) & pl.col("_next").is_not_null())
        .then((pl.col("_next") - pl.col("_t")).cast(pl.Float64) / pl.col("_k"))
        .otherwise(0.0)
    )
    # F(t) relative to the group's first breakpoint keeps the Float64 values small.
    cum = per_t.with_columns(_over(weight.cum_sum().shift(1, fill_value=0.0), by).alias("_F"))
    f = cum.select([*by, "_t", "_F"])
    return (
        lf.join(f.rename({"_t": start, "_F": "_Fs"}), on=[*by, start], how="left")
        .join(f.rename({"_t": end, "_F": "_Fe"}), on=[*by, end], how="left")
        .with_columns(
            pl.when(pl.col(end) > pl.col(start))
            .then(pl.col("_Fe") - pl.col("_Fs"))
            .otherwise(0.0)
            .alias(name)
        )
        .drop("_Fs", "_Fe")
    )


def nesting(
    ranges: pl.LazyFrame | pl.DataFrame,
    by: Sequence[str] = (),
    range_id: str = "range_id",
    start: str = START,
    end: str = END,
) -> pl.DataFrame:
    """Parent and depth of every range among the ranges of its ``by`` key.

    The parent is the tightest other range that contains it (`enclosing`, `tightest`): the
    rule of Nsight Systems' ``nvtxgpuproj`` ParentId. Ranges with identical bounds nest in
    ``range_id`` order (the lower id outside) so that the result is always a forest. ``depth``
    is the number of steps to the root along parents (0 = outermost), found by iterating over
    depth levels, not rows. Returns ``by + [range_id, "parent_range_id", "depth"]`` (eager: the
    iteration needs the row count of each level). ``range_id`` must be unique across keys.
    """
    by = list(by)
    rng = ranges.lazy().select([*by, range_id, start, end]).filter(pl.col(end) >= pl.col(start))
    q = rng.rename({range_id: "_child"})
    pairs = (
        enclosing(q, rng, by, query_id="_child", range_id=range_id, start=start, end=end)
        .join(q.select([*by, "_child", pl.col(start).alias("_cs"), pl.col(end).alias("_ce")]),
              on=[*by, "_child"])
        .join(rng.select([*by, range_id, pl.col(start).alias("_ps"), pl.col(end).alias("_pe")]),
              on=[*by, range_id])
        # Not itself, and among identical bounds only a lower id can be outside.
        .filter(
            (pl.col(range_id) != pl.col("_child"))
            & ~((pl.col("_ps") == pl.col("_cs")) & (pl.col("_pe") == pl.col("_ce"))
                & (pl.col(range_id) > pl.col("_child")))
        )
        .select([*by, "_child", range_id])
    )
    parent = (
        tightest(pairs, rng, by, query_id="_child", range_id=range_id, start=start, end=end)
        .select([*by, pl.col("_child").alias(range_id), pl.col(range_id).alias("parent_range_id")])
    )
    out = rng.select([*by, range_id]).join(parent, on=[*by, range_id], how="left").collect()
    # Level by level: a range's depth is its parent's depth + 1.
    depth = out.filter(pl.col("parent_range_id").is_null()).select(
        range_id, pl.lit(0, pl.Int32).alias("depth")
    )
    level = depth
    while level.height:
        nxt = (
            out.join(level.rename({range_id: "parent_range_id"}), on="parent_range_id")
            .select(range_id, (pl.col("depth") + 1).cast(pl.Int32).alias("depth"))
        )
        depth = pl.concat([depth, nxt])
        level = nxt
    return out.join(depth, on=range_id, how="left")
