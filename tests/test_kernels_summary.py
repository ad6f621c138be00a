"""The kernels summary grouped on categorical codes (`kernels._summary`) equals the plain
string group-by with ``mode().sort().first()``, ties and null demangled names included."""

from __future__ import annotations

import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from nsysan.passes import kernels

NAMES = ["void gemm<float, 128>(...)", "b", "a", None]
rows_st = st.lists(
    st.tuples(st.sampled_from(NAMES), st.sampled_from(["k1", "k2", "k0"]),
              st.sampled_from(["compute", "nccl"]), st.integers(0, 30_000),
              st.one_of(st.none(), st.integers(0, 500))),
    min_size=1, max_size=40)


def _frame(rows: list[tuple]) -> pl.DataFrame:
    df = pl.DataFrame(rows, schema={"demangled_name": pl.String, "short_name": pl.String,
                                    "op_class": pl.String, "_dur": pl.Int64,
                                    "_queue": pl.Int64}, orient="row")
    return df.with_columns(pl.col("_dur").alias("start_ns"),
                           (pl.col("_queue") * 2).alias("_api_dur"))


@settings(max_examples=150, deadline=None)
@given(rows_st)
def test_summary_equals_the_string_group_by(rows) -> None:
    launched = _frame(rows)
    got = kernels._summary(launched, 10_000).sort("demangled_name", nulls_last=True)
    want = launched.group_by("demangled_name").agg(
        pl.col("short_name").mode().sort().first(), pl.col("op_class").mode().sort().first(),
        pl.len().cast(pl.Int64).alias("count"), pl.col("_dur").sum().alias("total_ns"),
        pl.col("_dur").mean().alias("mean_ns"), pl.col("_dur").median().alias("median_ns"),
        pl.col("_dur").min().alias("min_ns"), pl.col("_dur").max().alias("max_ns"),
        pl.col("_api_dur").mean().alias("api_mean_ns"),
        pl.col("_queue").mean().alias("queue_mean_ns"),
        pl.col("_queue").max().alias("queue_max_ns"),
        (pl.col("_dur") < 10_000).sum().cast(pl.Int64).alias("_n_tiny"),
        pl.col("_dur").filter(pl.col("_dur") < 10_000).sum().alias("_tiny_ns"),
    ).sort("demangled_name", nulls_last=True)
    assert got.equals(want)


def test_null_short_names_take_the_plain_form() -> None:
    launched = _frame([("a", None, "compute", 5, 1), ("a", None, "compute", 7, 2),
                       ("a", "k", "compute", 9, 3)])
    got = kernels._summary(launched, 10_000)
    assert got.height == 1 and got["count"].item() == 3
