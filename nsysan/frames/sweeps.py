"""Sweeps over packed event keys in numpy: concurrency levels and window sums.

Same conventions as `nsysan.frames.intervals` (half-open Int64 ns intervals, ``by`` grouping
columns packed with `packed_keys.Keys`). These run on plain int64 arrays: at a few million
events a chain of polars expressions (each a pass with its own allocation, plus planning)
costs several times the same arithmetic in numpy, and the algorithms here are sorts, binary
searches and running sums that numpy does directly.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import polars as pl

from nsysan.frames.packed_keys import GROUP, Keys, group_agg

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


def window_sums(
    segments: pl.DataFrame,
    windows: pl.DataFrame,
    by: Sequence[str],
    window_col: str,
    value: str,
    name: str,
    start: str = START,
    end: str = END,
) -> pl.DataFrame:
    """Total length per (``by``, window, ``value``) of the pieces of ``segments`` inside the
    windows of their group: ``by + [window_col, value, name]``, only positive totals, in no
    particular order. Like `intervals.overlay` then a group-by, without building the pieces:
    segments and windows are each *disjoint* within a group; ``value`` is a non-null integer
    column of ``segments``, ``window_col`` identifies a window within its group.
    """
    by = list(by)
    seg = segments.select([*by, start, end, value]).filter(pl.col(end) > pl.col(start))
    win = windows.select([*by, window_col, start, end]).filter(pl.col(end) > pl.col(start))
    keys = Keys([seg, win], by, [start, end])
    ss, se = (keys.pack(0, c).to_numpy() for c in (start, end))
    ws, we = (keys.pack(1, c).to_numpy() for c in (start, end))
    w_order = np.argsort(ws, kind="stable")
    ws, we = ws[w_order], we[w_order]
    # Segments usually come sorted (from state_code_segments): checking is cheaper than sorting.
    s_order = None if np.all(ss[1:] >= ss[:-1]) else np.argsort(ss, kind="stable")
    if s_order is not None:
        ss, se = ss[s_order], se[s_order]
    # Both sets are disjoint, so every piece starts either where its segment starts (in the
    # window holding that start) or where its window starts (in the segment holding it, which
    # began earlier). Keys of different groups never meet: a window holds only its group's.
    # Window of every segment start, linearly: both sides are sorted, so the count of window
    # starts at or before each segment start is a running sum of the windows' insertion points.
    s_of_w = np.searchsorted(ss, ws, side="left") - 1
    w_of_s = np.cumsum(np.bincount(s_of_w + 1, minlength=len(ss) + 1)[:len(ss)]) - 1
    wi, si = w_of_s.clip(0), s_of_w.clip(0)
    from_seg = (w_of_s >= 0) & (ss < we[wi]) if len(ws) else np.zeros(len(ss), bool)
    from_win = (s_of_w >= 0) & (ws < se[si]) if len(ss) else np.zeros(len(ws), bool)
    s_rows = np.concatenate([np.flatnonzero(from_seg), si[from_win]])
    w_rows = np.concatenate([wi[from_seg], np.flatnonzero(from_win)])
    lo = np.concatenate([ss[from_seg], ws[from_win]])
    hi = np.minimum(se[s_rows], we[w_rows])
    seg_rows = s_rows if s_order is None else s_order[s_rows]
    w_ids, values, sums = _pair_sums(w_order[w_rows], len(win),
                                     seg[value].to_numpy()[seg_rows], keys.lengths(lo, hi))
    return (
        win.select([pl.col(c).gather(w_ids) for c in [*by, window_col]])
        .with_columns(pl.Series(value, values, seg.schema[value]), pl.Series(name, sums))
    )


def run_sums(
    segments: pl.DataFrame,
    windows: pl.DataFrame,
    group: str,
    window_col: str,
    value: str,
    name: str,
    start: str = START,
    end: str = END,
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """`window_sums` of every group of ``segments`` over the same ``windows`` (``window_col,
    start, end``; no group column): ``group, window_col, value, name``, only positive totals,
    in no particular order; and their `run_lengths`, in one pass. ``segments`` must come in
    runs of one ``group`` value each (sorted by group, as `intervals.state_code_segments`
    returns them), sorted by start and disjoint within a run; ``value`` is a small
    non-negative integer code; the windows are disjoint.

    How, per run (a loop over groups such as devices, not over events): the segments that
    start inside a window are a contiguous range (two binary searches per *window*), so every
    segment gets its window (or "outside", one cell per run) by one `np.repeat` and adds its
    whole length to its (run, window, value) cell; summed over a run's windows, those cells
    are the run's totals. Then two fixes per window: the last segment of a window loses the
    part past the window end, and the segment running into the window from before adds the
    part inside. A few passes over the segments in all: no packed keys, no sort, no search per
    segment.
    """
    win = windows.select(window_col, start, end).filter(pl.col(end) > pl.col(start))
    w_order = np.argsort(win[start].to_numpy(), kind="stable")
    ws, we = win[start].to_numpy()[w_order], win[end].to_numpy()[w_order]
    n_win = len(ws)
    runs = _Runs(segments, group, value, start, end)
    seg, ss, se, codes, firsts = runs.seg, runs.start, runs.end, runs.codes, runs.firsts
    n_codes = len(runs.present)
    per_run = (n_win + 1) * n_codes  # the windows' cells, then the outside cells
    if len(firsts) * per_run > 8 * seg.height + 4096:  # a sparse table: the generic pieces
        per_group = seg.select(group).unique().join(win, how="cross")
        return (window_sums(seg, per_group, [group], window_col, value, name, start, end),
                run_lengths(seg, group, value, name, start, end))
    bounds = np.r_[firsts, seg.height].tolist() if seg.height else [0]
    cells, fix_cell, fix_len = [], [], []
    w = np.arange(n_win)
    for g in range(len(bounds) - 1):  # per group, not per event
        lo, hi = bounds[g], bounds[g + 1]
        s, e = ss[lo:hi], se[lo:hi]
        first = np.searchsorted(s, ws, side="left")  # first segment starting in each window
        stop = np.searchsorted(s, we, side="left")  # one past the last
        # Cell base of every segment, runs of [outside, window 0, outside, window 1, ...,
        # outside], and its value.
        base = g * per_run
        outside = base + n_win * n_codes
        runs_of = np.stack([np.full(n_win, outside), base + w * n_codes], 1)
        sizes = np.stack([first - np.r_[0, stop[:-1]], stop - first], 1)
        cell = np.repeat(np.r_[runs_of.ravel(), outside],
                         np.r_[sizes.ravel(), len(s) - (stop[-1] if n_win else 0)])
        cell += codes[lo:hi]  # (in place: one array of the run's segments, not two)
        cells.append(cell)
        last = stop - 1
        cut = (stop > first) & (e[last.clip(0)] > we)  # the last segment runs past the end
        fix_cell.append(base + w[cut] * n_codes + codes[lo:hi][last[cut]])
        fix_len.append(we[cut] - e[last[cut]])
        before = first - 1
        into = (before >= 0) & (e[before.clip(0)] > ws)  # a segment runs in from before
        fix_cell.append(base + w[into] * n_codes + codes[lo:hi][before[into]])
        fix_len.append(np.minimum(e[before[into]], we[into]) - ws[into])
    n_runs = len(bounds) - 1
    # (one run, one device: its cells as they are, not a copy beside them)
    cell = (cells[0] if len(cells) == 1 else np.concatenate(cells) if cells
            else np.zeros(0, np.int64))
    del cells
    table = cell_sums(cell, runs.length, n_runs * per_run)
    del cell
    totals = table.reshape(n_runs, n_win + 1, n_codes).sum(axis=1).ravel()
    if fix_cell:
        np.add.at(table, np.concatenate(fix_cell), np.concatenate(fix_len))
    cell = np.flatnonzero(table.reshape(n_runs, n_win + 1, n_codes)[:, :n_win].ravel() > 0)
    run, rest = np.divmod(cell, n_win * n_codes)
    wins, values = np.divmod(rest, n_codes)
    per_window = pl.DataFrame([
        seg[group].gather(firsts[run]),
        win[window_col].gather(w_order[wins]),
        pl.Series(value, runs.present[values], seg.schema[value]),
        pl.Series(name, table.reshape(n_runs, n_win + 1, n_codes)[:, :n_win].ravel()[cell],
                  pl.Int64),
    ])
    return per_window, _run_table(runs, group, value, name, totals)


def run_lengths(segments: pl.DataFrame, group: str, value: str, name: str,
                start: str = START, end: str = END) -> pl.DataFrame:
    """Total length of the ``segments`` per (``group``, ``value``) for segments that come in
    runs of one ``group`` value each, like `run_sums` takes them: ``group, value, name``, only
    positive totals, in no particular order (``value``: a small non-negative integer code).
    One sum into a dense (run, value) table: no group codes to pack."""
    runs = _Runs(segments, group, value, start, end)
    n_codes = len(runs.present)
    run = np.repeat(np.arange(len(runs.firsts)), np.diff(np.r_[runs.firsts, runs.seg.height]))
    table = cell_sums(run * n_codes + runs.codes, runs.length, len(runs.firsts) * n_codes)
    return _run_table(runs, group, value, name, table)


def _run_table(runs: _Runs, group: str, value: str, name: str, table: np.ndarray,
               ) -> pl.DataFrame:
    """``group, value, name`` of the positive cells of a (run, value code) ``table``."""
    n_codes = len(runs.present)
    cell = np.flatnonzero(table > 0)
    return pl.DataFrame([
        runs.seg[group].gather(runs.firsts[cell // n_codes]),
        pl.Series(value, runs.present[cell % n_codes], runs.seg.schema[value]),
        pl.Series(name, table[cell], pl.Int64),
    ])


class _Runs:
    """Segments of positive length in runs of one group value each, with their values as
    dense codes (`run_sums`, `run_lengths`)."""

    def __init__(self, segments: pl.DataFrame, group: str, value: str, start: str, end: str,
                 ) -> None:
        seg = segments.select(group, start, end, value)
        ss, se = seg[start].to_numpy(), seg[end].to_numpy()
        if not np.all(se > ss):  # state segments have positive lengths: checking is cheap
            seg = seg.filter(pl.col(end) > pl.col(start))
            ss, se = seg[start].to_numpy(), seg[end].to_numpy()
        col = seg[group]
        self.seg, self.start, self.end, self.length = seg, ss, se, se - ss
        #: first row of every run (row 0 also when there are none)
        self.firsts = np.flatnonzero(np.r_[True, col[1:].ne_missing(col[:-1]).to_numpy()])
        # Dense codes of the values present (few: state codes), so the tables stay small.
        raw = seg[value].to_numpy()
        self.present = np.flatnonzero(np.bincount(raw)) if len(raw) else np.zeros(1, np.int64)
        # (a code per segment: int16 while they fit, a quarter of Int64's memory)
        lut = np.zeros(int(self.present[-1]) + 1,
                       np.int16 if len(self.present) < 1 << 15 else np.int64)
        lut[self.present] = np.arange(len(self.present))
        self.codes = lut[raw]


#: rows per `cell_sums` bincount
CELL_CHUNK = 1 << 22


def cell_sums(cell: np.ndarray, weights: np.ndarray, n: int) -> np.ndarray:
    """Sum of the non-negative integer ``weights`` per ``cell`` in ``[0, n)``, exactly, as
    Int64."""
    # Float sums are exact while every partial sum stays below 2**53 (with no negative weight,
    # none exceeds the total); the lengths of disjoint segments add up to at most the groups'
    # spans, far below that on any real trace.
    if float(weights.sum(dtype=np.float64)) < 2.0**52:
        if n > CELL_CHUNK:  # a table as large as a chunk: one bincount
            return np.bincount(cell, weights=weights, minlength=n).astype(np.int64)
        # a chunk at a time: bincount converts its weights to float64, a copy of each chunk
        # (not of all of them: 8 bytes per segment, ~0.14 GB on 10M kernels)
        table = np.zeros(n, np.int64)
        for a in range(0, len(cell), CELL_CHUNK):
            table += np.bincount(cell[a:a + CELL_CHUNK], weights=weights[a:a + CELL_CHUNK],
                                 minlength=n).astype(np.int64)
        return table
    table = np.zeros(n, np.int64)
    np.add.at(table, cell, weights)
    return table


def _pair_sums(first: np.ndarray, n_first: int, second: np.ndarray, weights: np.ndarray,
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sum of positive ``weights`` per distinct (``first``, ``second``) pair, ``first`` in
    ``[0, n_first)``: the pairs with a sum (positive) and the sums, in no particular order."""
    lo = int(second.min()) if len(second) else 0
    n_second = int(second.max()) - lo + 1 if len(second) else 1
    if n_first * n_second <= 8 * len(weights) + 4096:
        # Few distinct pairs (windows x states): an unbuffered add into a dense table is
        # exact integer arithmetic and several times faster than a hash group-by.
        table = np.zeros(n_first * n_second, np.int64)
        np.add.at(table, first * n_second + (second - lo), weights)
        cell = np.flatnonzero(table)
        return cell // n_second, cell % n_second + lo, table[cell]
    pieces = pl.DataFrame({"_f": first, "_s": second, "_w": weights})
    sums = group_agg(pieces, ["_f"], "_s", [pl.col("_w").sum()])
    return sums["_f"].to_numpy(), sums["_s"].to_numpy(), sums["_w"].to_numpy()
