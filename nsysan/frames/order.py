"""A total, content-derived row order for frames: outputs must not depend on physical row order.

Nsight Systems 2025.6+ does not promise the order in which an export lists its rows, so the
same capture exported twice can list them differently. Every frame the loader builds is
therefore put in an order that depends on the rows' content only: sorted by a few leading keys
(time, usually) and, where rows tie on those, by every other column given. Rows that are still
equal are equal in every column that was given, so any order of them is the same frame.

Only the tied rows are sorted by the full key (`content_sort`): on real exports ties on
(start, end) are rare, and sorting millions of rows by twenty columns would cost more than the
whole load.

Event frames are put in time order (`sort_by_time`: start, then end, then the content rule
above); `sort_by_time_in_place` does it column by column for the big frames a loader owns.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import polars as pl


def tied_rows(df: pl.DataFrame, keys: Sequence[str]) -> pl.Series:
    """True for every row of ``df`` (sorted by ``keys``) that shares all ``keys`` with its
    predecessor or its successor."""
    if df.height < 2:
        return pl.Series([False] * df.height, dtype=pl.Boolean)
    same = pl.all_horizontal(pl.col(k).eq_missing(pl.col(k).shift(1)) for k in keys)
    with_prev = df.select(same.fill_null(False).alias("tie")).to_series()
    with_next = with_prev.shift(-1, fill_value=False)
    return with_prev | with_next


def tie_order(df: pl.DataFrame, order: pl.Series, keys: Sequence[str],
              keyed: pl.DataFrame | None = None) -> pl.Series:
    """`break_ties` as a row order: ``order`` (row numbers of ``df`` sorting it by ``keys``,
    ascending) with the rows that tie on ``keys`` ordered by every other column. For a
    caller that gathers the rows itself (`sort_by_time_in_place`),
    which may pass the ``keys`` columns in ``order`` it has already gathered (``keyed``)."""
    rest = [c for c in df.columns if c not in keys]
    if not rest or df.height < 2:
        return order
    if keyed is None:
        keyed = df.select(keys)[order]
    perm = _tie_perm(keyed.select(keys), lambda at: df[order.gather(at)], keys,
                     [False] * len(keys), rest)
    return order if perm is None else order.gather(perm)


def _tie_perm(keyed: pl.DataFrame, rows_at: Callable[[pl.Series], pl.DataFrame],
              keys: Sequence[str], desc: list[bool], rest: list[str],
              within: tuple[pl.Series, int] | None = None) -> np.ndarray | None:
    """Positions of the sorted rows (``keyed``: their ``keys``; ``rows_at``: the rows at some
    positions) that order the rows tying on ``keys`` by ``rest``; None when none tie.

    ``within`` = (positions, height): ``keyed`` holds only the sorted rows at those
    positions (ascending, whole blocks of rows that can tie, so that rows adjacent there are
    adjacent in the frame of ``height`` rows, or differ on ``keys``)."""
    tied = tied_rows(keyed, keys)
    if not tied.any():
        return None
    at = tied.arg_true()
    height = keyed.height
    if within is not None:
        at, height = within[0].gather(at), within[1]
    # Sorting the tied rows by keys + rest keeps each block of ties where it was (the
    # blocks differ on keys, which lead the sort) and orders the rows inside each block.
    sub = rows_at(at).with_columns(pl.Series("_at", at)).sort(
        [*keys, *rest], descending=desc + [False] * len(rest), nulls_last=False,
        maintain_order=True,
    )
    perm = np.arange(height, dtype=np.int64)
    perm[at.to_numpy()] = sub["_at"].to_numpy()
    return perm


def content_sort(
    df: pl.DataFrame,
    keys: Sequence[str],
    *,
    descending: Sequence[bool] | bool = False,
    ties: Sequence[str] | None = None,
) -> pl.DataFrame:
    """``df`` sorted by ``keys``, rows that tie on them sorted further by ``ties`` (default:
    every other column, in frame order), nulls first. The result depends only on the content
    of ``df``, not on its row order, whenever ``keys + ties`` cover every column that
    distinguishes rows."""
    desc = [descending] * len(keys) if isinstance(descending, bool) else list(descending)
    out = df.sort(list(keys), descending=desc, nulls_last=False, maintain_order=True)
    return break_ties(out, keys, descending=desc, ties=ties)


#: rows per slice `strictly_increasing` tests at once (its transient columns stay small)
INCREASING_SLICE = 1 << 20


def strictly_increasing(df: pl.DataFrame, keys: Sequence[str]) -> bool:
    """True when the rows of ``df`` are in strictly increasing ``keys`` order (ascending,
    lexicographic) with no null key: then a sort by ``keys`` keeps every row where it is and
    no rows tie. Tested by comparing each row with the previous one (comparisons, not
    differences, which wrap around at the ends of the type), a slice of `INCREASING_SLICE`
    rows at a time: cheaper than a sort, and it holds a few columns of one slice, not of the
    frame. False for keys that are not integers (not tested: NaN and infinities sort by
    rules of their own)."""
    keys = list(keys)
    if not all(df.schema[k].is_integer() for k in keys):
        return False
    if df.height < 2:
        return df.height == 0 or not df.select(
            pl.any_horizontal(pl.col(k).is_null() for k in keys)).item()
    first, rest = keys[0], keys[1:]
    later = pl.col(first) > pl.col(first).shift(1)
    equal = pl.col(first) == pl.col(first).shift(1)
    for k in rest:
        later = later | (equal & (pl.col(k) > pl.col(k).shift(1)))
        equal = equal & (pl.col(k) == pl.col(k).shift(1))
    no_null = ~pl.any_horizontal(pl.col(k).is_null().any() for k in keys)
    for lo in range(0, df.height - 1, INCREASING_SLICE):
        part = df.select(keys).slice(lo, INCREASING_SLICE + 1)  # (+1: the next slice's first)
        if not part.select(later.slice(1).all() & no_null).item():
            return False
    return True


def content_sort_in_place(
    df: pl.DataFrame,
    keys: Sequence[str],
    *,
    descending: Sequence[bool] | bool = False,
    ties: Sequence[str] | None = None,
) -> pl.DataFrame:
    """`content_sort` of a frame the caller owns (no other reference sees it change): the
    row order is computed once and each column is replaced by its sorted copy in turn, so
    the sort holds one column twice, not the frame (a sort of the whole frame holds both
    copies until it ends: 600 MB more for ``cpu_samples`` of a 10M-kernel trace). A frame
    already in strictly increasing ascending ``keys`` order is returned as it is, and one
    already sorted by its first key (nsys writes CPU samples by time) has only its runs of
    equal first keys sorted (`_runs_order`): a sort by all keys builds ~30 bytes a row."""
    desc = [descending] * len(keys) if isinstance(descending, bool) else list(descending)
    if df.height < 2 or (not any(desc) and strictly_increasing(df, keys)):
        return df
    runs = _runs(df, keys) if not any(desc) else None
    if runs is None:
        order = df.select(pl.arg_sort_by(list(keys), descending=desc, nulls_last=False,
                                         maintain_order=True)).to_series()
    else:
        order = _runs_order(df, keys, runs)
    rest = [c for c in (ties if ties is not None else df.columns) if c not in keys]
    if rest:
        # Only rows of a run of equal first keys can tie: their keys alone are looked at
        # (all of them otherwise: ~250 MB more for the CPU samples of a 10M-kernel trace)
        keyed = df.select(keys)[order if runs is None else order.gather(runs)]
        perm = _tie_perm(keyed, lambda at: df[order.gather(at)], keys, desc, rest,
                         None if runs is None else (runs, df.height))
        del keyed
        if perm is not None:
            order = order.gather(perm)
    for i in range(df.width):
        df.replace_column(i, df.to_series(i).gather(order))
    return df


def _runs(df: pl.DataFrame, keys: Sequence[str]) -> pl.Series | None:
    """The rows in runs of an equal first key (ascending), when the first of ``keys`` is an
    integer column without nulls already in non-decreasing order; else None (integers
    only: NaN and infinities sort by rules of their own)."""
    first = df[keys[0]]
    if not first.dtype.is_integer() or first.null_count() or not first.is_sorted():
        return None
    same = (first == first.shift(1)).fill_null(False)
    return (same | same.shift(-1, fill_value=False)).arg_true()


def _runs_order(df: pl.DataFrame, keys: Sequence[str],
                at: pl.Series | None = None) -> pl.Series | None:
    """The row numbers sorting ``df`` by ascending ``keys`` (ties kept in row order), when
    its first key is an integer column without nulls already in non-decreasing order: only
    the rows in runs of an equal first key (``at``, `_runs`) are sorted (by all ``keys``;
    the runs stay where they are, since the first key leads the sort). None when the first
    key is not so."""
    if at is None:
        at = _runs(df, keys)
        if at is None:
            return None
    order = np.arange(df.height, dtype=np.int64)
    if at.len():
        sub = df.select(keys)[at].with_columns(pl.Series("_at", at))
        order[at.to_numpy()] = sub.sort(list(keys), nulls_last=False,
                                        maintain_order=True)["_at"].to_numpy()
    return pl.Series(order)


def break_ties(
    df: pl.DataFrame,
    keys: Sequence[str],
    *,
    descending: Sequence[bool] | bool = False,
    ties: Sequence[str] | None = None,
) -> pl.DataFrame:
    """``df``, already sorted by ``keys``, with the rows that tie on ``keys`` sorted by
    ``ties`` (default: every other column): see `content_sort`."""
    desc = [descending] * len(keys) if isinstance(descending, bool) else list(descending)
    rest = [c for c in (ties if ties is not None else df.columns) if c not in keys]
    if not rest or df.height < 2:
        return df
    perm = _tie_perm(df, lambda at: df[at], keys, desc, rest)
    return df if perm is None else df[perm]


def sort_by_time(df: pl.DataFrame, start: str = "start_ns", end: str = "end_ns") -> pl.DataFrame:
    """``df`` sorted by (start, end), rows with the same start and end by every other column
    (`nsysan.frames.order`): the order depends on the rows' content, never on the export's
    physical row order."""
    return df[time_order(df, start, end)]


def sort_by_time_in_place(df: pl.DataFrame, start: str, end: str) -> pl.DataFrame:
    """`sort_by_time` of a frame the caller owns (no other reference sees it change): each
    column is replaced by its sorted copy in turn, so the sort holds one column twice, not
    the frame (``gpu_ops`` of a 10M-kernel trace is ~2 GB of raw integer columns here). The
    sorted ``start`` and ``end`` that ordering the rows computed go in as they are."""
    for name in (start, end):  # one chunk first (the sort of chunks is 3x slower)
        i = df.get_column_index(name)
        if df.to_series(i).n_chunks() > 1:
            df.replace_column(i, df.to_series(i).rechunk())
    order, keys = _time_order(df, start, end)
    for name in (start, end):
        df.replace_column(df.get_column_index(name), keys.get_column(name))
    del keys
    for i, name in enumerate(df.columns):
        if name not in (start, end):
            # (a chunked column is made one chunk just before its gather, which is 2-4x
            # faster from one: that copy is freed at once and the next column's reuses its
            # memory; made for every column first, the copies' freed pages piled up while
            # the allocator held them, +77 MB in the build of 1M kernels' gpu_ops)
            df.replace_column(i, df.to_series(i).rechunk().gather(order))
    return df


def time_order(df: pl.DataFrame, start: str, end: str) -> pl.Series:
    """The row numbers of ``df`` in `sort_by_time` order."""
    return _time_order(df, start, end)[0]


def _time_order(df: pl.DataFrame, start: str, end: str) -> tuple[pl.Series, pl.DataFrame]:
    """`time_order`, and ``start``, ``end`` in that order (rows that tie are equal in both).

    Sorting by start alone is cheaper (one key) and gives the same order whenever the rows that
    share a start already have non-decreasing ends, which a vectorised check confirms; only
    otherwise is the two-key sort needed."""
    order = df.select(pl.arg_sort_by(start, maintain_order=True)).to_series()
    keys = pl.DataFrame([df[start].gather(order), df[end].gather(order)])
    s, e = keys[start], keys[end]
    if ((s == s.shift(1)) & (e < e.shift(1))).any():
        order = df.select(pl.arg_sort_by(start, end, maintain_order=True)).to_series()
        keys = pl.DataFrame([df[start].gather(order), df[end].gather(order)])
    del s, e
    return tie_order(df, order, [start, end], keys), keys
