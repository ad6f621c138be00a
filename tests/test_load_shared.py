"""Conformance on every real export in ../shared/traces: frames load with their schemas and
their row counts, names and nesting agree with direct SQL on the raw tables."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import polars as pl
import pytest
from conftest import NO_SHARED, shared_sqlite_files
from polars.testing import assert_frame_equal

from nsysan.frames import schemas
from nsysan.load import open_trace

pytestmark = pytest.mark.shared

GPU_TABLES = {
    "kernel": "CUPTI_ACTIVITY_KIND_KERNEL",
    "memcpy": "CUPTI_ACTIVITY_KIND_MEMCPY",
    "memset": "CUPTI_ACTIVITY_KIND_MEMSET",
}


def _sql(path: Path):
    con = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}

    def count(table: str, where: str = "1") -> int:
        if table not in tables:
            return 0
        return con.execute(f'SELECT count(*) FROM "{table}" WHERE {where}').fetchone()[0]

    return con, tables, count


@pytest.fixture(scope="module", params=shared_sqlite_files())
def loaded(request: pytest.FixtureRequest, shared_traces: Path):
    if request.param == NO_SHARED:
        pytest.fail(f"no .sqlite files under {shared_traces}")
    path = shared_traces / request.param
    return path, open_trace(path).load_all()


def test_frames_have_their_schemas(loaded) -> None:
    _, tr = loaded
    for name, schema in schemas.CANONICAL.items():
        df = tr.frame(name)
        assert df.schema == schema, name
        assert df["trace_id"].unique().to_list() in ([], [tr.trace_id]), name


#: the event frames' text columns that stay String (schemas docstring): a broadcast id and
#: JSON payloads, mostly distinct
STRING_COLUMNS = {"trace_id", "payload_json"}
EVENT_FRAMES = ("gpu_ops", "cuda_api", "nvtx", "osrt", "sync", "overhead", "memory_events")


def test_event_frames_hold_text_as_codes(loaded) -> None:
    _, tr = loaded
    for name in EVENT_FRAMES:
        df = tr.frame(name)
        assert {c for c, d in df.schema.items() if d == pl.String} <= STRING_COLUMNS, name
        for c, d in df.schema.items():
            if isinstance(d, pl.Enum) and df.height:
                # a closed vocabulary: every value is one of its labels, none is null
                # (memory_events.op may be null: an operation type nsys did not name)
                assert df[c].null_count() == 0 or (name, c) == ("memory_events", "op"), (name, c)


def test_row_counts_equal_direct_sql(loaded) -> None:
    path, tr = loaded
    _, _, count = _sql(path)
    by_kind = dict(tr.gpu_ops.group_by("kind").len().rows())
    for kind, table in GPU_TABLES.items():
        # documented filter: rows with start = end = 0 (timestamps CUPTI could not collect)
        assert by_kind.get(kind, 0) == count(table, 'NOT (start = 0 AND "end" = 0)'), kind
    assert tr.cuda_api.height == count("CUPTI_ACTIVITY_KIND_RUNTIME")
    styles = dict(tr.nvtx.group_by("style").len().rows())
    ranges = styles.get("push_pop", 0) + styles.get("start_end", 0)
    assert ranges == count("NVTX_EVENTS", "eventType IN (59, 60, 70, 71)")
    assert styles.get("mark", 0) == count("NVTX_EVENTS", "eventType = 34")
    assert tr.sync.height == count("CUPTI_ACTIVITY_KIND_SYNCHRONIZATION")
    assert tr.osrt.height == count("OSRT_API", "eventClass = 27")
    assert tr.meta.tables["StringIds"] == count("StringIds")


def test_names_resolve(loaded) -> None:
    path, tr = loaded
    _, _, count = _sql(path)
    kernels = tr.gpu_ops.filter(pl.col("kind") == "kernel")
    named = "shortName IN (SELECT id FROM StringIds)"
    assert kernels["name"].null_count() == kernels.height - count(GPU_TABLES["kernel"], named)
    assert tr.cuda_api["name"].null_count() == tr.cuda_api.height - count(
        "CUPTI_ACTIVITY_KIND_RUNTIME", "nameId IN (SELECT id FROM StringIds)"
    )
    with_text = (
        "eventType IN (59, 60, 70, 71, 34) AND "
        "(text IS NOT NULL OR textId IN (SELECT id FROM StringIds))"
    )
    assert tr.nvtx["name"].drop_nulls().len() == count("NVTX_EVENTS", with_text)
    assert tr.gpu_ops["op_class"].null_count() == 0
    assert tr.cuda_api["api_class"].null_count() == 0


def test_range_ids_number_the_events_in_content_order(loaded) -> None:
    """range_id is 1..n over the NVTX events in content order (time first, longer first), not
    the rowid: Nsight Systems 2025.6+ does not promise the row order of its exports."""
    path, tr = loaded
    _, tables, count = _sql(path)
    if "NVTX_EVENTS" not in tables:
        assert tr.nvtx.is_empty()
        return
    nv = tr.nvtx
    assert nv.height == count("NVTX_EVENTS", "eventType IN (59, 60, 70, 71, 34)")
    assert nv["range_id"].to_list() == list(range(1, nv.height + 1))
    by_content = nv.sort(["start_ns", "end_ns", "global_tid"], descending=[False, True, False],
                         maintain_order=True)
    assert by_content["range_id"].to_list() == nv["range_id"].to_list()
    # a parent starts no later and ends no earlier: it is numbered before its children
    assert (nv.filter(pl.col("parent_range_id").is_not_null())
            .select((pl.col("parent_range_id") < pl.col("range_id")).all()).item() is not False)


def test_nesting_is_sane(loaded) -> None:
    _, tr = loaded
    nv = tr.nvtx
    takes_part = (pl.col("style") != "mark") & pl.col("end_global_tid").is_null()
    assert nv.filter(takes_part)["depth"].null_count() == 0
    assert nv.filter(~takes_part)["depth"].null_count() == nv.filter(~takes_part).height
    assert (nv.filter(pl.col("parent_range_id").is_null() & takes_part)["depth"] == 0).all()
    parents = nv.select(
        pl.col("range_id").alias("parent_range_id"),
        pl.col("global_tid").alias("p_tid"),
        pl.col("start_ns").alias("p_start"),
        pl.col("end_ns").alias("p_end"),
        pl.col("depth").alias("p_depth"),
    )
    children = nv.filter(pl.col("parent_range_id").is_not_null()).join(
        parents, on="parent_range_id", how="left"
    )
    bad = children.filter(
        (pl.col("p_tid") != pl.col("global_tid"))
        | (pl.col("p_start") > pl.col("start_ns"))
        | (pl.col("p_end") < pl.col("end_ns"))
        | (pl.col("p_depth") != pl.col("depth") - 1)
    )
    assert bad.is_empty(), bad.head()


#: the same capture in several export forms / exporter versions must give identical frames
#: (frames that a form lacks the data for are left out: 2020.x has no PROCESSES or GPU uuid)
SAME_CAPTURE = [
    (
        "sc22-ddp-4gpu-nccl/4gpu_baseline.nsys-rep.nsys2023.4.4.sqlite",
        "sc22-ddp-4gpu-nccl/4gpu_baseline.nsys2023.4.4.parquetdir",
        (),
    ),
    (
        "sc23-vit-train-nvtx/4workers.nsys-rep.nsys2023.4.4.sqlite",
        "sc23-vit-train-nvtx/4workers.nsys2023.4.4.parquetdir",
        (),
    ),
    (
        "sc22-ddp-4gpu-nccl/4gpu_baseline.nsys-rep.nsys2022.4.2.sqlite",
        "sc22-ddp-4gpu-nccl/4gpu_baseline.nsys-rep.nsys2023.4.4.sqlite",
        (),
    ),
    (
        "aiprofiler-pytorch-emit-nvtx/baseline_nvtx.nsys-rep.nsys2022.4.2.sqlite",
        "aiprofiler-pytorch-emit-nvtx/baseline_nvtx.nsys-rep.nsys2023.4.4.sqlite",
        (),
    ),
    (
        "memfusion-trt-resnet/report1.sqlite",
        "memfusion-trt-resnet/report1.nsys-rep.nsys2023.4.4.sqlite",
        (),
    ),
    (
        "quasiben-nvtx-2020/cudf.sqlite",
        "quasiben-nvtx-2020/cudf.qdrep.nsys2022.4.2.sqlite",
        ("gpus", "processes"),
    ),
]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("a", "b", "skip"),
    SAME_CAPTURE,
    ids=[p[0].split("/")[0] + "-" + p[1].rsplit(".", 1)[-1] for p in SAME_CAPTURE],
)
def test_same_capture_same_frames(shared_traces: Path, a: str, b: str, skip: tuple) -> None:
    if not (shared_traces / a).exists() or not (shared_traces / b).exists():
        pytest.fail(f"{a} or {b} missing from {shared_traces}")
    ta = open_trace(shared_traces / a, trace_id="same")
    tb = open_trace(shared_traces / b, trace_id="same")
    assert ta.meta.missing.keys() - set(skip) == tb.meta.missing.keys() - set(skip)
    for name in schemas.CANONICAL:
        if name == "meta" or name in skip:
            continue
        try:
            assert_frame_equal(ta.frame(name), tb.frame(name))
        except AssertionError as exc:
            raise AssertionError(f"{name}: {exc}") from None
