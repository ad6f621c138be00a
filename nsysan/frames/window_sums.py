"""Time per window of disjoint segments, in numpy: the steps pass's overlap states per step.

Same conventions as `nsysan.frames.sweeps` (half-open Int64 ns intervals, ``by`` grouping
columns packed with `packed_keys.Keys`), on plain int64 arrays: binary searches, running sums
and dense tables instead of an interval overlay and a group-by.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import polars as pl

from nsysan.frames.packed_keys import Keys, group_agg
from nsysan.frames.sweeps import END, START


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
