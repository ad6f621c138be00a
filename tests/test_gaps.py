"""The gaps pass: tiny hand-built traces with named edge cases, the Nsight Systems gpu-starv
oracle on the shared traces (stored CSVs and a live run), and planted truth."""

from __future__ import annotations

import csv
import io
import shutil
import subprocess
from pathlib import Path

import polars as pl
import pytest

from nsysan.errors import ConfigError
from nsysan.frames import schemas
from nsysan.frames.trace import Trace
from nsysan.passes import gaps, steps
from nsysan.passes.base import PassResult

MS = 1_000_000
TID = 11  # the launching thread of every op below
#: the correlation id of calls that launched nothing here: a valid CUPTI id (unsigned 32
#: bits) no op of these cases holds
UNLINKED = (1 << 32) - 2


def gtid(pid: int, tid: int = TID) -> int:
    return (pid << 24) | tid


def build(ops=(), apis=(), nvtx=(), osrt=(), overhead=(), sync=()) -> Trace:
    """A trace from short dicts; every op gets a 1 ns launch call on thread ``tid`` (default
    TID) at ``api_s`` (default: the op start, inside busy time, so it never covers a gap)."""
    op_rows, api_rows = [], []
    for i, o in enumerate(ops):
        o = {"dev": 0, "pid": 1, "stream": 7, "cls": "compute", "kind": "kernel", "src": None,
             "name": "k", **o}
        corr = 10_000 + i
        op_rows.append({
            "kind": o["kind"], "start_ns": o["s"], "end_ns": o["e"], "global_pid": o["pid"] << 24,
            "pid": o["pid"], "device_id": o["dev"], "context_id": 1, "stream_id": o["stream"],
            "correlation_id": corr, "name": o["name"], "op_class": o["cls"],
            "src_kind": o["src"], "dst_kind": "device",
        })
        api_s = o.get("api_s", o["s"])  # when the launch call starts (default: op start)
        api_rows.append(
            {"s": api_s, "e": api_s + 1, "name": o.get("api", "cudaLaunchKernel"),
             "cls": o.get("api_class", "launch"), "pid": o["pid"], "corr": corr,
             "tid": o.get("tid", TID)}
        )
    apis = [*api_rows, *apis]
    frames = {
        "gpu_ops": pl.DataFrame(op_rows, schema=schemas.GPU_OPS, strict=False)
        if op_rows else schemas.empty(schemas.GPU_OPS),
        "cuda_api": pl.DataFrame(
            [{"start_ns": a["s"], "end_ns": a["e"], "name": a["name"], "api_class": a["cls"],
              "pid": a.get("pid", 1), "global_pid": a.get("pid", 1) << 24,
              "tid": a.get("tid", TID), "global_tid": gtid(a.get("pid", 1), a.get("tid", TID)),
              "correlation_id": a.get("corr", UNLINKED)} for a in apis],
            schema=schemas.CUDA_API, strict=False,
        ) if apis else schemas.empty(schemas.CUDA_API),
        "nvtx": pl.DataFrame(
            [{"range_id": i, "start_ns": n["s"], "end_ns": n["e"], "name": n["name"],
              "domain": n.get("domain", ""), "style": n.get("style", "push_pop"),
              "pid": n.get("pid", 1), "tid": n.get("tid", TID),
              "global_tid": gtid(n.get("pid", 1), n.get("tid", TID))}
             for i, n in enumerate(nvtx)], schema=schemas.NVTX, strict=False,
        ) if nvtx else schemas.empty(schemas.NVTX),
        "osrt": pl.DataFrame(
            [{"start_ns": r["s"], "end_ns": r["e"], "name": r["name"], "pid": r.get("pid", 1),
              "tid": r.get("tid", TID), "global_tid": gtid(r.get("pid", 1), r.get("tid", TID))}
             for r in osrt], schema=schemas.OSRT, strict=False,
        ) if osrt else schemas.empty(schemas.OSRT),
        "overhead": pl.DataFrame(
            [{"start_ns": r["s"], "end_ns": r["e"], "name": r["name"], "pid": r.get("pid", 1),
              "global_tid": gtid(r.get("pid", 1))} for r in overhead],
            schema=schemas.OVERHEAD, strict=False,
        ) if overhead else schemas.empty(schemas.OVERHEAD),
        "sync": pl.DataFrame(
            [{"start_ns": r["s"], "end_ns": r["e"], "sync_type": r["type"], "pid": 1,
              "global_pid": 1 << 24, "device_id": 0, "correlation_id": r.get("corr", UNLINKED - 4)}
             for r in sync], schema=schemas.SYNC, strict=False,
        ) if sync else schemas.empty(schemas.SYNC),
    }
    return Trace.from_frames("t", frames)


def run_gaps(trace: Trace, results=None, **params) -> PassResult:
    res = gaps.run(trace, gaps.GapsParams(**params), results or {})
    assert res.tables["gaps"].schema == schemas.GAPS
    assert res.tables["gap_summary"].schema == schemas.GAP_SUMMARY
    return res


def spans(res: PassResult, scope: str = "device") -> list[tuple]:
    g = res.tables["gaps"].filter(pl.col("scope") == scope)
    return g.select("pid", "device_id", "stream_id", "start_ns", "end_ns").rows()


def K(s, e, **kw):  # a compute kernel in ms
    return {"s": int(s * MS), "e": int(e * MS), **kw}


# ---------------------------------------------------------------------------------------------
# Where the gaps are
# ---------------------------------------------------------------------------------------------
GAP_CASES = {
    # name: (ops, params, scope, expected (pid, device, stream, start_ms, end_ms))
    "no_ops": ([], {}, "device", []),
    "single_op": ([K(1, 2)], {}, "device", []),
    "touching": ([K(1, 2), K(2, 3)], {}, "device", []),
    "nested": ([K(1, 10), K(2, 3), K(12, 13)], {}, "device", [(None, 0, None, 10, 12)]),
    "unsorted": ([K(12, 13), K(1, 2)], {}, "device", [(None, 0, None, 2, 12)]),
    "below_threshold": ([K(1, 2), K(2.5, 3)], {}, "device", []),
    "exactly_threshold_device_keeps": ([K(1, 2), K(3, 4)], {}, "device",
                                       [(None, 0, None, 2, 3)]),
    "exactly_threshold_process_device_drops": ([K(1, 2), K(3, 4)],
                                               {"scopes": ("process_device",)},
                                               "process_device", []),
    "start_zero_ignored": ([K(0, 0.5), K(5, 6), K(9, 10)], {}, "device",
                           [(None, 0, None, 6, 9)]),
    "multi_device": ([K(1, 2), K(5, 6), K(1, 8, dev=1), K(10, 11, dev=1)], {}, "device",
                     [(None, 0, None, 2, 5), (None, 1, None, 8, 10)]),
    "other_process_fills_device": ([K(1, 2), K(6, 7), K(2, 6, pid=2)], {}, "device", []),
    "process_device_sees_own_gaps": ([K(1, 2), K(6, 7), K(2, 6, pid=2)],
                                     {"scopes": ("process_device",)}, "process_device",
                                     [(1, 0, None, 2, 6)]),
    "stream_scope": ([K(1, 2), K(5, 6), K(2, 5, stream=8)], {"scopes": ("stream",)}, "stream",
                     [(1, 0, 7, 2, 5)]),
}


@pytest.mark.parametrize("name", list(GAP_CASES))
def test_gap_intervals(name):
    ops, params, scope, want = GAP_CASES[name]
    got = spans(run_gaps(build(ops), **params), scope)
    assert got == [(p, d, s, int(a * MS), int(b * MS)) for p, d, s, a, b in want]


OVERHEAD_CASES = {
    "flush_overhead_inside_is_busy": ("CUDA profiling data flush overhead", 3, 5, [(2, 3), (5, 6)]),
    "stop_overhead_inside_is_busy": ("CUDA profiling stop overhead", 2.5, 6, [(2, 2.5)]),
    "2022_flush_name_does_not_count": ("CUDA profiling data flush", 3, 5, [(2, 6)]),
    "not_strictly_inside_does_not_count": ("CUDA profiling overhead", 1, 5, [(2, 6)]),
}


@pytest.mark.parametrize("name", list(OVERHEAD_CASES))
def test_process_device_profiler_overhead(name):
    ov_name, s, e, want = OVERHEAD_CASES[name]
    trace = build([K(1, 2), K(6, 8)], overhead=[{"s": int(s * MS), "e": int(e * MS),
                                                "name": ov_name}])
    res = run_gaps(trace, scopes=("process_device", "device"), min_gap_ns=0)
    got = [(a, b) for *_, a, b in spans(res, "process_device")]
    assert got == [(int(a * MS), int(b * MS)) for a, b in want]
    # Overhead is never busy time in the device scope.
    assert [(a, b) for *_, a, b in spans(res, "device")] == [(2 * MS, 6 * MS)]


# ---------------------------------------------------------------------------------------------
# Why: causes
# ---------------------------------------------------------------------------------------------
OPS = [K(1, 2), K(12, 13)]  # one 10 ms gap [2, 12) ms on device 0
CAUSE_CASES = {
    # name: (extra frames, cause, {column: ns}, cause_frac)
    "nothing": ({}, "no_cuda_activity", {}, 1.0),
    "device_sync": ({"apis": [{"s": 2 * MS, "e": 11 * MS, "name": "cudaDeviceSynchronize",
                               "cls": "sync"}]}, "sync_api", {"sync_api_ns": 9 * MS}, 0.9),
    "stream_wait_event_does_not_block": ({"apis": [{"s": 2 * MS, "e": 11 * MS, "cls": "sync",
                                                    "name": "cudaStreamWaitEvent"}]},
                                         "no_cuda_activity", {}, 1.0),
    "cupti_sync_record": ({"sync": [{"s": 4 * MS, "e": 10 * MS, "type": "stream_sync"}]},
                          "sync_api", {"sync_api_ns": 6 * MS}, 0.6),
    "cupti_stream_wait_event_record": (
        {"sync": [{"s": 4 * MS, "e": 10 * MS, "type": "stream_wait_event"}]},
        "no_cuda_activity", {}, 1.0),
    "sync_memcpy": ({"apis": [{"s": 3 * MS, "e": 8 * MS, "name": "cudaMemcpy",
                               "cls": "memcpy"}]}, "sync_copy", {"sync_copy_ns": 5 * MS}, 0.5),
    "async_memcpy_is_not_sync": ({"apis": [{"s": 3 * MS, "e": 8 * MS, "name": "cudaMemcpyAsync",
                                            "cls": "memcpy"}]}, "no_cuda_activity", {}, 1.0),
    "launch_bound": ({"apis": [{"s": 2 * MS + i * MS, "e": 2 * MS + i * MS + MS // 2,
                                "name": "cudaLaunchKernel", "cls": "launch"} for i in range(10)]},
                     "launch_bound", {"launch_ns": 5 * MS}, 0.5),
    "osrt_on_launching_thread": ({"osrt": [{"s": 0, "e": 20 * MS, "name": "poll"}]},
                                 "osrt_wait", {"osrt_ns": 10 * MS}, 1.0),
    "osrt_on_other_thread_ignored": ({"osrt": [{"s": 0, "e": 20 * MS, "name": "poll", "tid": 99}]},
                                     "no_cuda_activity", {}, 1.0),
    "nvtx_host_range": ({"nvtx": [{"s": 2 * MS, "e": 10 * MS, "name": "DataLoader.__next__"}]},
                        "nvtx_range", {"nvtx_ns": 8 * MS}, 0.8),
    "nvtx_range_that_launched_work_ignored": (
        {"nvtx": [{"s": 0, "e": 20 * MS, "name": "forward"}]}, "no_cuda_activity", {}, 1.0),
    "nvtx_step_range_ignored": ({"nvtx": [{"s": 3 * MS, "e": 11 * MS, "name": "step 3"}]},
                                "no_cuda_activity", {}, 1.0),
    "nvtx_library_domain_ignored": (
        {"nvtx": [{"s": 3 * MS, "e": 11 * MS, "name": "ncclAllReduce", "domain": "NCCL"}]},
        "no_cuda_activity", {}, 1.0),
    "profiler_overhead": ({"overhead": [{"s": 2 * MS, "e": 9 * MS, "name": "CUPTI: Buffer flush"}]},
                          "profiler_overhead", {"overhead_ns": 7 * MS}, 0.7),
    "other_process_ignored": ({"apis": [{"s": 2 * MS, "e": 11 * MS, "pid": 5,
                                         "name": "cudaDeviceSynchronize", "cls": "sync"}]},
                              "no_cuda_activity", {}, 1.0),
    "below_min_share": ({"apis": [{"s": 2 * MS, "e": 2 * MS + MS // 2,
                                   "name": "cudaDeviceSynchronize", "cls": "sync"}]},
                        "no_cuda_activity", {"sync_api_ns": MS // 2}, 0.95),
    "tie_goes_to_first_cause": (
        {"apis": [{"s": 2 * MS, "e": 7 * MS, "name": "cudaStreamSynchronize", "cls": "sync"}],
         "osrt": [{"s": 7 * MS, "e": 12 * MS, "name": "poll"}]},
        "sync_api", {"sync_api_ns": 5 * MS, "osrt_ns": 5 * MS}, 0.5),
    "largest_share_wins": (
        {"apis": [{"s": 2 * MS, "e": 5 * MS, "name": "cudaStreamSynchronize", "cls": "sync"}],
         "nvtx": [{"s": 4 * MS, "e": 12 * MS, "name": "collate"}]},
        "nvtx_range", {"sync_api_ns": 3 * MS, "nvtx_ns": 8 * MS}, 0.8),
    "overlapping_evidence_is_a_union": (
        {"apis": [{"s": 3 * MS, "e": 6 * MS, "name": "cudaStreamSynchronize", "cls": "sync"},
                  {"s": 4 * MS, "e": 8 * MS, "name": "cudaEventSynchronize", "cls": "sync"}]},
        "sync_api", {"sync_api_ns": 5 * MS}, 0.5),
}
NS_COLS = [col for _, col, _ in gaps.CATEGORIES]


@pytest.mark.parametrize("name", list(CAUSE_CASES))
def test_gap_cause(name):
    extra, cause, cov, frac = CAUSE_CASES[name]
    res = run_gaps(build(OPS, **extra))
    row = res.tables["gaps"].row(0, named=True)
    assert (row["start_ns"], row["end_ns"]) == (2 * MS, 12 * MS)
    assert row["cause"] == cause
    assert row["cause_frac"] == pytest.approx(frac)
    assert {c: row[c] for c in NS_COLS} == {c: cov.get(c, 0) for c in NS_COLS}


def test_pageable_async_copy_is_a_sync_copy():
    copy = K(5, 6, kind="memcpy", cls="memcpy_h2d", src="pageable", api="cudaMemcpyAsync",
             api_class="memcpy")
    copy_call = {"s": 2 * MS, "e": 5 * MS, "name": "cudaMemcpyAsync", "cls": "memcpy"}
    trace = build([K(1, 2), copy, K(12, 13)], apis=[copy_call])
    # The auto-generated call at the op start is replaced by a long one: reuse its correlation.
    api = trace.cuda_api.with_columns(
        pl.when(pl.col("correlation_id") == UNLINKED).then(10_001)
        .otherwise(pl.col("correlation_id")).alias("correlation_id")
    )
    trace = Trace.from_frames("t", {"gpu_ops": trace.gpu_ops, "cuda_api": api})
    row = run_gaps(trace).tables["gaps"].row(0, named=True)
    assert (row["start_ns"], row["end_ns"]) == (2 * MS, 5 * MS)
    assert (row["cause"], row["sync_copy_ns"]) == ("sync_copy", 3 * MS)
    assert row["cause_detail"] == "cudaMemcpyAsync pageable (sync_copy) 3.0 ms of 3.0 ms"


def test_cause_detail_names_top_evidence():
    extra = {
        "nvtx": [{"s": 2 * MS, "e": 11 * MS, "name": "DataLoader.__next__"}],
        "osrt": [{"s": 3 * MS, "e": 10 * MS, "name": "poll"},
                 {"s": 10 * MS, "e": 10 * MS + 500_000, "name": "read"}],
    }
    row = run_gaps(build(OPS, **extra)).tables["gaps"].row(0, named=True)
    assert row["cause_detail"] == (
        "DataLoader.__next__ (nvtx) 9.0 ms of 10.0 ms; poll (osrt) 7.0 ms; read (osrt) 0.5 ms"
    )


def test_device_scope_uses_every_process_on_the_device():
    ops = [K(1, 2), K(12, 13), K(0.5, 1, pid=2)]
    sync = {"s": 2 * MS, "e": 11 * MS, "pid": 2, "name": "cudaDeviceSynchronize", "cls": "sync"}
    res = run_gaps(build(ops, apis=[sync]), scopes=("device", "process_device"))
    g = res.tables["gaps"]
    assert g.filter(pl.col("scope") == "device")["cause"].to_list() == ["sync_api"]
    assert g.filter(pl.col("scope") == "process_device")["cause"].to_list() == [
        "no_cuda_activity"
    ]


# ---------------------------------------------------------------------------------------------
# Summary, steps, metrics, params
# ---------------------------------------------------------------------------------------------
def steps_result(windows: list[tuple[int, int]], warm: int = 0) -> dict[str, PassResult]:
    df = pl.DataFrame(
        {"step": list(range(len(windows))), "start_ns": [a for a, _ in windows],
         "end_ns": [b for _, b in windows], "warmup": [i < warm for i in range(len(windows))]}
    )
    return {"steps": PassResult(tables={"steps": schemas.conform(df, schemas.STEPS)})}


def test_summary_buckets_and_totals():
    ops = [K(1, 2), K(4, 5), K(21, 22), K(151, 152), K(152.5, 153)]
    res = run_gaps(build(ops))
    s = res.tables["gap_summary"].row(0, named=True)
    assert (s["span_ns"], s["busy_ns"], s["idle_ns"]) == (152 * MS, 4.5 * MS, 147.5 * MS)
    assert s["idle_frac"] == pytest.approx(147.5 / 152)
    assert (s["n_gaps"], s["gaps_ns"]) == (3, (2 + 16 + 129) * MS)
    assert (s["n_gaps_1_10ms"], s["n_gaps_10_100ms"], s["n_gaps_ge_100ms"]) == (1, 1, 1)
    assert s["recurs_with_steps"] is None and s["steps_with_gap_frac"] is None
    m = res.metrics
    assert m["idle_ns"] == 147.5 * MS and m["gpu_busy_frac"] == pytest.approx(4.5 / 152)
    assert m["n_gaps"] == 3 and m["largest_gap_ns"] == 129 * MS
    assert m["gaps_ns_no_cuda_activity"] == 147 * MS


@pytest.mark.parametrize(
    ("gap_steps", "warm", "frac", "recurs"),
    [
        ((0, 1, 2, 3), 0, 1.0, True),
        ((0, 2), 0, 0.5, True),
        ((0,), 1, 0.0, False),  # the only gap is in the warm-up step
        ((1,), 0, 0.25, False),
    ],
)
def test_gaps_get_steps_and_recurrence(gap_steps, warm, frac, recurs):
    ops = []
    for k in range(4):  # step k = [10k + 1, 10k + 11) ms, busy except a planted 3 ms gap
        ops.append(K(10 * k + 1, 10 * k + 6))
        ops.append(K(10 * k + (9 if k in gap_steps else 6), 10 * k + 11))
    res = run_gaps(build(ops), steps_result([((10 * k + 1) * MS, (10 * k + 11) * MS)
                                             for k in range(4)], warm))
    assert res.tables["gaps"]["step"].to_list() == list(gap_steps)
    s = res.tables["gap_summary"].row(0, named=True)
    assert s["steps_with_gap_frac"] == pytest.approx(frac)
    assert s["recurs_with_steps"] is recurs


def test_regular_period_without_steps():
    regular = [K(10 * k + 1, 10 * k + 6) for k in range(6)]
    s = run_gaps(build(regular)).tables["gap_summary"].row(0, named=True)
    assert s["recurs_with_steps"] is True
    irregular = [K(t, t + 1) for t in (1, 4, 20, 22, 40, 70)]
    s = run_gaps(build(irregular)).tables["gap_summary"].row(0, named=True)
    assert s["recurs_with_steps"] is None


def test_empty_trace_has_every_table():
    res = run_gaps(build(), scopes=("device", "stream", "process_device"))
    assert res.tables["gaps"].is_empty() and res.tables["gap_summary"].is_empty()
    assert res.metrics["n_gaps"] == 0


@pytest.mark.parametrize(
    "kwargs",
    [{"scopes": ("gpu",)}, {"scopes": ()}, {"min_gap_ns": -1}, {"top_n": 0},
     {"min_cause_frac": 2.0}],
)
def test_bad_params_raise_config_error(kwargs):
    with pytest.raises(ConfigError):
        gaps.GapsParams(**kwargs)


# ---------------------------------------------------------------------------------------------
# Oracle: nsys analyze -r gpu-starv, stored CSVs and one live run
# ---------------------------------------------------------------------------------------------
STARV_CSV = "starv_gpu-starv_gap=1_rows=1000000.csv"


def _oracle_rows(text: str) -> list[tuple[int, int, int, int]]:
    lines = text.splitlines()
    head = next((i for i, line in enumerate(lines) if line.startswith("Row#")), None)
    if head is None:
        return []
    rows = csv.DictReader(io.StringIO("\n".join(lines[head:])))
    return [(int(r["Duration (ns)"]), int(r["Start (ns)"]), int(r["PID"]), int(r["Device ID"]))
            for r in rows]


def _nsysan_rows(path: Path) -> list[tuple[int, int, int, int]]:
    from nsysan.load import open_trace

    res = run_gaps(open_trace(path), scopes=("process_device",), min_gap_ns=MS)
    g = res.tables["gaps"].sort(["duration_ns", "start_ns"], descending=[True, False])
    return g.select("duration_ns", "start_ns", "pid", "device_id").rows()


def _oracle_cases(shared: Path) -> list[tuple[Path, Path]]:
    oracles = shared.parent / "oracles"
    cases = []
    for trace in sorted(shared.glob("*/*.sqlite")):
        folder = oracles / f"{trace.parent.name}__{trace.name.removesuffix('.sqlite')}"
        if (folder / STARV_CSV).exists():
            cases.append((trace, folder / STARV_CSV))
    return cases


@pytest.mark.shared
def test_process_device_gaps_equal_gpu_starv_oracle(shared_traces):
    cases = _oracle_cases(shared_traces)
    assert len(cases) >= 10
    for trace, oracle in cases:
        want = _oracle_rows(oracle.read_text())
        assert _nsysan_rows(trace) == want, trace.name


@pytest.mark.shared
@pytest.mark.nsys
def test_process_device_gaps_equal_live_gpu_starv(shared_traces, nsys_bin, tmp_path):
    src = shared_traces / "quasiben-nvtx-2020" / "cudf.sqlite"
    copy = tmp_path / src.name  # nsys writes next to its input
    shutil.copy(src, copy)
    out = subprocess.run(
        [str(nsys_bin), "analyze", "-r", "gpu-starv:gap=1:rows=1000000", "-f", "csv", str(copy)],
        capture_output=True, text=True, timeout=300, check=True,
    )
    want = _oracle_rows(out.stdout)
    assert len(want) >= 10
    assert _nsysan_rows(copy) == want


# ---------------------------------------------------------------------------------------------
# Planted truth (synthetic nsys exports with known gaps and causes)
# ---------------------------------------------------------------------------------------------
PLANTED = ["starved_input", "exposed_allreduce", "comm_gap_180ms", "sync_in_loop",
           "pageable_copies"]


def analyze_planted(name: str, layout: str, directory: Path):
    """(truth, gaps result) of a planted scenario, read through the loader."""
    from nsysan.load import open_trace
    from nsysan.testing import scenarios

    path, truth = scenarios.build(name, directory, layout)
    trace = open_trace(path)
    st = steps.run(trace, steps.StepsParams(), {})
    return truth, run_gaps(trace, {"steps": st}, scopes=("device", "process_device"))


@pytest.mark.parametrize("layout", ["2022.4", "2023.4"])
@pytest.mark.parametrize("name", PLANTED)
def test_planted_gaps_and_causes(name, layout, tmp_path):
    truth, res = analyze_planted(name, layout, tmp_path)
    g = res.tables["gaps"]
    for scope, dev_truth in (("device", truth.devices[0]),
                             ("process_device", truth.process_devices[(4242, 0)])):
        got = g.filter(pl.col("scope") == scope).select("start_ns", "end_ns").rows()
        strict = [(a, b) for a, b in dev_truth.gaps if b - a > MS]  # gpu-starv: > threshold
        assert got == (dev_truth.gaps_at_least(MS) if scope == "device" else strict)
    dev = g.filter(pl.col("scope") == "device")
    assert dev.select("start_ns", "end_ns").rows() == [
        (p.start_ns, p.end_ns) for p in truth.planted_gaps
    ]
    for row, planted in zip(dev.iter_rows(named=True), truth.planted_gaps, strict=True):
        assert row["cause"] == planted.cause
        for col in ("sync_api_ns", "sync_copy_ns", "launch_ns", "osrt_ns"):
            assert row[col] == getattr(planted, col), col
        # Truth counts every non-step range; nsysan leaves out ranges that launched GPU work
        # (here "forward", whose first launch ends the gap), so compare the host-only ranges.
        assert row["nvtx_ns"] == sum(
            ns for rng, ns in planted.ranges.items() if rng == "DataLoader.__next__"
        )
        # Planted truth numbers the CPU step whose host activity caused the gap; nsysan's step
        # is the GPU window holding the gap start, i.e. the same step or the one before it.
        assert row["step"] in (planted.step, planted.step - 1)
    summ = res.tables["gap_summary"].filter(pl.col("scope") == "device").row(0, named=True)
    assert (summ["span_ns"], summ["busy_ns"]) == (truth.devices[0].span_ns,
                                                  truth.devices[0].busy_ns)
    if truth.planted_gaps:
        assert summ["recurs_with_steps"] is (summ["steps_with_gap_frac"] >= 0.5)


def test_steps_regex_shared_with_nvtx_exclusion():
    # The gaps pass ignores step-like NVTX ranges using the steps pass's own pattern.
    assert gaps.STEP_NAME_PATTERN is steps.STEP_NAME_PATTERN
