"""The attribution pass: NVTX ranges -> GPU time (inclusive, busy, exclusive) and layers.

Hand-built traces with named cases, a property test against a brute-force oracle, the
synthetic ``layers`` scenario when available, and equality with ``nsys stats -r
nvtxgpuproj`` on every shared trace that has an oracle CSV (and live on one small trace).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import polars as pl
import pytest
from conftest import NO_SHARED, SHARED_TRACES, unavailable
from hypothesis import given, settings
from hypothesis import strategies as st

from nsysan.frames import schemas
from nsysan.frames.trace import Trace
from nsysan.passes import attribution as A

PID = 100


def gtid(pid: int, tid: int) -> int:
    return (pid << 24) | tid


def gpid(pid: int) -> int:
    return pid << 24


class Builder:
    """Tiny in-memory trace: NVTX ranges, API calls and the GPU ops they launch."""

    def __init__(self) -> None:
        self.ranges: list[dict] = []
        self.api: list[dict] = []
        self.ops: list[dict] = []
        self._corr = 0

    def range(self, start: int, end: int, name: str, *, tid: int = 1, pid: int = PID,
              depth: int | None = 0, parent: int | None = None, style: str = "push_pop",
              end_tid: int | None = None, domain: str = "") -> int:
        rid = len(self.ranges) + 1
        self.ranges.append(dict(
            range_id=rid, start_ns=start, end_ns=end, global_tid=gtid(pid, tid),
            global_pid=gpid(pid), pid=pid, tid=tid, domain=domain, name=name, style=style,
            end_global_tid=None if end_tid is None else gtid(pid, end_tid), depth=depth,
            parent_range_id=parent,
        ))
        return rid

    def launch(self, api: tuple[int, int], *ops: tuple[int, int], tid: int = 1, pid: int = PID,
               device: int = 0, corr: int | None = None, name: str = "cudaLaunchKernel",
               kind: str = "kernel", kernel: str = "k") -> int:
        if corr is None:
            self._corr += 1
            corr = self._corr
        self.api.append(dict(
            start_ns=api[0], end_ns=api[1], global_tid=gtid(pid, tid), global_pid=gpid(pid),
            pid=pid, tid=tid, correlation_id=corr, name=name,
        ))
        for s, e in ops:
            self.ops.append(dict(
                kind=kind, start_ns=s, end_ns=e, global_pid=gpid(pid), pid=pid,
                device_id=device, stream_id=7, correlation_id=corr, name=kernel,
                demangled_name=kernel, op_class="compute",
            ))
        return corr

    def trace(self, *, nvtx: bool = True) -> Trace:
        frames = {
            "gpu_ops": pl.DataFrame(self.ops, schema=_schema(schemas.GPU_OPS, self.ops)),
            "cuda_api": pl.DataFrame(self.api, schema=_schema(schemas.CUDA_API, self.api)),
        }
        if nvtx:
            frames["nvtx"] = pl.DataFrame(self.ranges, schema=_schema(schemas.NVTX, self.ranges))
        return Trace.from_frames("t", frames)


def _schema(schema: pl.Schema, rows: list[dict]) -> dict:
    cols = rows[0].keys() if rows else [c for c in schema if c != "trace_id"]
    return {c: schema[c] for c in cols}


def run(b: Builder, **params) -> tuple[pl.DataFrame, pl.DataFrame, dict]:
    res = A.run(b.trace(), A.AttributionParams(**params), {})
    att, layers = res.tables["attribution"], res.tables["layers"]
    assert att.schema == schemas.ATTRIBUTION
    assert layers.schema == schemas.LAYERS
    return att, layers, res.metrics


def row(att: pl.DataFrame, rid: int) -> dict:
    return att.filter(pl.col("range_id") == rid).row(0, named=True)


# ---------------------------------------------------------------------------------------------
# Named cases
# ---------------------------------------------------------------------------------------------


def test_nested_ranges_inclusive_and_exclusive():
    b = Builder()
    outer = b.range(0, 100, "step")
    inner = b.range(10, 50, "forward", depth=1, parent=outer)
    b.launch((20, 25), (30, 60))  # inside both
    b.launch((60, 65), (70, 90))  # inside the outer only
    att, layers, m = run(b)
    o, i = row(att, outer), row(att, inner)
    assert (o["proj_start_ns"], o["proj_end_ns"], o["n_gpu_ops"]) == (30, 90, 2)
    assert (o["gpu_busy_ns"], o["exclusive_gpu_ns"]) == (50, 20)
    assert (i["proj_start_ns"], i["proj_end_ns"], i["n_gpu_ops"]) == (30, 60, 1)
    assert (i["gpu_busy_ns"], i["exclusive_gpu_ns"]) == (30, 30)
    assert (o["cpu_start_ns"], o["cpu_end_ns"], i["depth"], i["parent_range_id"]) == (
        0, 100, 1, outer)
    assert m["coverage_frac"] == 1.0
    assert m["attributed_gpu_ns"] == m["gpu_busy_ns"] == 50
    assert m["top_layer"] == "forward"
    assert layers.filter(pl.col("name") == "forward")["exclusive_frac"].item() == 0.6


@pytest.mark.parametrize(
    ("case", "api", "inside"),
    [
        ("api equals the range (inclusive)", (10, 50), True),
        ("api starts at the range start", (10, 20), True),
        ("api ends at the range end", (40, 50), True),
        ("api straddles the range end", (45, 55), False),
        ("api straddles the range start", (5, 15), False),
        ("api starts at the range end", (50, 52), False),
        ("zero-length api at the range end", (50, 50), True),
        ("api after the range", (60, 61), False),
    ],
)
def test_launch_at_range_boundaries(case, api, inside):
    b = Builder()
    rid = b.range(10, 50, "r")
    b.launch(api, (100, 110))
    att, _, m = run(b)
    assert row(att, rid)["n_gpu_ops"] == (1 if inside else 0), case
    assert m["coverage_frac"] == (1.0 if inside else 0.0), case


def test_ranges_on_other_threads_and_processes_do_not_count():
    b = Builder()
    other_thread = b.range(0, 100, "other thread", tid=2)
    other_process = b.range(0, 100, "other process", pid=PID + 1)
    mine = b.range(0, 100, "mine")
    # The other process reuses correlation id 1: only (global_pid, correlation_id) may match.
    b.launch((10, 20), (30, 40), corr=1)
    b.launch((10, 20), (50, 70), corr=1, pid=PID + 1, tid=9)
    att, _, _ = run(b)
    assert row(att, other_thread)["n_gpu_ops"] == 0
    assert row(att, other_process)["n_gpu_ops"] == 0
    assert (row(att, mine)["n_gpu_ops"], row(att, mine)["gpu_busy_ns"]) == (1, 10)


def test_cross_thread_start_end_range_and_marks_are_excluded():
    b = Builder()
    b.range(0, 100, "crosses threads", style="start_end", end_tid=2)
    b.range(15, 15, "a mark", style="mark", depth=None)
    same = b.range(0, 100, "start/end on one thread", style="start_end")
    b.launch((10, 20), (30, 40))
    att, _, m = run(b)
    assert att["range_id"].to_list() == [same]
    assert row(att, same)["n_gpu_ops"] == 1
    assert m["n_ranges"] == 1


def test_graph_launch_attributes_all_its_kernels():
    b = Builder()
    rid = b.range(0, 100, "graph step")
    b.launch((10, 20), (30, 40), (40, 55), (60, 70), name="cudaGraphLaunch")
    att, layers, _ = run(b)
    r = row(att, rid)
    # nvtxgpuproj counts distinct launches: the graph launch is one op, its kernels all count.
    assert (r["n_gpu_ops"], r["proj_start_ns"], r["proj_end_ns"]) == (1, 30, 70)
    assert (r["gpu_busy_ns"], r["exclusive_gpu_ns"]) == (35, 35)
    assert layers["n_gpu_ops"].to_list() == [1]


def test_concurrent_ops_of_two_ranges_share_time_equally():
    b = Builder()
    a = b.range(0, 10, "a")
    c = b.range(20, 30, "c")
    b.launch((1, 2), (100, 200))
    b.launch((21, 22), (150, 250))  # overlaps [150, 200) on another stream
    att, _, m = run(b)
    assert row(att, a)["exclusive_gpu_ns"] == 75  # 50 alone + 50/2
    assert row(att, c)["exclusive_gpu_ns"] == 75
    assert row(att, a)["gpu_busy_ns"] == 100
    assert att["exclusive_gpu_ns"].sum() == m["attributed_gpu_ns"] == 150


def test_exclusive_rounding_sums_exactly_to_the_union():
    # Three ops overlap on [0, 10): 10/3 ns each cannot be whole; the sum must still be exact.
    b = Builder()
    rids = [b.range(10 * i, 10 * i + 5, f"r{i}") for i in range(3)]
    for i in range(3):
        b.launch((10 * i + 1, 10 * i + 2), (100, 110))
    att, _, m = run(b)
    got = sorted(att.filter(pl.col("range_id").is_in(rids))["exclusive_gpu_ns"].to_list())
    assert got == [3, 3, 4]
    assert m["attributed_gpu_ns"] == 10


def test_two_devices_add_up_and_unattributed_ops_lower_coverage():
    b = Builder()
    rid = b.range(0, 100, "r")
    b.launch((10, 20), (30, 40), device=0)
    b.launch((20, 30), (30, 40), device=1)  # same time, other GPU: GPU-time adds up
    b.launch((200, 210), (300, 340), device=0)  # outside any range
    att, _, m = run(b)
    assert row(att, rid)["gpu_busy_ns"] == 20
    assert row(att, rid)["exclusive_gpu_ns"] == 20
    assert m["gpu_busy_ns"] == 60
    assert m["coverage_frac"] == pytest.approx(20 / 60)


def test_memcpy_and_memset_count_as_gpu_ops():
    b = Builder()
    rid = b.range(0, 100, "copy")
    b.launch((10, 20), (30, 40), kind="memcpy", name="cudaMemcpyAsync")
    b.launch((20, 30), (50, 55), kind="memset", name="cudaMemsetAsync")
    att, _, _ = run(b)
    assert (row(att, rid)["n_gpu_ops"], row(att, rid)["gpu_busy_ns"]) == (2, 15)


def test_empty_ranges_kept_or_dropped():
    b = Builder()
    busy = b.range(0, 100, "busy")
    idle = b.range(200, 300, "idle")
    b.launch((10, 20), (30, 40))
    att, layers, _ = run(b)
    r = row(att, idle)
    assert (r["n_gpu_ops"], r["proj_start_ns"], r["gpu_busy_ns"], r["exclusive_gpu_ns"]) == (
        0, None, 0, 0)
    att2, layers2, _ = run(b, keep_empty_ranges=False)
    assert att2["range_id"].to_list() == [busy]
    assert layers2.height == layers.height == 2


def test_layers_union_same_name_instances_and_count_launches_once():
    b = Builder()
    outer = b.range(0, 100, "block")
    inner = b.range(10, 50, "block", depth=1, parent=outer)  # recursion: same name inside
    later = b.range(200, 300, "block")
    b.launch((20, 25), (30, 60))
    b.launch((210, 220), (230, 240))
    att, layers, _ = run(b)
    assert layers.height == 1
    lay = layers.row(0, named=True)
    assert (lay["instances"], lay["n_gpu_ops"], lay["gpu_busy_ns"]) == (3, 2, 40)
    assert lay["exclusive_gpu_ns"] == att["exclusive_gpu_ns"].sum() == 40
    assert row(att, inner)["exclusive_gpu_ns"] == 30 and row(att, later)["exclusive_gpu_ns"] == 10
    assert lay["exclusive_frac"] == 1.0


def test_domains_are_separate_layers():
    b = Builder()
    b.range(0, 100, "op", domain="NCCL")
    b.range(0, 100, "op", depth=1)
    b.launch((10, 20), (30, 40))
    _, layers, m = run(b)
    assert sorted(layers.select("domain", "name").rows()) == [("", "op"), ("NCCL", "op")]
    assert m["n_layers"] == 2


def test_depth_and_parent_computed_when_the_loader_left_them_null():
    b = Builder()
    outer = b.range(0, 100, "outer", depth=None)
    inner = b.range(10, 50, "inner", depth=None)
    b.launch((20, 30), (30, 40))
    att, _, _ = run(b)
    assert (row(att, outer)["depth"], row(att, outer)["parent_range_id"]) == (0, None)
    assert (row(att, inner)["depth"], row(att, inner)["parent_range_id"]) == (1, outer)
    assert row(att, inner)["exclusive_gpu_ns"] == 10


def test_overlapping_start_end_ranges_are_counted_exactly():
    # Start/end ranges on one thread that overlap without nesting: plain containment.
    b = Builder()
    x = b.range(0, 50, "x", style="start_end")
    y = b.range(30, 100, "y", style="start_end", depth=None)
    b.launch((35, 40), (100, 110))  # inside both
    b.launch((60, 70), (120, 130))  # inside y only
    b.launch((10, 20), (140, 150))  # inside x only
    att, _, m = run(b)
    assert (row(att, x)["n_gpu_ops"], row(att, y)["n_gpu_ops"]) == (2, 2)
    # The op launched inside both belongs (exclusively) to the shorter range, x.
    assert (row(att, x)["exclusive_gpu_ns"], row(att, y)["exclusive_gpu_ns"]) == (20, 10)
    assert m["attributed_gpu_ns"] == 30


@pytest.mark.parametrize(
    ("case", "build", "reason"),
    [
        ("nvtx not captured", lambda b: b.trace(nvtx=False), "not captured"),
        ("only marks", lambda b: (b.range(5, 5, "m", style="mark"), b.trace())[1], "no NVTX"),
        ("ranges on other threads", lambda b: (b.range(0, 9, "r", tid=5), b.trace())[1],
         "launches GPU work"),
        ("all ranges cross threads",
         lambda b: (b.range(0, 9, "r", style="start_end", end_tid=2), b.trace())[1],
         "another thread"),
    ],
)
def test_nvtx_unavailable_reasons(case, build, reason):
    b = Builder()
    b.launch((1, 2), (3, 4))
    res = A.run(build(b), A.AttributionParams(), {})
    assert res.metrics["nvtx_available"] is False, case
    assert reason in res.metrics["nvtx_unavailable_reason"], case
    assert res.tables["attribution"].schema == schemas.ATTRIBUTION
    # Not captured is unknown, never zero; captured-but-outside-ranges is a true zero.
    assert res.metrics["coverage_frac"] == (None if case == "nvtx not captured" else 0.0), case


def test_empty_trace_keeps_schemas():
    res = A.run(Trace.from_frames("t", {}), A.AttributionParams(), {})
    assert res.tables["attribution"].schema == schemas.ATTRIBUTION
    assert res.tables["layers"].schema == schemas.LAYERS
    assert res.tables["attribution"].is_empty()
    assert res.metrics["nvtx_available"] is False
    assert res.metrics["coverage_frac"] is None


# ---------------------------------------------------------------------------------------------
# Property: the pass equals brute force on random single-thread traces
# ---------------------------------------------------------------------------------------------


@st.composite
def random_trace(draw):
    b = Builder()
    n_r = draw(st.integers(1, 6))
    for _ in range(n_r):
        s = draw(st.integers(0, 60))
        b.range(s, s + draw(st.integers(0, 40)), draw(st.sampled_from("abc")),
                style="start_end", depth=None, tid=draw(st.sampled_from([1, 1, 2])))
    for _ in range(draw(st.integers(0, 8))):
        s = draw(st.integers(0, 100))
        ops = [(o, o + draw(st.integers(0, 30)))
               for o in draw(st.lists(st.integers(0, 80), min_size=1, max_size=3))]
        b.launch((s, s + draw(st.integers(0, 5))), *ops, device=draw(st.sampled_from([0, 1])),
                 tid=draw(st.sampled_from([1, 2])))
    return b


def union_len(iv: list[tuple[int, int]]) -> int:
    return len({t for s, e in iv for t in range(s, e)})


@settings(max_examples=80, deadline=None)
@given(random_trace())
def test_attribution_equals_brute_force(b):
    att, layers, m = run(b)
    corr_api = {a["correlation_id"]: a for a in b.api}
    total = sum(union_len([(o["start_ns"], o["end_ns"]) for o in b.ops if o["device_id"] == d])
                for d in (0, 1))
    for r in b.ranges:
        ops = [o for o in b.ops
               if corr_api[o["correlation_id"]]["global_tid"] == r["global_tid"]
               and r["start_ns"] <= corr_api[o["correlation_id"]]["start_ns"]
               and corr_api[o["correlation_id"]]["end_ns"] <= r["end_ns"]]
        got = row(att, r["range_id"])
        assert got["n_gpu_ops"] == len({o["correlation_id"] for o in ops})
        assert got["proj_start_ns"] == min((o["start_ns"] for o in ops), default=None)
        assert got["proj_end_ns"] == max((o["end_ns"] for o in ops), default=None)
        busy = sum(union_len([(o["start_ns"], o["end_ns"]) for o in ops if o["device_id"] == d])
                   for d in (0, 1))
        assert got["gpu_busy_ns"] == busy
        assert 0 <= got["exclusive_gpu_ns"] <= busy
    assert att["exclusive_gpu_ns"].sum() == m["attributed_gpu_ns"] <= total == m["gpu_busy_ns"]
    assert layers["exclusive_gpu_ns"].sum() == m["attributed_gpu_ns"]


# ---------------------------------------------------------------------------------------------
# Planted truth (synthetic nsys-schema SQLite), when the scenario exists
# ---------------------------------------------------------------------------------------------


def test_synthetic_layers_scenario(tmp_path):
    scenarios = pytest.importorskip("nsysan.testing.scenarios")
    if "layers" not in getattr(scenarios, "SCENARIOS", {}):
        pytest.skip("nsysan.testing.scenarios has no `layers` scenario yet")
    from nsysan import open_trace

    path, truth = scenarios.build("layers", tmp_path)
    res = A.run(open_trace(path), A.AttributionParams(), {})
    att = res.tables["attribution"]
    for r in truth.ranges:
        if r.depth < 0:
            continue  # not a same-thread range: not attributed
        got = att.filter(
            (pl.col("name") == r.name) & (pl.col("cpu_start_ns") == r.start_ns)
            & (pl.col("tid") == r.tid)
        ).row(0, named=True)
        assert (got["n_gpu_ops"], got["proj_start_ns"], got["proj_end_ns"]) == (
            r.n_gpu_ops, r.proj_start_ns, r.proj_end_ns), r.name
        assert got["gpu_busy_ns"] == r.gpu_busy_ns, r.name
        assert got["exclusive_gpu_ns"] == r.exclusive_gpu_ns, r.name
    layers = res.tables["layers"]
    for (domain, name), lt in truth.layers.items():
        got = layers.filter((pl.col("domain") == domain) & (pl.col("name") == name)).row(
            0, named=True)
        assert (got["instances"], got["n_gpu_ops"], got["gpu_busy_ns"],
                got["exclusive_gpu_ns"]) == (lt.instances, lt.n_gpu_ops, lt.gpu_busy_ns,
                                             lt.exclusive_gpu_ns), name
    if truth.attribution_coverage_frac is not None:
        assert res.metrics["coverage_frac"] == pytest.approx(truth.attribution_coverage_frac)


# ---------------------------------------------------------------------------------------------
# Nsight Systems' own nvtxgpuproj: stored oracle CSVs and one live run
# ---------------------------------------------------------------------------------------------

ORACLE_KEY = ["PID", "TID", "Orig Start (ns)", "Orig Duration (ns)",
              "Projected Start (ns)", "Projected Duration (ns)", "NumGPUOps"]


def oracle_folders(report: str) -> list[str]:
    """Oracle folders ``<trace dir>__<file stem>`` whose .sqlite is in the shared traces and
    whose ``report`` CSV exists; ``[NO_SHARED]`` when there are none."""
    out = []
    for folder in sorted((SHARED_TRACES.parent / "oracles").glob("*__*")):
        trace_dir, stem = folder.name.split("__", 1)
        if (SHARED_TRACES / trace_dir / f"{stem}.sqlite").exists() and (folder / report).exists():
            out.append(folder.name)
    return out or [NO_SHARED]


def oracle_paths(shared: Path, folder: str, report: str) -> tuple[Path, Path]:
    """(sqlite, oracle CSV) of one oracle folder."""
    if folder == NO_SHARED:
        unavailable(f"no oracle folders with {report} next to {shared}")
    trace_dir, stem = folder.split("__", 1)
    return shared / trace_dir / f"{stem}.sqlite", shared.parent / "oracles" / folder / report


def read_oracle(csv: Path) -> pl.DataFrame:
    """The oracle's rows by content: its RangeId is the SQLite rowid, which nsysan's
    content-derived range_id is not (see nsysan.load.adapters_nvtx)."""
    if csv.stat().st_size == 0:  # nsys printed no rows (no NVTX in the trace)
        return pl.DataFrame(schema={c: pl.Int64 for c in ORACLE_KEY})
    return pl.read_csv(csv, infer_schema_length=None).select(pl.col(ORACLE_KEY).cast(pl.Int64))


def ours_as_oracle(att: pl.DataFrame) -> pl.DataFrame:
    return att.filter(pl.col("n_gpu_ops") > 0).select(
        pl.col("pid").alias("PID"),
        pl.col("tid").alias("TID"),
        pl.col("cpu_start_ns").alias("Orig Start (ns)"),
        (pl.col("cpu_end_ns") - pl.col("cpu_start_ns")).alias("Orig Duration (ns)"),
        pl.col("proj_start_ns").alias("Projected Start (ns)"),
        (pl.col("proj_end_ns") - pl.col("proj_start_ns")).alias("Projected Duration (ns)"),
        pl.col("n_gpu_ops").alias("NumGPUOps"),
    ).cast(pl.Int64)


def assert_matches_oracle(att: pl.DataFrame, oracle: pl.DataFrame, where: str) -> None:
    """The same rows as nvtxgpuproj, as a multiset (every column compared)."""
    ours = ours_as_oracle(att).sort(ORACLE_KEY)
    theirs = oracle.sort(ORACLE_KEY)
    assert ours.height == theirs.height, f"{where}: {ours.height} ranges vs nsys {theirs.height}"
    diff = ours.join(theirs, on=ORACLE_KEY, how="anti", nulls_equal=True)
    assert diff.is_empty(), f"{where}: rows differing from nvtxgpuproj:\n{diff.head()}"
    assert ours.equals(theirs), f"{where}: row multiplicities differ from nvtxgpuproj"


@pytest.mark.shared
@pytest.mark.parametrize("folder", oracle_folders("proj_nvtxgpuproj.csv"))
def test_equals_nvtxgpuproj_oracle(shared_traces, folder):
    from nsysan import open_trace

    sqlite, csv = oracle_paths(shared_traces, folder, "proj_nvtxgpuproj.csv")
    res = A.run(open_trace(sqlite), A.AttributionParams(), {})
    att = res.tables["attribution"]
    assert_matches_oracle(att, read_oracle(csv), folder)
    if res.metrics["nvtx_available"]:
        assert att["exclusive_gpu_ns"].sum() == res.metrics["attributed_gpu_ns"]
        assert res.metrics["attributed_gpu_ns"] <= res.metrics["gpu_busy_ns"]


@pytest.mark.shared
@pytest.mark.nsys
def test_equals_live_nvtxgpuproj(shared_traces, nsys_bin, tmp_path):
    from nsysan import open_trace

    src = shared_traces / "dlprof-pyprof-nvtx" / "nsys_profile.sqlite"
    db = tmp_path / "trace.sqlite"
    shutil.copyfile(src, db)
    db.chmod(0o644)
    proc = subprocess.run(
        [str(nsys_bin), "stats", "-r", "gpukernsum,nvtxgpuproj", "-f", "csv",
         "-o", str(tmp_path / "out"), str(db)],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    oracle = read_oracle(tmp_path / "out_nvtxgpuproj.csv")
    assert oracle.height > 0
    att = A.run(open_trace(src), A.AttributionParams(), {}).tables["attribution"]
    assert_matches_oracle(att, oracle, "live nvtxgpuproj")
