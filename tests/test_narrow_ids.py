"""CUDA ids held as 32-bit integers in the frames (issue 21): device, context and stream ids
and correlation ids are UInt32 there, as CUPTI records them (every value up to 0xFFFFFFFE is
kept exactly; 0xFFFFFFFF, "not applicable", is null), and Int64 in the output tables; a
value outside 32 unsigned bits is a damaged export, rejected with one line, never wrapped."""

from __future__ import annotations

import gc
import sqlite3
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner
from conftest import SHARED_TRACES, shared_sqlite_files
from export_mutations import EXAMPLE, KERNEL, RUNTIME, SYNC, copy_export, execute

import nsysan
from nsysan.cli import cli
from nsysan.errors import TraceFormatError
from nsysan.frames import schemas
from nsysan.frames.conform import select_narrowed
from nsysan.load import open_trace
from nsysan.load import sqlite as sqlite_source
from nsysan.load.adapters import COPY_KINDS
from nsysan.passes.registry import registry
from nsysan.testing._memory import CASES, memory_case
from nsysan.testing.host_scenarios import SCENARIOS as HOST_SCENARIOS

IDS = ("device_id", "context_id", "stream_id", "correlation_id")
#: the largest CUDA id CUPTI writes (0xFFFFFFFF is its "not applicable")
CUDA_ID_MAX = (1 << 32) - 2
SHARED = SHARED_TRACES
#: a project-owned recording with CPU samples and context switches (fixtures/README.md)
HOST_FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "cpu_host_sampling.sqlite"
#: shared traces whose analyses fill the host and nccl tables (when present; a memory-usage
#: case of the test builder fills the memory tables)
WITH_EVERYTHING = ("sc22-ddp-4gpu-nccl/4gpu_baseline.nsys-rep.nsys2022.4.2.sqlite",
                   "sc23-vit-train-nvtx/4workers.nsys-rep.nsys2023.4.4.sqlite")


@pytest.fixture(params=["row path", "bulk path"])
def read_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """A test on both ways of reading a table: the small exports take the row path;
    a big table is read in bulk, where the columns a frame copies come narrow as read
    (`nsysan.load.sqlite_bulk`) and must give the same frames and the same errors."""
    if request.param == "bulk path":
        monkeypatch.setattr(sqlite_source, "BULK_MIN_ROWS", 1)
        monkeypatch.delenv("NSYSAN_NO_ADBC", raising=False)
    return request.param


@pytest.mark.usefixtures("read_path")
def test_frames_hold_cuda_ids_as_uint32_and_the_tables_as_int64(tmp_path: Path) -> None:
    trace = open_trace(EXAMPLE, trace_id="t", frame_cache=False)
    for frame, cols in (("gpu_ops", IDS), ("sync", IDS), ("cuda_api", ("correlation_id",)),
                        ("gpus", ("device_id",)), ("streams", ("context_id", "stream_id"))):
        got = trace.frame(frame).schema
        assert all(got[c] == pl.UInt32 for c in cols), (frame, got)
    # every table of an analysis has its declared schema in memory too (Int64 ids), for
    # the traces with host evidence, NCCL and memory events as well
    traces = [EXAMPLE, memory_case(tmp_path / "memory.sqlite", CASES[0]),
              *(SHARED / rel for rel in WITH_EVERYTHING if (SHARED / rel).exists())]
    specs = registry()
    every_scope = {"gaps.scopes": "device,stream,process_device"}  # keys of every width
    for path, settings in [(EXAMPLE, every_scope), *((t, None) for t in traces)]:
        result = nsysan.analyze(path, settings=settings)
        for name, res in result.results.items():
            for table, df in res.tables.items():
                assert df.schema == specs[name].tables[table], (path.name, table)


@pytest.mark.usefixtures("read_path")
@pytest.mark.parametrize(("table", "column", "frame_column", "value"), [
    (KERNEL, "streamId", "stream_id", 1 << 32),
    (KERNEL, "correlationId", "correlation_id", -1),
    (KERNEL, "gridX", "grid_x", 1 << 31),
    (KERNEL, "blockX", "block_x", 1 << 16),
    (KERNEL, "gridZ", "grid_z", -1),
    (RUNTIME, "correlationId", "correlation_id", 1 << 40),
    (SYNC, "contextId", "context_id", -(1 << 31) - 1),
])
def test_an_id_beyond_32_bits_is_an_error_not_a_wrapped_value(
    tmp_path: Path, table: str, column: str, frame_column: str, value: int,
) -> None:
    broken = copy_export(EXAMPLE, tmp_path / "in" / "t.sqlite")
    execute(broken, f'UPDATE "{table}" SET "{column}" = {value} WHERE rowid = 3')
    assert f"column {frame_column} holds {value}" in _analyze_fails(broken, tmp_path / "out")
    with pytest.raises(TraceFormatError, match=frame_column):
        nsysan.analyze(broken)


def _analyze_fails(broken: Path, out: Path) -> str:
    """``nsysan analyze`` of a damaged export: exit 1, one line ``Error: ...`` that says to
    export the report again (no internal error), and nothing half-written; the line."""
    result = CliRunner().invoke(cli, ["analyze", str(broken), "-o", str(out)])
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    assert "export the report again" in lines[0] and "internal error" not in lines[0]
    assert not (out / broken.stem).exists()  # nothing half-written
    return lines[0]


@pytest.mark.usefixtures("read_path")
def test_every_id_cupti_writes_is_kept_exactly(tmp_path: Path) -> None:
    # ids of the upper half of 32 bits are legitimate CUPTI values (unsigned), not damage
    edge = copy_export(EXAMPLE, tmp_path / "t.sqlite")
    high = (1 << 31) + 7
    execute(edge, f"UPDATE {KERNEL} SET streamId = {CUDA_ID_MAX} WHERE streamId = 20",
            f"UPDATE {KERNEL} SET correlationId = correlationId + {high}",
            f"UPDATE {RUNTIME} SET correlationId = correlationId + {high}")
    trace = open_trace(edge, trace_id="t", frame_cache=False)
    assert trace.gpu_ops["stream_id"].max() == CUDA_ID_MAX
    assert trace.cuda_api["correlation_id"].min() >= high
    result = nsysan.analyze(edge)
    # the NCCL kernels' stream (20 in the fixture) comes out whole in the nccl table
    assert result.table("nccl")["stream_id"].unique().to_list() == [CUDA_ID_MAX]
    # and every kernel still finds the call that launched it through the high ids
    base = nsysan.analyze(EXAMPLE)
    for table in ("kernels", "gaps"):  # launch times and gap causes included
        got, want = (r.table(table).drop("trace_id", "stream_id", strict=False)
                     for r in (result, base))
        assert got.equals(want), table
    assert result.table("kernels")["api_mean_ns"].is_not_null().any()


def test_conform_checks_only_what_it_narrows() -> None:
    wide = pl.DataFrame({"trace_id": ["t"], "device_id": [1 << 33]})
    schema = pl.Schema({"trace_id": pl.String, "device_id": schemas.CUDA_ID})
    with pytest.raises(TraceFormatError, match="column device_id holds 8589934592"):
        schemas.conform(wide, schema)
    with pytest.raises(TraceFormatError, match=r"column device_id holds -1, .*unsigned"):
        schemas.conform(pl.DataFrame({"device_id": [-1, 3]}), schema)
    with pytest.raises(TraceFormatError, match="column tid holds 2147483648"):
        schemas.conform(pl.DataFrame({"tid": [1 << 31]}), pl.Schema({"tid": schemas.OS_ID}))
    # widening, or narrowing values that fit, passes through unchanged
    assert schemas.conform(wide, pl.Schema({"device_id": pl.Int64}))["device_id"][0] == 1 << 33
    fits = pl.DataFrame({"device_id": [0, CUDA_ID_MAX + 1, None]})
    got = schemas.conform(fits, pl.Schema({"device_id": schemas.CUDA_ID}))
    assert got["device_id"].to_list() == [0, CUDA_ID_MAX + 1, None]
    assert got.schema["device_id"] == pl.UInt32
    with pytest.raises(TraceFormatError, match=r"column block_x holds 65536, .*65535"):
        schemas.conform(pl.DataFrame({"block_x": [1, 1 << 16]}),
                        pl.Schema({"block_x": schemas.LAUNCH_DIM}))
    with pytest.raises(TraceFormatError, match="column cpu holds -32769"):
        schemas.conform(pl.DataFrame({"cpu": [-(1 << 15) - 1]}), pl.Schema({"cpu": schemas.CPU}))
    signed = pl.DataFrame({"tid": [-(1 << 31), (1 << 31) - 1]})
    assert schemas.conform(signed, pl.Schema({"tid": schemas.OS_ID}))["tid"].to_list() == [
        -(1 << 31), (1 << 31) - 1]


def test_select_narrowed_is_conform_of_the_select_made_a_column_at_a_time() -> None:
    # what a frame build's last step gives: the columns and values of `conform` of the
    # select, each input column dropped from the build's own frame once read for the last time
    raw = pl.DataFrame({"globalTid": [(7 << 24) | 5, (7 << 24) | 6, None],
                        "gridX": [1, 70000, None], "start": [3, 1, 2], "unused": [0, 0, 0]})
    exprs = {"start_ns": "start", "tid": pl.col("globalTid") & 0xFFFFFF,
             "grid_x": "gridX", "pid": pl.col("globalTid") // (1 << 24), "flag": pl.lit(True),
             "grid_y": pl.col("gridX") // 2}
    schema = pl.Schema({"start_ns": pl.Int64, "tid": schemas.OS_ID, "grid_x": pl.Int32,
                        "pid": schemas.OS_ID, "flag": pl.Boolean, "grid_y": pl.Int64})
    want = schemas.conform(raw.select(**exprs), schema)
    own = raw.clone()
    got = select_narrowed(own, exprs, schema)
    assert got.schema == want.schema and got.equals(want)
    assert own.columns == ["unused"]  # read columns dropped; the caller's copy is not
    assert raw.width == 4
    assert select_narrowed(raw.head(0), exprs, schema).schema == want.schema
    # the checks of `conform` on each narrowed column, with the column's name
    with pytest.raises(TraceFormatError, match="column pid holds 4294967296"):
        select_narrowed(pl.DataFrame({"globalTid": [1 << 56]}),
                        {"pid": pl.col("globalTid") // (1 << 24)},
                        pl.Schema({"pid": schemas.OS_ID}))


def test_select_narrowed_casts_literals_and_refuses_unnamed_columns() -> None:
    raw = pl.DataFrame({"a": [1, 2], "b": [10, 20]})
    schema = pl.Schema({"x": pl.UInt32, "n": pl.UInt16, "k": pl.Int64})
    exprs = {"x": "b", "n": pl.lit(None), "k": pl.lit(5)}
    want = schemas.conform(raw.select(**exprs), schema)
    got = select_narrowed(raw.clone(), exprs, schema)
    assert got.schema == want.schema and got.equals(want)
    # pl.first() would read the first column left, not the input's: refused, not wrong
    with pytest.raises(ValueError, match="z must name the columns it reads"):
        select_narrowed(raw.clone(), {"x": "b", "z": pl.first()}, schema)


@pytest.mark.usefixtures("read_path")
def test_launch_dimensions_and_cpus_are_16_bit_and_kept_exactly(tmp_path: Path) -> None:
    # CUDA's limits: grid y/z up to 65535, blocks up to 1024 threads; Linux CPU numbers
    edge = copy_export(EXAMPLE, tmp_path / "t.sqlite")
    execute(edge, f"UPDATE {KERNEL} SET gridY = 65535, gridZ = 65535, blockX = 1024, "
            "blockY = 1024, blockZ = 64 WHERE rowid = 3")
    ops = open_trace(edge, trace_id="t", frame_cache=False).gpu_ops
    dims = ("grid_y", "grid_z", "block_x", "block_y", "block_z")
    assert all(ops.schema[c] == pl.UInt16 for c in dims) and ops.schema["grid_x"] == pl.Int32
    assert ops.select(pl.max(*dims)).row(0) == (65535, 65535, 1024, 1024, 64)
    host = open_trace(HOST_FIXTURE, trace_id="h", frame_cache=False)
    for frame in ("sched", "cpu_samples"):
        cpus = host.frame(frame)["cpu"]
        assert cpus.dtype == pl.Int16 and cpus.len() > 0, frame


@pytest.mark.usefixtures("read_path")
def test_a_cpu_number_beyond_16_bits_is_an_error(tmp_path: Path) -> None:
    broken = copy_export(HOST_FIXTURE, tmp_path / "in" / "h.sqlite")
    # (a switch-in: the frame's intervals carry the CPU their thread switched in on)
    execute(broken, f"UPDATE SCHED_EVENTS SET cpu = {1 << 15} WHERE rowid = "
            "(SELECT min(rowid) FROM SCHED_EVENTS WHERE isSchedIn = 1)")
    with pytest.raises(TraceFormatError, match=r"column cpu holds 32768, .*CPU number"):
        open_trace(broken, trace_id="h", frame_cache=False).frame("sched")


def test_copy_memory_and_thread_state_labels_are_one_byte_codes(tmp_path: Path) -> None:
    # the labels the export's codes name, per row (brute force over the raw rows), held as
    # one-byte codes of their own vocabularies; an unknown code keeps its number
    varied = copy_export(EXAMPLE, tmp_path / "t.sqlite")
    execute(varied, "UPDATE CUPTI_ACTIVITY_KIND_MEMCPY SET copyKind = CASE rowid % 4 WHEN 0 "
            "THEN 1 WHEN 1 THEN 2 WHEN 2 THEN 8 ELSE 77 END, srcKind = rowid % 8, "
            "dstKind = (rowid + 3) % 8")
    with sqlite3.connect(varied) as db:
        mem = {i: lbl.lower().replace(" ", "_") for i, lbl in
               db.execute("SELECT id, label FROM ENUM_CUDA_MEM_KIND")}
        raw = db.execute("SELECT copyKind, srcKind, dstKind FROM CUPTI_ACTIVITY_KIND_MEMCPY")
        want = sorted((COPY_KINDS[c][0] if c in COPY_KINDS else f"Unknown({c})", mem[s],
                       mem[d]) for c, s, d in raw)
    ops = open_trace(varied, trace_id="t", frame_cache=False).gpu_ops
    for column, dtype in (("copy_kind", schemas.COPY_KIND), ("src_kind", schemas.MEMORY_KIND),
                          ("dst_kind", schemas.MEMORY_KIND)):
        assert ops.schema[column] == dtype and ops[column].to_physical().dtype == pl.UInt8
    copies = ops.filter(pl.col("kind") == "memcpy").select(
        pl.col("copy_kind", "src_kind", "dst_kind").cast(pl.String))
    assert sorted(copies.iter_rows()) == want and len(want) > 4
    host = open_trace(HOST_FIXTURE, trace_id="h", frame_cache=False)
    states = host.frame("cpu_samples")["thread_state"]
    assert states.dtype == schemas.THREAD_STATE and states.to_physical().dtype == pl.UInt8
    assert host.frame("sched")["out_state"].dtype == schemas.THREAD_STATE
    with sqlite3.connect(HOST_FIXTURE) as db:  # the fixture's samples: 294, all running
        n_running = db.execute("SELECT count(*) FROM COMPOSITE_EVENTS WHERE threadState = 1")
        running = states.to_frame().select((pl.col("thread_state") == "running").sum()).item()
        assert running == n_running.fetchone()[0] == states.len()


@pytest.mark.usefixtures("read_path")
@pytest.mark.parametrize("kind", [-1, -2, -7])
def test_a_negative_copy_kind_is_an_error(tmp_path: Path, kind: int) -> None:
    # CUPTI's copy kinds are 0 or more; nsysan keys the copies' labels below -1, so a
    # negative kind would take another label (or fail inside polars): one line instead
    broken = copy_export(EXAMPLE, tmp_path / "in" / "t.sqlite")
    execute(broken, f"UPDATE CUPTI_ACTIVITY_KIND_MEMCPY SET copyKind = {kind} WHERE rowid = 2")
    line = _analyze_fails(broken, tmp_path / "out")
    assert f"column copyKind of CUPTI_ACTIVITY_KIND_MEMCPY holds {kind}" in line


def test_a_damaged_vocabulary_is_rejected_without_filling_it(tmp_path: Path) -> None:
    # nsys writes a few thread states; hundreds of distinct codes are a damaged export, and
    # the shared vocabulary stays as it was for the next trace of this process
    broken = copy_export(HOST_FIXTURE, tmp_path / "in" / "h.sqlite")
    execute(broken, "UPDATE COMPOSITE_EVENTS SET threadState = 100 + rowid")
    # (a frame of this process holding labels: polars frees the labels no column holds)
    held = open_trace(HOST_FIXTURE, frame_cache=False).frame("cpu_samples")["thread_state"]
    before = schemas.THREAD_STATE.categories.to_series().to_list()
    assert "running" in before
    with pytest.raises(TraceFormatError, match=r"column thread_state holds 294 distinct labels"):
        open_trace(broken, trace_id="h", frame_cache=False).frame("cpu_samples")
    assert schemas.THREAD_STATE.categories.to_series().to_list() == before
    # nor may a few labels fill it after many traces: the vocabulary (255 labels) is checked
    # before any is added
    room = schemas.SMALL_VOCABULARY_MAX - len(before)
    filler = pl.Series([f"held_{i}" for i in range(room - 3)]).cast(schemas.THREAD_STATE)
    full = schemas.THREAD_STATE.categories.to_series().to_list()
    few = copy_export(HOST_FIXTURE, tmp_path / "few" / "h.sqlite")
    execute(few, "UPDATE COMPOSITE_EVENTS SET threadState = 100 + rowid % 10")
    with pytest.raises(TraceFormatError, match=r"column thread_state brings the labels .* 255"):
        open_trace(few, trace_id="h", frame_cache=False).frame("cpu_samples")
    assert schemas.THREAD_STATE.categories.to_series().to_list() == full
    assert held.to_frame().select((pl.col("thread_state") == "running").all()).item()
    assert filler.cast(pl.String).to_list()[-1] == f"held_{room - 4}"
    # polars frees the labels only once no column holds any of them. ``held`` and the trace
    # it came from are in reference cycles (the errors above, the trace's frames) until the
    # collector runs: without it, the vocabulary stays full for the next test of this process
    del filler, held
    gc.collect()
    assert not any(label.startswith("held_")
                   for label in schemas.THREAD_STATE.categories.to_series().to_list())
    # frames made elsewhere (notebooks, `Trace.from_frames`) are checked when conformed
    with pytest.raises(TraceFormatError, match=r"column out_state holds 70 distinct labels"):
        schemas.conform(pl.DataFrame({"out_state": [f"s{i}" for i in range(70)]}),
                        pl.Schema({"out_state": schemas.THREAD_STATE}))
    assert open_trace(HOST_FIXTURE, frame_cache=False).frame("cpu_samples").height == 294
    # an analysis says so in one line and writes nothing
    planted, _ = HOST_SCENARIOS["cpu_bound_input"](tmp_path / "planted.sqlite")
    execute(planted, "UPDATE COMPOSITE_EVENTS SET threadState = 100 + rowid")
    line = _analyze_fails(planted, tmp_path / "out")
    assert ": column thread_state holds 240 distinct labels" in line


@pytest.mark.usefixtures("read_path")
def test_cuptis_not_applicable_marker_reads_as_null(tmp_path: Path) -> None:
    # 0xFFFFFFFF (CUPTI_INVALID_ID) is an unsigned 32-bit "does not apply": null, not an error
    marked = copy_export(EXAMPLE, tmp_path / "t.sqlite")
    execute(marked, f"UPDATE {KERNEL} SET streamId = {0xFFFFFFFF} WHERE rowid = 3",
            f"UPDATE {RUNTIME} SET correlationId = {0xFFFFFFFF} WHERE rowid = 5",
            f"UPDATE {SYNC} SET correlationId = {0xFFFFFFFF} WHERE rowid = 2")
    trace = open_trace(marked, trace_id="t", frame_cache=False)
    assert trace.gpu_ops["stream_id"].null_count() == 1
    assert trace.cuda_api["correlation_id"].null_count() == 1
    assert trace.sync["correlation_id"].null_count() == 1
    assert nsysan.analyze(marked).table("kernels").height > 0


def test_big_tables_give_the_columns_a_frame_copies_already_narrow(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The memory of a big build (issue 21): read in bulk, the ids and sizes a frame copies
    as they are arrive in the frame's own types, never as 64-bit copies."""
    from nsysan.load.adapters import Adapter

    monkeypatch.setattr(sqlite_source, "BULK_MIN_ROWS", 1)
    monkeypatch.delenv("NSYSAN_NO_ADBC", raising=False)
    read: dict[str, pl.Schema] = {}
    orig = Adapter.read

    def spy(self, table, *args, **kwargs):
        got = orig(self, table, *args, **kwargs)
        read[table] = got.schema
        return got

    monkeypatch.setattr(Adapter, "read", spy)
    trace = open_trace(EXAMPLE, trace_id="t", frame_cache=False)
    for frame in ("gpu_ops", "cuda_api", "sync"):
        trace.frame(frame)
    host = open_trace(HOST_FIXTURE, trace_id="h", frame_cache=False)
    for frame in ("sched", "cpu_samples"):
        host.frame(frame)
    want = {
        KERNEL: {"deviceId": pl.UInt32, "contextId": pl.UInt32, "streamId": pl.UInt32,
                 "correlationId": pl.UInt32, "gridX": pl.Int32, "gridY": pl.UInt16,
                 "blockZ": pl.UInt16, "start": pl.Int64, "shortName": pl.Int64},
        RUNTIME: {"correlationId": pl.UInt32, "returnValue": pl.Int32, "nameId": pl.Int64},
        SYNC: {"streamId": pl.UInt32, "correlationId": pl.UInt32, "syncType": pl.Int64},
        "SCHED_EVENTS": {"cpu": pl.Int16, "globalTid": pl.Int64},
        "COMPOSITE_EVENTS": {"cpu": pl.Int16, "threadState": pl.Int64},
    }
    for table, columns in want.items():
        assert table in read, table
        assert {c: read[table][c] for c in columns} == columns, table


#: the frames whose builders ask for narrow reads
NARROWING_FRAMES = ("gpu_ops", "cuda_api", "sync", "sched", "cpu_samples")


@pytest.mark.parametrize("rel", ["fixture:example_ddp", "fixture:cpu_host_sampling",
                                 *shared_sqlite_files()])
def test_narrow_reads_give_the_frames_of_int64_reads(
    rel: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every frame built from narrow reads equals the one built from Int64 reads, on every
    trace: a build that computed with a narrowed column (a product of UInt16 launch sizes
    wraps) would differ here, and only on the bulk path real traces take."""
    from nsysan.load.adapters import Adapter

    path = (EXAMPLE if rel == "fixture:example_ddp" else HOST_FIXTURE
            if rel.startswith("fixture:") else request.getfixturevalue("shared_traces") / rel)
    monkeypatch.setattr(sqlite_source, "BULK_MIN_ROWS", 1)
    monkeypatch.delenv("NSYSAN_NO_ADBC", raising=False)

    def frames() -> dict[str, pl.DataFrame]:
        trace = open_trace(path, trace_id="t", frame_cache=False)
        return {f: trace.frame(f) for f in NARROWING_FRAMES if trace.has(f)}

    narrow = frames()
    orig = Adapter.read

    def wide(self, table, required, optional=None, defaulted=None, narrow=None):
        return orig(self, table, required, optional, defaulted)

    monkeypatch.setattr(Adapter, "read", wide)
    as_int64 = frames()
    assert narrow.keys() == as_int64.keys() and narrow
    for name, df in narrow.items():
        assert df.schema == as_int64[name].schema, name
        assert df.equals(as_int64[name]), name
