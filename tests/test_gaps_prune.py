"""`gap_causes._prune` with the rows bounded by binary searches per window (`_candidates`,
sorted starts) against the binary search per row it stands for: long rows spanning several
windows, rows touching a window bound, zero and negative lengths, no window, one row, null
bounds and unsorted starts (no candidates: every row is tested)."""

from __future__ import annotations

import itertools

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
