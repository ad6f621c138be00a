"""The interval kernel against a brute-force per-nanosecond oracle.

Random interval sets are small (times in [0, 40)) so the oracle can enumerate every nanosecond;
they include several groups, touching, nested, zero-length and unsorted intervals.
"""

from __future__ import annotations

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nsysan.frames import intervals as iv

CLASSES = ["a", "b", "c"]
SCHEMA = {"g": pl.Int64, "cls": pl.String, "start_ns": pl.Int64, "end_ns": pl.Int64}

rows_st = st.lists(
    st.tuples(
        st.integers(0, 2),  # group
        st.sampled_from(CLASSES),
        st.integers(0, 30),  # start
        st.integers(0, 10),  # length (0 = zero-length)
    ),
    max_size=14,
)


def frame(rows: list[tuple[int, str, int, int]]) -> pl.DataFrame:
    return pl.DataFrame(
        [(g, c, s, s + n) for g, c, s, n in rows], schema=SCHEMA, orient="row"
    )


def covered(rows, group=None, cls=None) -> set[int]:
    """Every nanosecond covered by the (filtered) intervals."""
    out: set[int] = set()
    for g, c, s, n in rows:
        if (group is None or g == group) and (cls is None or c == cls):
            out.update(range(s, s + n))
    return out


def expand(df: pl.DataFrame, *key: str) -> set[tuple]:
    """(key..., t) for every nanosecond of every interval of ``df``."""
    return {
        (*(r[k] for k in key), t)
        for r in df.iter_rows(named=True)
        for t in range(r["start_ns"], r["end_ns"])
    }


def span(rows, group) -> tuple[int, int] | None:
    live = [(s, s + n) for g, _, s, n in rows if g == group and n > 0]
    if not live:
        return None
    return min(s for s, _ in live), max(e for _, e in live)


@settings(max_examples=150, deadline=None)
@given(rows_st)
def test_union_matches_brute_force(rows):
    out = iv.union(frame(rows), by=["g"]).collect()
    assert expand(out, "g") == {(g, t) for g in range(3) for t in covered(rows, g)}
    # Disjoint, non-touching and sorted within each group.
    for _, grp in out.group_by("g"):
        s, e = grp["start_ns"].to_list(), grp["end_ns"].to_list()
        assert all(a < b for a, b in zip(s, e, strict=True))
        assert all(e[i] < s[i + 1] for i in range(len(s) - 1))


@settings(max_examples=150, deadline=None)
@given(rows_st)
def test_union_without_groups(rows):
    out = iv.union(frame(rows)).collect()
    assert expand(out) == {(t,) for t in covered(rows)}


@settings(max_examples=150, deadline=None)
@given(rows_st)
def test_total_matches_brute_force(rows):
    out = iv.total(frame(rows), by=["g"]).collect()
    got = dict(zip(out["g"].to_list(), out["busy_ns"].to_list(), strict=True))
    want = {g: len(covered(rows, g)) for g in range(3) if covered(rows, g)}
    assert got == want
    one = iv.total(frame(rows)).collect()["busy_ns"].to_list()
    assert one == [len(covered(rows))]


@settings(max_examples=150, deadline=None)
@given(rows_st)
def test_complement_matches_brute_force(rows):
    out = iv.complement(frame(rows), by=["g"]).collect()
    want = set()
    for g in range(3):
        sp = span(rows, g)
        if sp:
            busy = covered(rows, g)
            want |= {(g, t) for t in range(*sp) if t not in busy}
    assert expand(out, "g") == want
    assert (out["end_ns"] > out["start_ns"]).all()


@settings(max_examples=150, deadline=None)
@given(rows_st)
def test_state_segments_match_brute_force_and_tile_the_span(rows):
    df = frame(rows)
    out = iv.state_segments(df, CLASSES, by=["g"]).collect()
    want = set()
    for g in range(3):
        sp = span(rows, g)
        if not sp:
            continue
        per_cls = {c: covered(rows, g, c) for c in CLASSES}
        for t in range(*sp):
            active = [c for c in CLASSES if t in per_cls[c]]
            want.add((g, "+".join(active) or "idle", t))
    assert expand(out, "g", "state") == want
    for g, grp in out.group_by("g"):
        s, e = grp["start_ns"].to_list(), grp["end_ns"].to_list()
        # Tiles [first start, last end) exactly: contiguous, no overlap, ...
        assert (s[0], e[-1]) == span(rows, g[0])
        assert all(e[i] == s[i + 1] for i in range(len(s) - 1))
        # ... and maximal: neighbours differ in state.
        st_ = grp["state"].to_list()
        assert all(st_[i] != st_[i + 1] for i in range(len(st_) - 1))


@settings(max_examples=150, deadline=None)
@given(rows_st, rows_st)
def test_overlay_matches_brute_force(seg_rows, win_rows):
    segments = iv.state_segments(frame(seg_rows), CLASSES, by=["g"]).collect()
    windows = (
        iv.union(frame(win_rows), by=["g"])
        .with_columns(pl.int_range(pl.len()).over("g").alias("step"))
        .collect()
    )
    out = iv.overlay(segments, windows, by=["g"], window_cols=["step"]).collect()
    seg_at = {(g, t): s for g, s, t in expand(segments, "g", "state")}
    win_at = {(g, t): w for g, w, t in expand(windows, "g", "step")}
    want = {
        (g, win_at[(g, t)], st_, t) for (g, t), st_ in seg_at.items() if (g, t) in win_at
    }
    got = expand(out, "g", "step", "state")
    assert got == want
    # Pieces never overlap: as many nanoseconds as distinct (g, t).
    assert int((out["end_ns"] - out["start_ns"]).sum()) == len({(g, t) for g, _, _, t in got})


CASES = {
    # name: (rows as (start, end), union, gaps)
    "empty": ([], [], []),
    "single": ([(2, 5)], [(2, 5)], []),
    "touching": ([(0, 3), (3, 6)], [(0, 6)], []),
    "nested": ([(0, 10), (2, 4)], [(0, 10)], []),
    "zero_length_inside_gap": ([(0, 2), (5, 5), (8, 9)], [(0, 2), (8, 9)], [(2, 8)]),
    "zero_length_only": ([(4, 4)], [], []),
    "unsorted": ([(8, 9), (0, 2), (1, 3)], [(0, 3), (8, 9)], [(3, 8)]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_union_and_complement_named_cases(name):
    rows, want_union, want_gaps = CASES[name]
    df = pl.DataFrame(rows, schema={"start_ns": pl.Int64, "end_ns": pl.Int64}, orient="row")
    got_u = iv.union(df).collect().rows()
    got_g = iv.complement(df).collect().rows()
    assert got_u == want_union
    assert got_g == want_gaps


def test_state_segments_ignore_unknown_classes_and_merge_touching():
    df = pl.DataFrame(
        {"cls": ["a", "a", "zzz"], "start_ns": [0, 3, 0], "end_ns": [3, 6, 100]}
    )
    out = iv.state_segments(df, ["a", "b"]).collect()
    assert out.rows() == [(0, 6, "a")]
