"""The launch statistics of the kernels pass (`kernels._launch_stats`: numpy gathers of the
call bounds, polars gathers when a bound is null) against a join written here, with ops whose
call is unknown, no API call at all, null call bounds, null demangled names and non-kernel
ops."""

from __future__ import annotations

import polars as pl
import pytest

from nsysan.frames.trace import Trace
from nsysan.passes import kernels, op_link


def _trace(api_bounds: list[tuple[int | None, int | None]], n_ops: int) -> Trace:
    api = pl.DataFrame({
        "start_ns": [s for s, _ in api_bounds], "end_ns": [e for _, e in api_bounds],
        "global_pid": [1] * len(api_bounds), "correlation_id": list(range(len(api_bounds))),
    }, schema={c: pl.Int64 for c in ("start_ns", "end_ns", "global_pid", "correlation_id")})
    kinds = ["kernel", "memcpy", "kernel", None]
    ops = pl.DataFrame({
        "kind": [kinds[i % 4] for i in range(n_ops)],
        "start_ns": [50 + 3 * i if i != 5 else None for i in range(n_ops)],
        "end_ns": [60 + 4 * i for i in range(n_ops)],
        "global_pid": [1] * n_ops,
        # every third op names a call that was not captured
        "correlation_id": [i if i % 3 else 1000 + i for i in range(n_ops)],
        "name": [f"k{i % 2}" for i in range(n_ops)],
        "demangled_name": [f"void k{i % 2}()" if i % 7 else None for i in range(n_ops)],
        "op_class": ["compute"] * n_ops,
    }, schema_overrides={"start_ns": pl.Int64, "end_ns": pl.Int64})
    return Trace.from_frames("t", {"gpu_ops": ops, "cuda_api": api})


@pytest.mark.parametrize("api_bounds", [
    [(10 * i, 10 * i + 3) for i in range(12)],
    [],
    [(10 * i, 10 * i + 3 if i != 4 else None) for i in range(12)],
])
def test_launch_stats_equal_the_polars_gathers(api_bounds) -> None:
    tr = _trace(api_bounds, 12)
    rows = op_link.api_rows(tr)
    assert rows is not None
    for name in (pl.col("demangled_name"),
                 pl.coalesce("demangled_name", "name").alias("demangled_name")):
        got = kernels._launch_stats(tr.gpu_ops, tr.cuda_api, rows, name)
        calls = tr.cuda_api.select("global_pid", "correlation_id",
                                   pl.col("start_ns").alias("_as"), pl.col("end_ns").alias("_ae"))
        want = (tr.gpu_ops.filter(pl.col("kind") == "kernel")
                .join(calls, on=["global_pid", "correlation_id"], how="left",
                      maintain_order="left")
                .select(name, pl.col("name").alias("short_name"), "op_class",
                        (pl.col("end_ns") - pl.col("start_ns")).alias("_dur"),
                        (pl.col("_ae") - pl.col("_as")).alias("_api_dur"),
                        (pl.col("start_ns") - pl.col("_as")).alias("_queue")))
        assert got.equals(want)
        assert got.height == 6 and got["_queue"].null_count() > 0
