"""Containment and sharing: which NVTX ranges enclose which intervals, range nesting, and
equal sharing of concurrent busy time. Same conventions as `nsysan.frames.intervals`
(half-open Int64 ns intervals, ``by`` grouping columns, no Python loops over events).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import polars as pl

from nsysan.frames.intervals import END, START
from nsysan.frames.packed_keys import Keys

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
    queries by one packed ``(by, start)`` key (`packed_keys.Keys`); the queries whose start lies
    in ``[range.start, range.end]`` are then one contiguous block of rows, whose bounds two
    binary searches find; the blocks are expanded and filtered on the query end. The work is
    proportional to the number of (query, range) pairs whose query *starts* inside the range,
    i.e. output-sensitive (queries × nesting depth for NVTX around API calls), never
    queries × ranges.

    Zero-length queries and ranges take part (a mark-like query at a range boundary is inside);
    queries with a null bound are inside nothing. Returns ``by + [query_id, range_id]``, one
    row per pair, in no particular order.
    """
    if query_id == range_id:
        raise ValueError("enclosing: query_id and range_id must be different column names")
    by = list(by)
    # Queries and ranges both name their bounds _s/_e so that one `Keys` packs them alike.
    q = (
        queries.lazy()
        .select([*by, query_id, pl.col(start).alias("_s"), pl.col(end).alias("_e")])
        .filter(pl.col("_s").is_not_null() & pl.col("_e").is_not_null())
        .collect()
    )
    r = (
        ranges.lazy()
        .select([*by, range_id, pl.col(start).alias("_s"), pl.col(end).alias("_e")])
        .filter(pl.col("_e") >= pl.col("_s"))
        .collect()
    )
    keys = Keys([q, r], by, ["_s", "_e"])
    q = q.with_columns(keys.pack(0, "_s").alias("_k")).sort("_k")
    # Block of the queries starting in [range start, range end]: [lo, hi) in sorted order.
    lo = q["_k"].search_sorted(keys.pack(1, "_s"), side="left")
    hi = q["_k"].search_sorted(keys.pack(1, "_e"), side="right")
    pairs = (
        r.select(range_id, "_e")
        .with_columns(lo.alias("_lo"), hi.alias("_hi"))
        .filter(pl.col("_hi") > pl.col("_lo"))
        .select(range_id, pl.col("_e").alias("_re"), pl.int_ranges("_lo", "_hi").alias("_qi"))
        .explode("_qi", empty_as_null=False)  # _lo < _hi: lists are never empty
    )
    qi = pairs["_qi"]
    return (
        q.select([pl.col(c).gather(qi) for c in [*by, query_id, "_e"]])
        .hstack(pairs.select(range_id, "_re"))
        .filter(pl.col("_e") <= pl.col("_re"))
        .select([*by, query_id, range_id])
        .lazy()
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
    still well defined. Returns ``by + [query_id, range_id]``, in no particular order.
    """
    by = list(by)
    extra = [depth] if depth else []
    # Rank the ranges once by tightness (a sort of the ranges, not of the larger pair list);
    # per query the tightest range is then the one of minimal rank.
    ranked = (
        ranges.lazy()
        .select([*by, range_id, (pl.col(end) - pl.col(start)).alias("_len"),
                 pl.col(start).alias("_rs"), *extra])
        .sort(["_len", "_rs", *extra, range_id],
              descending=[False, True, *([True] * len(extra)), True])
        .select([*by, range_id])
        .collect()
    )
    rank = _rank_lookup(pairs, ranked[range_id], range_id) if not by else None
    if rank is not None:
        best = (
            pairs.lazy()
            .select(query_id, rank)
            .filter(pl.col("_rank") >= 0)  # pairs of unknown ranges: the join drops them
            .group_by(query_id)
            .agg(pl.col("_rank").min())
            .collect()
        )
    else:
        best = (
            pairs.lazy()
            .select([*by, query_id, range_id])
            .join(ranked.with_row_index("_rank").lazy(), on=[*by, range_id], how="inner")
            .group_by([*by, query_id])
            .agg(pl.col("_rank").min())
            .collect()
        )
    # A rank is a row of the tightness-sorted ranges: a gather gives the range back.
    return best.select(
        [*by, query_id, ranked[range_id].gather(best["_rank"])]
    ).lazy()


def _rank_lookup(pairs: pl.LazyFrame | pl.DataFrame, ranked: pl.Series, range_id: str,
                 ) -> pl.Series | None:
    """``_rank`` (row of ``ranked``; -1: absent) of every pair's range, by an array lookup,
    when the range ids are distinct, non-negative and dense (e.g. row indices); else None.
    Probing a hash table with millions of pairs costs several times this gather."""
    if not ranked.dtype.is_integer() or ranked.null_count() or ranked.is_empty():
        return None
    lo, hi = int(ranked.min()), int(ranked.max())  # type: ignore[arg-type]
    if lo < 0 or hi >= 4 * ranked.len() + 1024 or ranked.n_unique() < ranked.len():
        return None
    rank_of = np.full(hi + 1, -1, np.int64)
    rank_of[ranked.to_numpy()] = np.arange(ranked.len())
    ids = pairs.lazy().select(range_id).collect().to_series()
    if ids.null_count() or not ids.dtype.is_integer():
        return None
    ids_np = ids.to_numpy()
    inside = (ids_np >= 0) & (ids_np <= hi)
    return pl.Series("_rank", np.where(inside, rank_of[ids_np.clip(0, hi)], -1))


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
    frame = df.lazy().collect()
    valid = pl.col(start).is_not_null() & pl.col(end).is_not_null()
    x = frame.select([*by, start, end]).filter(valid)
    # Group and time packed into one Int64 key: one single-key sort of the +1/-1 events gives
    # every group's breakpoints in order, and binary searches replace joins on (by, time).
    keys = Keys([x], by, [start, end])
    k_start, k_end = keys.pack(0, start), keys.pack(0, end)
    ones = pl.repeat(1, x.height, dtype=pl.Int64, eager=True)
    # The active count after all events at an instant: the running sum at its last event
    # (deltas sum to zero per group, so the sum restarts at every group by itself).
    per_t = (
        pl.DataFrame({"_k": pl.concat([k_start, k_end]), "_d": pl.concat([ones, -ones])})
        .sort("_k")
        .select("_k", pl.col("_d").cum_sum().alias("_n"))
        .filter(pl.col("_k") != pl.col("_k").shift(-1, fill_value=-1))
        .with_columns(keys.group(pl.col("_k")).alias("_g"), keys.time(pl.col("_k")).alias("_t"))
    )
    # Weight of the segment [t, next): its length divided by how many intervals are active.
    same_group_next = pl.col("_g") == pl.col("_g").shift(-1)
    weight = (
        pl.when((pl.col("_n") > 0) & same_group_next)
        .then((pl.col("_t").shift(-1) - pl.col("_t")).cast(pl.Float64) / pl.col("_n"))
        .otherwise(0.0)
    )
    # F(t) relative to the group's first breakpoint keeps the Float64 values small; the sum
    # restarts per group (a window over the few groups) so every share is summed in the same
    # order as a per-group sweep would.
    f = per_t.select(
        (weight.cum_sum().shift(1, fill_value=0.0).over("_g") if by
         else weight.cum_sum().shift(1, fill_value=0.0)).alias("_F")
    )["_F"]
    at_s = f.gather(per_t["_k"].search_sorted(k_start, side="left"))
    at_e = f.gather(per_t["_k"].search_sorted(k_end, side="left"))
    share = x.select(
        pl.when(pl.col(end) > pl.col(start)).then(at_e - at_s).otherwise(0.0).alias(name)
    )[name]
    if x.height < frame.height:  # rows with a null bound take no part and get 0
        rows = frame.select(pl.int_range(pl.len()).filter(valid))[:, 0]
        share = pl.zeros(frame.height, pl.Float64, eager=True).scatter(rows, share).alias(name)
    return frame.with_columns(share).lazy()


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
