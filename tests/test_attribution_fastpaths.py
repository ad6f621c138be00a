"""The array-lookup fast paths of attribution, containment.tightest and the steps projection
give exactly what their join fallbacks give (and fall back where they must)."""

from __future__ import annotations

import random
from unittest import mock

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from test_attribution import Builder, random_trace

from nsysan.frames import containment as cn
from nsysan.passes import attribution as A
from nsysan.passes import steps as S
from nsysan.passes.op_keys import unique_rows


def _join_rows(table: list[int | None], queries: list[int | None]) -> list[int]:
    rows = {k: i for i, k in enumerate(table) if k is not None}
    return [rows.get(q, -1) if q is not None else -1 for q in queries]


@pytest.mark.parametrize("seed", range(5))
def test_unique_rows_equals_a_lookup(seed):
    rnd = random.Random(seed)
    table: list[int | None] = [*rnd.sample(range(200), 60), None, None]
    queries: list[int | None] = [rnd.choice([None, *range(220)]) for _ in range(100)]
    got = unique_rows(pl.Series(table, dtype=pl.Int64), pl.Series(queries, dtype=pl.Int64))
    assert got is not None
    assert got.to_list() == _join_rows(table, queries)


def test_unique_rows_declines_duplicates_negatives_and_other_dtypes():
    q = pl.Series([1, 2], dtype=pl.Int64)
    assert unique_rows(pl.Series([1, 1, 3], dtype=pl.Int64), q) is None
    assert unique_rows(pl.Series([-5, 1], dtype=pl.Int64), q) is None
    assert unique_rows(pl.Series([1, 2], dtype=pl.UInt32), q) is None
    empty = unique_rows(pl.Series([], dtype=pl.Int64), q)
    assert empty is not None and empty.to_list() == [-1, -1]


def _attribution(b: Builder) -> tuple[pl.DataFrame, pl.DataFrame, dict]:
    res = A.run(b.trace(), A.AttributionParams(), {})
    return res.tables["attribution"], res.tables["layers"], res.metrics


def _without_fast_paths(b: Builder) -> tuple[pl.DataFrame, pl.DataFrame, dict]:
    # (the launch links have one path: `op_link.api_rows` never declines)
    with mock.patch.object(cn, "_rank_lookup", return_value=None):
        return _attribution(b)


@settings(max_examples=60, deadline=None)
@given(random_trace())
def test_attribution_fast_paths_equal_the_joins(b):
    fast, slow = _attribution(b), _without_fast_paths(b)
    assert fast[0].equals(slow[0])
    assert fast[1].equals(slow[1])
    assert fast[2] == slow[2]


def test_duplicate_api_rows_own_the_op_once():
    b = Builder()
    b.range(0, 100, "outer")
    b.range(10, 50, "inner", depth=1, parent=1)
    b.launch((20, 21), (30, 40), (35, 45))
    b.api.append(dict(b.api[-1]))  # the same (global_pid, correlation_id) twice
    att, _, m = _attribution(b)
    assert att["exclusive_gpu_ns"].sum() == m["attributed_gpu_ns"] == 15
    assert att.filter(pl.col("name") == "inner")["exclusive_gpu_ns"].item() == 15


def test_total_busy_counts_null_devices_as_a_device_of_their_own():
    """The pass fills null devices with -1, which no CUDA device id (unsigned 32 bits) is:
    the total GPU busy time is the union per device, the null device's ops one more device."""
    b = Builder()
    b.range(0, 100, "r")
    b.launch((1, 2), (10, 30), device=None)
    b.launch((3, 4), (20, 40), device=None)
    b.launch((5, 6), (25, 50), device=0)
    # null: [10, 40) = 30; device 0: [25, 50) = 25 (overlapping the null device's ops)
    assert _attribution(b)[2]["gpu_busy_ns"] == 30 + 25


def test_tightest_rank_lookup_equals_the_join():
    rnd = random.Random(3)
    ids = list(range(50))
    ranges = pl.DataFrame({
        "range_id": ids,
        "start_ns": [rnd.randrange(100) for _ in ids],
    }).with_columns((pl.col("start_ns") + pl.Series([rnd.randrange(50) for _ in ids]))
                    .alias("end_ns"))
    pairs = pl.DataFrame({
        "query_id": [rnd.randrange(30) for _ in range(200)],
        "range_id": [rnd.randrange(55) for _ in range(200)],  # some ranges are unknown
    })

    def run() -> pl.DataFrame:
        return cn.tightest(pairs, ranges).collect().sort("query_id")

    fast = run()
    with mock.patch.object(cn, "_rank_lookup", return_value=None):
        slow = run()
    assert fast.equals(slow)
    # Sparse ids take the join path by themselves.
    far = ranges.with_columns(pl.col("range_id") * 1000)
    assert cn._rank_lookup(pairs, far["range_id"], "range_id") is None
    assert np.all(cn._rank_lookup(pairs, ranges["range_id"], "range_id").to_numpy() >= -1)


def test_steps_projection_by_hand():
    b = Builder()
    for k in range(4):
        b.range(100 * k, 100 * k + 90, f"step {k}")
        for j in range(3):
            t = 100 * k + 10 * j
            b.launch((t, t + 2), (1000 + t, 1000 + t + 5))
    b.launch((310, 312), (2000, 2100), tid=2)  # another thread: only the last step's end
    steps = S.run(b.trace(), S.StepsParams(), {}).tables["steps"]
    # a step's window: from its first launched op to the next step's; the last step ends
    # at the latest end of what its CPU range launched from any thread of the process
    assert steps["start_ns"].to_list() == [1000, 1100, 1200, 1300]
    assert steps["end_ns"].to_list() == [1100, 1200, 1300, 2100]


@pytest.mark.parametrize("graph", [False, True])
def test_ops_without_a_launch_do_not_shift_the_bounds_of_the_others(graph):
    """The pass links ops to launches by row and reads the ops' bounds from ``gpu_ops`` by
    op row: an op whose call was not captured, listed first, must not move the others'
    bounds onto their neighbours (with ``graph``, one launch has two ops: the merge path)."""
    b = Builder()
    b.range(0, 100, "outer")
    b.range(10, 60, "inner", depth=1, parent=1)
    b.launch((1, 2), (0, 5))
    b.api.pop()  # the first op's launching call was not captured
    b.launch((20, 21), (30, 40))
    b.launch((70, 71), (80, 95), *([(96, 99)] if graph else []))
    att, _, m = _attribution(b)
    row = {r["name"]: r for r in att.iter_rows(named=True)}
    assert (row["inner"]["proj_start_ns"], row["inner"]["proj_end_ns"]) == (30, 40)
    assert row["inner"]["exclusive_gpu_ns"] == row["inner"]["gpu_busy_ns"] == 10
    tail = 15 + (3 if graph else 0)
    assert (row["outer"]["proj_start_ns"], row["outer"]["proj_end_ns"]) == (30, 99 if graph else 95)
    assert row["outer"]["exclusive_gpu_ns"] == tail
    assert row["outer"]["gpu_busy_ns"] == 10 + tail
    assert m["attributed_gpu_ns"] == 10 + tail
