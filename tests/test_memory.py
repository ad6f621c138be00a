"""The memory pass and its findings, against brute force over the exported rows.

The brute force reads CUDA_GPU_MEMORY_USAGE_EVENTS straight from the SQLite file (not through
the loader) and walks it in plain Python loops: the level at time t is the sum of the
allocations minus the frees with start <= t.
"""

from __future__ import annotations

import json
import random
import sqlite3
from pathlib import Path

import polars as pl
import pytest
from conftest import REPO_ROOT
from row_order import shuffled_copy

from nsysan.api import analyze, analyze_to_dir
from nsysan.errors import ConfigError, SchemaError
from nsysan.load import open_trace
from nsysan.passes.memory_schemas import MEMORY, MEMORY_SITES, MEMORY_SUMMARY
from nsysan.testing._memory import ACT_BYTES, CASES, DEVICE_TOTAL, MIB, PID, memory_case
from nsysan.testing.synth import TraceBuilder

MEMORY_CODES = {"MEMORY_NEAR_OOM", "MEMORY_GROWTH", "POOL_FRAGMENTATION", "MEMORY_CHURN"}
EXPECTED = {"sawtooth": {"MEMORY_CHURN"}, "leak": {"MEMORY_GROWTH"},
            "pool": {"POOL_FRAGMENTATION"}, "near_oom": {"MEMORY_NEAR_OOM"}}
KINDS = {0: "pageable", 1: "pinned", 2: "device", 3: "array", 4: "managed",
         5: "device_static", 6: "managed_static", 7: "unknown"}
DEVICE_KINDS = ("device", "array", "device_static")
LAYOUTS = ("2022.4", "2023.4")


# ---------------------------------------------------------------------------------------------
# brute force
# ---------------------------------------------------------------------------------------------
def raw_events(path: Path) -> list[dict]:
    con = sqlite3.connect(path)
    try:
        cols = [r[1] for r in con.execute("PRAGMA table_info(CUDA_GPU_MEMORY_USAGE_EVENTS)")]
        rows = con.execute("SELECT * FROM CUDA_GPU_MEMORY_USAGE_EVENTS").fetchall()
        duration = con.execute("SELECT duration FROM ANALYSIS_DETAILS").fetchone()[0]
    finally:
        con.close()
    out = []
    for row in rows:
        r = dict(zip(cols, row, strict=True))
        sign = 1 if r["memoryOperationType"] == 0 else -1
        out.append({"t": r["start"], "pid": (r["globalPid"] >> 24) & 0xFFFFFF,
                    "dev": r["deviceId"], "kind": KINDS[r["memKind"]],
                    "signed": sign * r["bytes"], "alloc": sign > 0, "bytes": r["bytes"],
                    "pool": r.get("localMemoryPoolAddress"),
                    "size": r.get("localMemoryPoolSize"),
                    "used": r.get("localMemoryPoolUtilizedSize")})
    out.append({"duration": duration})
    return out


def level(events: list[dict], t: int, *, strict: bool = False) -> int:
    total = 0
    for e in events:
        if e["t"] < t or (not strict and e["t"] == t):
            total += e["signed"]
    return total


def brute_curve(events: list[dict], duration: int, bins: int) -> dict:
    width = max(-(-duration // bins), 1)
    n_bins = -(-duration // width)
    keys = sorted({(e["dev"], e["pid"], e["kind"]) for e in events})
    out = {}
    for key in keys:
        mine = [e for e in events if (e["dev"], e["pid"], e["kind"]) == key]
        first_bin = min(e["t"] for e in mine) // width
        for b in range(first_bin, n_bins):
            lo, hi = b * width, min((b + 1) * width, duration)
            best = level(mine, lo, strict=True)
            for e in mine:
                if lo <= e["t"] < hi:
                    best = max(best, level(mine, e["t"]))
            out[(*key, b)] = (lo, hi, best, level(mine, hi, strict=True))
    return out


def brute_peak(events: list[dict]) -> tuple[int, int]:
    best, when = None, None
    for t in sorted({e["t"] for e in events}):
        v = level(events, t)
        if best is None or v > best:
            best, when = v, t
    return best, when


def device_events(events: list[dict], pid: int | None = None) -> list[dict]:
    return [e for e in events if e["kind"] in DEVICE_KINDS and (pid is None or e["pid"] == pid)]


# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cases(tmp_path_factory) -> dict[tuple[str, str], Path]:
    d = tmp_path_factory.mktemp("memory")
    return {(case, layout): memory_case(d / f"{case}_{layout}.sqlite", case, layout)
            for case in CASES for layout in LAYOUTS}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("case", CASES)
def test_planted_case_gives_its_finding_and_no_other(cases, case, layout):
    r = analyze(cases[(case, layout)])
    got = {f.code for f in r.diagnosis.findings} & MEMORY_CODES
    assert got == EXPECTED[case]
    peak = next(i for i in r.diagnosis.baseline.items if i.key == "memory_used_bytes")
    raw = raw_events(cases[(case, layout)])[:-1]
    assert peak.value == brute_peak(device_events(raw))[0]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("case", CASES)
def test_tables_equal_brute_force(cases, case, layout):
    path = cases[(case, layout)]
    r = analyze(path, passes=["steps", "memory"], settings={"memory.bins": "37"},
                findings=False)
    raw = raw_events(path)
    duration, events = raw[-1]["duration"], raw[:-1]
    curve = r.results["memory"].tables["memory"]
    want = brute_curve(events, duration, 37)
    got = {(row["device_id"], row["pid"], row["mem_kind"], row["bin"]):
           (row["start_ns"], row["end_ns"], row["in_use_bytes_max"], row["in_use_bytes_end"])
           for row in curve.iter_rows(named=True)}
    assert got == want
    summary = r.results["memory"].tables["memory_summary"].row(0, named=True)
    dev = device_events(events, PID)
    assert (summary["peak_bytes"], summary["peak_ns"]) == brute_peak(dev)
    assert summary["device_total_bytes"] == DEVICE_TOTAL
    assert summary["margin_bytes"] == DEVICE_TOTAL - brute_peak(device_events(events))[0]
    steps = r.results["steps"].tables["steps"].sort("start_ns")
    steady = steps.filter(~pl.col("warmup")) if not steps["warmup"].all() else steps
    bounds = list(zip(steady["start_ns"], steady["end_ns"], strict=True))
    n = len(bounds)
    growth = (level(dev, bounds[-1][1], strict=True) - level(dev, bounds[0][0], strict=True)) / n
    assert summary["growth_bytes_per_step"] == pytest.approx(growth)
    grown = sum(level(dev, e, strict=True) > level(dev, s, strict=True) for s, e in bounds)
    assert summary["steps_grown_frac"] == pytest.approx(grown / n)
    inside = [e for e in dev if any(s <= e["t"] < x for s, x in bounds)]
    assert summary["allocs_per_step"] == pytest.approx(sum(e["alloc"] for e in inside) / n)
    assert summary["free_bytes_per_step"] == pytest.approx(
        sum(e["bytes"] for e in inside if not e["alloc"]) / n)
    if case == "leak":
        assert growth == 16 * MIB
    if case == "pool":
        assert summary["pool_reserved_peak_bytes"] == n * ACT_BYTES
        assert summary["pool_growths_with_slack"] == n - 1


@pytest.mark.parametrize("kinds", [("device", "pinned", "managed", "device"), ("device",)])
def test_curve_of_random_events_equals_brute_force(tmp_path, kinds):
    """Two processes, two devices, several kinds (or only device memory: then two processes
    share each device), ties at one timestamp, out of order."""
    rng = random.Random(7)
    b = TraceBuilder()
    for pid in (10, 20):
        b.add_api(b.add_process(pid), 0, 1_000, "cudaGetDevice")
    b.add_gpu(0)
    b.add_gpu(1)
    live: dict[tuple, list[int]] = {}
    for i in range(400):
        pid, dev = rng.choice((10, 20)), rng.choice((0, 1))
        kind = rng.choice(kinds)
        t = rng.randrange(0, 50) * 100_000
        held = live.setdefault((pid, dev, kind), [])
        if held and rng.random() < 0.4:
            nbytes = held.pop(rng.randrange(len(held)))
            b.add_memory_event(pid, t, nbytes, "free", address=i, device_id=dev, mem_kind=kind)
        else:
            nbytes = rng.randrange(1, 1 << 30)
            held.append(nbytes)
            b.add_memory_event(pid, t, nbytes, "alloc", address=i, device_id=dev,
                               mem_kind=kind)
    path = b.write(tmp_path / "random.sqlite")
    r = analyze(path, passes=["memory"], settings={"memory.bins": "23"}, findings=False)
    raw = raw_events(path)
    want = brute_curve(raw[:-1], raw[-1]["duration"], 23)
    curve = r.results["memory"].tables["memory"]
    got = {(row["device_id"], row["pid"], row["mem_kind"], row["bin"]):
           (row["start_ns"], row["end_ns"], row["in_use_bytes_max"], row["in_use_bytes_end"])
           for row in curve.iter_rows(named=True)}
    assert got == want
    summary = r.results["memory"].tables["memory_summary"]
    for row in summary.iter_rows(named=True):
        mine = [e for e in device_events(raw[:-1]) if e["pid"] == row["pid"]
                and e["dev"] == row["device_id"]]
        assert (row["peak_bytes"], row["peak_ns"]) == brute_peak(mine)
        on_device = [e for e in device_events(raw[:-1]) if e["dev"] == row["device_id"]]
        assert (row["device_peak_bytes"], row["device_peak_ns"]) == brute_peak(on_device)
        assert row["n_steps"] == 0 and row["growth_bytes_per_step"] is None
    # row order is not data
    copy = tmp_path / "shuffled.sqlite"
    assert "CUDA_GPU_MEMORY_USAGE_EVENTS" in shuffled_copy(path, copy)
    r2 = analyze(copy, passes=["memory"], settings={"memory.bins": "23"}, findings=False)
    for name in ("memory", "memory_summary"):
        a = r.results["memory"].tables[name].drop("trace_id")
        assert a.equals(r2.results["memory"].tables[name].drop("trace_id"))


def test_events_join_their_call_and_nvtx_site(cases):
    from nsysan.passes.memory import linked_events

    ev = linked_events(open_trace(cases[("sawtooth", "2023.4")]))
    allocs = ev.filter((pl.col("op") == "alloc") & (pl.col("bytes") == ACT_BYTES))
    assert set(allocs["api_name"]) == {"cudaMalloc"} and set(allocs["nvtx_name"]) == {"forward"}
    frees = ev.filter(pl.col("op") == "free")
    assert set(frees["api_name"]) == {"cudaFree"} and set(frees["nvtx_name"]) == {"backward"}
    assert (ev["api_start_ns"] <= ev["start_ns"]).all()
    assert (ev["start_ns"] <= ev["api_end_ns"]).all()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_export_without_pool_columns(tmp_path, layout):
    path = memory_case(tmp_path / "p.sqlite", "pool", layout, pool_columns=False)
    r = analyze(path)
    assert r.results["memory"].tables["memory"]["pool_size_bytes_max"].null_count() \
        == r.results["memory"].tables["memory"].height
    assert "POOL_FRAGMENTATION" in r.diagnosis.unavailable
    assert not {f.code for f in r.diagnosis.findings} & MEMORY_CODES


# ---------------------------------------------------------------------------------------------
# traces without events: nothing changes
# ---------------------------------------------------------------------------------------------
def _no_memory_outputs(path: Path, out: Path) -> None:
    _, target = analyze_to_dir(path, out)
    names = {p.name for p in Path(target).iterdir()}
    assert not {"memory.parquet", "memory_summary.parquet", "memory_sites.parquet"} & names
    manifest = json.loads((Path(target) / "manifest.json").read_text())
    assert "memory" not in manifest["passes"]
    assert "memory_events" not in json.dumps(manifest)
    findings = (Path(target) / "findings.json").read_text()
    for code in ("MEMORY_NEAR_OOM", "MEMORY_GROWTH", "POOL_FRAGMENTATION"):
        assert code not in findings


def test_fixture_without_events_is_unchanged(tmp_path):
    _no_memory_outputs(REPO_ROOT / "fixtures" / "example_ddp.sqlite", tmp_path)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_empty_table_is_like_no_table(tmp_path, layout):
    path = memory_case(tmp_path / "x.sqlite", "sawtooth", layout)
    # the same trace with the table present and empty (nsys --lazy=false without the option)
    con = sqlite3.connect(path)
    con.execute("DELETE FROM CUDA_GPU_MEMORY_USAGE_EVENTS")
    con.commit()
    con.close()
    trace = open_trace(path)
    assert trace.memory_events.is_empty() and trace.has("memory_events")
    assert "memory_events" not in trace.meta.quality
    _no_memory_outputs(path, tmp_path / "out")


def test_shared_trace_without_events(shared_traces, tmp_path):
    path = shared_traces / "sc22-ddp-4gpu-nccl" / "4gpu_baseline.nsys-rep.nsys2023.4.4.sqlite"
    _no_memory_outputs(path, tmp_path)


# ---------------------------------------------------------------------------------------------
# failure paths
# ---------------------------------------------------------------------------------------------
def test_bad_params_are_config_errors(cases):
    with pytest.raises(ConfigError, match="bins"):
        analyze(cases[("leak", "2022.4")], settings={"memory.bins": "0"})
    with pytest.raises(ConfigError, match="near_oom_warn_frac"):
        analyze(cases[("leak", "2022.4")], settings={"memory.near_oom_warn_frac": "2"})


def test_table_without_required_column_is_a_schema_error(tmp_path):
    path = memory_case(tmp_path / "x.sqlite", "leak")
    con = sqlite3.connect(path)
    con.execute("ALTER TABLE CUDA_GPU_MEMORY_USAGE_EVENTS DROP COLUMN bytes")
    con.commit()
    con.close()
    with pytest.raises(SchemaError, match=r"CUDA_GPU_MEMORY_USAGE_EVENTS.*bytes"):
        open_trace(path).memory_events  # noqa: B018


def test_host_memory_only_is_not_evaluated(tmp_path):
    b = TraceBuilder()
    b.add_api(b.add_process(PID), 0, 500, "cudaHostAlloc")
    b.add_gpu(0)
    b.add_memory_event(PID, 1000, MIB, "alloc", address=1, mem_kind="pinned")
    r = analyze(b.write(tmp_path / "pinned.sqlite"))
    assert r.results["memory"].tables["memory"].height > 0
    assert r.results["memory"].tables["memory_summary"].is_empty()
    assert r.results["memory"].tables["memory_sites"].is_empty()
    assert {"MEMORY_NEAR_OOM", "MEMORY_GROWTH", "POOL_FRAGMENTATION"} <= set(
        r.diagnosis.unavailable)
    assert r.results["memory"].metrics["n_events"] == 1
    assert "peak_memory_bytes" not in r.results["memory"].metrics


def test_timeline_in_use_lane_equals_brute_force(cases):
    from nsysan.report import plots

    path = cases[("near_oom", "2022.4")]
    r = analyze(path)
    tables = {n: df for res in r.results.values() for n, df in res.tables.items()}
    (tl,) = plots.device_timelines(r.trace, tables, None, n_bins=50)
    lane = tl.lanes["memory in use"]
    dev = device_events(raw_events(path)[:-1])
    edges = tl.edges.tolist()
    for i in range(len(edges) - 1):
        lo, hi = edges[i], edges[i + 1]
        best = level(dev, lo, strict=True)
        for e in dev:
            if lo <= e["t"] < hi or (i == len(edges) - 2 and e["t"] == hi):
                best = max(best, level(dev, e["t"]))
        assert lane[i] == pytest.approx(best / DEVICE_TOTAL)
    assert lane.max() == pytest.approx(0.99, abs=1e-9)
    without = {n: df for n, df in tables.items() if not n.startswith("memory")}
    (plain,) = plots.device_timelines(r.trace, without, None, n_bins=50)
    assert "memory in use" not in plain.lanes


def test_findings_name_the_allocation_site(cases):
    leak = analyze(cases[("leak", "2023.4")])
    (f,) = [f for f in leak.diagnosis.findings if f.code == "MEMORY_GROWTH"]
    steps = leak.results["steps"].tables["steps"]
    site = f.evidence["offenders"][0]
    # every steady-state leak allocation is made inside `forward`
    assert (site["name"], site["value"], site["count"]) == (
        "forward", steps.height * 16 * MIB, steps.height)
    oom = analyze(cases[("near_oom", "2022.4")])
    (f,) = [f for f in oom.diagnosis.findings if f.code == "MEMORY_NEAR_OOM"]
    assert f.evidence["offenders"][0]["name"] == "init"
    assert f.severity == "critical" and f.device_id == 0


@pytest.mark.parametrize("case", ["pool", "leak"])
def test_outputs_do_not_depend_on_row_order(cases, tmp_path, monkeypatch, case):
    """Every output file and every canonical frame (memory_events included) of a shuffled
    copy equal the original's (the check of tests/test_determinism.py)."""
    from test_determinism import _check_shuffled

    src = cases[(case, "2023.4")]
    _, out = analyze_to_dir(src, tmp_path / "plain")
    assert {"memory.parquet", "memory_summary.parquet"} <= {p.name for p in out.iterdir()}
    _check_shuffled(src, tmp_path / "s", monkeypatch, seed=3)


def test_cli_memory_settings(cases, tmp_path):
    from click.testing import CliRunner

    from nsysan.cli import cli

    def run(*args: str):
        r = CliRunner().invoke(cli, list(args))
        return r.exit_code, r.stdout, r.stderr

    # a memory setting selects the pass also on a trace without events: its tables are
    # written empty, with their schemas (as every pass that finds nothing), and no memory
    # finding is drawn
    code, _, err = run("analyze", str(REPO_ROOT / "fixtures" / "example_ddp.sqlite"),
                       "--set", "memory.bins=10", "-o", str(tmp_path / "a"))
    assert code == 0, err
    target = tmp_path / "a" / "example_ddp"
    for name, schema in (("memory", MEMORY), ("memory_summary", MEMORY_SUMMARY),
                         ("memory_sites", MEMORY_SITES)):
        table = pl.read_parquet(target / f"{name}.parquet")
        assert table.is_empty() and table.schema == schema
    codes = {f["code"] for f in json.loads((target / "findings.json").read_text())["findings"]}
    assert not codes & {"MEMORY_NEAR_OOM", "MEMORY_GROWTH", "POOL_FRAGMENTATION"}
    assert json.loads((target / "manifest.json").read_text())["passes"]["memory"]["bins"] == 10
    code, _, err = run("analyze", str(cases[("leak", "2022.4")]), "--set", "memory.bins=0",
                       "-o", str(tmp_path / "b"))
    assert code == 1 and err.startswith("Error:") and "bins" in err
    code, _, err = run("analyze", str(cases[("leak", "2022.4")]), "--set", "memory.bins=7",
                       "-o", str(tmp_path / "c"))
    assert code in (0, 1), err  # 1: findings at the failing severity
    curve = pl.read_parquet(tmp_path / "c" / "leak_2022.4" / "memory.parquet")
    assert curve["bin"].max() == 6


def test_rules_say_why_they_cannot_judge(cases, tmp_path):
    # no steps: growth per step cannot be judged
    r = analyze(cases[("leak", "2022.4")],
                settings={"steps.name_pattern": "^no such step$", "steps.periodicity": "false"})
    assert r.results["steps"].tables["steps"].is_empty()
    assert "MEMORY_GROWTH" in r.diagnosis.unavailable
    assert "steps" in r.diagnosis.reasons["MEMORY_GROWTH"]
    # device memory size unknown: no margin
    path = memory_case(tmp_path / "nogpu.sqlite", "near_oom")
    con = sqlite3.connect(path)
    con.execute("DELETE FROM TARGET_INFO_GPU")
    con.commit()
    con.close()
    r = analyze(path)
    summary = r.results["memory"].tables["memory_summary"]
    assert summary["device_total_bytes"].is_null().all() and summary["margin_frac"].is_null().all()
    assert "MEMORY_NEAR_OOM" in r.diagnosis.unavailable
    assert "totalMemory" in r.diagnosis.reasons["MEMORY_NEAR_OOM"]


def brute_sites(path: Path, bounds: list[tuple[int, int]]) -> dict:
    """(device, pid, site) -> [allocs, bytes, steady allocs, steady bytes], plain loops."""
    con = sqlite3.connect(path)
    try:
        events = con.execute("SELECT start, globalPid, deviceId, bytes, memKind, "
                             "correlationId FROM CUDA_GPU_MEMORY_USAGE_EVENTS "
                             "WHERE memoryOperationType = 0").fetchall()
        calls = con.execute("SELECT globalTid, correlationId, start, end "
                            "FROM CUPTI_ACTIVITY_KIND_RUNTIME").fetchall()
        ranges = con.execute("SELECT globalTid, start, end, coalesce(text, "
                             "(SELECT value FROM StringIds WHERE id = textId)) FROM NVTX_EVENTS "
                             "WHERE end IS NOT NULL AND (endGlobalTid IS NULL "
                             "OR endGlobalTid = globalTid)").fetchall()
    finally:
        con.close()
    out: dict = {}
    for start, gpid, dev, nbytes, kind, corr in events:
        if KINDS[kind] not in DEVICE_KINDS:
            continue
        call = [c for c in calls if c[0] >> 24 == gpid >> 24 and c[1] == corr]
        if not call:
            continue
        tid, _, s, e = call[0]
        inside = [r for r in ranges if r[0] == tid and r[1] <= s and e <= r[2]]
        inside.sort(key=lambda r: (-r[1], r[2]))
        site = inside[0][3] if inside else None
        row = out.setdefault((dev, (gpid >> 24) & 0xFFFFFF, site), [0, 0, 0, 0])
        steady = any(a <= start < b for a, b in bounds)
        row[0] += 1
        row[1] += nbytes
        row[2] += steady
        row[3] += nbytes if steady else 0
    return out


@pytest.mark.parametrize("case", ["sawtooth", "leak"])
def test_sites_equal_brute_force(cases, case):
    path = cases[(case, "2022.4")]
    r = analyze(path, passes=["steps", "memory"], findings=False)
    steps = r.results["steps"].tables["steps"]
    bounds = list(zip(steps["start_ns"], steps["end_ns"], strict=True))
    sites = r.results["memory"].tables["memory_sites"]
    got = {(row["device_id"], row["pid"], row["nvtx_name"]):
           [row["n_allocs"], row["alloc_bytes"], row["steady_n_allocs"],
            row["steady_alloc_bytes"]] for row in sites.iter_rows(named=True)}
    assert got == brute_sites(path, bounds)
    assert set(got) >= {(0, PID, "init"), (0, PID, "forward")}
    assert sites["alloc_bytes_frac"].sum() == pytest.approx(1.0)
    off = analyze(path, passes=["steps", "memory"], settings={"memory.sites": "false"},
                  findings=False)
    assert off.results["memory"].tables["memory_sites"].is_empty()
    assert off.results["memory"].tables["memory_summary"].equals(
        r.results["memory"].tables["memory_summary"])


def test_device_levels_without_the_pass_equal_the_pass(cases):
    from nsysan.passes.memory import device_levels

    path = cases[("sawtooth", "2023.4")]
    fresh = device_levels(open_trace(path))  # built here
    r = analyze(path)
    shared = device_levels(r.trace)  # left by the pass
    assert fresh.keys() == shared.keys() == {0}
    for dev in fresh:
        assert fresh[dev][0].tolist() == shared[dev][0].tolist()
        assert fresh[dev][1].tolist() == shared[dev][1].tolist()
    t, lvl = fresh[0]
    dev_events = device_events(raw_events(path)[:-1])
    assert lvl.tolist() == [level(dev_events, x) for x in t.tolist()]
