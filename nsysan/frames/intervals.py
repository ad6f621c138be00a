"""The interval kernel: every pass builds on these few vectorised operations.

All intervals are half-open ``[start, end)`` in Int64 nanoseconds. Zero-length intervals cover
nothing and are dropped. ``by`` names the grouping columns (e.g. ``["device_id"]``); an empty
list means one group. Nothing here loops in Python over events: each function is a handful of
vectorised operations, so cost is a sort plus linear scans.

Why packed keys (`nsysan.frames.packed_keys`) and no ``.over(by)``: a sort by several columns
costs about three times a sort by one Int64, and polars window functions cost about a second
per 100k rows when there are tens of thousands of groups (e.g. evidence per gap in the gaps
pass). Every group and time is packed into one Int64 whose order is (group, time) and whose
groups occupy disjoint ranges. After one single-column sort every group is contiguous, running
sums and maxima run over the whole column (+1/-1 deltas sum to zero within each group, so a
global running sum restarts at 0 at every group by itself; an earlier group's keys are all
smaller, so a running max never leaks into the next group), and "the interval holding t" is a
binary search over all groups at once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import polars as pl

from nsysan.frames import sweeps
from nsysan.frames.packed_keys import GROUP, Keys

START = "start_ns"
END = "end_ns"


def _last_at_or_before(sorted_keys: pl.Series, keys: pl.Series, strict: bool = False,
                       ) -> pl.Series:
    """Row of the last of ``sorted_keys`` <= each of ``keys`` (< when ``strict``); -1: none.
    Null keys find none."""
    # numpy's binary search is several times faster than polars' on millions of keys.
    found = np.searchsorted(sorted_keys.to_numpy(), keys.fill_null(-1).to_numpy(),
                            side="left" if strict else "right")
    out = pl.Series(found.astype(np.int64) - 1)
    return out if keys.null_count() == 0 else out.set(keys.is_null(), -1)


def _collect(df: pl.LazyFrame | pl.DataFrame, cols: list[str], keep: pl.Expr) -> pl.DataFrame:
    return df.lazy().select(cols).filter(keep).collect()


def packed_blocks(keys: Keys, frame: int, start: str, end: str,
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The union's blocks of frame ``frame`` of ``keys`` (intervals of positive length): group
    codes, packed starts and packed ends, sorted (numpy)."""
    # Starts and ends are sorted separately (`merge_sorted`): two sorts of values, no
    # permutation to carry along. A group has as many ends as starts (its keys all lie between
    # the keys of the groups before and after it), so its blocks stay its own.
    s = sweeps.sorted_values(keys.pack(frame, start).to_numpy())
    e = sweeps.sorted_values(keys.pack(frame, end).to_numpy())
    bs, be = merge_sorted(s, e)
    return bs // keys.span, bs, be


def merge_sorted(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Block starts and block ends (sorted) of the union of the intervals ``[start, end)``
    whose starts are ``starts``, sorted ascending, and whose ends are ``ends`` in either of two
    orders that give the same blocks: sorted ascending on their own, or the running maximum
    (``np.maximum.accumulate``) of the ends taken in the order of ``starts``. Intervals that
    overlap or touch merge. Every end must be at or above its start, and intervals of zero
    length must be dropped first (alone, one would give a block of zero length). Keys packed
    per group (`packed_keys.Keys`, group codes times a span) merge within their group only:
    every key of an earlier group is below every key of a later one.

    A block ends after row ``k`` exactly where ``starts[k + 1] > ends[k]``. With the running
    maximum this says that every earlier interval has ended. With ends sorted on their own it
    says the same: the ``k + 1`` smallest ends then all lie before ``starts[k + 1]``, so they
    are those of the ``k + 1`` earliest starts (any later interval ends at or after its
    start), and the largest of them, ``ends[k]``, is the block's end. Sorting the two arrays
    separately (two sorts of plain values) is cheaper than an argsort and a gather."""
    first = np.ones(len(starts), bool)
    np.greater(starts[1:], ends[:-1], out=first[1:])
    last = np.ones(len(starts), bool)
    last[:-1] = first[1:]
    return starts[first], ends[last]


def _blocks(keys: Keys, frame: int, start: str, end: str) -> pl.DataFrame:
    """`packed_blocks` as a frame: ``_g`` (group code), packed ``start`` and ``end``."""
    g, bs, be = packed_blocks(keys, frame, start, end)
    return pl.DataFrame({GROUP: g, start: bs, end: be},
                        schema={GROUP: pl.Int64, start: pl.Int64, end: pl.Int64})


def _union_blocks(df: pl.LazyFrame | pl.DataFrame, by: list[str], start: str, end: str,
                  ) -> tuple[Keys, pl.DataFrame]:
    """Keys of ``df`` and its union's blocks: ``_g``, ``start``, ``end`` (times), sorted."""
    x = _collect(df, [*by, start, end], pl.col(end) > pl.col(start))
    keys = Keys([x], by, [start, end])
    blocks = _blocks(keys, 0, start, end)
    g = pl.col(GROUP)
    return keys, blocks.with_columns(keys.time(pl.col(start), g), keys.time(pl.col(end), g))


def union(
    df: pl.LazyFrame | pl.DataFrame,
    by: Sequence[str] = (),
    start: str = START,
    end: str = END,
) -> pl.LazyFrame:
    """Merge overlapping or touching intervals per group.

    Returns ``by + [start, end]``, sorted by group then start, disjoint and non-touching.
    """
    keys, blocks = _union_blocks(df, list(by), start, end)
    return keys.attach_by(blocks).lazy()


def total(df: pl.LazyFrame | pl.DataFrame, by: Sequence[str] = (),
          start: str = START, end: str = END, name: str = "busy_ns") -> pl.LazyFrame:
    """Length of the union per group (``by + [name]``)."""
    by = list(by)
    x = _collect(df, [*by, start, end], pl.col(end) > pl.col(start))
    keys = Keys([x], by, [start, end])
    g, bs, be = packed_blocks(keys, 0, start, end)
    length = keys.lengths(bs, be)
    if not by:
        return pl.LazyFrame({name: [int(length.sum())]}, schema={name: pl.Int64})
    # Blocks come sorted by group code, which is ordered like the groups: the sums of the
    # runs of equal codes are the groups' sums, in order.
    firsts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]]) if len(g) else g
    sums = np.add.reduceat(length, firsts) if len(g) else length
    return keys.attach_by(pl.DataFrame({GROUP: g[firsts], name: sums},
                                       schema={GROUP: pl.Int64, name: pl.Int64})).lazy()


def complement(
    df: pl.LazyFrame | pl.DataFrame,
    by: Sequence[str] = (),
    start: str = START,
    end: str = END,
) -> pl.LazyFrame:
    """Gaps between the union's blocks, inside ``[first start, last end)`` of each group.

    Returns ``by + [start, end]`` of every gap (strictly positive length), sorted.
    """
    keys, blocks = _union_blocks(df, list(by), start, end)
    same = pl.col(GROUP) == pl.col(GROUP).shift(1)
    gaps = blocks.select(
        pl.col(GROUP).filter(same),
        pl.col(end).shift(1).filter(same).alias(start),
        pl.col(start).filter(same).alias(end),
    )
    return keys.attach_by(gaps).lazy()


def state_names(classes: Sequence[str], idle: str = "idle") -> dict[int, str]:
    """State label of every state code of `state_code_segments` (bit i: ``classes[i]``)."""
    return {
        c: "+".join(n for i, n in enumerate(classes) if c >> i & 1) or idle
        for c in range(1 << len(classes))
    }


def state_code_segments(
    df: pl.LazyFrame | pl.DataFrame,
    classes: Sequence[str],
    by: Sequence[str] = (),
    class_col: str = "cls",
    start: str = START,
    end: str = END,
) -> pl.LazyFrame:
    """`state_segments` with the state as a bit set: ``by + [start, end, state_code]`` (Int64,
    bit i set: ``classes[i]`` active; `state_names` labels them). Grouping or filtering
    by an integer code is much cheaper than by a label string."""
    by = list(by)
    classes = list(classes)
    # The class index, null for classes not in ``classes``: one lookup both filters and maps.
    index = pl.col(class_col).replace_strict(
        classes, list(range(len(classes))), default=None, return_dtype=pl.Int16
    )
    x = (
        df.lazy().select([*by, index.alias("_c"), start, end])
        .filter((pl.col(end) > pl.col(start)) & pl.col("_c").is_not_null())
        .collect()
    )
    # One event per interval start and end, packed into a single Int64 with the class index
    # and the direction in the low bits (2 per class, rounded up to a power of two so that
    # shifts and masks unpack them): a one-column sort is the cheapest. The events are
    # written into one array in place (as expressions, each shift and sum was an array of
    # its own: ~1 GB more on 10M kernels), and the rows are forgotten once packed.
    shift = max(2 * len(classes) - 1, 1).bit_length()
    keys = Keys([x], by, [start, end], low=1 << shift)
    n = x.height
    cls = x["_c"].to_numpy()
    events = np.empty(2 * n, np.int64)
    for half, col, is_start in ((events[:n], start, 1), (events[n:], end, 0)):
        half[:] = keys.pack(0, col).to_numpy()
        half <<= shift
        half += cls
        half += cls + is_start
    keys.forget_rows()
    del x, cls
    events = sweeps.sort_in_place(events)  # ops sorted by start: two runs
    key, code = sweeps.state_instants(events, shift, len(classes))
    del events  # (its memory is not the keys': ~0.19 GB on 10M kernels)
    # Segments are maximal runs of one state: keep the instants where the state changes. A
    # group's first instant has something active and its last nothing, so group boundaries are
    # changes too; the last instant of a group only closes the segment before it.
    # (each array of every instant is dropped after its last use: ~0.16 GB apiece on 10M
    # kernels)
    change = np.ones(len(code), bool)
    change[1:] = code[1:] != code[:-1]
    key, code = key[change], code[change]
    del change
    schema = {start: keys.dtype, end: keys.dtype, "state_code": pl.Int64}
    if keys.one_group:
        # Every instant but the last opens a segment, closed by the next one: views of the
        # instants, no group codes or segment indices (~0.4 GB at the peak on 10M kernels).
        segs = pl.DataFrame({start: keys.times(key[:-1], None), end: keys.times(key[1:], None),
                             "state_code": code[:-1]}, schema=schema)
        del key, code
        if not by:
            return segs.lazy()
        return keys.attach_by(segs.select(pl.lit(0, pl.Int64).alias(GROUP), pl.all())).lazy()
    group = key // keys.span
    opens = np.flatnonzero(group[:-1] == group[1:])  # the next instant is of the same group
    g = group[opens]
    del group
    codes = code[opens]
    del code
    begins = pl.Series(keys.times(key[opens], g), dtype=keys.dtype)
    opens += 1  # (in place: the instant that closes each segment, no array beside it)
    ends = pl.Series(keys.times(key[opens], g), dtype=keys.dtype)
    del key, opens
    segs = pl.DataFrame({GROUP: g, start: begins, end: ends, "state_code": codes},
                        schema={GROUP: pl.Int64, **schema})
    del g, begins, ends, codes
    return keys.attach_by(segs).lazy()


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
    names = state_names(classes, idle)
    return state_code_segments(df, classes, by, class_col, start, end).select(
        [*by, start, end,
         pl.col("state_code").replace_strict(names, return_dtype=pl.String).alias("state")]
    )


def _by_start(keys: Keys, frame: int, start: str, end: str) -> pl.DataFrame:
    """Packed ``start`` and ``end`` of frame ``frame`` with its row number, by packed start."""
    df = pl.DataFrame([keys.pack(frame, start), keys.pack(frame, end)]).with_row_index("_row")
    # Segments usually come sorted (from state_code_segments): checking is cheaper than sorting.
    return df if df[start].is_sorted() else df.sort(start)


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
    and the window's ``window_cols``; pieces outside every window are dropped. Pieces come
    sorted by group, then start.
    """
    by = list(by)
    window_cols = list(window_cols)
    seg = segments.lazy().filter(pl.col(end) > pl.col(start)).collect()
    win = _collect(windows, [*by, *window_cols, start, end], pl.col(end) > pl.col(start))
    seg_cols = [c for c in seg.columns if c not in (*by, start, end)]
    keys = Keys([seg, win], by, [start, end])
    s, w = (_by_start(keys, i, start, end) for i in (0, 1))
    # Both sets are disjoint, so every piece either starts where its segment starts (inside
    # the window holding that start) or where its window starts (inside the segment holding
    # that start, which began earlier). Keys of different groups never meet: a window holds
    # only keys of its own group.
    win_of_seg = _last_at_or_before(w[start], s[start])
    seg_of_win = _last_at_or_before(s[start], w[start], strict=True)

    def pieces(own: pl.DataFrame, other: pl.DataFrame, found: pl.Series) -> pl.DataFrame:
        some = found >= 0
        hit = other.select(pl.all().gather(found.filter(some)).name.prefix("_o"))
        return (
            own.filter(some).hstack(hit)
            .filter(pl.col(start) < pl.col(f"_o{end}"))
            .select(pl.col("_row"), pl.col("_o_row"), pl.col(start),
                    pl.min_horizontal(end, f"_o{end}").alias(end))
        )

    from_seg = pieces(s, w, win_of_seg).rename({"_row": "_s", "_o_row": "_w"})
    from_win = pieces(w, s, seg_of_win).rename({"_row": "_w", "_o_row": "_s"})
    # Each part is already in packed-start order: merging is linear, a sort is not.
    cut = from_seg.merge_sorted(from_win.select(from_seg.columns), key=start)
    return (
        seg.select([*by, *seg_cols]).select(pl.all().gather(cut["_s"]))
        .hstack(win.select(window_cols).select(pl.all().gather(cut["_w"])))
        .hstack(cut.select(keys.time(pl.col(start)), keys.time(pl.col(end))))
        .select([*by, *window_cols, *seg_cols, start, end])
        .lazy()
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

    ``df`` keeps its rows, order and columns; intervals of ``df`` may overlap each other.
    Exposed time = length - coverage.
    """
    cov = _collect(cover, [*by, start, end], pl.col(end) > pl.col(start))
    return _segment_sums(df, cov, {name: pl.lit(1, pl.Int64)}, list(by), start, end, union=True)


def segment_sums(
    df: pl.LazyFrame | pl.DataFrame,
    segments: pl.LazyFrame | pl.DataFrame,
    weights: Mapping[str, pl.Expr],
    by: Sequence[str] = (),
    start: str = START,
    end: str = END,
) -> pl.LazyFrame:
    """For every interval of ``df`` and every ``name: weight`` of ``weights``, the sum over
    the *disjoint* ``segments`` of its ``by`` group of ``weight`` (an integer expression on
    ``segments``) times the length of the segment's intersection with the interval.

    E.g. with ``state_code_segments`` and a 0/1 weight per state predicate: the time each
    window spends in those states, without cutting the segments into pieces. ``df`` keeps
    its rows, order and columns (0 where nothing overlaps).
    """
    seg = segments.lazy().filter(pl.col(end) > pl.col(start)).collect()
    return _segment_sums(df, seg, weights, list(by), start, end, union=False)


def _segment_sums(df: pl.LazyFrame | pl.DataFrame, seg: pl.DataFrame,
                  weights: Mapping[str, pl.Expr], by: list[str], start: str, end: str,
                  union: bool) -> pl.LazyFrame:
    """`segment_sums`, or with ``union`` the sums over the union of ``seg``'s intervals.

    How: with ``C(t)`` = weighted length of the segments before ``t`` (disjoint and sorted,
    so ``C`` is a prefix sum found by a binary search per endpoint), an interval's sum is
    ``C(end) - C(start)``.
    """
    base = df.lazy().collect()
    keys = Keys([base.select([*by, start, end]), seg], by, [start, end])
    names = list(weights)
    if union:
        segs = _blocks(keys, 1, start, end).with_columns(pl.lit(1, pl.Int64).alias("_w0"))
    else:
        order = _by_start(keys, 1, start, end)
        w = seg.select(
            w.fill_null(0).cast(pl.Int64).alias(f"_w{i}") for i, w in enumerate(weights.values())
        )
        if not order["_row"].is_sorted():  # segments usually come sorted: no gather then
            w = w.select(pl.all().gather(order["_row"]))
        segs = order.select(keys.group(pl.col(start)).alias(GROUP), start, end).hstack(w)
    # Global exclusive running sums of weighted lengths; a group's own prefix is the
    # difference to the value at its first segment, looked up only where it is needed.
    # (numpy: its running sum is about twice as fast as polars' here.)
    length = segs.select(keys.length(pl.col(start), pl.col(end))).to_series().to_numpy()
    for i in range(len(names)):
        weighted = segs[f"_w{i}"].to_numpy() * length
        segs = segs.with_columns(pl.Series(f"_p{i}", np.cumsum(weighted) - weighted))

    def cum_at(col: str) -> list[pl.Series]:
        # C(t): everything in the group's segments that start at or before t, clipped at t.
        key = keys.pack(0, col)
        if segs.is_empty():
            return [pl.zeros(len(key), pl.Int64, eager=True)] * len(names)
        row = _last_at_or_before(segs[start], key)
        group_first = _last_at_or_before(segs[start], key // keys.span * keys.span, strict=True)
        g = pl.col(GROUP)
        hit = segs.select(pl.all().gather(row.clip(0))).with_columns(
            keys.time(pl.col(start), g).alias("_bs"), keys.time(pl.col(end), g).alias("_be")
        )
        at_first = segs.select(pl.all().gather((group_first + 1).clip(0, segs.height - 1)))
        same = (row >= 0) & (hit[GROUP] == key // keys.span)
        clipped = pl.min_horizontal(base[col], pl.col("_be")) - pl.col("_bs")
        return [
            hit.select(
                pl.when(same)
                .then(pl.col(f"_p{i}") - at_first[f"_p{i}"] + pl.col(f"_w{i}") * clipped)
                .otherwise(0)
            ).to_series()
            for i in range(len(names))
        ]

    at_end, at_start = cum_at(end), cum_at(start)
    return base.with_columns(
        pl.when(pl.col(end) > pl.col(start)).then(e - s).otherwise(0).cast(pl.Int64).alias(n)
        for n, e, s in zip(names, at_end, at_start, strict=True)
    ).lazy()
