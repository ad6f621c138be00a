"""A trace keeps its frames without the constant ``trace_id`` column and hands each frame out
with it (`nsysan.frames.trace._at_rest`): every reader sees exactly the frame of the schema,
while the kept frames hold no per-row copy of one id (16 bytes a row once polars
materialises a String column, 0.8 GB over the frames of a 10M-kernel trace)."""

from __future__ import annotations

import polars as pl
import pytest
from conftest import REPO_ROOT
from findings_cases import SCENARIOS as FINDINGS_CASES
from findings_cases import scenario as findings_case
from polars.testing import assert_frame_equal

from nsysan.frames import schemas, schemas_host
from nsysan.frames.context import AnalysisContext, Product, product
from nsysan.frames.trace import TRACE_ID, Trace, _constant_columns
from nsysan.load import open_trace
from nsysan.testing.host_scenarios import SCENARIOS as HOST_SCENARIOS
from nsysan.testing.scenarios import SCENARIOS, build

FIXTURES = REPO_ROOT / "fixtures"
ALL_FRAMES = {**schemas.CANONICAL, **schemas_host.HOST_EVIDENCE}


@pytest.mark.parametrize("name", ["example_ddp.sqlite", "cpu_host_sampling.sqlite"])
def test_frames_are_kept_without_the_id_and_handed_out_with_it(name: str) -> None:
    trace = open_trace(FIXTURES / name, frame_cache=False, trace_id="run-7")
    for frame, schema in ALL_FRAMES.items():
        kept = trace.stored(frame)
        assert TRACE_ID not in kept.columns, frame
        got = trace.frame(frame)
        assert got.schema == schema, frame  # the column back, first, as String
        assert got[TRACE_ID].to_list() == ["run-7"] * got.height, frame
        assert_frame_equal(got.drop(TRACE_ID), kept)
    assert sum(trace.frame(f).height for f in ("gpu_ops", "cpu_samples")) > 0  # rows checked


def test_a_handed_out_frame_is_the_readers_own() -> None:
    trace = open_trace(FIXTURES / "example_ddp.sqlite", frame_cache=False)
    mine = trace.frame("gpu_ops")
    mine.drop_in_place("name")  # a reader changing its frame in place
    mine.insert_column(1, pl.lit("x").alias("extra"))
    assert trace.frame("gpu_ops").schema == schemas.GPU_OPS
    assert "name" in trace.stored("gpu_ops").columns


def test_frames_that_mix_trace_ids_keep_their_column() -> None:
    ops = pl.DataFrame({
        "trace_id": ["a", "b", None], "kind": ["kernel"] * 3, "start_ns": [1, 2, 3],
        "end_ns": [2, 3, 4], "device_id": [0, 0, 0],
    })
    trace = Trace.from_frames("a", {"gpu_ops": ops})
    assert trace.stored("gpu_ops")[TRACE_ID].to_list() == ["a", "b", None]
    mine = trace.frame("gpu_ops")
    assert mine[TRACE_ID].to_list() == ["a", "b", None]
    mine.drop_in_place("name")  # still the reader's own frame
    assert "name" in trace.stored("gpu_ops").columns
    # a null is no match for the id (the test compares nulls as values)
    only_id = Trace.from_frames("a", {"gpu_ops": ops.with_columns(
        pl.Series(TRACE_ID, ["a", "a", None]))})
    assert only_id.frame("gpu_ops")[TRACE_ID].to_list() == ["a", "a", None]
    empty = Trace.from_frames("a", {"gpu_ops": ops.clear()})
    assert TRACE_ID not in empty.stored("gpu_ops").columns
    assert empty.frame("gpu_ops").schema == schemas.GPU_OPS


def test_products_are_built_once_for_the_kept_frame() -> None:
    # each `frame` call is a new object: products must key on the kept one, or every
    # request would compare whole frames and build again
    trace = open_trace(FIXTURES / "example_ddp.sqlite", frame_cache=False)
    calls: list[int] = []

    def build(t: Trace) -> int:
        calls.append(1)
        return t.frame("gpu_ops").height

    counted = Product("test.count", ("gpu_ops",), build)
    ctx = AnalysisContext(trace)
    assert product(ctx, counted) == product(ctx, counted) == trace.gpu_ops.height
    assert len(calls) == 1


def test_columns_without_values_are_kept_as_null_columns() -> None:
    # (kept as polars' constant null column: its zeroed pages are never touched; readers see
    # the same column)
    ops = pl.DataFrame({
        "kind": ["kernel", "memcpy"], "start_ns": [1, 2], "end_ns": [2, 3],
        "device_id": [0, 0], "bytes": [None, 64],
    })
    trace = Trace.from_frames("t", {"gpu_ops": ops})
    want = schemas.conform(ops.with_columns(pl.lit("t").alias(TRACE_ID)), schemas.GPU_OPS)
    got = trace.frame("gpu_ops")
    assert_frame_equal(got, want)
    assert got["graph_node_id"].dtype == pl.Int64 and got["graph_node_id"].null_count() == 2
    assert got["bytes"].to_list() == [None, 64]
    assert got["copy_kind"].dtype == schemas.GPU_OPS["copy_kind"]
    sorted_back = got.sort("start_ns", descending=True)  # a reader's own work on it
    assert sorted_back["graph_node_id"].to_list() == [None, None]
    assert_frame_equal(trace.frame("gpu_ops"), want)


def test_integer_columns_of_one_value_are_handed_out_unchanged() -> None:
    # one process: global_pid and context_id the same in every row (kept as constant
    # columns); device_id too, but the passes read it row by row (kept as it is)
    ops = pl.DataFrame({
        "kind": ["kernel"] * 3, "start_ns": [3, 1, 2], "end_ns": [4, 2, 3],
        "global_pid": [7 << 24] * 3, "pid": [7] * 3, "device_id": [0] * 3,
        "context_id": [1] * 3, "stream_id": [7, 7, 9], "correlation_id": [5, 6, 7],
    })
    trace = Trace.from_frames("t", {"gpu_ops": ops})
    want = schemas.conform(ops.with_columns(pl.lit("t").alias(TRACE_ID)), schemas.GPU_OPS)
    # which columns are kept as constants (the null ones too; not the keys read per row)
    constants = _constant_columns(want.drop(TRACE_ID))
    assert {c: v for c, v in constants.items() if v is not None} == {
        "global_pid": 7 << 24, "context_id": 1}
    assert "graph_node_id" in constants and "device_id" not in constants
    assert "pid" not in constants and "stream_id" not in constants
    got = trace.frame("gpu_ops")
    assert_frame_equal(got, want)
    assert_frame_equal(got.sort("start_ns"), want.sort("start_ns"))
    assert_frame_equal(pl.concat([got, got.filter(pl.col("stream_id") == 9)]),
                       pl.concat([want, want.filter(pl.col("stream_id") == 9)]))
    assert got.group_by("context_id").agg(pl.len()).rows() == [(1, 3)]


def test_an_unknown_frame_names_every_known_one() -> None:
    trace = Trace.from_frames("t", {})
    with pytest.raises(KeyError, match=r"gpu_ops.*cpu_samples"):
        trace.frame("gpu_op")


#: frames big enough on a real trace that a whole-frame filter's expansion matters
_BIG_FRAMES = ("gpu_ops", "cuda_api", "nvtx", "sync", "cpu_samples", "sched")


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_an_analysis_never_filters_joins_or_sorts_a_whole_big_frame(
        scenario: str, tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Polars expands a frame's constant columns (``trace_id`` as `Trace.frame` hands it
    out, the constant columns kept at rest) to one value per row when the whole frame is
    filtered, joined or sorted: 0.5 GB for one filter of cuda_api at 10M kernels. No pass,
    finding or report does that to a big frame as handed out: each selects its columns
    first, or filters inside a select (`_at_rest`)."""
    path = build(scenario, tmp_path)[0]
    _assert_no_whole_frame_filters(lambda: _analyze(path, tmp_path), monkeypatch)


def test_no_whole_big_frame_is_filtered_by_the_memory_pass_or_the_perfetto_trace(
        tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As above, on a trace with CUDA memory events (the memory pass's innermost ranges),
    with the Perfetto trace written too (its GPU and NVTX tracks)."""
    pytest.importorskip("perfetto")
    from nsysan.testing._memory import CASES, memory_case

    path = memory_case(tmp_path / "memory.sqlite", CASES[0])
    _assert_no_whole_frame_filters(lambda: _analyze(path, tmp_path, perfetto=True),
                                   monkeypatch)


def test_no_whole_big_frame_is_filtered_for_the_ranks_of_a_cpu_only_profile(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """As above, for the rank processes of a profile without GPU work (MPI ranks told apart
    by their NVTX ranges), and for the host lanes of the report's timeline."""
    from nsysan.multirank.ranks import rank_processes
    from nsysan.passes import host

    trace = open_trace(FIXTURES / "cpu_nvtx_osrt.sqlite", frame_cache=False)
    _assert_no_whole_frame_filters(lambda: rank_processes(trace), monkeypatch)
    sampled = open_trace(FIXTURES / "cpu_host_sampling.sqlite", frame_cache=False)
    tids = sampled.frame("cpu_samples")["global_tid"].unique()
    _assert_no_whole_frame_filters(lambda: host._host_frames(sampled, tids), monkeypatch)


@pytest.mark.parametrize("scenario", sorted(HOST_SCENARIOS))
def test_no_whole_big_frame_is_filtered_on_the_host_scenarios(
        scenario: str, tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As above, on the planted host-evidence cases (CPU contention, a CPU-bound input...)."""
    path = HOST_SCENARIOS[scenario](tmp_path / f"{scenario}.sqlite")[0]
    _assert_no_whole_frame_filters(lambda: _analyze(path, tmp_path), monkeypatch)


@pytest.mark.parametrize("case", sorted(FINDINGS_CASES))
def test_no_finding_filters_a_whole_big_frame(
        case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """As above, for every rule on the hand-built findings cases: each plants one finding
    (a launch-bound loop, unoverlapped H2D copies...), so that finding's evidence path runs
    (rules whose finding no case plants stop earlier: a slow start has its own test)."""
    from nsysan.findings import diagnose

    trace, results = findings_case(case)
    _assert_no_whole_frame_filters(lambda: diagnose(trace, results), monkeypatch)


def test_no_whole_big_frame_is_filtered_by_a_slow_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """As above, for SLOW_START's calls before the first kernel (a 40 s start-up)."""
    from findings_cases import MS, Case, _steps, healthy

    from nsysan.findings import diagnose

    case: Case = healthy()
    case.api("cuInit", "other", -40_000 * MS, -40_000 * MS + 5 * MS)
    trace, results = case.build(_steps())
    found: list[str] = []
    _assert_no_whole_frame_filters(
        lambda: found.extend(f.code for f in diagnose(trace, results).findings), monkeypatch)
    assert "SLOW_START" in found  # (the path under test ran)


@pytest.mark.shared
@pytest.mark.parametrize("name", ["sc22-ddp-4gpu-nccl/4gpu_baseline.nsys-rep.nsys2022.4.2.sqlite",
                                  "sc23-vit-train-nvtx/4workers.nsys-rep.nsys2023.4.4.sqlite"])
def test_no_whole_big_frame_is_filtered_on_traces_with_host_evidence(
        name: str, shared_traces, tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As above, on real traces whose CPU samples and switches the host pass reads."""
    path = shared_traces / name
    _assert_no_whole_frame_filters(lambda: _analyze(path, tmp_path), monkeypatch)


def _analyze(path, tmp_path, perfetto: bool = False) -> None:
    from nsysan.api import analyze_to_dir

    analyze_to_dir(open_trace(path, frame_cache=False), tmp_path / "out", perfetto=perfetto)


def _assert_no_whole_frame_filters(run, monkeypatch: pytest.MonkeyPatch) -> None:
    handed: dict[int, tuple[str, pl.DataFrame]] = {}  # (the frame kept: its id stays unique)
    real_frame = Trace.frame

    def frame(self: Trace, name: str) -> pl.DataFrame:
        out = real_frame(self, name)
        if name in _BIG_FRAMES:
            handed[id(out)] = (name, out)
        return out

    monkeypatch.setattr(Trace, "frame", frame)
    offenders: list[tuple[str, str]] = []
    for method in ("filter", "join", "sort"):
        real = getattr(pl.DataFrame, method)

        def spy(self: pl.DataFrame, *args, _real=real, _method=method, **kwargs):
            if id(self) in handed:
                offenders.append((handed[id(self)][0], _method))
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(pl.DataFrame, method, spy)
    run()
    assert handed  # the spy saw the frames
    assert offenders == []
