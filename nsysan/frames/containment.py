"""Containment and sharing: which NVTX ranges enclose which intervals, range nesting, and
equal sharing of concurrent busy time. Same conventions as `nsysan.frames.intervals`
(half-open Int64 ns intervals, ``by`` grouping columns, no Python loops over events).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
import polars as pl

from nsysan.frames.intervals import END, START
from nsysan.frames.packed_keys import LIMIT, Keys
from nsysan.frames.sweeps import interval_events, runs_within, sort_order

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
    keep_by: bool = True,
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
    row per pair, in no particular order; without ``keep_by``, only ``[query_id, range_id]``
    (for ids unique across keys: a column less per pair, 200 MB on a 10M-kernel trace).
    """
    if query_id == range_id:
        raise ValueError("enclosing: query_id and range_id must be different column names")
    by = list(by)
    # Queries and ranges both name their bounds _s/_e so that one `Keys` packs them alike.
    q = (queries.lazy().select([*by, query_id, pl.col(start).alias("_s"),
                                pl.col(end).alias("_e")]).collect())
    if q["_s"].has_nulls() or q["_e"].has_nulls():  # (else no copy of the queries)
        q = q.filter(pl.col("_s").is_not_null() & pl.col("_e").is_not_null())
    r = (
        ranges.lazy()
        .select([*by, range_id, pl.col(start).alias("_s"), pl.col(end).alias("_e")])
        .filter(pl.col("_e") >= pl.col("_s"))
        .collect()
    )
    packed = _pack_one_key(q, r, by)
    if packed is None:
        keys = Keys([q, r], by, ["_s", "_e"])
        packed = tuple(keys.pack(i, c).to_numpy() for i, c in ((0, "_s"), (1, "_s"), (1, "_e")))
    q_key, r_start, r_end = packed
    order = sort_order(q_key)
    q_key = q_key[order]
    # Block of the queries starting in [range start, range end]: [lo, hi) in sorted order.
    # (n >= 0: a range's end is not below its start, and packing keeps the order of times.)
    lo = np.searchsorted(q_key, r_start, side="left")
    n = np.searchsorted(q_key, r_end, side="right") - lo
    del q_key, r_start, r_end
    q_rows, r_rows = _pairs_inside(order, lo, n, q["_e"].to_numpy(), r["_e"].to_numpy())
    # (the search arrays and the bounds go before the ids are gathered: with the pairs, the
    # largest arrays of the pass)
    del order, lo, n
    q = q.select([*by, query_id] if keep_by else [query_id])
    r = r.select(range_id)
    return q.select(pl.all().gather(q_rows)).hstack(r.select(pl.all().gather(r_rows))).lazy()


#: `enclosing` expands the candidate pairs of at most this many ranges' blocks at a time
#: (ranges in order; a range with a larger block is expanded alone): five arrays of this many
#: Int64 rows, instead of five over every candidate (tens of millions on a 10M-kernel trace)
PAIR_CHUNK = 1 << 22


def _pairs_inside(order: np.ndarray, lo: np.ndarray, n: np.ndarray, q_end: np.ndarray,
                  r_end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The (query row, range row) pairs of `enclosing`: range ``i`` holds the sorted queries
    ``order[lo[i] : lo[i] + n[i]]`` (those starting inside it), kept when the query also ends
    inside it. In range order, then sorted-query order, whatever the chunking.

    The rows kept are UInt32 (polars' row index type) when both frames have fewer rows than
    that holds: the pairs are the pass's largest arrays (queries × nesting depth, ~40M on a
    10M-kernel trace), held while the ids are gathered."""
    index = np.uint32 if max(len(order), len(n)) <= np.iinfo(np.uint32).max else np.int64
    kept_q: list[np.ndarray] = []
    kept_r: list[np.ndarray] = []
    for a, b in runs_within(np.cumsum(n), PAIR_CHUNK):
        n_c = n[a:b]
        # Every (range, query of its block) pair: row k of a block is its first row plus k.
        r_rows = np.repeat(np.arange(a, b), n_c)
        q_rows = order[np.repeat(lo[a:b] - (np.cumsum(n_c) - n_c), n_c)
                       + np.arange(len(r_rows))]
        # The end test in numpy, before any column is gathered: only the pairs kept are built.
        inside = q_end[q_rows] <= r_end[r_rows]
        kept_q.append(q_rows[inside].astype(index))
        kept_r.append(r_rows[inside].astype(index))
    if not kept_q:
        return np.zeros(0, index), np.zeros(0, index)
    if len(kept_q) == 1:
        return kept_q[0], kept_r[0]
    return np.concatenate(kept_q), np.concatenate(kept_r)


def _pack_one_key(q: pl.DataFrame, r: pl.DataFrame, by: list[str],
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """`enclosing`'s packed keys (query starts, range starts, range ends) in numpy, for one
    Int64 ``by`` column (a thread id) or none, Int64 times and no nulls, when
    ``(key - min key) * span + (time - min time)`` fits in 62 bits: the order and equalities
    of `packed_keys.Keys` (so the same pairs in the same order), with a few numpy passes
    instead of concatenating both frames' columns and packing each in polars. None: the
    general keys."""
    if len(by) > 1 or not q.height or not r.height:
        return None
    cols = [q["_s"], q["_e"], r["_s"], r["_e"], *(f[c] for f in (q, r) for c in by)]
    if any(c.dtype != pl.Int64 or c.null_count() for c in cols):
        return None
    q_s, r_s, r_e = (c.to_numpy() for c in (cols[0], cols[2], cols[3]))
    # Only these three are packed (a range's end is not below its start; a query's end,
    # never packed, may be anything).
    tmin = min(int(q_s.min()), int(r_s.min()))
    span = max(int(q_s.max()), int(r_e.max())) - tmin + 1
    if not by:
        return (q_s - tmin, r_s - tmin, r_e - tmin) if span < LIMIT else None
    q_g, r_g = cols[4].to_numpy(), cols[5].to_numpy()
    g_lo = min(int(q_g.min()), int(r_g.min()))
    n_keys = max(int(q_g.max()), int(r_g.max())) - g_lo + 1
    if n_keys * span >= LIMIT:
        return None
    r_base = (r_g - g_lo) * span - tmin
    return (q_g - g_lo) * span - tmin + q_s, r_base + r_s, r_base + r_e


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
    untied = None if by else _untied_shortest(pairs, ranges, query_id, range_id, start, end)
    if untied is not None:
        return untied.lazy()
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
    best = None if rank is None else _min_rank(pairs.lazy().select(query_id).collect(), rank)
    if rank is not None and best is None:
        best = (
            pairs.lazy()
            .select(query_id, rank)
            .filter(pl.col("_rank") >= 0)  # pairs of unknown ranges: the join drops them
            .group_by(query_id)
            .agg(pl.col("_rank").min())
            .collect()
        )
    elif best is None:
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


def _dense_ids(ids: pl.Series) -> np.ndarray | None:
    """``ids`` as a numpy array when they are non-null, non-negative integers dense enough
    to index an array (e.g. row indices); else None."""
    if not ids.dtype.is_integer() or ids.null_count() or ids.is_empty():
        return None
    lo, hi = int(ids.min()), int(ids.max())  # type: ignore[arg-type]
    return ids.to_numpy() if lo >= 0 and hi < 4 * ids.len() + 1024 else None


def _untied_shortest(pairs: pl.LazyFrame | pl.DataFrame, ranges: pl.LazyFrame | pl.DataFrame,
                     query_id: str, range_id: str, start: str, end: str,
                     ) -> pl.DataFrame | None:
    """`tightest` without ``by`` when every query has one shortest range (the usual case:
    then the later tie-breaks never apply): a minimum length per query by an unbuffered
    minimum into an array indexed by query id, no sort of the ranges. None when a query has
    two shortest ranges, or the ids are not dense integers (the general path decides)."""
    r = ranges.lazy().select(range_id, (pl.col(end) - pl.col(start)).alias("_len")).collect()
    p = pairs.lazy().select(query_id, range_id).collect()
    rid, q, pr = _dense_ids(r[range_id]), _dense_ids(p[query_id]), _dense_ids(p[range_id])
    if rid is None or q is None or pr is None or r["_len"].null_count():
        return None
    row_of = np.full(max(int(rid.max()), int(pr.max())) + 1, -1, np.int64)
    row_of[rid] = np.arange(len(rid))
    if np.any(row_of[rid] != np.arange(len(rid))):  # a range id held twice
        return None
    row = row_of[pr]
    known = row >= 0  # pairs of unknown ranges: the join drops them
    q, pr = q[known], pr[known]
    length = r["_len"].to_numpy()[row[known]]
    best = np.full(int(q.max(initial=0)) + 1, np.iinfo(np.int64).max)
    np.minimum.at(best, q, length)
    shortest = length == best[q]
    if np.bincount(q[shortest]).max(initial=0) > 1:
        return None
    return pl.DataFrame([pl.Series(query_id, q[shortest]).cast(p.schema[query_id]),
                         pl.Series(range_id, pr[shortest]).cast(r.schema[range_id])])


def _min_rank(queries: pl.DataFrame, rank: pl.Series) -> pl.DataFrame | None:
    """``query_id, _rank``: the least ``rank`` (>= 0) per query, by an unbuffered minimum into
    an array indexed by query id, when the ids (the one column of ``queries``) are dense
    non-negative integers (e.g. row indices); else None. A hash group-by over millions of
    pairs costs several times this."""
    ids = queries.to_series()
    q = _dense_ids(ids)
    if q is None:
        return None
    r = rank.to_numpy()
    known = r >= 0  # pairs of unknown ranges: the join drops them
    best = np.full(int(q.max()) + 1, np.iinfo(np.int64).max)
    np.minimum.at(best, q[known], r[known])
    found = np.flatnonzero(best < np.iinfo(np.int64).max)
    return pl.DataFrame([pl.Series(ids.name, found).cast(ids.dtype),
                         pl.Series("_rank", best[found])])


def _rank_lookup(pairs: pl.LazyFrame | pl.DataFrame, ranked: pl.Series, range_id: str,
                 ) -> pl.Series | None:
    """``_rank`` (row of ``ranked``; -1: absent) of every pair's range, by an array lookup,
    when the range ids are distinct, non-negative and dense (e.g. row indices); else None.
    Probing a hash table with millions of pairs costs several times this gather."""
    rid = _dense_ids(ranked)
    if rid is None or ranked.n_unique() < ranked.len():
        return None
    hi = int(rid.max())
    rank_of = np.full(hi + 1, -1, np.int64)
    rank_of[rid] = np.arange(ranked.len())
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
    # Group and time packed into one Int64 key, the direction in the low bit: one sort of
    # the events' values gives every group's breakpoints in order, and binary searches
    # replace joins on (by, time).
    keys = Keys([x], by, [start, end], low=2)
    k_start, k_end = keys.pack(0, start).to_numpy(), keys.pack(0, end).to_numpy()
    key = interval_events(k_start, k_end)
    # (Arrays of one value per event, two per interval: each is computed in place where it
    # can be and dropped after its last use, so that few are alive at once on millions of
    # ops.)
    # The active count after all events at an instant: the running sum at its last event
    # (deltas sum to zero per group, so the sum restarts at every group by itself).
    count = key & 1
    count <<= 1
    count -= 1
    np.cumsum(count, out=count)
    key >>= 1
    last = np.ones(len(key), bool)
    np.not_equal(key[1:], key[:-1], out=last[:-1])
    key, count = key[last], count[last]
    del last
    group = key // keys.span
    t = keys.times(key, group)
    # Weight of the segment [t, next): its length divided by how many intervals are active.
    weight = np.zeros(len(key))
    live = np.flatnonzero((count[:-1] > 0) & (group[:-1] == group[1:]))
    weight[live] = (t[live + 1] - t[live]).astype(np.float64) / count[live]
    del live, t, count
    # F(t) relative to the group's first breakpoint keeps the Float64 values small; the sum
    # restarts per group (a loop over the groups, e.g. devices) so every share is summed in
    # the same order as a per-group sweep would.
    bounds = np.flatnonzero(np.r_[True, group[1:] != group[:-1], True]) if len(key) else [0]
    del group
    f = np.zeros(len(key))
    for lo, hi in itertools.pairwise(bounds):
        f[lo + 1:hi] = np.cumsum(weight[lo:hi - 1])
    del weight
    at_s = pl.Series(f[np.searchsorted(key, k_start, side="left")])
    del k_start
    at_e = pl.Series(f[np.searchsorted(key, k_end, side="left")])
    del key, f, k_end
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
