"""The shared per-device streams (`nsysan.findings.streams`) and the rules built on them give
what the direct definitions give: coverage by prefix sums equals coverage by a union, the
memoised busy union is the one `intervals` computes, exposed time is |S ∪ C| − |C|, and the
short-gap launch test finds the earliest launch return of the ops that end each gap."""

from __future__ import annotations

import itertools

import numpy as np
import polars as pl
import pytest
from findings_cases import scenario
from hypothesis import given, settings
from hypothesis import strategies as st

from nsysan.findings import streams
from nsysan.findings.context import Context
from nsysan.frames import intervals
from nsysan.frames.context import AnalysisContext
from nsysan.frames.trace import Trace
from nsysan.passes import device_blocks

CPU = ["device_id", "start_ns", "end_ns"]


# The reference `exposed_ns` is checked against: the subset's union measured per device
# against the union of the compute kernels, by prefix sums (itself checked against the
# definition |S ∪ C| - |C| below).
def _compute_blocks(trace: Trace) -> pl.DataFrame:
    return device_blocks.union(trace, ["compute"], timed=False)


def _uncovered_ns(blocks: pl.DataFrame, cover: pl.DataFrame) -> int:
    """Total length of sorted disjoint ``blocks`` not under sorted disjoint ``cover`` (both
    ``device_id, start_ns, end_ns``), matched per device; a null device matches nothing."""
    total = 0
    for (dev,), b in blocks.group_by(["device_id"]):  # one iteration per device
        s, e = b["start_ns"].to_numpy(), b["end_ns"].to_numpy()
        total += int((e - s).sum())
        if dev is None:
            continue
        c = cover.filter(pl.col("device_id") == dev)
        cs, ce = c["start_ns"].to_numpy(), c["end_ns"].to_numpy()
        total -= int((streams.covered_before(cs, ce, e) - streams.covered_before(cs, ce, s)).sum())
    return total


def _frame(rows: list[tuple[int | None, int, int]]) -> pl.DataFrame:
    return pl.DataFrame(rows, schema={"device_id": pl.Int64, "start_ns": pl.Int64,
                                      "end_ns": pl.Int64}, orient="row")


intervals_st = st.lists(
    st.tuples(st.sampled_from([0, 1, None]), st.integers(0, 200), st.integers(0, 40)).map(
        lambda t: (t[0], t[1], t[1] + t[2])), max_size=25)


@settings(max_examples=150, deadline=None)
@given(intervals_st, st.lists(st.integers(-10, 260), min_size=1, max_size=12))
def test_covered_before_is_the_union_length_before_t(rows, ts) -> None:
    u = intervals.union(_frame([r for r in rows if r[0] == 0]), by=[]).collect()
    s, e = u["start_ns"].to_numpy(), u["end_ns"].to_numpy()
    got = streams.covered_before(s, e, np.array(ts, dtype=np.int64))
    want = [int(np.clip(np.minimum(e, t) - s, 0, None).sum()) for t in ts]
    assert got.tolist() == want


@settings(max_examples=150, deadline=None)
@given(intervals_st, intervals_st)
def test_uncovered_is_union_minus_cover(subset, cover) -> None:
    """exposed = |S ∪ C| − |C| per device (the definition the exposed-copy rules use); a
    subset on a null device is exposed entirely (nothing is matched with a null device)."""
    s, c = _frame(subset), _frame(cover)
    c = c.filter(pl.col("device_id").is_not_null())
    blocks = intervals.union(s, by=["device_id"]).collect()
    got = _uncovered_ns(blocks, intervals.union(c, by=["device_id"]).collect())
    want = 0
    for dev in s["device_id"].unique().to_list():
        mine = s.filter(pl.col("device_id").is_null() if dev is None
                        else pl.col("device_id") == dev)
        theirs = c.filter(pl.col("device_id") == dev) if dev is not None else c.clear()
        both = intervals.total(pl.concat([mine, theirs])).collect().item() or 0
        alone = intervals.total(theirs).collect().item() or 0 if theirs.height else 0
        want += both - alone
    assert got == want


def test_gaps_between_blocks_is_the_complement() -> None:
    ops = _frame([(0, 10, 20), (0, 15, 30), (0, 40, 50), (1, 5, 6), (1, 8, 9), (0, 60, 61),
                  (2, 1, 2)])
    blocks = intervals.union(ops, by=["device_id"]).collect()
    want = intervals.complement(ops, by=["device_id"]).collect()
    assert streams.gaps_between(blocks).equals(want)


def test_busy_union_is_shared_within_an_analysis() -> None:
    tr, _ = scenario("healthy")
    tr = AnalysisContext(tr)
    first = streams.busy_blocks(tr)
    # computed once per analysis (the blocks; their frame is built at each call)
    assert device_blocks.blocks(tr) is device_blocks.blocks(tr)
    assert streams.busy_blocks(tr).equals(first)
    want = intervals.union(tr.frame("gpu_ops").filter(pl.col("start_ns") > 0),
                           by=["device_id"]).collect()
    assert first.equals(want)
    # a trace over other frames gets its own union
    ops = tr.frame("gpu_ops").head(3)
    other = Trace.from_frames("other", {"gpu_ops": ops})
    assert streams.busy_blocks(other).equals(
        intervals.union(ops.filter(pl.col("start_ns") > 0), by=["device_id"]).collect())


def _short_gaps_by_definition(ctx: Context) -> pl.DataFrame:
    """The short-gap classification written directly on two-column joins (the definition)."""
    ops, api = ctx.trace.frame("gpu_ops"), ctx.trace.frame("cuda_api")
    busy = ops.lazy().filter(pl.col("start_ns") > 0).select(CPU)
    gaps = (intervals.complement(busy, by=["device_id"])
            .with_columns((pl.col("end_ns") - pl.col("start_ns")).alias("duration_ns"))
            .filter(pl.col("duration_ns") < ctx.params.short_gap_max_ns))
    w = ctx.window
    gaps = gaps.filter((pl.col("start_ns") >= w[0]) & (pl.col("end_ns") <= w[1]))
    gaps = gaps.sort("start_ns")
    # in a blocking call: a backward as-of join on the call unions' starts, per device
    for name, calls in zip(("_in_sync", "_in_copy"), ctx._blocking_calls, strict=True):
        calls = calls.lazy().sort("start_ns").rename({"start_ns": "_cs", "end_ns": "_ce"})
        gaps = (gaps.join_asof(calls, left_on="start_ns", right_on="_cs", by="device_id",
                               strategy="backward", check_sortedness=False)
                .with_columns((pl.col("_ce").is_not_null()
                               & (pl.col("start_ns") < pl.col("_ce"))).alias(name))
                .drop(["_cs", "_ce"]))
    ends = gaps.select(["device_id", pl.col("end_ns").alias("start_ns")])
    launch = (ops.lazy().join(ends, on=["device_id", "start_ns"], how="semi")
              .join(api.lazy().select(["global_pid", "correlation_id",
                                       pl.col("end_ns").alias("_api_end")]),
                    on=["global_pid", "correlation_id"])
              .group_by(["device_id", "start_ns"]).agg(pl.col("_api_end").min())
              .rename({"start_ns": "end_ns"}))
    gaps = gaps.join(launch, on=["device_id", "end_ns"], how="left")
    late = pl.col("_api_end").is_not_null() & (pl.col("_api_end") > pl.col("start_ns"))
    kind = (pl.when(pl.col("_in_sync")).then(pl.lit("sync"))
            .when(pl.col("_in_copy")).then(pl.lit("copy"))
            .when(late).then(pl.lit("launch")).otherwise(pl.lit("other")))
    return gaps.select([*CPU, "duration_ns", kind.alias("kind")]).collect()


@pytest.mark.parametrize(("name", "kinds"), [
    ("healthy", set()), ("sync_in_loop", set()), ("launch_bound", {"launch"}),
    ("pageable_copies", {"copy", "launch"})])
def test_short_gaps_match_the_definition(name: str, kinds: set[str]) -> None:
    tr, res = scenario(name)
    ctx = Context(tr, res)
    ctx.can_classify_short_gaps()
    got, want = ctx.short_gaps, _short_gaps_by_definition(ctx)
    # held compact (the frames' device ids, no duration); a kind's rows come whole
    assert got.schema["device_id"] == pl.UInt32 and "duration_ns" not in got.columns
    assert got.with_columns(pl.col("device_id").cast(pl.Int64)).equals(want.drop("duration_ns"))
    for kind in ("copy", "launch", "other", "startup", "sync"):
        of_kind = want.filter(pl.col("kind") == kind).drop("kind")
        assert ctx.short_gaps_of(kind).equals(of_kind), kind
    assert set(got["kind"]) == kinds


@pytest.mark.parametrize("name", ["healthy", "pageable_copies", "unoverlapped_h2d"])
def test_exposed_ns_matches_the_definition(name: str) -> None:
    tr, res = scenario(name)
    ctx = Context(tr, res)
    subset = ctx.trace.frame("gpu_ops").filter(pl.col("kind") == "memcpy").select(CPU)
    compute = ctx.trace.frame("gpu_ops").filter(pl.col("op_class") == "compute").select(CPU)
    both = intervals.total(pl.concat([subset, compute]), by=["device_id"]).collect()
    comp = intervals.total(compute.filter(pl.col("device_id").is_in(
        subset["device_id"].unique().implode())), by=["device_id"]).collect()
    want = int(both["busy_ns"].sum()) - int(comp["busy_ns"].sum())
    assert ctx.exposed_ns(subset) == want


def _starts_inside_by_asof(df: pl.DataFrame, blocks: pl.DataFrame) -> list[bool]:
    """The as-of join formulation `starts_inside` replaced."""
    calls = blocks.sort("start_ns").lazy().rename({"start_ns": "_cs", "end_ns": "_ce"})
    j = (df.lazy().join_asof(calls, left_on="start_ns", right_on="_cs", by="device_id",
                             strategy="backward", check_sortedness=False)
         .select(pl.col("_ce").is_not_null() & (pl.col("start_ns") < pl.col("_ce"))).collect())
    return j.to_series().to_list()


@settings(max_examples=200, deadline=None)
@given(intervals_st, st.lists(st.tuples(st.sampled_from([0, 1, 2, None]), st.integers(-5, 260)),
                              max_size=30))
def test_starts_inside_is_the_asof_join(rows, starts) -> None:
    blocks = intervals.union(_frame(rows), by=["device_id"]).collect()
    df = pl.DataFrame(sorted(starts, key=lambda r: r[1]), orient="row",
                      schema={"device_id": pl.Int64, "start_ns": pl.Int64})
    got = streams.starts_inside(df, blocks).tolist()
    assert got == _starts_inside_by_asof(df, blocks)


def test_starts_inside_edges() -> None:
    blocks = _frame([(0, 10, 20), (0, 30, 40), (None, 0, 100), (1, 5, 6)])
    df = pl.DataFrame({"device_id": [0, 0, 0, 0, 0, None, 1, 1, 2],
                       "start_ns": [9, 10, 19, 20, 30, 50, 5, 6, 15]},
                      schema={"device_id": pl.Int64, "start_ns": pl.Int64})
    # a start at a block's start is inside, at its end is not; a null device meets nothing
    want = [False, True, True, False, True, False, True, False, False]
    assert streams.starts_inside(df, blocks).tolist() == want
    assert _starts_inside_by_asof(df, blocks) == want
    assert streams.starts_inside(df.clear(), blocks).tolist() == []
    assert streams.starts_inside(df, blocks.clear()).tolist() == [False] * df.height
    assert streams.starts_inside(df.head(1), blocks.tail(1)).tolist() == [False]


def _min_at_by_join(keys: pl.Series, at: pl.Series, values: pl.Series) -> list:
    """The group-by + left join `min_at` replaced."""
    first = (pl.DataFrame({"_at": at, "_v": values}).group_by("_at").agg(pl.col("_v").min()))
    return (keys.alias("_at").to_frame().join(first, on="_at", how="left",
                                              maintain_order="left")["_v"].to_list())


opt_int = st.one_of(st.none(), st.integers(0, 12))


@settings(max_examples=300, deadline=None)
@given(st.lists(opt_int, max_size=12), st.lists(st.tuples(opt_int, opt_int), max_size=25))
def test_min_at_is_group_min_left_joined(keys, rows) -> None:
    k = pl.Series("k", keys, pl.Int64)
    at = pl.Series("at", [r[0] for r in rows], pl.Int64)
    v = pl.Series("_api_end", [r[1] for r in rows], pl.Int64)
    got = streams.min_at(k, at, v)
    assert got.dtype == pl.Int64 and got.len() == len(keys)
    assert got.to_list() == _min_at_by_join(k, at, v)


def test_min_at_edges() -> None:
    i64 = pl.Int64
    empty = pl.Series([], dtype=i64)
    assert streams.min_at(empty, pl.Series([1, 2], dtype=i64),
                          pl.Series([3, 4], dtype=i64)).to_list() == []
    assert streams.min_at(pl.Series([5, 1], dtype=i64), empty, empty).to_list() == [None, None]
    # duplicate keys, ties, several rows per key, a null key, a key seen only with nulls
    keys = pl.Series([7, 3, 7, None, 9], dtype=i64)
    at = pl.Series([7, 7, 3, 9, None, 7], dtype=i64)
    v = pl.Series([40, 30, 5, None, 1, 30], dtype=i64)
    assert streams.min_at(keys, at, v).to_list() == [30, 5, 30, None, None]
    assert _min_at_by_join(keys, at, v) == [30, 5, 30, None, None]


@pytest.mark.parametrize("starts", [[], [5], [1, 2, 9], [1, 1, 2], [3, 1, 2], [None, 1, 2],
                                    [1, None], [2, 2]])
def test_by_start_is_the_sort(starts) -> None:
    from nsysan.findings.context import _by_start

    df = pl.DataFrame({"start_ns": starts, "row": list(range(len(starts)))},
                      schema={"start_ns": pl.Int64, "row": pl.Int64})
    got = _by_start(df)
    assert got["start_ns"].to_list() == df.sort("start_ns")["start_ns"].to_list()
    if len(starts) <= 1 or all(a is not None and b is not None and a < b
                               for a, b in itertools.pairwise(starts)):
        assert got["row"].to_list() == list(range(len(starts)))  # not sorted again


@settings(max_examples=150, deadline=None)
@given(intervals_st, st.lists(st.tuples(st.sampled_from([0, 1, None]), st.integers(-5, 230),
                                        st.integers(-3, 40)), max_size=15))
def test_exposed_ns_is_union_minus_compute(ops_rows, subset_rows) -> None:
    ops = _frame(ops_rows).with_columns(
        pl.Series("op_class", ["compute" if k % 3 else "nccl" for k in range(len(ops_rows))],
                  pl.String))
    tr = Trace.from_frames("t", {"gpu_ops": ops})
    subset = pl.DataFrame([(d, s, s + n) for d, s, n in subset_rows], orient="row",
                          schema={"device_id": pl.Int64, "start_ns": pl.Int64,
                                  "end_ns": pl.Int64})
    want = (_uncovered_ns(intervals.union(subset, by=["device_id"]).collect(),
                                 _compute_blocks(tr)) if subset.height else 0)
    assert streams.exposed_ns(tr, subset) == want


def test_sync_calls_are_the_sync_rows_in_order() -> None:
    tr, res = scenario("sync_in_loop")
    ctx = Context(tr, res)
    api = tr.frame("cuda_api")
    want = api.filter(pl.col("api_class") == "sync").select("pid", "name", "start_ns", "end_ns")
    assert want.height > 0
    assert ctx.sync_calls.equals(want)


@settings(max_examples=300, deadline=None)
@given(intervals_st, st.lists(st.integers(-5, 260), max_size=60))
def test_inside_by_ranges_is_inside_by_search(rows, ts) -> None:
    """Both ways of `streams._inside` (ranges of sorted instants per block, a search per
    instant) agree with the definition, with ties at block starts and ends."""
    u = intervals.union(_frame([r for r in rows if r[0] == 0]), by=[]).collect()
    bs, be = u["start_ns"].to_numpy(), u["end_ns"].to_numpy()
    t = np.array(sorted(ts), dtype=np.int64)
    want = [bool(((bs <= x) & (x < be)).any()) for x in t.tolist()]
    assert streams._inside(t, bs, be).tolist() == want
    assert streams._inside(t[::-1].copy(), bs, be).tolist() == want[::-1]  # unsorted: search
    many = np.repeat(t, 5)  # more instants than 4x the blocks: the ranges
    assert streams._inside(many, bs, be).tolist() == np.repeat(want, 5).tolist()
