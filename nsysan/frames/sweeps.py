"""Sweeps over packed event keys in numpy: sorted copies, state instants, concurrency levels.

Same conventions as `nsysan.frames.intervals` (half-open Int64 ns intervals, ``by`` grouping
columns packed with `packed_keys.Keys`). These run on plain int64 arrays: at a few million
events a chain of polars expressions (each a pass with its own allocation, plus planning)
costs several times the same arithmetic in numpy, and the algorithms here are sorts, binary
searches and running sums that numpy does directly. The time per window of disjoint
segments (the steps pass's states per step) is `nsysan.frames.window_sums`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import polars as pl

from nsysan.frames.packed_keys import GROUP, Keys

START = "start_ns"
END = "end_ns"


def dense_codes(codes: pl.Series) -> tuple[np.ndarray, np.ndarray]:
    """Dense 0-based index (same order) of every value of a non-null Int64 ``codes`` and the
    distinct values, sorted. A hash ``unique`` and a binary search into the few distinct
    values: cheaper than a rank, which sorts every row."""
    uniq = np.sort(codes.unique().to_numpy())
    return np.searchsorted(uniq, codes.to_numpy()), uniq


def sort_order(keys: np.ndarray) -> np.ndarray:
    """Stable argsort of non-negative Int64 ``keys``. numpy sorts plain values several times
    faster than it argsorts them, so when the range allows, the row number rides along in
    the low bits of the values and comes back out of the sorted values."""
    n = len(keys)
    bits = max(n - 1, 1).bit_length()
    if n and int(keys.max()) < 1 << (62 - bits):
        # (in place: one array of n beside ``keys``, not four)
        packed = keys << bits
        packed |= np.arange(n)
        packed.sort()
        packed &= (1 << bits) - 1
        return packed
    return np.argsort(keys, kind="stable")


def runs_within(upto: np.ndarray, limit: int) -> list[tuple[int, int]]:
    """Consecutive runs ``[a, b)`` of items covering all of them, each holding at most
    ``limit`` rows unless one item alone holds more (it is then a run of its own); ``upto``
    is the running count of rows up to and including each item (``np.cumsum`` of the
    counts). For work done a few whole groups at a time in bounded memory."""
    runs = []
    a = 0
    while a < len(upto):
        before = int(upto[a - 1]) if a else 0
        b = max(int(np.searchsorted(upto, before + limit, side="right")), a + 1)
        runs.append((a, b))
        a = b
    return runs


def sorted_values(values: np.ndarray) -> np.ndarray:
    """``np.sort(values)`` of integer ``values``, read-only. polars sorts them (on several
    threads, and quickly on the nearly sorted runs of event keys) four to five times faster
    than numpy on millions of values, holding the same one sorted copy beside them; where no
    copy may be held, `sort_in_place`."""
    return pl.Series(values).sort().to_numpy()


def sort_in_place(values: np.ndarray) -> np.ndarray:
    """Sort ``values`` itself and return it: an array the caller built for the sort needs no
    sorted copy beside it (the events of a 10M-op trace are ~190 MB per array).

    Event keys often come as a few sorted runs (ops sorted by device and start: their starts
    are one run, their ends nearly another); numpy's stable sort, a timsort, merges such runs
    in a few linear passes, two to five times faster than its default quicksort. On shuffled
    values it is ten times slower, so it is taken only when few neighbours are out of order
    (counting them is one cheap pass)."""
    if len(values) > 1 and np.count_nonzero(values[1:] < values[:-1]) * 50 < len(values):
        values.sort(kind="stable")
    else:
        values.sort()
    return values


def interval_events(starts: np.ndarray, ends: np.ndarray, shift: int = 0,
                    member: np.ndarray | None = None) -> np.ndarray:
    """The sorted events of intervals with packed Int64 keys ``starts``/``ends``: a start is
    ``(start << 1 | 1) << shift | member``, an end ``(end << 1) << shift | member`` (an end
    sorts before a start at the same instant). Built in one array of the events' size and
    sorted there: no temporaries of that size beside it."""
    n = len(starts)
    events = np.empty(2 * n, np.int64)
    first, second = events[:n], events[n:]
    np.left_shift(starts, 1, out=first)
    first |= 1
    np.left_shift(ends, 1, out=second)
    if shift:
        events <<= shift
    if member is not None:
        first |= member
        second |= member
    return sort_in_place(events)


def stable_order(index: np.ndarray, n: int) -> np.ndarray:
    """Stable argsort of a non-negative ``index`` below ``n``: numpy radix-sorts 16-bit keys
    (one linear pass), where a 64-bit key would take a comparison sort."""
    if n <= 1 << 16:
        return np.argsort(index.astype(np.uint16), kind="stable")
    return np.argsort(index, kind="stable")


def state_instants(events: np.ndarray, shift: int, n_classes: int,
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Packed key and state code (bit i set: class i active; int16 below 15 classes) after
    all events at every instant, from sorted events ``key << shift | 2 * class +
    is_start``. ``events`` is consumed (shifted in place into the keys): the caller drops
    it once this returns."""
    # Narrow dtypes where the values allow: these passes are bound by memory traffic.
    # Codes below 2**15 fit in int16, and so does every running sum of toggles (a code).
    small = np.int16 if n_classes < 15 else np.int64
    low = (events & ((1 << shift) - 1)).astype(np.uint8 if shift <= 8 else np.int64)
    cls, is_start = low >> 1, (low & 1).astype(np.int8)
    delta = 2 * is_start - 1
    # A class's state changes where its count of active intervals goes 0 -> 1 or 1 -> 0. The
    # count is a running sum over that class's events only (deltas sum to zero per group, so
    # it restarts at every group by itself); the code is then one running sum of +-2^class at
    # those toggles. That is one pass over the events, not one per class.
    toggles = np.zeros(len(events), small)
    for i in range(n_classes):  # per class, not per event
        idx = np.flatnonzero(cls == i)
        d = delta[idx]
        on_off = np.cumsum(d, dtype=np.int64) == is_start[idx]  # 1 after a start, 0 after an end
        toggles[idx[on_off]] = d[on_off].astype(small) << i
    del low, cls, is_start, delta
    key = events
    key >>= shift
    last = np.ones(len(events), bool)  # last event of its instant
    last[:-1] = key[1:] != key[:-1]
    return key[last], np.cumsum(toggles, dtype=small)[last]


def member_concurrency(
    df: pl.DataFrame | pl.LazyFrame,
    by: Sequence[str],
    members: Sequence[str],
    max_name: str,
    mean_name: str,
    start: str = START,
    end: str = END,
) -> pl.DataFrame:
    """Per ``by`` group, how many distinct members (rows with equal ``members`` columns, e.g.
    streams) have an interval active: the maximum and the time-weighted mean over the time
    when at least one is (``by + [max_name (Int64), mean_name (Float64)]``; groups with no
    interval of positive length are absent). Intervals of one member may overlap or touch.

    How: one sort of all start/end events by (group, time) with the member in the low bits;
    a stable radix sort by member then gives every member's events in time order, whose
    running count (deltas sum to zero per member, so one global running sum restarts at
    every member by itself) turns the member on (0 -> 1) or off (1 -> 0); back in time
    order, the running sum of those toggles is the number of active members. That is the
    union per member and a sweep of the unions, without sorting twice.
    """
    by, members = list(by), list(members)
    # (a lazy ``df`` is filtered and selected in one copy of its rows)
    x = (df.lazy().select([*by, *members, start, end]).filter(pl.col(end) > pl.col(start))
         .collect())
    member, n_members = member_codes(x, [*by, *members])
    bits = max(n_members - 1, 1).bit_length()  # the member in the low bits: shifts, no division
    keys = Keys([x], by, [start, end], low=2 << bits)
    # (key, is_start, member): ends sort before starts at an instant; the level is read after
    # the instant's last event, so that order only has to be the same for every member.
    k_start, k_end = keys.pack(0, start).to_numpy(), keys.pack(0, end).to_numpy()
    keys.forget_rows()  # the rows are packed: only their group table is kept, for the output
    del x
    # Narrow dtypes for the per-event arrays (memory traffic is the cost): a level counts
    # members, far below 2**31.
    # Memory: on a 10M-op trace each array of the events is ~190 MB; they are built and
    # sorted in place, and each is dropped after its last use.
    if _serial(member, n_members, k_start, k_end):
        # No member runs two intervals at once (a CUDA stream runs its ops one after the
        # other): active members = active intervals, a running sum of +-1 over the events,
        # without the members' own sweeps.
        del member
        key = interval_events(k_start, k_end)
        del k_start, k_end
        # (+1 at a start, -1 at an end, from the low bit in one int8 array: the low byte
        # of a key holds its low bit)
        delta = key.astype(np.int8)
        delta &= 1
        delta <<= 1
        delta -= 1
        level = np.cumsum(delta, dtype=np.int32)
        del delta
        key >>= 1
    else:
        key = interval_events(k_start, k_end, bits, member)
        del k_start, k_end, member
        is_start = ((key >> bits) & 1).astype(np.int8)
        order = stable_order(key & ((1 << bits) - 1), n_members)
        s_o = is_start[order]
        del is_start
        d = 2 * s_o - 1
        toggles = np.empty_like(d)
        toggles[order] = np.where(np.cumsum(d, dtype=np.int64) == s_o, d, 0)  # 0 <-> 1
        del order, s_o, d
        level = np.cumsum(toggles, dtype=np.int32)
        del toggles
        key >>= 1 + bits
    if not len(key):
        return keys.attach_by(pl.DataFrame(
            schema={GROUP: pl.Int64, max_name: pl.Int64, mean_name: pl.Float64}))
    # Each group's first event, and its group code (one group, as a trace per rank with one
    # device: no group code per event; else the codes of every event are dropped before the
    # segments' lengths are made beside the keys and levels)
    if keys.one_group:
        firsts, group = np.zeros(1, np.int64), np.zeros(1, np.int64)
    else:
        every = key // keys.span
        firsts = np.flatnonzero(np.r_[True, every[1:] != every[:-1]])
        group = every[firsts]
        del every
    # Every event opens the segment up to the next event, at the level after it. No need to
    # keep only an instant's last event: the segments between events of one instant are
    # empty (length 0), and inside an instant the level first falls (ends) then rises
    # (starts), so its maximum is still reached after an instant's last event. A group's
    # last segment runs into the next group: its length is set to 0.
    length = keys.lengths(key[:-1], key[1:])
    del key
    length[firsts[1:] - 1] = 0  # (the segment before a group's first event)
    # Integer sums, then one division: exactly what a group-by of n * length would give.
    # Busy time is the length of the segments with a member active; zeroing the others
    # first changes no sum of level * length (their level is 0), so both sums come from
    # ``length`` itself, in place.
    at = level[:-1]
    length[at <= 0] = 0
    busy = np.add.reduceat(length, firsts)
    length *= at
    out = pl.DataFrame({
        GROUP: group,
        max_name: np.maximum.reduceat(level, firsts).astype(np.int64),
        mean_name: np.add.reduceat(length, firsts) / busy,
    }, schema={GROUP: pl.Int64, max_name: pl.Int64, mean_name: pl.Float64})
    return keys.attach_by(out)


#: rows of the member order `_serial` checks at once
SERIAL_SLICE = 1 << 20


def _serial(member: np.ndarray, n_members: int, start: np.ndarray, end: np.ndarray) -> bool:
    """Whether no member's intervals overlap (touching is fine), for rows in ``start`` order
    (else False: not worth a sort to find out). A stable radix sort by member keeps each
    member's rows in start order; then each interval must end by the next one's start."""
    if len(start) < 2:
        return True
    if not np.all(start[1:] >= start[:-1]):
        return False
    order = stable_order(member, n_members)
    # (a slice of the order at a time, one row into the next: its rows' members and bounds
    # are gathered for the slice only, not three arrays of every row beside the order)
    for lo in range(0, len(order) - 1, SERIAL_SLICE):
        rows = order[lo:lo + SERIAL_SLICE + 1]
        m, s, e = member[rows], start[rows], end[rows]
        if np.any((m[1:] == m[:-1]) & (e[:-1] > s[1:])):
            return False
    return True


def member_codes(x: pl.DataFrame, cols: list[str]) -> tuple[np.ndarray, int]:
    """A 0-based code below ``n`` of every row's ``cols`` (equal values, equal codes; their
    order is of no matter) and ``n``. Integer columns without nulls whose combined range is
    small (devices, processes, streams) are packed arithmetically (a column of one value
    adds nothing), and made dense by a table of the codes present only when the range is
    wider than 2**16: no polars arithmetic, hash or sort over the rows. Else dense ranks."""
    code: np.ndarray | None = None
    size = 1
    for c in cols:
        col = x[c]
        if not col.dtype.is_integer() or col.null_count() or not x.height:
            size = -1
            break
        lo, hi = col.min(), col.max()
        if lo == hi:  # one value (one device, one process): nothing to tell apart
            continue
        size *= int(hi) - int(lo) + 1  # type: ignore[arg-type]
        if size > 4 * x.height + 4096:
            break
        # (Int64 whatever the column's integer type: the codes join Int64 event keys.)
        v = (col.to_numpy() - int(lo)).astype(np.int64, copy=False)  # type: ignore[arg-type]
        code = v if code is None else code * (int(hi) - int(lo) + 1) + v  # type: ignore[arg-type]
    if 0 < size <= 4 * x.height + 4096:
        if code is None:
            return np.zeros(x.height, np.int64), 1
        if size <= 1 << 16:  # few codes: dense enough for the bits and the radix sort
            return code, size
        present = np.bincount(code, minlength=size) > 0
        return (np.cumsum(present) - 1)[code], int(present.sum())
    member, uniq = dense_codes(Keys([x], cols, []).group_code(0))
    return member, len(uniq)
