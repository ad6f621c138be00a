"""Host-evidence frames (sched, cpu_samples, cpu_stacks) and the module -> layer taxonomy:
planted synthetic rows, edge cases of switch pairing, and brute force over the raw tables of
every shared trace that has them."""

from __future__ import annotations

import sqlite3
from collections import Counter, defaultdict
from pathlib import Path

import polars as pl
import pytest
from conftest import NO_SHARED, REPO_ROOT, shared_sqlite_files

from nsysan.frames import host_taxonomy as ht
from nsysan.load import open_trace
from nsysan.testing.synth import TraceBuilder

LIBCUDA = "/usr/lib/x86_64-linux-gnu/libcuda.so.535.86.10"
PYTHON = "/usr/bin/python3.10"
VDSO = "[vdso]"
LIBC = "/usr/lib/x86_64-linux-gnu/libc.so.6"


def _builder() -> tuple[TraceBuilder, int, int]:
    b = TraceBuilder()
    main = b.add_process(100, "python", main_thread="python")
    worker = b.add_thread(100, 101, "worker")
    b.add_gpu(0)
    b.add_on_cpu(main, 1_000, 5_000, cpu=2)
    b.add_on_cpu(main, 7_000, 9_000, cpu=3)  # migrated
    b.add_on_cpu(worker, 2_000, 8_000, cpu=1)
    b.add_sample(main, 2_000, [("clock_gettime", VDSO), ("cuEventSynchronize", LIBCUDA)])
    b.add_sample(main, 3_000, [("PyEval_EvalFrame", PYTHON)])
    b.add_sample(worker, 4_000, [("memcpy", LIBC)])  # an OS leaf with no known caller
    return b, main, worker


def test_planted_frames(tmp_path: Path) -> None:
    b, main, worker = _builder()
    trace = open_trace(b.write(tmp_path / "t.sqlite"), frame_cache=False)
    sched = trace.frame("sched")
    assert sched.select("global_tid", "cpu", "start_ns", "end_ns").rows() == [
        (main, 2, 1_000, 5_000), (main, 3, 7_000, 9_000), (worker, 1, 2_000, 8_000)]
    assert not sched["open_start"].any() and not sched["open_end"].any()
    samples = trace.frame("cpu_samples")
    assert samples.select("time_ns", "global_tid", "leaf_symbol", "leaf_module",
                          "stack_layer", "thread_state").rows() == [
        (2_000, main, "clock_gettime", VDSO, "runtime_driver", "running"),
        (3_000, main, "PyEval_EvalFrame", PYTHON, "framework", "running"),
        (4_000, worker, "memcpy", LIBC, "os", "running"),
    ]
    stacks = trace.frame("cpu_stacks")
    assert stacks.height == 4 and stacks.filter(pl.col("depth") == 1)["module"].to_list() == [
        LIBCUDA]
    layers = ht.sample_layers(stacks).join(samples.select("sample_id", "time_ns"),
                                           on="sample_id").sort("time_ns")
    # vdso polled from libcuda is a driver wait; libc with no known caller stays os
    assert layers.select("leaf_layer", "layer").rows() == [
        ("os", "runtime_driver"), ("framework", "framework"), ("os", "os")]


def test_open_ends_and_lost_switches(tmp_path: Path) -> None:
    b, main, worker = _builder()
    path = b.write(tmp_path / "t.sqlite")
    con = sqlite3.connect(path)
    # the main thread ran already when recording began (first switch-in lost) and the worker
    # never switched out (last switch-out lost)
    con.execute("DELETE FROM SCHED_EVENTS WHERE globalTid = ? AND start = 1000", (main,))
    con.execute("DELETE FROM SCHED_EVENTS WHERE globalTid = ? AND start = 8000", (worker,))
    con.commit()
    duration = con.execute("SELECT duration FROM ANALYSIS_DETAILS").fetchone()[0]
    con.close()
    trace = open_trace(path, frame_cache=False)
    sched = trace.frame("sched")
    assert sched.select("global_tid", "start_ns", "end_ns", "open_start", "open_end").rows() == [
        (main, 0, 5_000, True, False), (main, 7_000, 9_000, False, False),
        (worker, 2_000, duration, False, True)]
    assert any("closed at the session end" in n for n in trace.meta.notes)


def test_traces_without_host_tables(tmp_path: Path) -> None:
    b = TraceBuilder()
    b.add_process(100)
    trace = open_trace(b.write(tmp_path / "t.sqlite"), frame_cache=False)
    for name in ("sched", "cpu_samples", "cpu_stacks"):
        assert trace.frame(name).is_empty()
    assert "sched" not in trace.meta.missing  # optional frames do not change "missing"


@pytest.mark.parametrize(
    ("module", "layer"),
    [
        ("/usr/local/cuda-12.2/compat/lib.real/libcuda.so.535.86.10", "runtime_driver"),
        ("/usr/local/cuda/lib64/libcudart.so.12", "runtime_driver"),
        ("/opt/nccl/lib/libnccl.so.2.15.5", "communication"),
        ("/usr/lib/libmpi.so.40", "communication"),
        ("/usr/lib/libucp.so.0", "communication"),
        ("/usr/lib/x86_64-linux-gnu/libcudnn_cnn_infer.so.8.6.0", "operator_library"),
        ("/usr/local/cuda/lib64/libcublasLt.so.12", "operator_library"),
        ("/opt/conda/lib/python3.8/site-packages/nvidia/dali/libdali_operators.so",
         "data_pipeline"),
        ("/usr/lib/libjpeg.so.8", "data_pipeline"),
        ("/site-packages/PIL/_imaging.cpython-310-x86_64-linux-gnu.so", "data_pipeline"),
        ("/site-packages/cv2/cv2.abi3.so", "data_pipeline"),
        ("/opt/conda/lib/python3.8/site-packages/torch/lib/libtorch_cpu.so", "framework"),
        ("/usr/bin/python3.10", "framework"),
        ("/usr/lib/libpython3.11.so.1.0", "framework"),
        ("/opt/jax/xla_extension.so", "framework"),
        ("/usr/lib/x86_64-linux-gnu/libc.so.6", "os"),
        ("/usr/lib/x86_64-linux-gnu/libc-2.31.so", "os"),
        ("/usr/lib/x86_64-linux-gnu/libpthread-2.31.so", "os"),
        ("[kernel.kallsyms]", "os"),
        ("[vdso]", "os"),
        ("/usr/local/cuda-11.8/NsightSystems-cli-2022.4.2/target-linux-x64/libcupti.so.11.8",
         "profiler"),
        ("/opt/nsys/libToolsInjection64.so", "profiler"),
        ("/usr/lib/libsomething_else.so", "unknown"),
        ("[Unknown]", "unknown"),
        ("/usr/lib/libcudaxyz.so", "unknown"),  # libcuda prefix without .so: not the driver
        (None, "unknown"),
    ],
)
def test_taxonomy(module: str | None, layer: str) -> None:
    got = pl.DataFrame({"m": [module]}, schema={"m": pl.String}).select(
        ht.layer_expr(pl.col("m")))
    assert got.item() == layer
    assert layer in ht.HOST_LAYERS


def test_taxonomy_table_is_versioned() -> None:
    table = ht.rule_table()
    assert table.height == len(ht.TAXONOMY) and set(table["layer"]) <= set(ht.HOST_LAYERS)
    assert ht.TAXONOMY_VERSION
    assert set(ht.STACK_LAYER_OF) == set(ht.HOST_LAYERS)


def _raw_sched(path: Path) -> dict[int, tuple[int, int]]:
    """Brute force: per thread, (on-CPU ns, switch-ins) over the raw SCHED_EVENTS rows."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    rows = con.execute("SELECT globalTid, start, isSchedIn FROM SCHED_EVENTS").fetchall()
    duration = con.execute("SELECT duration FROM ANALYSIS_DETAILS").fetchone()[0]
    con.close()
    by_tid: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for g, t, i in rows:
        by_tid[g].append((t, 1 if i else 0))
    out = {}
    for g, events in by_tid.items():
        events.sort()
        on, ins, since = 0, 0, None
        for k, (t, is_in) in enumerate(events):
            if is_in:
                if since is not None:
                    on += t - since
                since, ins = t, ins + 1
            else:
                if since is None and k == 0:
                    on += t - min(0, t)
                elif since is not None:
                    on += t - since
                since = None
        if since is not None:
            on += max(duration, since) - since
        out[g] = (on, ins)
    return out


def _with_table(table: str) -> list[str]:
    names = []
    for name in shared_sqlite_files():
        if name == NO_SHARED:
            return [NO_SHARED]
        from conftest import SHARED_TRACES
        con = sqlite3.connect(f"file:{SHARED_TRACES / name}?mode=ro", uri=True)
        ok = con.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (table,)).fetchone()
        con.close()
        if ok:
            names.append(name)
    return names or [NO_SHARED]


@pytest.mark.parametrize("name", _with_table("SCHED_EVENTS"))
def test_sched_equals_brute_force(shared_traces: Path, name: str) -> None:
    path = shared_traces / name
    sched = open_trace(path, frame_cache=False).frame("sched")
    got = sched.group_by("global_tid").agg(
        on=(pl.col("end_ns") - pl.col("start_ns")).sum(),
        ins=(~pl.col("open_start")).sum(),
    )
    assert {g: (on, ins) for g, on, ins in got.iter_rows()} == _raw_sched(path)


def _leaf_modules(trace) -> Counter:
    """Samples per (thread, leaf module) in the ``cpu_samples`` frame."""
    samples = trace.frame("cpu_samples")
    return Counter({(g, m): n for g, m, n in
                    samples.group_by("global_tid", "leaf_module").len().iter_rows()})


def _raw_leaf_modules(path: Path) -> tuple[Counter, int]:
    """Brute force: samples per (thread, leaf module) in SQL over the raw rows, and the number
    of stack frames."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    raw = Counter({(g, m): n for g, m, n in con.execute(
        "SELECT e.globalTid, s.value, count(*) FROM COMPOSITE_EVENTS e "
        "LEFT JOIN SAMPLING_CALLCHAINS c ON c.id = e.id AND c.stackDepth = 0 "
        "LEFT JOIN StringIds s ON s.id = c.module GROUP BY 1, 2")})
    frames = con.execute("SELECT count(*) FROM SAMPLING_CALLCHAINS").fetchone()[0]
    con.close()
    return raw, frames


@pytest.mark.parametrize("name", _with_table("COMPOSITE_EVENTS"))
def test_samples_equal_brute_force(shared_traces: Path, name: str) -> None:
    path = shared_traces / name
    trace = open_trace(path, frame_cache=False)
    raw, frames = _raw_leaf_modules(path)
    assert _leaf_modules(trace) == raw
    assert trace.frame("cpu_stacks").height == frames


@pytest.mark.parametrize("sparse", [False, True])
def test_string_id_codes_equal_a_lookup(sparse: bool) -> None:
    """cpu_stacks resolves StringIds keys through a dense table (or, for ids too large or
    negative, by hashing): each row must get exactly its own id's text, nulls staying null."""
    from nsysan.load.adapters_samples import _dense_codes

    base = [7, 3, None, 3, 0, 12, 7, None, 12, 12]
    ids = [x * (1 << 40) if (sparse and x is not None) else x for x in base]
    col = pl.Series("symbol", ids, dtype=pl.Int64)
    got = _dense_codes(col)
    if sparse:
        assert got is None  # the hashing path takes them
        return
    assert got is not None
    at, distinct = got
    assert distinct["symbol"].to_list() == sorted({x for x in ids if x is not None})
    assert [None if a is None else distinct["symbol"][a] for a in at.to_list()] == ids


def test_sample_layers_do_not_depend_on_frame_order() -> None:
    stacks = pl.DataFrame({
        "sample_id": [1, 1, 1, 2, 2, 3, 4],
        "depth": [0, 1, 2, 0, 1, 0, 1],  # sample 4 has no leaf frame
        "module": [VDSO, LIBC, LIBCUDA, LIBC, PYTHON, "libmystery.so", PYTHON],
    }).with_columns(pl.col("module").cast(pl.Categorical))
    want = [(1, "os", "runtime_driver"), (2, "os", "framework"), (3, "unknown", "unknown")]
    assert ht.sample_layers(stacks).rows() == want
    shuffled = stacks[[6, 3, 0, 5, 2, 4, 1]]
    assert ht.sample_layers(shuffled).rows() == want
    assert ht.sample_layers(stacks.with_columns(pl.col("module").cast(pl.String))).rows() == want


# ---------------------------------------------------------------------------------------------
# The project's own recorded fixture (fixtures/cpu_host_sampling.sqlite, fixtures/README.md):
# real CPU sampling and context switches of a known program, so the truth is the program's
# design, and the numbers are checked against brute force over its raw rows
# ---------------------------------------------------------------------------------------------
RECORDED = REPO_ROOT / "fixtures" / "cpu_host_sampling.sqlite"


def test_recorded_fixture_frames_equal_brute_force() -> None:
    trace = open_trace(RECORDED, frame_cache=False)
    sched = trace.frame("sched")
    got = sched.group_by("global_tid").agg(
        on=(pl.col("end_ns") - pl.col("start_ns")).sum(),
        ins=(~pl.col("open_start")).sum(),
    )
    assert {g: (on, ins) for g, on, ins in got.iter_rows()} == _raw_sched(RECORDED)
    raw, frames = _raw_leaf_modules(RECORDED)
    assert _leaf_modules(trace) == raw and sum(raw.values()) == 294
    assert trace.frame("cpu_stacks").height == frames == 1853


def test_recorded_fixture_host_threads_match_the_program() -> None:
    """The program (fixtures/record/host_cpu.c): main and three spinners spin for 150 ms at
    once on a 2-CPU machine, a sleeper naps 20 x 5 ms, nsys adds its own threads."""
    from nsysan.passes import registry
    from nsysan.passes.schedule import run_passes

    trace = open_trace(RECORDED, frame_cache=False)
    chosen = registry.resolve(["host"])
    results, _ = run_passes(chosen, trace, registry.build_params(chosen, None))
    threads = {r["name"]: r for r in results["host"].tables["host_threads"].iter_rows(named=True)}
    busy = ["main", "spinner 0", "spinner 1", "spinner 2"]
    assert set(busy) | {"sleeper", "[NSys]", "[NSys Comms]"} <= set(threads)
    for name in busy:  # sampled every ~1 ms while on-CPU; the program's own binary is not in
        t = threads[name]  # the taxonomy, so its samples stay "unknown" (never guessed)
        assert t["n_samples"] >= 50 and t["top_layer"] == "unknown", t
        assert 1_000_000 - 10_000 < t["sampling_period_ns"] < 1_000_000 + 10_000
    # four threads wanting the CPU for 150 ms on 2 CPUs: together at most 2 CPUs' worth of
    # their shared window, each descheduled while runnable for part of it
    window = max(threads[n]["window_ns"] for n in busy)
    assert sum(threads[n]["on_cpu_ns"] for n in busy) <= 2 * window
    assert all(threads[n]["off_cpu_ns"] > 0.2 * threads[n]["window_ns"] for n in busy)
    sleeper = threads["sleeper"]  # blocked in nanosleep nearly all of its life
    assert sleeper["on_cpu_ns"] < 0.05 * sleeper["window_ns"] and sleeper["n_switches"] >= 20
    assert threads["[NSys]"]["role"] == threads["[NSys Comms]"]["role"] == "profiler"
