"""The synthetic trace builder and its scenarios: real nsys-schema files, exact planted truth.

What is proven here:
- every scenario builds, deterministically, in both layouts, as a small SQLite file whose tables
  and columns are those of real nsys 2022.4 / 2023.4 exports (checked against the DDL read from
  real exports in ../shared/research/ddl);
- the identity, string, correlation and NVTX conventions hold (globalTid encoding, StringIds,
  per-process correlation ids, domains, registered strings, start/end ranges);
- the planted truth agrees with itself (scenario construction vs a naive sweep) and with the
  file (SQL over the written rows);
- Nsight Systems itself reads the files and computes the planted numbers: `nsys stats -r
  gpukernsum` (kernel totals), `nsys analyze -r gpu-starv` (gaps) and `nsys stats -r
  nvtxgpuproj` (NVTX projection);
- the committed fixtures (recorded CPU trace, synthetic examples) are what their README says.
"""

from __future__ import annotations

import csv
import hashlib
import importlib.util
import re
import sqlite3
import subprocess
from pathlib import Path

import pytest
from conftest import REPO_ROOT, unavailable

from nsysan.errors import ConfigError
from nsysan.testing import kernels as K
from nsysan.testing import scenarios
from nsysan.testing._model import SYNC_KINDS
from nsysan.testing.synth import TraceBuilder, global_tid
from nsysan.testing.truth import PlantedTruth, complement, states, total, union

LAYOUTS = ("2022.4", "2023.4")
NAMES = list(scenarios.SCENARIOS)
RESEARCH_DDL = REPO_ROOT.parent / "shared" / "research" / "ddl"
DDL_FILES = {
    "2022.4": "ddl_nsys-2022.4.2_schema-3.0.0_lazy-false.sql",
    "2023.4": "ddl_nsys-2023.4.4_schema-3.7.2_lazy-false.sql",
}
FIXTURES = REPO_ROOT / "fixtures"
MS = 1_000_000


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[tuple[str, str], tuple[Path, PlantedTruth]]:
    out = tmp_path_factory.mktemp("synth")
    return {(n, lay): scenarios.build(n, out, lay) for n in NAMES for lay in LAYOUTS}


@pytest.fixture(scope="module")
def research_ddl() -> Path:
    """../shared/research/ddl (skips locally, fails under CI=true when absent)."""
    if not all((RESEARCH_DDL / f).is_file() for f in DDL_FILES.values()):
        unavailable(f"nsys DDL research files not found in {RESEARCH_DDL}")
    return RESEARCH_DDL


def rows(path: Path, sql: str, *args) -> list[tuple]:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return con.execute(sql, args).fetchall()
    finally:
        con.close()


def tables(path: Path) -> list[str]:
    return [r[0] for r in rows(path, "SELECT name FROM sqlite_master WHERE type = 'table'")]


def table_info(con: sqlite3.Connection, table: str) -> list[tuple]:
    """(name, type, notnull, pk) of each column, in order."""
    return [(r[1], r[2], r[3], r[5]) for r in con.execute(f"PRAGMA table_info({table})")]


# -- the files ---------------------------------------------------------------------------------
LAYOUT_TABLES = {  # present in one layout, absent in the other
    "2022.4": {"EXPORT_META_DATA", "TARGET_INFO_CUDA_NULL_STREAM", "ENUM_CUDA_KRENEL_LAUNCH_TYPE"},
    "2023.4": {
        "META_DATA_EXPORT",
        "META_DATA_CAPTURE",
        "TARGET_INFO_CUDA_CONTEXT_INFO",
        "ENUM_CUDA_KERNEL_LAUNCH_TYPE",
        "ENUM_CUPTI_STREAM_TYPE",
    },
}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", NAMES)
def test_scenario_is_a_small_nsys_export(built, name, layout):
    path, truth = built[(name, layout)]
    assert path.stat().st_size < 1 << 20
    assert rows(path, "PRAGMA integrity_check") == [("ok",)]
    have = set(tables(path))
    other = "2023.4" if layout == "2022.4" else "2022.4"
    assert LAYOUT_TABLES[layout] <= have
    assert not LAYOUT_TABLES[other] & have
    for table, n in truth.counts.items():
        if table.isupper():
            got = rows(path, f"SELECT count(*) FROM {table}")[0][0] if table in have else 0
            assert got == n, table
    meta = "EXPORT_META_DATA" if layout == "2022.4" else "META_DATA_EXPORT"
    version = dict(rows(path, f"SELECT name, value FROM {meta}"))
    assert version["EXPORT_SCHEMA_VERSION"] == {"2022.4": "3.0.0", "2023.4": "3.7.2"}[layout]
    assert rows(path, "SELECT duration FROM ANALYSIS_DETAILS") == [(truth.duration_ns,)]
    green = [
        c
        for c, *_ in rows(path, "SELECT name FROM pragma_table_info('CUPTI_ACTIVITY_KIND_KERNEL')")
    ]
    assert ("greenContextId" in green) == (layout == "2023.4")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_columns_match_real_nsys_ddl(built, research_ddl, layout, tmp_path):
    """Every table we write has the real export's columns: names, order, types, NOT NULL, key."""
    real = sqlite3.connect(":memory:")
    real.executescript((research_ddl / DDL_FILES[layout]).read_text())
    full, _ = scenarios.layers(tmp_path / "full.sqlite", layout, lazy=False)
    paths = [full] + [p for (_, lay), (p, _) in built.items() if lay == layout]
    checked = set()
    for path in paths:
        con = sqlite3.connect(path)
        for table in tables(path):
            assert table_info(con, table) == table_info(real, table), f"{path.name}: {table}"
            checked.add(table)
        con.close()
    real.close()
    assert len(checked) >= 30  # lazy=False wrote every table the builder knows


def test_lazy_export_omits_empty_tables(built, tmp_path):
    path, _ = built[("healthy", "2022.4")]  # no OS runtime, no sync, no memset
    eager, _ = scenarios.healthy(tmp_path / "eager.sqlite", lazy=False)
    for table in ("OSRT_API", "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", "CUPTI_ACTIVITY_KIND_MEMSET"):
        assert table not in tables(path)
        assert rows(eager, f"SELECT count(*) FROM {table}") == [(0,)]
    assert dict(rows(eager, "SELECT name, value FROM EXPORT_META_DATA"))["EXPORT_LAZY"] == "false"


def test_builds_are_deterministic(tmp_path):
    def digest(p: Path) -> str:
        return hashlib.sha256(p.read_bytes()).hexdigest()

    a, ta = scenarios.starved_input(tmp_path / "a.sqlite", seed=3)
    # same name elsewhere (the file name is part of the export metadata), same seed
    b, tb = scenarios.starved_input(tmp_path / "again" / "a.sqlite", seed=3)
    c, tc = scenarios.starved_input(tmp_path / "c.sqlite", seed=4)
    assert digest(a) == digest(b) and ta.summary() == tb.summary()
    assert digest(a) != digest(c) and ta.devices[0].busy_ns != tc.devices[0].busy_ns
    assert [g.duration_ns for g in tc.planted_gaps] == [g.duration_ns for g in ta.planted_gaps]


# -- nsys conventions --------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_identity_strings_and_launch_links(built, name):
    path, truth = built[(name, "2022.4")]
    assert rows(path, "SELECT id, value FROM StringIds WHERE id < 3") == [
        (0, "[Unknown]"),
        (1, "[kernel.kallsyms]"),
        (2, "[Max depth]"),
    ]
    for table, col in [
        ("CUPTI_ACTIVITY_KIND_KERNEL", "demangledName"),
        ("CUPTI_ACTIVITY_KIND_KERNEL", "shortName"),
        ("CUPTI_ACTIVITY_KIND_RUNTIME", "nameId"),
        ("ThreadNames", "nameId"),
    ]:
        dangling = f"SELECT count(*) FROM {table} t LEFT JOIN StringIds s ON s.id = t.{col} "
        assert rows(path, dangling + "WHERE s.id IS NULL") == [(0,)], (table, col)
    # globalTid = HW:8 VM:8 PID:24 TID:24 with VM = 1, HW = 0 (local capture)
    pids = {p for p, _ in truth.process_devices}
    for (g,) in rows(path, "SELECT DISTINCT globalTid FROM CUPTI_ACTIVITY_KIND_RUNTIME"):
        assert g >> 48 == 1 and (g >> 24) & 0xFFFFFF in pids and g & 0xFFFFFF in pids
    # every GPU op joins exactly one launch call of its own process, which starts before it
    for table in ("KERNEL", "MEMCPY", "MEMSET"):
        t = f"CUPTI_ACTIVITY_KIND_{table}"
        if t not in tables(path):
            continue
        joined = rows(
            path,
            f"SELECT o.start, count(r.start), max(r.start) FROM {t} o LEFT JOIN "
            "CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = o.correlationId "
            "AND (r.globalTid & 0xFFFFFFFFFF000000) = o.globalPid GROUP BY o.rowid",
        )
        assert joined and all(n == 1 and api < start for start, n, api in joined), t
    names = [
        n
        for (n,) in rows(
            path,
            "SELECT DISTINCT s.value FROM CUPTI_ACTIVITY_KIND_RUNTIME r "
            "JOIN StringIds s ON s.id = r.nameId",
        )
    ]
    assert all(re.search(r"_v\d{4,}$", n) or n.startswith("cu") for n in names), names


def test_correlation_ids_collide_across_processes(built):
    path, truth = built[("multi_device", "2022.4")]
    pids = rows(
        path, "SELECT DISTINCT (globalPid >> 24) & 0xFFFFFF FROM CUPTI_ACTIVITY_KIND_KERNEL"
    )
    assert sorted(p for (p,) in pids) == [6101, 6102]
    shared = rows(
        path,
        "SELECT count(*) FROM (SELECT correlationId FROM CUPTI_ACTIVITY_KIND_RUNTIME "
        "GROUP BY correlationId HAVING count(DISTINCT globalTid >> 24) = 2)",
    )[0][0]
    assert shared > 100  # a reader joining on correlationId alone gets wrong matches
    ctx = rows(
        path, "SELECT DISTINCT globalPid, contextId, streamId FROM CUPTI_ACTIVITY_KIND_KERNEL"
    )
    assert {(c, s) for _, c, s in ctx if s == 7} == {(1, 7)} and len(ctx) == 4
    assert set(truth.devices) == {0, 1} and set(truth.process_devices) == {(6101, 0), (6102, 1)}


def test_graph_launch_kernels_share_the_launch_correlation_id(built):
    path, truth = built[("layers", "2023.4")]
    graph = rows(
        path,
        "SELECT s.value, count(*), count(k.graphNodeId) FROM CUPTI_ACTIVITY_KIND_KERNEL k "
        "JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId "
        "JOIN StringIds s ON s.id = r.nameId GROUP BY k.correlationId HAVING count(*) > 1",
    )
    assert graph == [("cudaGraphLaunch_v10000", 3, 3)] * 2
    assert truth.extra["graph_kernels"] == 6


def test_sync_rows_use_the_capture_era_numbering(built):
    path, _ = built[("sync_in_loop", "2022.4")]
    got = rows(
        path,
        "SELECT s.value, y.syncType, y.streamId = 4294967295, y.eventId = 4294967295 "
        "FROM CUPTI_ACTIVITY_KIND_SYNCHRONIZATION y JOIN CUPTI_ACTIVITY_KIND_RUNTIME r "
        "ON r.correlationId = y.correlationId JOIN StringIds s ON s.id = r.nameId "
        "GROUP BY 1, 2, 3, 4 ORDER BY 1",
    )
    assert got == [
        ("cudaDeviceSynchronize_v3020", SYNC_KINDS["context"][1], 1, 1),
        ("cudaStreamSynchronize_v3020", SYNC_KINDS["stream"][1], 0, 1),
    ]
    assert [SYNC_KINDS[k][1] for k in ("context", "event", "stream")] == [1, 2, 3]


def test_nvtx_encoding(built):
    path, truth = built[("layers", "2022.4")]
    by_type = dict(rows(path, "SELECT eventType, count(*) FROM NVTX_EVENTS GROUP BY 1"))
    n_ranges = truth.counts["nvtx_ranges"]
    assert by_type[59] + by_type[60] == n_ranges and by_type[34] == truth.counts["nvtx_marks"]
    assert rows(path, "SELECT text, domainId FROM NVTX_EVENTS WHERE eventType = 75") == [
        ("nsysan.model", 1)
    ]
    registered = rows(
        path,
        "SELECT DISTINCT s.value, e.domainId FROM NVTX_EVENTS e JOIN StringIds s "
        "ON s.id = e.textId WHERE e.text IS NULL ORDER BY 1",
    )
    assert registered == [("Linear", 1), ("ReLU", 0)]
    se = rows(
        path, "SELECT rangeId, endGlobalTid IS NOT NULL FROM NVTX_EVENTS WHERE eventType = 60"
    )
    assert [r for r, _ in se] == [1, 2, 3] and [x for _, x in se] == [0, 0, 1]
    assert rows(path, "SELECT count(*) FROM NVTX_EVENTS WHERE eventType = 34 AND end IS NULL") == [
        (2,)
    ]


# -- planted truth -----------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_truth_is_self_consistent(built, name):
    _, truth = built[(name, "2022.4")]
    planted = sorted((g.device_id, g.start_ns, g.end_ns) for g in truth.planted_gaps)
    swept = sorted(
        (d, s, e)
        for d, t in truth.devices.items()
        for s, e in t.gaps_at_least(truth.gap_threshold_ns)
    )
    assert planted == swept
    for t in [*truth.devices.values(), *truth.process_devices.values()]:
        assert sum(t.states.values()) == t.span_ns
        assert t.states.get("idle", 0) == t.idle_ns == sum(e - s for s, e in t.gaps)
        assert t.exposed_nccl_ns == sum(
            v
            for k, v in t.states.items()
            if k == "nccl" or ("nccl" in k.split("+") and "compute" not in k.split("+"))
        )
    for d, per_step in truth.exposed_nccl_per_step_ns.items():
        assert sum(per_step) == truth.devices[d].exposed_nccl_ns
    assert truth.kernels and all(k.count > 0 for k in truth.kernels.values())


def test_scenario_headlines(built):
    t = {n: built[(n, "2023.4")][1] for n in NAMES}
    h = t["healthy"].device()
    assert 0.96 < h.busy_ns / h.span_ns < 0.98 and not h.gaps_at_least(MS)
    assert h.nccl_ns > 0 and h.exposed_nccl_ns == 0
    assert h.h2d_ns > 0 and h.h2d_unoverlapped_ns == 0
    s = t["starved_input"]
    assert [g.duration_ns for g in s.planted_gaps] == [25 * MS] * 3
    assert all(g.ranges["DataLoader.__next__"] > 0.99 * g.duration_ns for g in s.planted_gaps)
    assert all(0.8 * g.duration_ns < g.osrt_ns < g.duration_ns for g in s.planted_gaps)
    assert t["comm_gap_180ms"].exposed_nccl_per_step_ns[0] == [180 * MS] * 4
    lb = t["launch_bound"]
    assert lb.extra["n_kernels"] == 2000 and lb.extra["launch_api_ns"] > 3 * lb.extra["kernel_ns"]
    assert (
        max(e - s for s, e in lb.device().gaps) < 300_000
        and lb.device().busy_ns < 0.3 * lb.device().span_ns
    )
    p = t["pageable_copies"]
    assert len(p.planted_gaps) == 5 and all(
        g.sync_copy_ns > 0.9 * g.duration_ns for g in p.planted_gaps
    )
    y = t["sync_in_loop"]
    assert len(y.planted_gaps) == 9 and all(g.sync_api_ns == 1_500_000 for g in y.planted_gaps)
    m = t["multi_device"]
    assert [(g.pid, g.device_id, g.duration_ns) for g in m.planted_gaps] == [(6102, 1, 12 * MS)]
    assert m.exposed_nccl_per_step_ns[0][3] > 12 * MS  # rank 0 waits for the straggler
    lay = t["layers"]
    attributed = sum(r.exclusive_gpu_ns for r in lay.ranges)
    assert attributed + lay.extra["unattributed_ns"] == lay.device().busy_ns
    assert lay.attribution_coverage_frac == pytest.approx(attributed / lay.device().busy_ns)
    assert {r.depth for r in lay.ranges} == {-1, 0, 1, 2}


@pytest.mark.parametrize("name", ["healthy", "multi_device", "layers", "launch_bound"])
def test_truth_matches_the_written_rows(built, name):
    """The file holds exactly the planted work: SQL over it reproduces the truth."""
    path, truth = built[(name, "2023.4")]
    sums = rows(
        path,
        "SELECT s.value, count(*), sum(k.end - k.start) FROM CUPTI_ACTIVITY_KIND_KERNEL k "
        "JOIN StringIds s ON s.id = k.demangledName GROUP BY 1",
    )
    assert {n: (c, t) for n, c, t in sums} == {
        k.demangled_name: (k.count, k.total_ns) for k in truth.kernels.values()
    }
    for d, dev in truth.devices.items():
        spans = [
            (s, e)
            for t in ("KERNEL", "MEMCPY", "MEMSET")
            if f"CUPTI_ACTIVITY_KIND_{t}" in tables(path)
            for s, e in rows(
                path, f"SELECT start, end FROM CUPTI_ACTIVITY_KIND_{t} WHERE deviceId = ?", d
            )
        ]
        assert total(spans) == dev.busy_ns
        assert complement(spans, *dev.span) == dev.gaps


def test_oracle_helpers_on_named_cases():
    assert union([(5, 6), (0, 2), (2, 3), (4, 4)]) == [(0, 3), (5, 6)]  # touching merge, empty drop
    assert complement([(2, 3), (5, 9)], 0, 8) == [(0, 2), (3, 5)]
    assert complement([], 1, 4) == [(1, 4)]

    class Op:
        def __init__(self, s, e, c):
            self.start_ns, self.end_ns, self.op_class = s, e, c

    got = states([Op(0, 10, "compute"), Op(5, 15, "nccl"), Op(20, 25, "memcpy_h2d")], 0, 25)
    assert got == {"compute": 5, "compute+nccl": 5, "nccl": 5, "idle": 5, "h2d": 5}


# -- builder errors ----------------------------------------------------------------------------
def _builder() -> tuple[TraceBuilder, int]:
    b = TraceBuilder()
    return b, b.add_process(10)


@pytest.mark.parametrize(
    "case, action",
    [
        ("unknown layout", lambda b, g, p: b.write(p, "2024.1")),
        ("reversed interval", lambda b, g, p: b.add_kernel(g, 10_000, 5_000, K.ADD)),
        (
            "launch after the kernel",
            lambda b, g, p: b.add_kernel(g, 10_000, 20_000, K.ADD, api_start=10_000),
        ),
        ("unknown process", lambda b, g, p: b.add_osrt(global_tid(11, 11), 0, 5, "poll")),
        ("duplicate process", lambda b, g, p: b.add_process(10)),
        ("bad sync kind", lambda b, g, p: b.add_sync(g, 0, 5, kind="device")),
        ("cross-thread push/pop", lambda b, g, p: b.add_nvtx_range(g, 0, 5, "r", end_gtid=g + 1)),
        ("bad copy kind", lambda b, g, p: b.add_memcpy(g, 9_000, 9_500, kind="H2D")),
        (
            "sync copy ends early",
            lambda b, g, p: b.add_memcpy(g, 20_000, 30_000, sync=True, api_end=25_000),
        ),
    ],
)
def test_builder_rejects_impossible_traces(case, action, tmp_path):
    b, g = _builder()
    with pytest.raises(ConfigError):
        action(b, g, tmp_path / "x.sqlite")


def test_unknown_scenario_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="unknown scenario"):
        scenarios.build("nope", tmp_path)


# -- Nsight Systems reads the files and finds the planted numbers --------------------------------
def nsys_csv(nsys: Path, args: list[str], out: Path) -> list[dict[str, str]]:
    """Run ``nsys stats`` / ``nsys analyze`` with CSV output into ``out``; return the rows."""
    res = subprocess.run(
        [str(nsys), *args, "-f", "csv", "--force-overwrite=true", "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    found = sorted(out.parent.glob(out.name + "_*.csv"))
    assert len(found) <= 1, found
    return list(csv.DictReader(found[0].read_text().splitlines())) if found else []


@pytest.mark.nsys
@pytest.mark.parametrize(
    "name, layout",
    [
        ("healthy", "2022.4"),
        ("launch_bound", "2022.4"),
        ("multi_device", "2022.4"),
        ("layers", "2023.4"),
    ],
)
def test_nsys_gpukernsum_equals_planted_kernel_totals(built, nsys_bin, name, layout, tmp_path):
    path, truth = built[(name, layout)]
    got: dict[str, list[int]] = {}
    for r in nsys_csv(nsys_bin, ["stats", "-r", "gpukernsum", str(path)], tmp_path / "k"):
        g = got.setdefault(r["Name"], [0, 0])  # this version groups by name and geometry
        g[0] += int(r["Instances"])
        g[1] += int(r["Total Time (ns)"])
    assert got == {k.demangled_name: [k.count, k.total_ns] for k in truth.kernels.values()}


@pytest.mark.nsys
@pytest.mark.parametrize(
    "name", ["starved_input", "sync_in_loop", "pageable_copies", "multi_device", "healthy"]
)
def test_nsys_gpu_starvation_equals_planted_gaps(built, nsys_bin, name, tmp_path):
    """nsys's rule reports gaps > 1 ms per (process, device): exactly the planted ones."""
    path, truth = built[(name, "2022.4")]
    got = nsys_csv(
        nsys_bin, ["analyze", "-r", "gpu-starv:gap=1:rows=1000000", str(path)], tmp_path / "g"
    )
    assert sorted(
        (int(r["PID"]), int(r["Device ID"]), int(r["Start (ns)"]), int(r["Duration (ns)"]))
        for r in got
    ) == sorted((g.pid, g.device_id, g.start_ns, g.duration_ns) for g in truth.planted_gaps)


@pytest.mark.nsys
def test_nsys_nvtxgpuproj_equals_planted_projection(built, nsys_bin, tmp_path):
    path, truth = built[("layers", "2022.4")]
    got = nsys_csv(nsys_bin, ["stats", "-r", "nvtxgpuproj", str(path)], tmp_path / "p")
    assert sorted(
        (
            r["Name"],
            int(r["Orig Start (ns)"]),
            int(r["Projected Start (ns)"]),
            int(r["Projected Duration (ns)"]),
            int(r["NumGPUOps"]),
            int(r["Lvl"]),
        )
        for r in got
    ) == sorted(
        (
            t.qualified_name,
            t.start_ns,
            t.proj_start_ns,
            t.proj_end_ns - t.proj_start_ns,
            t.n_gpu_ops,
            t.depth,
        )
        for t in truth.ranges
        if t.n_gpu_ops and t.proj_start_ns is not None and t.proj_end_ns
    )


# -- committed fixtures ------------------------------------------------------------------------
def test_recorded_cpu_fixture_is_what_the_readme_says():
    rep, db = FIXTURES / "cpu_nvtx_osrt.nsys-rep", FIXTURES / "cpu_nvtx_osrt.sqlite"
    assert rep.stat().st_size < 1 << 20 and db.stat().st_size < 1 << 20
    meta = dict(rows(db, "SELECT name, value FROM EXPORT_META_DATA"))
    assert (meta["EXPORT_PRODUCT_VERSION"], meta["EXPORT_SCHEMA_VERSION"]) == (
        "2022.4.2.1",
        "3.0.0",
    )
    by_type = dict(rows(db, "SELECT eventType, count(*) FROM NVTX_EVENTS GROUP BY 1"))
    assert by_type == {33: 1, 34: 4, 39: 3, 59: 26, 60: 2, 75: 1, 76: 1}
    assert rows(
        db, "SELECT count(*) FROM NVTX_EVENTS WHERE textId IS NOT NULL AND text IS NULL"
    ) == [(4,)]
    assert rows(
        db, "SELECT text, int64Value FROM NVTX_EVENTS WHERE eventType = 60 AND endGlobalTid IS NULL"
    ) == [("setup", 42)]
    assert rows(db, "SELECT text FROM NVTX_EVENTS WHERE endGlobalTid IS NOT NULL") == [
        ("cross-thread",)
    ]
    osrt = dict(
        rows(
            db,
            "SELECT s.value, count(*) FROM OSRT_API o JOIN StringIds s ON s.id = o.nameId "
            "WHERE o.eventClass = 27 GROUP BY 1",
        )
    )
    assert {k: osrt[k] for k in ("poll", "read", "usleep", "nanosleep", "write")} == {
        "poll": 4,
        "read": 2,
        "usleep": 10,
        "nanosleep": 5,
        "write": 2,
    }
    assert rows(
        db, "SELECT eventClass, count(*) FROM OSRT_API WHERE eventClass != 27 GROUP BY 1"
    ) == [(31, 1), (32, 2)]
    assert "CUPTI_ACTIVITY_KIND_KERNEL" not in tables(db)  # CPU only: lazy export, no CUDA tables


def test_recorded_host_fixture_is_what_the_readme_says():
    rep, db = FIXTURES / "cpu_host_sampling.nsys-rep", FIXTURES / "cpu_host_sampling.sqlite"
    assert rep.stat().st_size < 1 << 20 and db.stat().st_size < 1 << 20
    meta = dict(rows(db, "SELECT name, value FROM EXPORT_META_DATA"))
    assert meta["EXPORT_PRODUCT_VERSION"] == "2022.4.2.1"
    counts = [rows(db, f"SELECT count(*) FROM {t}")[0][0]
              for t in ("SCHED_EVENTS", "COMPOSITE_EVENTS", "SAMPLING_CALLCHAINS")]
    assert counts == [376, 294, 1853]
    assert rows(db, "SELECT count(DISTINCT cpu) FROM SCHED_EVENTS") == [(2,)]
    names = sorted(n for (n,) in rows(
        db, "SELECT s.value FROM ThreadNames t JOIN StringIds s ON s.id = t.nameId"))
    assert names == ["[NSys Comms]", "[NSys]", "main", "sleeper", "spinner 0", "spinner 1",
                     "spinner 2"]
    assert sorted(rows(db, "SELECT text FROM NVTX_EVENTS WHERE eventType = 59")) == [
        ("compute",), ("sleep",)]
    assert "CUPTI_ACTIVITY_KIND_KERNEL" not in tables(db)


def test_synthetic_examples_are_up_to_date():
    spec = importlib.util.spec_from_file_location("make_synthetic", FIXTURES / "make_synthetic.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.stale(FIXTURES) == [], "run: python fixtures/make_synthetic.py"
