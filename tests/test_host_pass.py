"""The host pass: host_threads, host_layers and host_gaps against planted truth and brute force
(raw SCHED_EVENTS / COMPOSITE_EVENTS rows of the shared traces)."""

from __future__ import annotations

import itertools
import sqlite3
from collections import defaultdict
from pathlib import Path

import polars as pl
import pytest
from conftest import NO_SHARED, SHARED_TRACES

from nsysan import api
from nsysan.passes import host
from nsysan.testing import host_scenarios as hs
from nsysan.testing.synth import TraceBuilder

SC22 = "sc22-ddp-4gpu-nccl/4gpu_baseline.nsys-rep.nsys2022.4.2.sqlite"
VIT = "sc23-vit-train-nvtx/4workers.nsys-rep.nsys2023.4.4.sqlite"
PASSES = ["steps", "gaps", "overlap", "host"]


def _host(path: Path | str) -> api.PassResult:
    return api.analyze(path, passes=PASSES, findings=False).results["host"]


def test_without_host_tables_every_table_is_empty_with_its_schema(tmp_path: Path) -> None:
    b = TraceBuilder()
    g = b.add_process(1)
    b.add_gpu(0)
    from nsysan.testing import kernels as K
    b.add_kernel(g, 10_000, 20_000, K.SGEMM)
    res = _host(b.write(tmp_path / "t.sqlite"))
    for name, schema in host.TABLES.items():
        assert res.tables[name].is_empty() and res.tables[name].schema == schema
    assert "--sample=cpu --cpuctxsw=process-tree" in res.metrics["host_evidence"]


def test_cpu_bound_input_tables(tmp_path: Path) -> None:
    path, truth = hs.cpu_bound_input(tmp_path / "t.sqlite")
    res = _host(path)
    th = res.tables["host_threads"].row(0, named=True)
    assert th["role"] == "launcher" and th["n_samples"] == 12 * 20
    assert th["on_cpu_ns"] == 12 * (20 * hs.MS + 100 * hs.US)
    assert th["n_switches"] == 12 and th["n_migrations"] == 11
    assert th["data_pipeline_frac"] == pytest.approx(0.8)  # DALI, JPEG and libc under DALI
    assert th["framework_frac"] == pytest.approx(0.2)
    assert res.metrics["sampling_period_ns"] == hs.PERIOD_NS
    layers = res.tables["host_layers"].filter(pl.col("step").is_null())
    assert dict(layers.select("layer", "n_samples").iter_rows()) == {
        "data_pipeline": 192, "framework": 48}
    assert set(layers["est_ns"]) == {192 * hs.PERIOD_NS, 48 * hs.PERIOD_NS}
    gaps = res.tables["host_gaps"]
    assert gaps.height == 11 and (gaps["on_cpu_frac"] == 1.0).all()
    assert gaps["duration_ns"].sum() == truth["gap_idle_ns"]
    assert (gaps["top_layer"] == "data_pipeline").all()


def test_driver_wait_layers(tmp_path: Path) -> None:
    path, _ = hs.gpu_bound_driver_wait(tmp_path / "t.sqlite")
    th = _host(path).tables["host_threads"].row(0, named=True)
    # libcuda leaves and [vdso] polled from libcuda are driver waits; one Python sample a loop
    assert th["runtime_driver_frac"] == pytest.approx(30 / 31)
    assert th["top_layer"] == "runtime_driver"


def test_descheduled_launcher_unblocked_off_cpu(tmp_path: Path) -> None:
    path, _ = hs.descheduled_launcher(tmp_path / "t.sqlite")
    res = _host(path)
    assert res.metrics["deschedule_rule"] == "osrt_uncovered"
    gaps = res.tables["host_gaps"]
    # brute force: off-CPU inside each gap, nothing blocking covers it
    assert (gaps["unblocked_off_cpu_ns"] == gaps["duration_ns"] - gaps["on_cpu_ns"]).all()
    assert (gaps["on_cpu_frac"] < 0.1).all()


def _shared(name: str) -> Path:
    path = SHARED_TRACES / name
    if not path.is_file():
        from conftest import unavailable
        unavailable(f"{name} not found in the shared traces")
    return path


def _raw(path: Path) -> tuple[list, list, int]:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    sched = con.execute("SELECT globalTid, start, cpu, isSchedIn FROM SCHED_EVENTS").fetchall()
    samples = con.execute("SELECT globalTid, start FROM COMPOSITE_EVENTS").fetchall()
    duration = con.execute("SELECT duration FROM ANALYSIS_DETAILS").fetchone()[0]
    con.close()
    return sched, samples, duration


@pytest.mark.parametrize("name", [SC22, VIT] if SHARED_TRACES.is_dir() else [NO_SHARED])
def test_shared_traces_equal_brute_force(shared_traces: Path, name: str) -> None:
    path = _shared(name)
    res = _host(path)
    sched, samples, duration = _raw(path)
    events = defaultdict(list)
    for g, t, cpu, i in sched:
        events[g].append((t, 1 if i else 0, cpu))
    want = {}
    for g, ev in events.items():  # these traces alternate in/out, starting with a switch-in
        ev.sort()
        on = sum(min(max(o[0], 0), duration) - min(max(i[0], 0), duration)
                 for i, o in zip(ev[0::2], ev[1::2], strict=False))
        ins = [e for e in ev if e[1]]
        mig = sum(1 for a, b in itertools.pairwise(ins) if a[2] != b[2])
        want[g] = (on, len(ins), mig)
    th = res.tables["host_threads"]
    got = {g: (on, n, m) for g, on, n, m in
           th.select("global_tid", "on_cpu_ns", "n_switches", "n_migrations").iter_rows()
           if on is not None}
    assert got == want
    n_by_tid = defaultdict(int)
    for g, _ in samples:
        n_by_tid[g] += 1
    assert dict(th.filter(pl.col("n_samples") > 0).select("global_tid", "n_samples")
                .iter_rows()) == dict(n_by_tid)
    gaps = res.tables["host_gaps"]
    assert gaps.height > 0
    for row in gaps.iter_rows(named=True):  # per-gap samples of each launching thread
        n = sum(1 for g, t in samples
                if g == row["global_tid"] and row["gap_start_ns"] <= t < row["gap_end_ns"])
        layers = sum(row[f"{layer}_samples"] for layer in host.ht.HOST_LAYERS)
        assert row["n_samples"] == n == layers


def test_scheduling_without_sampling(tmp_path: Path) -> None:
    from nsysan.testing import kernels as K
    b = TraceBuilder()
    g = b.add_process(7)
    b.add_gpu(0)
    b.add_kernel(g, 1 * hs.MS, 2 * hs.MS, K.SGEMM)
    b.add_kernel(g, 12 * hs.MS, 13 * hs.MS, K.SGEMM)
    b.add_on_cpu(g, 4 * hs.MS, 7 * hs.MS)
    res = _host(b.write(tmp_path / "t.sqlite"))
    assert "partly captured: no sampling" in res.metrics["host_evidence"]
    row = res.tables["host_gaps"].row(0, named=True)
    assert row["on_cpu_ns"] == 3 * hs.MS and row["n_samples"] == 0
    assert row["host_detail"] == "on-CPU 30% of the gap; no samples"


def test_row_order_is_not_data(tmp_path: Path) -> None:
    path, _ = hs.descheduled_launcher(tmp_path / "a.sqlite")
    shuffled = tmp_path / "b.sqlite"
    shuffled.write_bytes(path.read_bytes())
    con = sqlite3.connect(shuffled)
    for table in ("SCHED_EVENTS", "COMPOSITE_EVENTS", "SAMPLING_CALLCHAINS", "OSRT_API",
                  "CUPTI_ACTIVITY_KIND_RUNTIME"):
        con.execute(f"CREATE TABLE t AS SELECT * FROM {table} ORDER BY rowid DESC")
        con.execute(f"DELETE FROM {table}")
        con.execute(f"INSERT INTO {table} SELECT * FROM t")
        con.execute("DROP TABLE t")
    con.commit()
    con.close()
    a, b = _host(path), _host(shuffled)
    for name in host.TABLES:
        assert a.tables[name].drop("trace_id").equals(b.tables[name].drop("trace_id")), name
    assert a.metrics == b.metrics


def test_scale_trace_replicates_host_evidence(shared_traces: Path, tmp_path: Path) -> None:
    import sys

    from conftest import REPO_ROOT
    sys.path.insert(0, str(REPO_ROOT / "bench"))
    try:
        import scale_trace
    finally:
        sys.path.pop(0)
    src = _shared(SC22)
    counts = scale_trace.scale(src, tmp_path / "x2.sqlite", 2)
    con = sqlite3.connect(src)
    n = {t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
         for t in ("SCHED_EVENTS", "COMPOSITE_EVENTS", "SAMPLING_CALLCHAINS")}
    con.close()
    assert all(counts[t] == 2 * n[t] for t in n)
    out = sqlite3.connect(tmp_path / "x2.sqlite")
    orphans = out.execute("SELECT count(*) FROM SAMPLING_CALLCHAINS c LEFT JOIN "
                          "COMPOSITE_EVENTS e ON e.id = c.id WHERE e.id IS NULL").fetchone()[0]
    distinct = out.execute("SELECT count(DISTINCT id) FROM COMPOSITE_EVENTS").fetchone()[0]
    out.close()
    assert orphans == 0 and distinct == 2 * n["COMPOSITE_EVENTS"]


def test_traces_without_host_tables_build_no_host_frame(tmp_path: Path) -> None:
    from nsysan.testing.scenarios import build

    path, _ = build("healthy", tmp_path)
    result = api.analyze(path)
    assert not {"sched", "cpu_samples", "cpu_stacks"} & set(result.trace.meta.quality)


@pytest.mark.parametrize("stem", ["sc22-ddp-4gpu-nccl/4gpu_baseline",
                                  "sc23-vit-train-nvtx/4workers"])
def test_sqlite_and_parquetdir_give_the_same_host_frames(shared_traces: Path, stem: str) -> None:
    from nsysan.load import open_trace

    folder = shared_traces / Path(stem).parent
    name = Path(stem).name
    sqlite = next(iter(folder.glob(f"{name}*.nsys2023.4.4.sqlite")), None)
    pqdir = folder / f"{name}.nsys2023.4.4.parquetdir"
    if sqlite is None or not pqdir.is_dir():
        pytest.skip("no 2023.4.4 export pair")
    a, b = (open_trace(p, frame_cache=False, trace_id="t") for p in (sqlite, pqdir))
    for frame in ("sched", "cpu_samples", "cpu_stacks"):
        assert a.frame(frame).equals(b.frame(frame)), frame



@pytest.mark.parametrize("dense", [True, False])
def test_layer_counts_equal_a_group_by(monkeypatch: pytest.MonkeyPatch, dense: bool) -> None:
    """Samples per (thread, step, layer), counted chunk by chunk into one dense array or by
    hashing (too many keys), equal a plain group-by: the whole trace (step null) and each
    step window [start, end) holding the sample's time."""
    import numpy as np

    rng = np.random.default_rng(7)
    n = 5_000
    samples = pl.DataFrame({
        "global_tid": rng.choice([11, 12, 40, 7], n),
        "time_ns": np.sort(rng.integers(0, 10_000, n)),
        "layer": pl.Series(rng.choice(list(host.ht.HOST_LAYERS), n)).cast(host.LAYER),
    })
    # windows with a gap between them and one ending before the next starts
    steps = pl.DataFrame({"step": [3, 1, 2], "start_ns": [6_000, 1_000, 2_500],
                          "end_ns": [9_000, 2_000, 5_000]})
    monkeypatch.setattr(host, "COUNT_CHUNK", 777)
    if not dense:
        monkeypatch.setattr(host, "DENSE_KEYS", 0)
    got = host._layer_counts(samples, steps)
    whole = samples.group_by("global_tid", "layer").agg(n_samples=pl.len()).with_columns(
        step=pl.lit(None, dtype=pl.Int64))
    per_step = samples.join_where(steps, pl.col("time_ns") >= pl.col("start_ns"),
                                  pl.col("time_ns") < pl.col("end_ns")).group_by(
        "global_tid", "step", "layer").agg(n_samples=pl.len())
    want = pl.concat([whole.select(got.columns), per_step.select(got.columns)])
    keys = ["global_tid", "step", "layer"]
    assert got.sort(keys).equals(want.cast({"n_samples": pl.Int64}).sort(keys))
    assert got.filter(pl.col("step").is_null())["n_samples"].sum() == n


def test_the_benchmark_floor_records_every_read_of_an_analysis(tmp_path: Path) -> None:
    """`bench/bench_analyze.py`'s sqlite3 floor replays the reads an analysis makes: the
    whole-table reads and the filtered scan of the call chains, recorded by spying on the
    reader (the spy broke once, silently, when the reader gained a parameter)."""
    import sys

    from conftest import REPO_ROOT

    from nsysan.testing.host_scenarios import SCENARIOS
    sys.path.insert(0, str(REPO_ROOT / "bench"))
    try:
        import bench_analyze
    finally:
        sys.path.pop(0)
    path, _ = SCENARIOS["cpu_bound_input"](tmp_path / "host.sqlite")
    columns, filtered = bench_analyze.needed_columns(path)
    assert {"CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", "COMPOSITE_EVENTS",
            "SCHED_EVENTS"} <= set(columns)
    assert any("SAMPLING_CALLCHAINS" in q for q in filtered)
    sql = bench_analyze.floor_sql((columns, filtered))
    assert "SAMPLING_CALLCHAINS" in sql and "COMPOSITE_EVENTS" in sql
    assert "SAMPLING_CALLCHAINS" not in bench_analyze.floor_sql((columns, filtered), host=False)
