"""`gap_causes._prune` with the rows bounded by binary searches per window (`_candidates`,
sorted starts) against the binary search per row it stands for: long rows spanning several
windows, rows touching a window bound, zero and negative lengths, no window, one row, null
bounds and unsorted starts (no candidates: every row is tested); a few run-long rows taken
apart from the bound, and the give-up when the candidates would be most of the rows."""

from __future__ import annotations

import itertools

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nsysan.passes import gap_causes

rows_st = st.lists(st.tuples(st.integers(-5, 120), st.integers(-3, 60)), max_size=40)
cuts_st = st.lists(st.integers(0, 110), max_size=10)


def _frame(rows, sort: bool) -> pl.DataFrame:
    df = pl.DataFrame([(s, s + d, i) for i, (s, d) in enumerate(rows)],
                      schema={"start_ns": pl.Int64, "end_ns": pl.Int64, "i": pl.Int64},
                      orient="row")
    return df.sort("start_ns") if sort else df


def _windows(cuts) -> pl.DataFrame:
    pts = sorted(set(cuts))
    pairs = list(itertools.pairwise(pts))[::2]  # disjoint, sorted, with room between
    return pl.DataFrame(pairs, schema={"_ws": pl.Int64, "_we": pl.Int64}, orient="row")


def _both(df: pl.DataFrame, wins: pl.DataFrame, monkeypatch) -> tuple[list, list]:
    monkeypatch.setattr(gap_causes, "_MIN_ROWS", 0)
    # never give up: these frames are small, their candidates often most rows
    monkeypatch.setattr(gap_causes, "_MAX_CANDIDATE_FRAC", 1.0)
    got = gap_causes._prune(df, wins).collect()["i"].to_list()
    monkeypatch.setattr(gap_causes, "_candidates", lambda *a: None)
    want = gap_causes._prune(df, wins).collect()["i"].to_list()
    monkeypatch.undo()
    return got, want


@settings(max_examples=200, deadline=None)
@given(rows_st, cuts_st)
def test_candidates_keep_what_the_search_per_row_keeps(rows, cuts):
    with pytest.MonkeyPatch.context() as mp:
        got, want = _both(_frame(rows, sort=True), _windows(cuts), mp)
    assert got == want


def test_candidates_are_used_only_for_sorted_starts_without_nulls(monkeypatch):
    monkeypatch.setattr(gap_causes, "_MIN_ROWS", 0)
    monkeypatch.setattr(gap_causes, "_MAX_CANDIDATE_FRAC", 1.0)  # 3 of 4 rows: not too many
    wins = _windows([10, 20, 40, 50])
    df = _frame([(0, 30), (12, 1), (45, 2), (60, 5)], sort=True)
    assert gap_causes._candidates(df, wins).tolist() == [0, 1, 2]
    assert gap_causes._candidates(_frame([(5, 1), (1, 1)], sort=False), wins) is None
    nulls = df.with_columns(pl.lit(None, pl.Int64).alias("end_ns"))
    assert gap_causes._candidates(nulls, wins) is None
    # and with them the search per row decides as before
    with pytest.MonkeyPatch.context() as mp:
        got, want = _both(nulls, wins, mp)
    assert got == want == []


def test_small_frames_skip_the_candidates():
    df = _frame([(0, 30)], sort=True)
    assert gap_causes._candidates(df, _windows([10, 20])) is None



@settings(max_examples=200, deadline=None)
@given(rows_st, cuts_st, st.integers(-3, 70))
def test_rows_longer_than_the_bound_apart_keep_what_the_search_per_row_keeps(rows, cuts, bound):
    # any bound, the rows longer than it candidates of their own (the second try of
    # `_candidates`), never given up
    df = _frame(rows, sort=True)
    s = df["start_ns"].to_numpy()
    long = np.flatnonzero(df["end_ns"].to_numpy() - s > bound)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gap_causes, "_candidates",
                   lambda d, w: gap_causes._bounded(s, w, bound, long, 1 << 62))
        got = gap_causes._prune(df, _windows(cuts)).collect()["i"].to_list()
        got_cand = gap_causes._candidates(df, _windows(cuts))
        mp.setattr(gap_causes, "_candidates", lambda *a: None)
        want = gap_causes._prune(df, _windows(cuts)).collect()["i"].to_list()
    assert got == want
    assert got_cand.tolist() == sorted(set(got_cand.tolist()))


def _spy(f, calls: list):
    def wrapped(*a):
        calls.append(a)
        return f(*a)
    return wrapped


def test_one_run_long_row_does_not_make_every_row_a_candidate(monkeypatch):
    # 2000 short rows and, first, a row as long as the run (a whole-run NVTX range)
    rows = [(0, 100_000)] + [(50 * i, 10) for i in range(2000)]
    df = _frame(rows, sort=True)
    wins = _windows([1000, 1100, 50_000, 50_200])
    monkeypatch.setattr(gap_causes, "_MIN_ROWS", 0)
    monkeypatch.setattr(gap_causes, "_LONG_ROWS", 8)
    monkeypatch.setattr(gap_causes, "_bounded", _spy(gap_causes._bounded, calls := []))
    cand = gap_causes._candidates(df, wins)
    # the longest bound gave up, the 8th longest (10) did: a few rows around each window
    assert len(calls) == 2 and calls[1][2] == 10
    assert cand is not None and 0 in cand.tolist() and len(cand) < 20
    got = gap_causes._prune(df, wins).collect()["i"].to_list()
    monkeypatch.setattr(gap_causes, "_candidates", lambda *a: None)
    want = gap_causes._prune(df, wins).collect()["i"].to_list()
    assert got == want and 0 in got and len(got) == 1 + 2 + 4


def test_candidates_give_up_when_most_rows_are_long(monkeypatch):
    # every row spans every window: candidates would be all rows, so none are listed
    df = _frame([(i, 100_000 + i) for i in range(2000)], sort=True)
    wins = _windows([1000, 1100, 50_000, 50_200])
    monkeypatch.setattr(gap_causes, "_MIN_ROWS", 0)
    monkeypatch.setattr(gap_causes, "_LONG_ROWS", 8)
    monkeypatch.setattr(gap_causes, "_bounded", _spy(gap_causes._bounded, calls := []))
    assert gap_causes._candidates(df, wins) is None
    assert len(calls) == 2  # both tries made, both too many
    assert gap_causes._prune(df, wins).collect()["i"].to_list() == list(range(2000))
