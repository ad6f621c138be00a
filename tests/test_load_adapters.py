"""Adapters on tiny nsys-shaped exports: every mapping rule, one named case each."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest
from conftest import gtid, make_nsys_sqlite
from hypothesis import given, settings
from hypothesis import strategies as st

from nsysan.errors import SchemaError
from nsysan.frames import schemas
from nsysan.load import open_trace
from nsysan.load.adapters_nvtx import nest_ranges

PID, TID = 4242, 4243
T1 = gtid(PID, TID)
GPID = gtid(PID, 0)


def _trace(tmp_path: Path, tables: dict, strings: dict | None = None, **kw):
    path = make_nsys_sqlite(tmp_path / "t.sqlite", tables, strings=strings, **kw)
    return open_trace(path, trace_id="t")


def _kernel(start: int, end: int, short: int, demangled: int | None = None, **kw) -> dict:
    row = {
        "start": start,
        "end": end,
        "deviceId": 0,
        "contextId": 1,
        "streamId": 7,
        "correlationId": start,
        "globalPid": GPID,
        "shortName": short,
        "demangledName": demangled if demangled is not None else short,
    }
    return {**row, **kw}


# --- gpu_ops --------------------------------------------------------------------------------

KERNEL_CLASSES = {
    "old NCCL name": ("ncclKernel_AllReduce_RING_LL_Sum_float", "nccl"),
    "new NCCL name": ("ncclDevKernel_SendRecv", "nccl"),
    "pre-2.8 NCCL name": ("ncclAllReduceRingLLKernel_sum_f32", "nccl"),
    "gemm": ("ampere_sgemm_128x64_tn", "compute"),
    "name merely containing nccl": ("my_nccl_helper", "compute"),
}


@pytest.mark.parametrize("case", list(KERNEL_CLASSES))
def test_kernel_op_class(tmp_path: Path, case: str) -> None:
    name, op_class = KERNEL_CLASSES[case]
    tr = _trace(tmp_path, {"CUPTI_ACTIVITY_KIND_KERNEL": [_kernel(1, 2, 1)]}, {1: name})
    row = tr.gpu_ops.row(0, named=True)
    assert (row["kind"], row["name"], row["demangled_name"], row["op_class"]) == (
        "kernel",
        name,
        name,
        op_class,
    )


def test_nccl_found_in_demangled_name(tmp_path: Path) -> None:
    tr = _trace(
        tmp_path,
        {"CUPTI_ACTIVITY_KIND_KERNEL": [_kernel(1, 2, short=1, demangled=2)]},
        {1: "templated", 2: "void ncclDevKernel_Generic<4>(ncclDevKernelArgsStorage)"},
    )
    assert tr.gpu_ops["op_class"].to_list() == ["nccl"]


COPIES = {
    # copyKind: (copy_kind, op_class)
    "HtoD": (1, "HtoD", "memcpy_h2d"),
    "DtoH": (2, "DtoH", "memcpy_d2h"),
    "DtoD": (8, "DtoD", "memcpy_d2d"),
    "HtoH": (9, "HtoH", "memcpy_d2d"),
    "PtoP": (10, "PtoP", "memcpy_p2p"),
    "unified HtoD": (11, "UVM_HtoD", "memcpy_h2d"),
    "unified DtoH": (12, "UVM_DtoH", "memcpy_d2h"),
    "unified DtoD": (13, "UVM_DtoD", "memcpy_d2d"),
    "HtoA": (3, "HtoA", "memcpy_h2d"),
    "AtoH": (4, "AtoH", "memcpy_d2h"),
    "AtoD": (6, "AtoD", "memcpy_d2d"),
    "unknown": (0, "Unknown", "memcpy_d2d"),
    "unheard of": (99, "Unknown(99)", "memcpy_d2d"),
}


@pytest.mark.parametrize("case", list(COPIES))
def test_memcpy_kind_and_class(tmp_path: Path, case: str) -> None:
    kind, copy_kind, op_class = COPIES[case]
    row = {
        "start": 5,
        "end": 9,
        "deviceId": 0,
        "contextId": 1,
        "streamId": 7,
        "correlationId": 3,
        "globalPid": GPID,
        "bytes": 64,
        "copyKind": kind,
        "srcKind": 0,
        "dstKind": 2,
    }
    tr = _trace(tmp_path, {"CUPTI_ACTIVITY_KIND_MEMCPY": [row]})
    got = tr.gpu_ops.row(0, named=True)
    assert got["kind"] == "memcpy"
    assert (got["copy_kind"], got["name"], got["op_class"]) == (copy_kind, copy_kind, op_class)
    assert (got["src_kind"], got["dst_kind"], got["bytes"]) == ("pageable", "device", 64)


@pytest.mark.parametrize(
    ("enum_rows", "expected"),
    [
        ([], ["pinned", "managed_static"]),  # table present but empty (2022.4, no CUDA)
        (None, ["pinned", "managed_static"]),  # table absent (reduced / 2020.x exports)
        (
            [{"id": 1, "label": "Pinned"}, {"id": 6, "label": "Managed Static"}],
            ["pinned", "managed_static"],
        ),
        ([{"id": 1, "label": "Locked Host"}], ["locked_host", None]),  # the table wins
    ],
    ids=["empty enum", "no enum", "enum", "enum differs"],
)
def test_memory_kinds_from_enum_or_builtin(tmp_path: Path, enum_rows, expected) -> None:
    rows = [
        {
            "start": 1,
            "end": 2,
            "deviceId": 0,
            "contextId": 1,
            "streamId": 7,
            "correlationId": 1,
            "globalPid": GPID,
            "bytes": 8,
            "copyKind": 1,
            "srcKind": 1,
            "dstKind": 6,
        }
    ]
    tables = {"CUPTI_ACTIVITY_KIND_MEMCPY": rows}
    if enum_rows is not None:
        tables["ENUM_CUDA_MEM_KIND"] = enum_rows
    got = _trace(tmp_path, tables).gpu_ops.row(0, named=True)
    assert [got["src_kind"], got["dst_kind"]] == expected


def test_gpu_ops_union_sorted_and_unknown_timestamps_dropped(tmp_path: Path) -> None:
    memset = {
        "start": 3,
        "end": 4,
        "deviceId": 0,
        "contextId": 1,
        "streamId": 7,
        "correlationId": 9,
        "globalPid": GPID,
        "value": 0,
        "bytes": 16,
        "memKind": 2,
    }
    tr = _trace(
        tmp_path,
        {
            "CUPTI_ACTIVITY_KIND_KERNEL": [_kernel(10, 20, 1), _kernel(0, 0, 1), _kernel(1, 2, 1)],
            "CUPTI_ACTIVITY_KIND_MEMSET": [memset],
        },
        {1: "k"},
    )
    ops = tr.gpu_ops
    assert ops.schema == schemas.GPU_OPS
    assert ops.select("kind", "start_ns").rows() == [("kernel", 1), ("memset", 3), ("kernel", 10)]
    ms = ops.filter(pl.col("kind") == "memset").row(0, named=True)
    assert (ms["name"], ms["op_class"], ms["dst_kind"], ms["bytes"]) == (
        "memset",
        "memset",
        "device",
        16,
    )
    assert ops["pid"].unique().to_list() == [PID]
    assert ops["global_pid"].unique().to_list() == [GPID]
    assert (
        "table CUPTI_ACTIVITY_KIND_MEMCPY not found: gpu_ops has none of those rows (a lazy "
        "export also omits a table when nothing of that kind was recorded)"
    ) in tr.meta.notes


def test_kernel_geometry_and_optional_columns(tmp_path: Path) -> None:
    tr = _trace(
        tmp_path,
        {
            "CUPTI_ACTIVITY_KIND_KERNEL": [
                _kernel(
                    1,
                    2,
                    1,
                    gridX=4,
                    gridY=2,
                    gridZ=1,
                    blockX=128,
                    blockY=1,
                    blockZ=1,
                    graphNodeId=77,
                )
            ]
        },
        {1: "k"},
    )
    row = tr.gpu_ops.row(0, named=True)
    assert [row[c] for c in ("grid_x", "grid_y", "block_x", "graph_node_id")] == [4, 2, 128, 77]


def test_missing_required_column_is_a_schema_error(tmp_path: Path) -> None:
    ddl = {"CUPTI_ACTIVITY_KIND_KERNEL": "start INTEGER, end INTEGER, deviceId INTEGER"}
    tr = _trace(tmp_path, {"CUPTI_ACTIVITY_KIND_KERNEL": [{"start": 1, "end": 2}]}, ddl=ddl)
    with pytest.raises(SchemaError, match="lacks column streamId, shortName"):
        tr.frame("gpu_ops")


# --- cuda_api -------------------------------------------------------------------------------

API_NAMES = {
    # raw name: (name, api_class, layer by eventClass 0/1)
    "cudaLaunchKernel_v7000": ("cudaLaunchKernel", "launch", 0),
    "cudaLaunchKernel_ptsz_v7000": ("cudaLaunchKernel_ptsz", "launch", 0),
    "__cudaLaunchKernel_v13000": ("__cudaLaunchKernel", "launch", 0),
    "cudaLaunchKernelExC_v11060": ("cudaLaunchKernelExC", "launch", 0),
    "cudaLaunchCooperativeKernel_v9000": ("cudaLaunchCooperativeKernel", "launch", 0),
    "cuLaunchKernel": ("cuLaunchKernel", "launch", 1),
    "cuLaunchKernelEx": ("cuLaunchKernelEx", "launch", 1),
    "cudaGraphLaunch_v10000": ("cudaGraphLaunch", "graph", 0),
    "cuGraphLaunch": ("cuGraphLaunch", "graph", 1),
    "cudaDeviceSynchronize_v3020": ("cudaDeviceSynchronize", "sync", 0),
    "cudaStreamSynchronize_v3020": ("cudaStreamSynchronize", "sync", 0),
    "cudaEventSynchronize_v3020": ("cudaEventSynchronize", "sync", 0),
    "cudaStreamWaitEvent_v3020": ("cudaStreamWaitEvent", "sync", 0),
    "cuCtxSynchronize": ("cuCtxSynchronize", "sync", 1),
    "cuStreamSynchronize": ("cuStreamSynchronize", "sync", 1),
    "cuEventSynchronize": ("cuEventSynchronize", "sync", 1),
    "cudaMalloc_v3020": ("cudaMalloc", "malloc", 0),
    "cudaMallocAsync_v11020": ("cudaMallocAsync", "malloc", 0),
    "cudaFreeHost_v3020": ("cudaFreeHost", "malloc", 0),
    "cudaHostAlloc_v3020": ("cudaHostAlloc", "malloc", 0),
    "cuMemAlloc_v2": ("cuMemAlloc_v2", "malloc", 1),
    "cuMemFree_v2": ("cuMemFree_v2", "malloc", 1),
    "cudaMemcpyAsync_v3020": ("cudaMemcpyAsync", "memcpy", 0),
    "cuMemcpyHtoDAsync_v2": ("cuMemcpyHtoDAsync_v2", "memcpy", 1),
    "cudaMemsetAsync_v3020": ("cudaMemsetAsync", "memset", 0),
    "cuMemsetD32Async": ("cuMemsetD32Async", "memset", 1),
    "cudaEventRecord_v3020": ("cudaEventRecord", "other", 0),
    "cudaStreamQuery_v3020": ("cudaStreamQuery", "other", 0),
    "cudaGetDeviceProperties_v2_v12000": ("cudaGetDeviceProperties_v2", "other", 0),
    "cuGetProcAddress_v2": ("cuGetProcAddress_v2", "other", 1),
    "cudaMemGetInfo_v3020": ("cudaMemGetInfo", "other", 0),
}


def test_cuda_api_names_classes_and_layers(tmp_path: Path) -> None:
    strings = dict(enumerate(API_NAMES, start=1))
    rows = [
        {
            "start": i * 10,
            "end": i * 10 + 5,
            "eventClass": API_NAMES[name][2],
            "globalTid": T1,
            "correlationId": i,
            "nameId": i,
            "returnValue": 0,
        }
        for i, name in strings.items()
    ]
    api = _trace(tmp_path, {"CUPTI_ACTIVITY_KIND_RUNTIME": rows}, strings).cuda_api
    assert api.schema == schemas.CUDA_API
    got = {
        raw: tuple(r)
        for raw, r in zip(API_NAMES, api.select("name", "api_class", "layer").rows(), strict=True)
    }
    expected = {
        raw: (name, cls, "runtime" if ec == 0 else "driver")
        for raw, (name, cls, ec) in API_NAMES.items()
    }
    assert got == expected
    assert api.select("pid", "tid", "global_pid").unique().rows() == [(PID, TID, GPID)]


@pytest.mark.parametrize(
    ("name", "event_class", "layer"),
    [
        ("cuLaunchKernel", 99, "driver"),
        ("cudaLaunchKernel", 99, "runtime"),
        ("__cudaPushCallConfiguration", 99, "runtime"),
    ],
)
def test_layer_from_name_when_event_class_does_not_say(tmp_path, name, event_class, layer):
    rows = [
        {
            "start": 1,
            "end": 2,
            "eventClass": event_class,
            "globalTid": T1,
            "nameId": 1,
            "returnValue": 0,
        }
    ]
    api = _trace(tmp_path, {"CUPTI_ACTIVITY_KIND_RUNTIME": rows}, {1: name}).cuda_api
    assert api["layer"].to_list() == [layer]


def test_ids_with_high_hardware_byte(tmp_path: Path) -> None:
    # SQLite stores globalTid values >= 2**63 as negative numbers; pid/tid must still come out
    t = gtid(PID, TID, hw_vm=0x8001)
    assert t < 0
    rows = [{"start": 1, "end": 2, "eventClass": 0, "globalTid": t, "nameId": 1, "returnValue": 0}]
    api = _trace(tmp_path, {"CUPTI_ACTIVITY_KIND_RUNTIME": rows}, {1: "cudaFree"}).cuda_api
    assert api.select("pid", "tid").row(0) == (PID, TID)
    assert api["global_pid"].item() == gtid(PID, 0, hw_vm=0x8001)


# --- NVTX -----------------------------------------------------------------------------------


def _ev(start, end, etype=59, tid=T1, **kw) -> dict:
    return {"start": start, "end": end, "eventType": etype, "globalTid": tid, **kw}


def test_nvtx_styles_names_domains_and_payloads(tmp_path: Path) -> None:
    other = gtid(PID + 1, PID + 1)
    rows = [
        _ev(0, None, 75, domainId=1, text="NCCL"),  # domain create (pid PID)
        _ev(0, None, 75, tid=other, domainId=1, text="DALI"),  # same id, other process
        _ev(10, 20, 59, text="push"),  # rowid 3
        _ev(12, 18, 60, textId=5, domainId=1),  # start/end, name from StringIds
        _ev(15, None, 34, text="mark"),
        _ev(30, 40, 59, tid=other, domainId=1, text="loader"),
        _ev(31, 32, 70, text="nvtxt"),
        _ev(33, 34, 71, text="nvtxt se", jsonText='{"bytes": 8}'),
        _ev(35, 36, 59, domainId=9, text="orphan", jsonTextId=6),
        _ev(0, None, 39, text="thread name"),  # not an event
        _ev(0, None, 33, text="category"),  # not an event
    ]
    tr = _trace(tmp_path, {"NVTX_EVENTS": rows}, {5: "registered", 6: '{"x": 1}'})
    nv = tr.nvtx
    assert nv.schema == schemas.NVTX
    got = nv.select("range_id", "style", "name", "domain", "start_ns", "end_ns", "pid").rows()
    assert got == [  # range_id: the position in content order (time first), not the rowid
        (1, "push_pop", "push", "", 10, 20, PID),
        (2, "start_end", "registered", "NCCL", 12, 18, PID),
        (3, "mark", "mark", "", 15, 15, PID),
        (4, "push_pop", "loader", "DALI", 30, 40, PID + 1),
        (5, "push_pop", "nvtxt", "", 31, 32, PID),
        (6, "start_end", "nvtxt se", "", 33, 34, PID),
        (7, "push_pop", "orphan", None, 35, 36, PID),
    ]
    assert nv["payload_json"].to_list() == [None] * 5 + ['{"bytes": 8}', '{"x": 1}']
    assert any(
        "1 NVTX events are in domains whose name was not captured" in n for n in tr.meta.notes
    )


def test_nvtx_unterminated_ranges(tmp_path: Path) -> None:
    rows = [_ev(10, None), _ev(20, 1000), _ev(30, 40), _ev(50, None, 34)]
    nv = _trace(tmp_path, {"NVTX_EVENTS": rows}, duration=1000).nvtx
    assert nv.select("end_ns", "unterminated").rows() == [
        (1000, True),
        (1000, True),
        (40, False),
        (50, False),
    ]


def test_nvtx_session_end_without_analysis_details(tmp_path: Path) -> None:
    rows = [_ev(10, None), _ev(20, 70)]
    nv = _trace(tmp_path, {"NVTX_EVENTS": rows}, duration=None).nvtx
    assert nv.select("end_ns", "unterminated").rows() == [(70, True), (70, True)]
    # rows that are not events (a domain created late) count towards that end too
    rows.append(_ev(90, None, 75, domainId=1, text="late"))
    (tmp_path / "late").mkdir()
    nv = _trace(tmp_path / "late", {"NVTX_EVENTS": rows}, duration=None).nvtx
    assert nv.select("end_ns", "unterminated").rows() == [(90, True), (70, False)]


NESTING = {
    # rows (start, end, tid, end_tid) -> expected (depth, parent) per row, parent as row index
    "nested": ([(0, 100), (10, 50), (20, 30)], [(0, None), (1, 0), (2, 1)]),
    "siblings": ([(0, 100), (10, 20), (20, 30)], [(0, None), (1, 0), (1, 0)]),
    "identical intervals nest by id": ([(0, 10), (0, 10)], [(0, None), (1, 0)]),
    "same start, longer is parent": ([(0, 5), (0, 10)], [(1, 1), (0, None)]),
    "same end": ([(0, 10), (5, 10)], [(0, None), (1, 0)]),
    "zero length inside": ([(0, 10), (4, 4)], [(0, None), (1, 0)]),
    "touching is not nesting": ([(0, 10), (10, 20)], [(0, None), (0, None)]),
    "crossing start/end ranges": ([(0, 10), (5, 15), (6, 12)], [(0, None), (0, None), (1, 1)]),
    "threads never nest": ([(0, 100, 1), (10, 20, 2)], [(0, None), (0, None)]),
    "cross-thread range takes no part": (
        [(0, 100), (10, 20, 1, 2), (30, 40)],
        [(0, None), (None, None), (1, 0)],
    ),
}


@pytest.mark.parametrize("case", list(NESTING))
def test_nvtx_nesting(tmp_path: Path, case: str) -> None:
    spec, expected = NESTING[case]
    rows = []
    for i, r in enumerate(spec):
        start, end, tid, end_tid = [*r, 1, None][:4] if len(r) == 2 else [*r, None][:4]
        rows.append(
            _ev(
                start,
                end,
                60,
                tid=gtid(PID, tid),
                endGlobalTid=gtid(PID, end_tid) if end_tid else None,
                text=f"r{i}",  # distinct rows: exact copies would be one range (duplicate_row)
            )
        )
    nv = _trace(tmp_path, {"NVTX_EVENTS": rows}).nvtx.sort("range_id")
    # range_id is content-derived: map each id back to the first unused row of that content
    # (identical rows are interchangeable, the lower id takes the earlier row)
    content = [(r["start"], r["end"], r["globalTid"], r["endGlobalTid"]) for r in rows]
    row_of: dict[int, int] = {}
    for rid, start, end, tid, end_tid in nv.select(
            "range_id", "start_ns", "end_ns", "global_tid", "end_global_tid").rows():
        row_of[rid] = next(i for i, c in enumerate(content)
                           if c == (start, end, tid, end_tid) and i not in row_of.values())
    got = {row_of[rid]: (d, None if p is None else row_of[p])
           for rid, d, p in nv.select("range_id", "depth", "parent_range_id").rows()}
    assert [got[i] for i in range(len(rows))] == expected


def _brute_force_parents(rows: list[tuple[int, int, int]]) -> dict[int, int | None]:
    """The closest earlier range (in (start, end desc, id) order) that contains each range."""
    order = sorted(range(len(rows)), key=lambda i: (rows[i][0], -rows[i][1], i))
    parents: dict[int, int | None] = {}
    for pos, i in enumerate(order):
        _, e, t = rows[i]
        parents[i] = next(
            (j for j in reversed(order[:pos]) if rows[j][2] == t and rows[j][1] >= e), None
        )
    return parents


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 12), max_size=70))
def test_previous_at_least_matches_brute_force(values: list[int]) -> None:
    """The nearest earlier position holding a value at least as large (the parent search of
    the NVTX nesting), against a scan back from every position."""
    from nsysan.load.adapters_nvtx import _previous_at_least

    want = [next((j for j in range(i - 1, -1, -1) if values[j] >= v), -1)
            for i, v in enumerate(values)]
    got = _previous_at_least(np.array(values, dtype=np.int64))
    assert got.tolist() == want


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 50), st.integers(0, 30), st.integers(0, 2)).map(
            lambda t: (t[0], t[0] + t[1], t[2])
        ),
        max_size=25,
    )
)
def test_nest_ranges_matches_brute_force(rows: list[tuple[int, int, int]]) -> None:
    df = pl.DataFrame(
        {
            "range_id": list(range(len(rows))),
            "global_tid": [r[2] for r in rows],
            "start_ns": [r[0] for r in rows],
            "end_ns": [r[1] for r in rows],
        },
        schema={
            "range_id": pl.Int64,
            "global_tid": pl.Int64,
            "start_ns": pl.Int64,
            "end_ns": pl.Int64,
        },
    )
    got = dict(nest_ranges(df).select("range_id", "parent_range_id").rows())
    assert got == _brute_force_parents(rows)
    depth = dict(nest_ranges(df).select("range_id", "depth").rows())
    for i, parent in got.items():
        assert depth[i] == (0 if parent is None else depth[parent] + 1)


# --- the other frames -------------------------------------------------------------------------


def test_sync_osrt_overhead_streams_threads_processes_gpus(tmp_path: Path) -> None:
    t2 = gtid(PID, TID + 1)
    invalid = 0xFFFFFFFF
    tables = {
        "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION": [
            {
                "start": 1,
                "end": 2,
                "deviceId": 0,
                "contextId": 1,
                "streamId": 7,
                "correlationId": 3,
                "globalPid": GPID,
                "syncType": s,
            }
            for s in (1, 2, 3)
        ]
        + [
            {
                "start": 4,
                "end": 5,
                "deviceId": 0,
                "contextId": 1,
                "streamId": invalid,
                "correlationId": 4,
                "globalPid": GPID,
                "syncType": 4,
            },
            {
                "start": 6,
                "end": 7,
                "deviceId": 0,
                "contextId": 1,
                "streamId": 7,
                "correlationId": 5,
                "globalPid": GPID,
                "syncType": 0,
            },
        ],
        "OSRT_API": [
            {
                "start": 1,
                "end": 9,
                "eventClass": 27,
                "globalTid": T1,
                "nameId": 1,
                "returnValue": 0,
            },
            {
                "start": 0,
                "end": 0,
                "eventClass": 31,
                "globalTid": T1,
                "nameId": 2,
                "returnValue": 0,
            },
        ],
        "PROFILER_OVERHEAD": [
            {"start": 3, "end": 4, "globalTid": T1, "nameId": 3, "returnValue": 0}
        ],
        "TARGET_INFO_CUDA_STREAM": [
            {
                "streamId": s,
                "hwId": 0,
                "vmId": 0,
                "processId": PID,
                "contextId": 1,
                "priority": 0,
                "flag": f,
            }
            for s, f in ((7, 1), (13, 2), (14, 3), (15, 0))
        ],
        "ThreadNames": [
            {"nameId": 4, "priority": 10, "globalTid": T1},
            {"nameId": 5, "priority": 10, "globalTid": T1},  # tie: the last wins
            {"nameId": 6, "priority": 0, "globalTid": T1},
            {"nameId": 6, "priority": None, "globalTid": t2},
        ],
        "PROCESSES": [{"globalPid": GPID, "pid": PID, "name": "python"}],
        "TARGET_INFO_GPU": [
            {
                "vmId": 0,
                "id": 3,
                "cuDevice": 0,
                "name": "A100",
                "smCount": 108,
                "computeMajor": 8,
                "computeMinor": 0,
                "totalMemory": 40,
                "clockRate": 1410,
            }
        ],
    }
    strings = {
        1: "poll",
        2: "marker",
        3: "CUDA profiling data flush",
        4: "a",
        5: "main",
        6: "worker",
    }
    tr = _trace(tmp_path, tables, strings)
    assert tr.sync.select("sync_type", "stream_id").rows() == [  # ties in content order
        ("event_sync", 7),
        ("stream_sync", 7),
        ("stream_wait_event", 7),
        ("context_sync", None),
        ("unknown", 7),
    ]
    assert tr.osrt.select("name", "pid", "tid").rows() == [("poll", PID, TID)]
    assert tr.overhead.select("name", "pid").rows() == [("CUDA profiling data flush", PID)]
    assert tr.streams.select("stream_id", "stream_type", "pid").rows() == [
        (7, "default", PID),
        (13, "non_blocking", PID),
        (14, "null", PID),
        (15, "unknown", PID),
    ]
    assert tr.threads.select("global_tid", "name").rows() == [(T1, "main"), (t2, "worker")]
    assert tr.processes.select("global_pid", "pid", "name").rows() == [(GPID, PID, "python")]
    assert tr.gpus.select("device_id", "name", "sm_count", "compute_capability").rows() == [
        (0, "A100", 108, "8.0")
    ]
    for name, schema in schemas.CANONICAL.items():
        assert tr.frame(name).schema == schema, name
        assert tr.frame(name)["trace_id"].unique().to_list() in ([], ["t"]), name


def test_absent_tables_give_empty_frames_and_say_how_to_capture(tmp_path: Path) -> None:
    tr = _trace(tmp_path, {"NVTX_EVENTS": [_ev(1, 2, text="x")]})
    assert tr.gpu_ops.is_empty() and tr.gpu_ops.schema == schemas.GPU_OPS
    assert tr.cuda_api.is_empty()
    assert tr.meta.missing["gpu_ops"].startswith(
        "tables CUPTI_ACTIVITY_KIND_KERNEL/CUPTI_ACTIVITY_KIND_MEMCPY/CUPTI_ACTIVITY_KIND_MEMSET "
        "not found: was the profile captured with `--trace=cuda`?"
    )
    assert tr.meta.missing["cuda_api"].startswith(
        "table CUPTI_ACTIVITY_KIND_RUNTIME not found: was the profile captured with `--trace=cuda`?"
    )
    assert "nvtx" not in tr.meta.missing
    assert not tr.has("gpu_ops") and tr.has("nvtx")


def test_meta_frame_and_trace_meta(tmp_path: Path) -> None:
    tables = {
        "EXPORT_META_DATA": [
            {"name": "EXPORT_PRODUCT_VERSION", "value": "2022.4.2.1"},
            {"name": "EXPORT_SCHEMA_VERSION", "value": "3.0.0"},
        ],
        "META_DATA_CAPTURE": [
            {"name": "CAPTURE_EVENT_TYPE", "value": "CUDA"},
            {"name": "CAPTURE_EVENT_TYPE", "value": "NVTX"},
            {"name": "PROCESS_0:ENVIRONMENT_VARIABLE", "value": 'TOKEN="secret"'},
        ],
        "TARGET_INFO_SESSION_START_TIME": [{"utcEpochNs": 1668125677736728256}],
    }
    tr = _trace(tmp_path, tables, duration=5_000)
    m = tr.meta
    assert (m.exporter_version, m.schema_version, m.duration_ns, m.session_start_utc_ns) == (
        "2022.4.2.1",
        "3.0.0",
        5_000,
        1668125677736728256,
    )
    assert m.capture["CAPTURE_EVENT_TYPE"] == ["CUDA", "NVTX"]
    assert m.tables["StringIds"] == 0
    kv = dict(tr.meta_frame.select("key", "value").rows())
    assert kv["exporter_version"] == "2022.4.2.1"
    assert kv["duration_ns"] == "5000"
    assert kv["export:EXPORT_SCHEMA_VERSION"] == "3.0.0"
    assert kv["capture:CAPTURE_EVENT_TYPE"] in ("CUDA", "NVTX")
    assert kv["missing:gpu_ops"].startswith("tables CUPTI_ACTIVITY_KIND_KERNEL")
    assert not any("secret" in (v or "") for v in kv.values())  # env vars stay out of reports
