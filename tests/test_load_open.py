"""open_trace: trace ids, routing by content, laziness, and the parquetdir form."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import polars as pl
import pytest
from conftest import gtid, make_nsys_sqlite
from polars.testing import assert_frame_equal

import nsysan
from nsysan.errors import SchemaError, TraceFormatError
from nsysan.frames import schemas
from nsysan.load import open_trace, trace_id_for

TRACE_IDS = {
    "4gpu_baseline.nsys-rep.nsys2022.4.2.sqlite": "4gpu_baseline",
    "4gpu_baseline.nsys2023.4.4.parquetdir": "4gpu_baseline",
    "mpi_report1.qdrep.nsys2022.4.2.sqlite": "mpi_report1",
    "report1_ee4fcf30.sqlite": "report1_ee4fcf30",
    "run.nsys-rep": "run",
    "run.qdrep": "run",
    "run.nsys-rep.nsys2022.4.2.31f3b8-1797c2a6b0ad0e00.sqlite": "run",  # nsysan's cache name
    "my run (rank 3).sqlite": "my_run_rank_3",
    "trace.v2.db": "trace.v2",
    ".sqlite": "sqlite",  # a dot file: nothing to strip
    "résumé.sqlite": "r_sum",
}


@pytest.mark.parametrize("name", list(TRACE_IDS))
def test_trace_id_for(name: str) -> None:
    assert trace_id_for(Path("/some/dir") / name) == TRACE_IDS[name]


def _kernels_and_nvtx(path: Path) -> Path:
    t = gtid(10, 11)
    return make_nsys_sqlite(
        path,
        {
            "CUPTI_ACTIVITY_KIND_KERNEL": [
                {"start": 5, "end": 9, "deviceId": 0, "contextId": 1, "streamId": 7,
                 "correlationId": 1, "globalPid": gtid(10, 0), "shortName": 1,
                 "demangledName": 1}
            ],
            "CUPTI_ACTIVITY_KIND_RUNTIME": [
                {"start": 1, "end": 4, "eventClass": 0, "globalTid": t, "correlationId": 1,
                 "nameId": 2, "returnValue": 0}
            ],
            "NVTX_EVENTS": [
                {"start": 0, "end": 10, "eventType": 59, "globalTid": t, "text": "step"},
                {"start": 1, "end": 5, "eventType": 59, "globalTid": t, "textId": 3},
            ],
        },
        strings={1: "gemm", 2: "cudaLaunchKernel_v7000", 3: "forward"},
    )  # fmt: skip


def test_public_api_and_laziness(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert nsysan.open_trace is open_trace
    tr = open_trace(_kernels_and_nvtx(tmp_path / "x.sqlite"))
    assert tr.trace_id == "x"
    assert tr.meta.source_format == "sqlite"
    built: list[str] = []
    real = tr._loader
    monkeypatch.setattr(tr, "_loader", lambda name: built.append(name) or real(name))
    first, again = tr.gpu_ops, tr.gpu_ops
    assert_frame_equal(first, again)
    assert tr.stored("gpu_ops") is tr.stored("gpu_ops")  # the kept frame: one object
    assert built == ["gpu_ops"]  # read on first use, then cached


def test_routing_is_by_content_not_suffix(tmp_path: Path) -> None:
    path = _kernels_and_nvtx(tmp_path / "x.sqlite")
    renamed = path.rename(tmp_path / "export.bin")
    assert open_trace(renamed).gpu_ops.height == 1


def test_parquetdir_gives_the_same_frames(tmp_path: Path) -> None:
    sqlite_path = _kernels_and_nvtx(tmp_path / "x.sqlite")
    pq = tmp_path / "x.parquetdir"
    pq.mkdir()
    con = sqlite3.connect(sqlite_path)
    for (table,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'"):
        cur = con.execute(f'SELECT * FROM "{table}"')
        cols = [d[0] for d in cur.description]
        pl.DataFrame(
            cur.fetchall(), schema=cols, orient="row", infer_schema_length=None
        ).write_parquet(pq / f"{table}.parquet")
    con.close()
    a, b = open_trace(sqlite_path), open_trace(pq, trace_id="x")
    assert b.meta.source_format == "parquetdir"
    for name in schemas.CANONICAL:
        if name != "meta":
            assert_frame_equal(a.frame(name), b.frame(name))
    assert b.nvtx.select("name", "depth", "parent_range_id").rows() == [
        ("step", 0, None),
        ("forward", 1, 1),
    ]


def test_empty_directory_is_not_a_profile(tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError, match="is a directory, not a profile"):
        open_trace(tmp_path)


def test_require_cuda_treats_empty_cuda_tables_as_absent(tmp_path: Path) -> None:
    path = make_nsys_sqlite(
        tmp_path / "lazy_false.sqlite",
        {"CUPTI_ACTIVITY_KIND_KERNEL": [], "CUPTI_ACTIVITY_KIND_RUNTIME": []},
    )
    assert open_trace(path).gpu_ops.is_empty()  # opens: captured, nothing happened
    with pytest.raises(SchemaError, match="has no CUDA activity tables"):
        open_trace(path, require_cuda=True)
    assert open_trace(_kernels_and_nvtx(tmp_path / "x.sqlite"), require_cuda=True).gpu_ops.height
