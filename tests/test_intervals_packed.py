"""The packed-key paths of the interval kernel that small brute-force inputs never reach.

`tests/test_intervals.py` checks every function against brute force on small integer times and
one integer group column: there, group codes and times pack as plain offsets. Here the same
inputs are transformed so that packing must fall back, and the results must be the transformed
results of the plain path:

* times scaled to ~2^60 (the packed range no longer fits: times are replaced by their rank);
* string and null group values (codes are dense ranks; nulls sort first);
* two group columns with huge ranges (the combined code is re-ranked).
"""

from __future__ import annotations

import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from nsysan.frames import intervals as iv
from nsysan.frames.packed_keys import LIMIT, Keys
from nsysan.passes.distinct import distinct

CLASSES = ["a", "b", "c"]
SCALE = 1 << 55  # 40 * 2^55 > 2^60: three groups no longer fit 62 bits
SHIFT = 12345
BIG = 1 << 40  # one column's range fits, the product of two does not

rows_st = st.lists(
    st.tuples(
        st.sampled_from([0, 1, 2, None]),  # group (null is a group of its own)
        st.sampled_from(CLASSES),
        st.integers(0, 30),
        st.integers(0, 10),
    ),
    max_size=14,
)


def frame(rows) -> pl.DataFrame:
    return pl.DataFrame(
        [(g, c, s, s + n) for g, c, s, n in rows],
        schema={"g": pl.Int64, "cls": pl.String, "start_ns": pl.Int64, "end_ns": pl.Int64},
        orient="row",
    )


def scaled(df: pl.DataFrame) -> pl.DataFrame:
    t = [c for c in ("start_ns", "end_ns") if c in df.columns]
    return df.with_columns(pl.col(t) * SCALE + SHIFT)


def as_strings(df: pl.DataFrame) -> pl.DataFrame:
    # "g0" < "g1" < "g2" sort like 0 < 1 < 2, so the row order must not change.
    return df.with_columns(pl.format("g{}", pl.col("g")).alias("g"))


def two_columns(df: pl.DataFrame) -> pl.DataFrame:
    # Each column alone fits as an offset; together the product of their ranges does not.
    return df.with_columns((pl.col("g") * BIG).alias("g"), (-pl.col("g") * BIG).alias("h"))


WEIGHTS = {
    "a_ns": (pl.col("state_code") & 1).cast(pl.Int64),
    "busy_x2_ns": (pl.col("state_code") > 0).cast(pl.Int64) * 2,
}


def functions(df: pl.DataFrame, by: list[str]) -> dict[str, pl.DataFrame]:
    segs = iv.state_segments(df, CLASSES, by=by).collect()
    windows = (
        iv.union(df.filter(pl.col("cls") == "a"), by=by)
        .with_columns(pl.int_range(pl.len()).alias("step"))
        .collect()
    )
    codes = iv.state_code_segments(df, CLASSES, by=by).collect()
    return {
        "sums": iv.segment_sums(windows, codes, WEIGHTS, by=by).collect(),
        "union": iv.union(df, by=by).collect(),
        "total": iv.total(df, by=by).collect(),
        "complement": iv.complement(df, by=by).collect(),
        "segments": segs,
        "overlay": iv.overlay(segs, windows, by=by).collect(),
        "covered": iv.covered(df, df.filter(pl.col("cls") == "b"), by=by).collect(),
    }


@settings(max_examples=100, deadline=None)
@given(rows_st)
def test_huge_times_rank_instead_of_offset(rows):
    df = frame(rows)
    want = functions(df, ["g"])
    got = functions(scaled(df), ["g"])
    for name in ("union", "complement", "segments", "overlay"):
        assert got[name].equals(scaled(want[name])), name
    assert got["total"].equals(want["total"].with_columns(pl.col("busy_ns") * SCALE))
    assert got["covered"].equals(
        scaled(want["covered"]).with_columns(pl.col("covered_ns") * SCALE)
    )
    assert got["sums"].equals(scaled(want["sums"]).with_columns(pl.col(list(WEIGHTS)) * SCALE))


@settings(max_examples=100, deadline=None)
@given(rows_st)
def test_string_groups_with_nulls(rows):
    df = frame(rows)
    want, got = functions(df, ["g"]), functions(as_strings(df), ["g"])
    for name, out in got.items():
        assert out.equals(as_strings(want[name])), name


@settings(max_examples=100, deadline=None)
@given(rows_st)
def test_two_group_columns_with_huge_ranges(rows):
    df = frame(rows)
    want, got = functions(df, ["g"]), functions(two_columns(df), ["g", "h"])
    for name, out in got.items():
        exp = two_columns(want[name])
        assert out.equals(exp.select(out.columns)), name


def test_keys_sort_like_the_columns_with_nulls_first():
    df = pl.DataFrame({
        "s": ["b", None, "a", "b", "a"],
        "i": [3, 1, None, -(1 << 62), 1 << 62],
        "t": [5, 4, 3, 2, 1],
    })
    for by in (["s"], ["i"], ["s", "i"], ["i", "s"]):
        keys = Keys([df], by, ["t"])
        packed = keys.pack(0, "t")
        assert int(packed.max()) < LIMIT  # type: ignore[arg-type]
        want = df.sort([*by, "t"], nulls_last=False)
        assert df.with_columns(packed.alias("_k")).sort("_k").drop("_k").equals(want), by
        decoded = keys.attach_by(pl.DataFrame({"_g": keys.group_code(0)}))
        assert decoded.equals(df.select(by)), by


def test_keys_decode_the_same_after_forgetting_their_rows():
    """`Keys.forget_rows` (the sorted GPU ops keep their keys through the reports) keeps
    every decoding: by values through the radix or the lookup table, times by offset or
    rank."""
    df = pl.DataFrame({
        "s": ["b", None, "a", "b", "a"],
        "i": [3, 1, None, -(1 << 62), 1 << 62],
        "t": [5, 4, 3, 2, 1 << 61],
    })
    for by in (["s"], ["i"], ["s", "i"], ["i"]):
        keys = Keys([df], by, ["t"])
        packed, codes = keys.pack(0, "t"), keys.group_code(0)
        want = (keys.attach_by(pl.DataFrame({"_g": codes})),
                pl.select(keys.time(pl.lit(packed))).to_series())
        keys.forget_rows()
        assert keys._frames == [] and keys._codes == []
        got = (keys.attach_by(pl.DataFrame({"_g": codes})),
               pl.select(keys.time(pl.lit(packed))).to_series())
        assert got[0].equals(want[0]) and got[0].equals(df.select(by)), by
        assert got[1].equals(want[1]) and got[1].to_list() == df["t"].to_list(), by


def test_keys_across_frames_share_codes_and_times():
    a = pl.DataFrame({"g": [1, 2], "t": [10, 20]})
    b = pl.DataFrame({"g": [2, 1], "t": [15, 5]})
    keys = Keys([a, b], ["g"], ["t"])
    merged = pl.concat([keys.pack(0, "t"), keys.pack(1, "t")]).to_list()
    assert sorted(merged) == [merged[i] for i in (3, 0, 2, 1)]  # (1,5) (1,10) (2,15) (2,20)


def test_the_fallbacks_above_are_taken():
    df = frame([(0, "a", 0, 5), (1, "a", 40, 0), (2, "b", 3, 4), (None, "c", 1, 1)])
    assert Keys([df], ["g"], ["start_ns", "end_ns"])._uniq is None  # plain offsets
    assert Keys([scaled(df)], ["g"], ["start_ns", "end_ns"])._uniq is not None  # ranks
    strings = Keys([as_strings(df)], ["g"], ["start_ns"])
    assert strings._radix is None  # ranked codes: decoded by a lookup table
    two = two_columns(df)
    assert two["g"].max() - two["g"].min() + 2 < LIMIT  # type: ignore[operator]
    assert Keys([two], ["g", "h"], ["start_ns"])._radix is None  # re-ranked combination


@settings(max_examples=150, deadline=None)
@given(rows_st, rows_st)
def test_segment_sums_match_the_overlay_pieces(seg_rows, win_rows):
    """Weighted time per window equals the sum over the overlay's pieces (brute-forced in
    tests/test_intervals.py); windows may overlap here, and every window gets a row."""
    segs = iv.state_code_segments(frame(seg_rows), CLASSES, by=["g"]).collect()
    windows = frame(win_rows).with_columns(pl.int_range(pl.len()).alias("step"))
    got = iv.segment_sums(windows, segs, WEIGHTS, by=["g"]).collect()
    assert got.drop(list(WEIGHTS)).equals(windows)
    dur = pl.col("end_ns") - pl.col("start_ns")
    for w in windows.iter_rows(named=True):
        one = pl.DataFrame([w]).cast(windows.schema)  # type: ignore[arg-type]
        pieces = iv.overlay(segs, one, by=["g"]).collect()
        want = pieces.select((dur * expr).sum().alias(name) for name, expr in WEIGHTS.items())
        row = got.filter(pl.col("step") == w["step"]).select(list(WEIGHTS))
        assert row.rows() == want.rows(), w


def test_wide_second_group_column_keeps_group_order() -> None:
    # dense codes of the first column times the second column's own (offset) range would
    # pass 2**63: the second column is ranked too, so groups stay distinct and ordered
    big = 2**61 + 2**60
    df = pl.DataFrame({"pid": [1, 2, 3, 4, 4, 2], "dev": [0, big, 5, big, 0, None],
                       "start_ns": [0, 0, 0, 0, 100, 3], "end_ns": [5, 6, 7, 8, 200, 9]})
    got = iv.union(df, by=["pid", "dev"]).collect()
    assert got.equals(df.sort("pid", "dev", "start_ns", nulls_last=False))
    assert distinct(df.select("pid", "dev")).sort("pid", "dev").equals(
        df.select("pid", "dev").unique().sort("pid", "dev"))
