"""The kernels pass: per-name statistics, Tensor Core columns, launch statistics, and equality
with ``nsys stats -r gpukernsum`` on every shared trace that has an oracle CSV (and live)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import polars as pl
import pytest
from test_attribution import oracle_folders, oracle_paths

from nsysan.frames import schemas
from nsysan.frames.trace import Trace
from nsysan.passes import kernels as K
from nsysan.passes import tensor_core as tc

GPID = 100 << 24


def make_trace(kernels: list[tuple], api: list[tuple], extra_ops: list[dict] = ()) -> Trace:
    """kernels: (corr, start, end, short name, demangled name, op_class);
    api: (corr, start, end)."""
    ops = [
        dict(kind="kernel", correlation_id=c, start_ns=s, end_ns=e, name=n, demangled_name=d,
             op_class=oc, global_pid=GPID, pid=100, device_id=0)
        for c, s, e, n, d, oc in kernels
    ] + list(extra_ops)
    calls = [
        dict(correlation_id=c, start_ns=s, end_ns=e, global_pid=GPID, pid=100, tid=1,
             global_tid=GPID | 1, name="cudaLaunchKernel")
        for c, s, e in api
    ]
    cols = ["kind", "correlation_id", "start_ns", "end_ns", "name", "demangled_name", "op_class",
            "global_pid", "pid", "device_id"]
    gpu_ops = pl.DataFrame(ops, schema={c: schemas.GPU_OPS[c] for c in cols})
    cuda_api = pl.DataFrame(calls, schema={c: schemas.CUDA_API[c] for c in calls[0]}) if calls \
        else pl.DataFrame(schema={c: schemas.CUDA_API[c] for c in ("correlation_id", "start_ns")})
    return Trace.from_frames("t", {"gpu_ops": gpu_ops, "cuda_api": cuda_api})


def run(trace: Trace, **params) -> tuple[pl.DataFrame, dict]:
    res = K.run(trace, K.KernelsParams(**params), {})
    table = res.tables["kernels"]
    assert table.schema == schemas.KERNELS
    return table, res.metrics


GEMM = "volta_h884gemm_64x64_ldg8_nn"
SGEMM = "ampere_sgemm_32x32_sliced1x4_tn"


def test_statistics_per_demangled_name():
    t = make_trace(
        kernels=[
            (1, 100, 110, "add", "void add<float>(float *)", "compute"),
            (2, 200, 230, "add", "void add<float>(float *)", "compute"),
            (3, 300, 340, "add", "void add<float>(float *)", "compute"),
            (4, 400, 405, "add", "void add<double>(double *)", "compute"),  # same short name
            (5, 500, 600, GEMM, GEMM, "compute"),
        ],
        api=[(1, 90, 95), (2, 150, 160), (3, 290, 292), (4, 395, 396), (5, 480, 490)],
    )
    table, m = run(t)
    assert table["demangled_name"].to_list() == [
        GEMM, "void add<float>(float *)", "void add<double>(double *)"]  # by total time
    add = table.filter(pl.col("demangled_name") == "void add<float>(float *)").row(0, named=True)
    assert (add["short_name"], add["count"], add["total_ns"], add["min_ns"], add["max_ns"]) == (
        "add", 3, 80, 10, 40)
    assert (add["mean_ns"], add["median_ns"]) == (pytest.approx(80 / 3), 30.0)
    assert add["gpu_time_frac"] == pytest.approx(80 / 185)
    assert add["api_mean_ns"] == pytest.approx((5 + 10 + 2) / 3)
    assert add["queue_mean_ns"] == pytest.approx((10 + 50 + 10) / 3)
    assert add["queue_max_ns"] == 50
    assert add["op_class"] == "compute"
    assert table["gpu_time_frac"].sum() == pytest.approx(1.0)
    assert (m["n_kernels"], m["n_kernel_names"], m["kernel_time_ns"]) == (5, 3, 185)
    assert m["top_kernels"][0]["name"] == GEMM


def test_tensor_core_columns_and_shares():
    t = make_trace(
        kernels=[
            (1, 0, 600, GEMM, GEMM, "compute"),
            (2, 600, 900, SGEMM, SGEMM, "compute"),
            (3, 900, 1000, "relu", "void relu<float>(float *)", "compute"),
        ],
        api=[(1, 0, 1), (2, 1, 2), (3, 2, 3)],
    )
    table, m = run(t)
    got = {r["short_name"]: (r["tensor_core"], r["tensor_core_rule"])
           for r in table.iter_rows(named=True)}
    assert got == {GEMM: (True, "mma_shape_gemm"), SGEMM: (False, "simt_gemm_conv"),
                   "relu": (None, None)}
    assert m["tensor_core_frac"] == pytest.approx(0.6)
    assert m["matmul_without_tc_frac"] == pytest.approx(0.3)
    assert m["tensor_core_unknown_frac"] == pytest.approx(0.1)
    assert m["tensor_core_taxonomy_version"] == tc.TAXONOMY_VERSION


@pytest.mark.parametrize(
    ("threshold", "count", "frac"),
    [(10_000, 2, 0.5), (5, 1, 0.25), (1, 0, 0.0)],
)
def test_tiny_kernels(threshold, count, frac):
    t = make_trace(
        kernels=[(1, 0, 3, "a", "a", "compute"), (2, 10, 20, "a", "a", "compute"),
                 (3, 20, 20_020, "b", "b", "compute"), (4, 30_000, 50_000, "b", "b", "compute")],
        api=[],
    )
    _, m = run(t, tiny_kernel_ns=threshold)
    assert (m["tiny_kernel_count"], m["tiny_kernel_frac"]) == (count, frac)


def test_graph_launch_kernels_share_their_call_and_missing_calls_are_skipped():
    t = make_trace(
        kernels=[(7, 100, 110, "g", "g", "compute"), (7, 120, 130, "g", "g", "compute"),
                 (7, 140, 150, "g", "g", "compute"), (8, 200, 210, "g", "g", "compute")],
        api=[(7, 50, 60)],  # correlation 8: launch call not captured
    )
    table, _ = run(t)
    r = table.row(0, named=True)
    assert (r["count"], r["api_mean_ns"], r["queue_mean_ns"], r["queue_max_ns"]) == (
        4, 10.0, 70.0, 90)


def test_duplicate_api_rows_do_not_duplicate_kernels():
    t = make_trace(kernels=[(1, 100, 110, "k", "k", "compute")], api=[(1, 50, 60), (1, 50, 60)])
    table, m = run(t)
    assert table["count"].to_list() == [1] and m["n_kernels"] == 1


def test_copies_are_not_kernels_and_nccl_keeps_its_class():
    copy = dict(kind="memcpy", correlation_id=9, start_ns=0, end_ns=999, name="HtoD",
                demangled_name="HtoD", op_class="memcpy_h2d", global_pid=GPID, pid=100,
                device_id=0)
    nccl = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm *, unsigned long, ncclWork *)"
    t = make_trace(kernels=[(1, 0, 10, "ncclKernel_AllReduce_RING_LL_Sum_float", nccl, "nccl")],
                   api=[(1, 0, 1)], extra_ops=[copy])
    table, m = run(t)
    assert table["op_class"].to_list() == ["nccl"] and m["kernel_time_ns"] == 10
    assert table["tensor_core"].to_list() == [False]


def test_no_kernels_keeps_schema():
    table, m = run(Trace.from_frames("t", {}))
    assert table.is_empty()
    assert m["n_kernels"] == 0 and m["tensor_core_frac"] is None and m["top_kernels"] == []


# ---------------------------------------------------------------------------------------------
# Nsight Systems' own gpukernsum: stored oracle CSVs and one live run
# ---------------------------------------------------------------------------------------------


def read_kernsum(csv: Path) -> pl.DataFrame:
    """gpukernsum (2022.4) splits a name by grid/block: sum its rows per Name."""
    return (
        pl.read_csv(csv, infer_schema_length=None)
        .group_by("Name")
        .agg(
            pl.col("Instances").sum().alias("count"),
            pl.col("Total Time (ns)").sum().alias("total_ns"),
            pl.col("Min (ns)").min().alias("min_ns"),
            pl.col("Max (ns)").max().alias("max_ns"),
        )
        .rename({"Name": "demangled_name"})
        .cast({c: pl.Int64 for c in ("count", "total_ns", "min_ns", "max_ns")})
    )


def assert_matches_kernsum(table: pl.DataFrame, oracle: pl.DataFrame, where: str) -> None:
    ours = table.select(oracle.columns)
    assert ours.height == oracle.height, f"{where}: {ours.height} names vs nsys {oracle.height}"
    diff = ours.join(oracle, on=oracle.columns, how="anti")
    assert diff.is_empty(), f"{where}: kernels differing from gpukernsum:\n{diff.head()}"


@pytest.mark.shared
@pytest.mark.parametrize("folder", oracle_folders("kern_gpukernsum.csv"))
def test_equals_gpukernsum_oracle(shared_traces, folder):
    from nsysan import open_trace

    sqlite, csv = oracle_paths(shared_traces, folder, "kern_gpukernsum.csv")
    table, _ = run(open_trace(sqlite))
    assert_matches_kernsum(table, read_kernsum(csv), folder)


@pytest.mark.shared
@pytest.mark.nsys
def test_equals_live_gpukernsum(shared_traces, nsys_bin, tmp_path):
    from nsysan import open_trace

    src = shared_traces / "dlprof-pyprof-nvtx" / "nsys_profile.sqlite"
    db = tmp_path / "trace.sqlite"
    shutil.copyfile(src, db)
    db.chmod(0o644)
    proc = subprocess.run(
        [str(nsys_bin), "stats", "-r", "gpukernsum", "-f", "csv", "-o", str(tmp_path / "out"),
         str(db)],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    oracle = read_kernsum(tmp_path / "out_gpukernsum.csv")
    assert oracle.height > 0
    table, _ = run(open_trace(src))
    assert_matches_kernsum(table, oracle, "live gpukernsum")
