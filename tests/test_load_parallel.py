"""Parallel loading (issue 9) must not change results: the bulk ADBC/pyarrow read of big
tables, frames built in prefetch threads, and the cheap (start, end) sort."""

from __future__ import annotations

import threading
from pathlib import Path

import polars as pl
import pytest
from conftest import make_nsys_sqlite

from nsysan.errors import TraceFormatError
from nsysan.frames import order, schemas
from nsysan.frames.trace import Trace, TraceMeta
from nsysan.load import open_trace
from nsysan.load import sqlite as sqlite_source
from nsysan.load.sqlite import SqliteSource

SC22 = "sc22-ddp-4gpu-nccl/4gpu_baseline.nsys-rep.nsys2022.4.2.sqlite"
NVTX_COLS = ["start", "end", "eventType", "text", "globalTid", "textId", "category"]


def _nvtx(n: int, text: object = "x") -> list[dict]:
    rows = [{"start": 10 * i, "end": 10 * i + 5, "eventType": 59, "globalTid": 7,
             "text": None if i < 3000 or i % 5 == 0 else f"range {i % 7}", "category": None,
             "textId": i % 3 if i % 2 else None} for i in range(n)]
    rows[-1]["text"] = text
    return rows


def _both_paths(path: Path, table: str, cols: list[str], monkeypatch: pytest.MonkeyPatch):
    used: list[object] = []
    orig = SqliteSource._read_bulk
    monkeypatch.setattr(SqliteSource, "_read_bulk",
                        lambda self, *a: used.append(r := orig(self, *a)) or r)
    monkeypatch.setattr(sqlite_source, "BULK_MIN_ROWS", 1)
    bulk = SqliteSource(path).read(table, cols)
    monkeypatch.setattr(sqlite_source, "BULK_MIN_ROWS", 10**12)
    monkeypatch.setenv("NSYSAN_NO_ADBC", "1")
    rows = SqliteSource(path).read(table, cols)
    return used, bulk, rows


def test_bulk_read_equals_the_row_path_with_null_first_text(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = make_nsys_sqlite(tmp_path / "t.sqlite", {"NVTX_EVENTS": _nvtx(5000)})
    used, bulk, rows = _both_paths(path, "NVTX_EVENTS", NVTX_COLS, monkeypatch)
    assert used and used[0] is not None  # the bulk path answered, NULL-first text and all
    assert bulk.equals(rows) and bulk.schema == rows.schema
    assert bulk["text"].null_count() == rows["text"].null_count() > 3000


@pytest.mark.parametrize("bad", [b"ab\xffc", 42])
def test_text_the_bulk_path_cannot_take_goes_the_row_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bad: object
) -> None:
    """Invalid UTF-8 must never reach polars unvalidated; a number in a TEXT column must read
    as on the row path."""
    rows_in = _nvtx(5000, text=bad)
    path = make_nsys_sqlite(tmp_path / "t.sqlite", {"NVTX_EVENTS": rows_in})
    if isinstance(bad, bytes):  # store the bytes as TEXT, as a broken exporter would
        import sqlite3

        con = sqlite3.connect(path)
        con.execute("UPDATE NVTX_EVENTS SET text = CAST(? AS TEXT) WHERE start = ?",
                    (bad, 10 * 4999))
        con.commit()
        con.close()
    used, bulk, rows = _both_paths(path, "NVTX_EVENTS", NVTX_COLS, monkeypatch)
    assert bulk.equals(rows) and bulk.schema == rows.schema
    if isinstance(bad, bytes):
        assert used == [None]  # refused: the table was read the other way
        assert bulk["text"][-1] == "ab\ufffdc"
    else:
        assert bulk["text"][-1] == "42"


def test_sort_by_time_handles_ties_with_decreasing_ends() -> None:
    df = pl.DataFrame({"start_ns": [5, 1, 5, 5, 0], "end_ns": [9, 2, 7, 9, 1],
                       "row": [0, 1, 2, 3, 4]})
    out = order.sort_by_time(df)
    assert out.equals(df.sort("start_ns", "end_ns", maintain_order=True))
    assert out["row"].to_list() == [4, 1, 2, 0, 3]
    ordered = df.filter(pl.col("row") != 2)
    assert order.sort_by_time(ordered).equals(
        ordered.sort("start_ns", "end_ns", maintain_order=True))


@pytest.mark.parametrize("seed", range(6))
def test_sort_by_time_in_place_equals_a_sort_then_tie_break(seed: int) -> None:
    """The column-by-column sort of `gpu_ops` (`sort_by_time_in_place`, `time_order`) gives
    the order of a whole-frame sort by (start, end) whose ties are broken by every other
    column (`order.break_ties`), on chunked frames full of ties, decreasing ends and nulls."""
    import numpy as np

    from nsysan.frames.order import break_ties

    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 400))
    start = rng.integers(0, 20, n)
    df = pl.DataFrame({
        "start": start, "end": start + rng.integers(0, 4, n),
        "a": pl.Series(rng.integers(0, 3, n)).set(pl.Series(rng.random(n) < 0.2), None),
        "b": rng.integers(0, 2, n),
    })
    cut = int(rng.integers(1, n))
    chunked = pl.concat([df[:cut], df[cut:]], rechunk=False)
    expected = break_ties(df.sort("start", "end", maintain_order=True), ["start", "end"])
    assert order.sort_by_time(chunked, "start", "end").equals(expected)
    own = chunked.clone()
    assert order.sort_by_time_in_place(own, "start", "end").equals(expected)
    assert own.equals(expected)  # sorted in place ...
    assert chunked.equals(df)  # ... and only the frame given: its clone's source is as it was


def test_prefetched_frames_equal_frames_built_one_by_one(shared_traces: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sqlite_source, "BULK_MIN_ROWS", 1000)  # sc22's event tables go bulk
    names = ["gpu_ops", "cuda_api", "nvtx", "sync", "osrt", "overhead", "gpus", "meta"]
    serial = open_trace(shared_traces / SC22, frame_cache=False)
    parallel = open_trace(shared_traces / SC22, frame_cache=False)
    parallel.prefetch(reversed(names))  # sync (needs cuda_api) is queued before cuda_api
    for name in names:
        assert parallel.frame(name).equals(serial.frame(name)), name
    assert parallel.meta.notes == serial.meta.notes


def _trace(loader) -> Trace:
    meta = TraceMeta(trace_id="t", path=Path("t"), source_path=Path("t"), source_format="memory")
    return Trace(meta, loader)


def _gated_loader():
    """A loader that records the frames it builds and holds each build until ``gate`` is
    set: (loader, names built, gate)."""
    calls: list[str] = []
    gate = threading.Event()

    def loader(name: str) -> pl.DataFrame:
        calls.append(name)
        gate.wait(5)
        return schemas.empty(schemas.CANONICAL[name])

    return loader, calls, gate


def _until_built(order: list[str]) -> None:
    """Wait (at most 5 s) until the one prefetch thread took its first frame."""
    for _ in range(1000):
        if order:
            return
        threading.Event().wait(0.005)


def test_a_frame_is_built_once_however_many_threads_ask() -> None:
    loader, calls, gate = _gated_loader()
    trace = _trace(loader)
    trace.prefetch(["gpu_ops"])
    threads = [threading.Thread(target=trace.frame, args=("gpu_ops",)) for _ in range(3)]
    for t in threads:
        t.start()
    gate.set()
    for t in threads:
        t.join(5)
    assert calls == ["gpu_ops"]


def test_wait_for_prefetch_returns_once_every_queued_frame_is_built() -> None:
    """`wait_for_prefetch` blocks until the prefetch threads have built all queued frames
    (with at most ``workers`` at a time, none in the waiting thread), then returns; with
    nothing queued it returns at once, and a failed build does not raise there."""
    loader, calls, gate = _gated_loader()
    trace = _trace(loader)
    trace.wait_for_prefetch()  # nothing queued
    trace.prefetch(["gpu_ops", "nvtx", "cuda_api"], workers=1)
    waited = threading.Event()
    waiter = threading.Thread(target=lambda: (trace.wait_for_prefetch(), waited.set()))
    waiter.start()
    _until_built(calls)
    assert not waited.wait(0.2)  # the builds are held: still waiting
    assert calls == ["gpu_ops"]  # the one thread's first build; the waiter builds nothing
    gate.set()
    waiter.join(5)
    assert waited.is_set()
    assert calls == ["gpu_ops", "nvtx", "cuda_api"]  # one thread, none built by the waiter
    assert set(trace._frames) == {"gpu_ops", "nvtx", "cuda_api"}

    def failing(name: str) -> pl.DataFrame:
        raise ValueError(name)

    broken = _trace(failing)
    broken.prefetch(["gpu_ops"])
    broken.wait_for_prefetch()  # the failure is the caller's frame()'s to report
    with pytest.raises(ValueError):
        broken.frame("gpu_ops")


def test_a_failed_prefetch_raises_in_the_caller() -> None:
    attempts: list[str] = []

    def loader(name: str) -> pl.DataFrame:
        attempts.append(name)
        raise TraceFormatError("corrupt SQLite file while reading CUPTI_ACTIVITY_KIND_KERNEL")

    trace = _trace(loader)
    trace.prefetch(["gpu_ops"])
    with pytest.raises(TraceFormatError, match="corrupt"):
        trace.frame("gpu_ops")
    assert attempts[-1] == "gpu_ops"


@pytest.mark.parametrize("bad", ["text", b"\x00", 1.5])
def test_a_stray_integer_value_reads_as_on_the_row_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bad: object
) -> None:
    rows_in = _nvtx(5000)
    rows_in[4000]["textId"] = bad  # past ADBC's first batch, where it has typed the column
    path = make_nsys_sqlite(tmp_path / "t.sqlite", {"NVTX_EVENTS": rows_in})
    _, bulk, rows = _both_paths(path, "NVTX_EVENTS", NVTX_COLS, monkeypatch)
    assert bulk.equals(rows) and bulk.schema == rows.schema
    assert bulk["textId"][3999] == rows_in[3999]["textId"]


def test_an_unfinished_prefetch_does_not_hold_up_exit(tmp_path: Path) -> None:
    """Interrupting an analysis (or finishing one that needed fewer frames) must not wait for
    frames still loading in the background."""
    import subprocess
    import sys
    import time

    script = tmp_path / "exit.py"
    script.write_text(
        "import time\n"
        "from pathlib import Path\n"
        "from nsysan.frames.trace import Trace, TraceMeta\n"
        "meta = TraceMeta(trace_id='t', path=Path('t'), source_path=Path('t'),"
        " source_format='memory')\n"
        "Trace(meta, lambda name: time.sleep(60)).prefetch(['gpu_ops', 'nvtx'])\n"
        "time.sleep(0.2)\n"
    )
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, str(script)], timeout=30)
    assert done.returncode == 0
    assert time.perf_counter() - t0 < 20


def test_each_frame_build_returns_the_freed_heap(monkeypatch) -> None:
    """After building a frame, the memory glibc kept of the build is given back
    (`nsysan.frames.heap.trim`); a frame already built costs nothing."""
    import nsysan.frames.trace as trace_module
    from nsysan.frames import heap

    trims: list[int] = []
    monkeypatch.setattr(trace_module, "trim", lambda: trims.append(1))
    trace = _trace(lambda name: schemas.empty(schemas.CANONICAL[name]))
    trace.frame("gpu_ops")
    trace.frame("gpu_ops")
    assert trims == [1]
    heap.trim()  # the real one: harmless wherever it runs


def _recording_loader(delay_s: float = 0.05):
    """A loader that records the order frames were built in and the most built at once."""
    from nsysan.frames import schemas_host

    lock = threading.Lock()
    running, most, order = [0], [0], []

    def loader(name: str) -> pl.DataFrame:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
            order.append(name)
        threading.Event().wait(delay_s)
        with lock:
            running[0] -= 1
        schema = schemas.CANONICAL.get(name) or schemas_host.HOST_EVIDENCE[name]
        return schemas.empty(schema)

    return loader, most, order


def _wait_for_prefetch(trace) -> None:
    # (waiting for the threads, not asking for the frames: the caller would build one itself)
    for _ in range(1000):
        if trace._prefetching.threads == 0:
            return
        threading.Event().wait(0.01)
    raise AssertionError("prefetch threads still running")


def test_prefetch_calls_share_one_queue_and_their_threads() -> None:
    """The event frames and, later, the host frames are prefetched by separate calls: the
    frames are still built at most ``workers`` at a time (each build's transient copies held
    at once), every frame once."""
    loader, most, order = _recording_loader()
    trace = _trace(loader)
    trace.prefetch(["gpu_ops", "nvtx", "cuda_api"])
    trace.prefetch(["cpu_samples", "sched", "gpu_ops"])  # (gpu_ops: queued already)
    trace.prefetch(["osrt"], workers=2)
    _wait_for_prefetch(trace)
    # every prefetch thread ended with the queue: a later call starts new ones
    assert trace._prefetching.threads == 0 and not trace._prefetching.todo
    assert sorted(order) == sorted(["gpu_ops", "nvtx", "cuda_api", "cpu_samples", "sched",
                                    "osrt"])
    assert most[0] == 2
    for name in order:  # built: asking for them builds nothing again
        trace.frame(name)
    assert len(order) == 6


def test_prefetch_first_goes_ahead_of_the_waiting_frames() -> None:
    """``first`` puts frames ahead of those no thread took yet (the host frames of a trace
    whose builds are bounded), and a call may add threads up to its ``workers``."""
    loader, most, order = _recording_loader(0.1)
    trace = _trace(loader)
    trace.prefetch(["gpu_ops", "nvtx", "cuda_api", "sync"], workers=1)
    _until_built(order)  # the one thread took gpu_ops
    trace.prefetch(["cpu_samples", "sched"], workers=1, first=True)
    _wait_for_prefetch(trace)
    assert order == ["gpu_ops", "cpu_samples", "sched", "nvtx", "cuda_api", "sync"]
    assert most[0] == 1
    # more workers than run: the call starts the difference
    loader, most, order = _recording_loader(0.3)
    trace = _trace(loader)
    trace.prefetch(["gpu_ops", "nvtx", "cuda_api", "sync"], workers=2)
    trace.prefetch(["cpu_samples", "sched"], workers=4, first=True)
    _wait_for_prefetch(trace)
    assert most[0] == 4 and sorted(order[:4]) == ["cpu_samples", "gpu_ops", "nvtx", "sched"]


def test_release_takes_waiting_frames_off_the_prefetch_queue() -> None:
    """A released trace is not built again behind the caller's back: frames no prefetch
    thread took yet are dropped from the queue (a job releases each rank's frames)."""
    loader, calls, gate = _gated_loader()
    trace = _trace(loader)
    trace.prefetch(["gpu_ops", "nvtx", "cuda_api", "sync"], workers=1)
    _until_built(calls)  # the one thread took gpu_ops
    trace.release(["cuda_api"])
    assert list(trace._prefetching.todo) == ["nvtx", "sync"]
    trace.release()  # everything: the waiting frames too
    assert not trace._prefetching.todo
    gate.set()
    _wait_for_prefetch(trace)
    assert calls == ["gpu_ops"]  # the build under way ended (and is kept); nothing else
    assert "gpu_ops" in trace._frames
    trace.frame("nvtx")  # asked for later: built then
    assert calls == ["gpu_ops", "nvtx"]


def test_frame_builds_are_bounded_above_the_concurrency_limit() -> None:
    """Four frames at once on a trace of up to `CONCURRENT_MAX_OPS` kernels, two above it."""
    from nsysan.frames.trace import TableCounts
    from nsysan.passes.schedule import CONCURRENT_MAX_OPS, build_workers

    for kernels, workers in ((10, 4), (CONCURRENT_MAX_OPS, 4), (CONCURRENT_MAX_OPS + 1, 2)):
        trace = _trace(lambda name: schemas.empty(schemas.CANONICAL[name]))
        trace.meta.tables = TableCounts({"CUPTI_ACTIVITY_KIND_KERNEL": kernels})
        assert build_workers(trace) == workers


def test_a_prefetch_thread_that_cannot_start_is_not_counted(monkeypatch) -> None:
    """When the system gives no thread, the queue does not count one: a later prefetch
    starts threads again, and every frame is still built (by it, or by the caller)."""
    loader, _, order = _recording_loader(0.0)
    trace = _trace(loader)

    def refuse(self) -> None:
        raise RuntimeError("can't start new thread")

    with monkeypatch.context() as patch:
        patch.setattr(threading.Thread, "start", refuse)
        trace.prefetch(["gpu_ops", "nvtx"])
    assert trace._prefetching.threads == 0
    trace.prefetch(["cuda_api"])
    _wait_for_prefetch(trace)
    assert sorted(order) == ["cuda_api", "gpu_ops", "nvtx"]


def test_the_build_bound_does_not_wait_for_the_row_counts() -> None:
    """How many frames are built at once is decided as soon as a SQLite trace is open: from
    the span of the kernel table's rowids, not from its count(*) (seconds on a cold 10M-kernel
    file), which may still be running."""
    from concurrent.futures import Future

    from nsysan.frames.trace import TableCounts
    from nsysan.passes.schedule import CONCURRENT_MAX_OPS, build_workers

    never: Future[dict[str, int]] = Future()  # counts that never finish
    kernel = "CUPTI_ACTIVITY_KIND_KERNEL"
    for bound, workers in ((10, 4), (CONCURRENT_MAX_OPS + 1, 2)):
        trace = _trace(lambda name: schemas.empty(schemas.CANONICAL[name]))
        trace.meta.tables = TableCounts(names=[kernel], nonempty={kernel: True},
                                        pending=never, bounds={kernel: bound})
        assert build_workers(trace) == workers
    # the SQLite source gives the bounds: here, the row counts themselves
    fixture = Path(__file__).resolve().parent.parent / "fixtures" / "example_ddp.sqlite"
    trace = open_trace(fixture, frame_cache=False)
    tables = trace.meta.tables
    bounds = tables._bounds  # (the counts may have finished: at_most then gives them)
    assert set(bounds) == set(tables) and all(bounds[t] >= n for t, n in tables.items())
    assert bounds[kernel] == tables[kernel] > 0


@pytest.mark.parametrize("seed", range(8))
def test_content_sort_in_place_equals_content_sort(seed: int) -> None:
    """`content_sort_in_place` (the final sorts of ``cpu_samples`` and ``sched``) gives the
    frame `content_sort` gives, on chunked frames with ties, nulls, Categorical text (sorted
    lexically) and descending keys, with and without an explicit ``ties`` list."""
    import numpy as np

    from nsysan.frames.order import content_sort, content_sort_in_place

    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 300))
    df = pl.DataFrame({
        "t": rng.integers(0, 15, n),
        "u": pl.Series(rng.integers(0, 3, n)).set(pl.Series(rng.random(n) < 0.2), None),
        "name": pl.Series(rng.choice(["b", "a", "c", "aa"], n)).cast(pl.Categorical()),
        "v": rng.integers(0, 2, n),
    })
    cut = int(rng.integers(1, n))
    chunked = pl.concat([df[:cut], df[cut:]], rechunk=False)
    descending = [bool(seed % 2), False]
    ties = None if seed % 3 else ["t", "u", "name"]
    expected = content_sort(df, ["t", "u"], descending=descending, ties=ties)
    own = chunked.clone()
    out = content_sort_in_place(own, ["t", "u"], descending=descending, ties=ties)
    assert out.equals(expected) and own.equals(expected)
    assert chunked.equals(df)


@pytest.mark.parametrize("seed", range(8))
def test_content_sort_in_place_of_a_frame_sorted_by_its_first_key(seed: int) -> None:
    """A frame already in first-key order (CPU samples by time) has only its runs of equal
    first keys sorted: the result is `content_sort`'s, with ties, nulls and text in the
    other keys and columns."""
    import numpy as np

    from nsysan.frames.order import _runs_order, content_sort, content_sort_in_place

    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 300))
    df = pl.DataFrame({
        "t": np.sort(rng.integers(0, n // 3 + 2, n)),
        "u": pl.Series(rng.integers(0, 3, n)).set(pl.Series(rng.random(n) < 0.2), None),
        "name": pl.Series(rng.choice(["b", "a", "c", "aa"], n)).cast(pl.Categorical()),
        "v": rng.integers(0, 2, n),
    })
    cut = int(rng.integers(1, n))
    chunked = pl.concat([df[:cut], df[cut:]], rechunk=False)
    ties = None if seed % 3 else ["t", "u", "name"]
    runs = _runs_order(chunked, ["t", "u"])  # the path this frame takes
    assert runs is not None and runs.to_list() == chunked.select(pl.arg_sort_by(
        "t", "u", nulls_last=False, maintain_order=True)).to_series().to_list()
    expected = content_sort(df, ["t", "u"], ties=ties)
    out = content_sort_in_place(chunked.clone(), ["t", "u"], ties=ties)
    assert out.equals(expected)


@pytest.mark.parametrize("slice_rows", [1, 2, 3, 7, 1 << 20])
def test_strictly_increasing_matches_a_sort_check(slice_rows: int, monkeypatch) -> None:
    """`strictly_increasing` says True exactly when the rows are in strictly increasing
    ascending key order with no null key, whatever the slices it tests them in: a step
    down or a tie at a slice boundary is found."""
    import itertools

    import numpy as np

    from nsysan.frames import order

    monkeypatch.setattr(order, "INCREASING_SLICE", slice_rows)
    rng = np.random.default_rng(slice_rows)
    base = pl.DataFrame({"t": [1, 1, 2, 2, 3, 5, 5, 9], "g": [1, 2, 1, 3, 0, 4, 6, 0],
                         "s": list(range(8))})

    def reference(df: pl.DataFrame) -> bool:
        if df.select(pl.any_horizontal(pl.all().is_null().any())).item():
            return False
        rows = df.rows()
        return all(a < b for a, b in itertools.pairwise(rows))

    cases = [base, base.head(1), base.head(0), base.with_columns(s=pl.lit(0)), base.reverse()]
    for at in range(1, 8):  # a step down at every position (slice boundaries included)
        cases.append(base.with_columns(pl.Series("t", [*base["t"][:at], 0, *base["t"][at + 1:]])))
        cases.append(base.with_columns(s=pl.Series([*range(at), at - 1, *range(at + 1, 8)])))
    cases.append(base.with_columns(pl.Series("g", [1, None, 1, 3, 0, 4, 6, 0])))
    for _ in range(20):
        n = int(rng.integers(0, 12))
        cases.append(pl.DataFrame({"t": np.sort(rng.integers(0, 4, n)),
                                   "g": rng.integers(0, 3, n), "s": rng.integers(0, 3, n)}))
    for df in cases:
        assert order.strictly_increasing(df, ["t", "g", "s"]) == reference(df), df
    # comparisons, not differences: no wrap-around at the ends of the type
    for dtype, values in ((pl.Int8, [127, -128]), (pl.Int64, [2**63 - 1, -2]),
                          (pl.UInt64, [2**64 - 1, 0])):
        wrapped = pl.DataFrame({"t": pl.Series(values, dtype=dtype), "g": [0, 0], "s": [0, 1]})
        assert not order.strictly_increasing(wrapped, ["t", "g", "s"])  # as the first key
        assert not order.strictly_increasing(wrapped, ["g", "t"])  # as a later key
    for not_integers in (base.with_columns(pl.col("g").cast(pl.String)),
                         base.with_columns(pl.col("g").cast(pl.Float64))):
        assert not order.strictly_increasing(not_integers, ["t", "g"])  # not tested


def test_content_sort_in_place_leaves_an_ordered_frame_as_it_is() -> None:
    """The fast path: a frame already in strictly increasing key order keeps its column
    buffers (no gather copied them), and is what `content_sort` gives; a frame out of order
    is sorted into new ones."""
    from nsysan.frames.order import content_sort, content_sort_in_place

    def buffer(df: pl.DataFrame) -> int:
        return df["x"]._get_buffer_info()[0]

    ordered = pl.DataFrame({"t": [1, 1, 2], "g": [1, 2, 0], "x": [30, 10, 20]})
    expected, before = content_sort(ordered, ["t", "g"]), buffer(ordered)
    out = content_sort_in_place(ordered, ["t", "g"])
    assert out.equals(expected) and buffer(out) == before
    shuffled = ordered.reverse()
    before = buffer(shuffled)
    out = content_sort_in_place(shuffled, ["t", "g"])
    assert out.equals(expected) and buffer(out) != before


def test_a_frame_released_while_it_is_built_is_still_returned(monkeypatch) -> None:
    """A `release` from another thread between the build and the return (here: inside the
    heap trim that follows the build) does not turn the caller's request into a KeyError."""
    import nsysan.frames.trace as trace_module

    trace = _trace(lambda name: schemas.empty(schemas.CANONICAL[name]))
    monkeypatch.setattr(trace_module, "trim", lambda: trace.release(["gpu_ops"]))
    assert trace.frame("gpu_ops").schema == schemas.GPU_OPS
