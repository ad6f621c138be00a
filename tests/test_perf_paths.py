"""Performance paths must not change results: ADBC integer reads, the frame cache,
the scaled-trace generator of bench/ (issue 9)."""

from __future__ import annotations

import importlib.util
import sqlite3
import sys
from pathlib import Path

import polars as pl
import pytest
from conftest import REPO_ROOT, make_nsys_sqlite

from nsysan.frames import schemas
from nsysan.load import cache, open_trace
from nsysan.load.sqlite import SqliteSource

SC22 = "sc22-ddp-4gpu-nccl/4gpu_baseline.nsys-rep.nsys2022.4.2.sqlite"
HAS_ADBC = importlib.util.find_spec("adbc_driver_sqlite") is not None


def _rows(n: int) -> list[dict]:
    return [{"start": 10 * i, "end": 10 * i + 5, "eventClass": 0, "globalTid": 7, "nameId": 1,
             "returnValue": 0, "correlationId": i if i % 3 else None} for i in range(n)]


@pytest.mark.skipif(not HAS_ADBC, reason="adbc-driver-sqlite not installed")
@pytest.mark.parametrize("name", ["t.sqlite", "dir with space/a?b#c%20.sqlite"])
def test_integer_columns_come_through_adbc_and_match_the_row_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    path = tmp_path / name
    path.parent.mkdir(exist_ok=True)
    make_nsys_sqlite(path, {"CUPTI_ACTIVITY_KIND_RUNTIME": _rows(3000)})
    cols = ["end", "start", "correlationId", "nameId"]
    fast = SqliteSource(path)
    used = []
    orig = SqliteSource._read_ints
    monkeypatch.setattr(SqliteSource, "_read_ints",
                        lambda self, t, c: used.append(r := orig(self, t, c)) or r)
    got = fast.read("CUPTI_ACTIVITY_KIND_RUNTIME", cols)
    assert used and used[0] is not None  # the fast path answered
    monkeypatch.setenv("NSYSAN_NO_ADBC", "1")
    slow = SqliteSource(path).read("CUPTI_ACTIVITY_KIND_RUNTIME", cols)
    assert got.equals(slow) and got.schema == slow.schema
    assert got["correlationId"].null_count() == 1000


@pytest.mark.parametrize("bad", ["text", b"\x00", 1.5])
def test_a_stray_value_anywhere_reads_as_on_the_row_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bad: object
) -> None:
    # a value that is not an integer (a non-integral real included: it used to be cut to 1)
    # is NULL on every path, and counted (docs/data-quality.md, value_not_integer)
    rows = _rows(5000)
    rows[4000]["start"] = bad  # past ADBC's first batch, where it has typed the column
    path = make_nsys_sqlite(tmp_path / "t.sqlite", {"CUPTI_ACTIVITY_KIND_RUNTIME": rows})
    src = SqliteSource(path)
    df = src.read("CUPTI_ACTIVITY_KIND_RUNTIME", ["start", "end"])
    assert df.height == 5000 and df.schema["start"] == pl.Int64
    assert df["start"][4000] is None and df["start"][3999] == 39990
    assert src.issues("CUPTI_ACTIVITY_KIND_RUNTIME") == {"start": {"nulled": 1}}
    monkeypatch.setenv("NSYSAN_NO_ADBC", "1")
    slow = SqliteSource(path)
    assert df.equals(slow.read("CUPTI_ACTIVITY_KIND_RUNTIME", ["start", "end"]))
    assert slow.issues("CUPTI_ACTIVITY_KIND_RUNTIME") == {"start": {"nulled": 1}}


def _frames(trace) -> dict[str, pl.DataFrame]:
    return {name: trace.frame(name) for name in ("gpu_ops", "cuda_api", "nvtx", "sync", "meta")}


def test_frame_cache_gives_identical_frames_and_notes(
    shared_traces: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NSYSAN_NO_CACHE", raising=False)
    src = shared_traces / SC22
    first = open_trace(src, cache_dir=tmp_path, frame_cache=True)
    a = _frames(first)
    cache.flush()  # files are written in the background
    folder = next((tmp_path / "frames").iterdir())
    assert {p.name for p in folder.glob("*.arrow")} >= {"gpu_ops.arrow", "nvtx.arrow"}
    second = open_trace(src, cache_dir=tmp_path, frame_cache=True, trace_id="other")

    def boom(*args: object) -> None:
        raise AssertionError("a cache hit must not read SQLite")

    monkeypatch.setattr(SqliteSource, "read_narrowed", boom)  # (`read` goes through it)
    b = _frames(second)
    for name, df in a.items():
        expect = df.with_columns(pl.lit("other").alias("trace_id")) if "trace_id" in df else df
        # (`equals` compares values only: a String column equals its Categorical)
        assert b[name].schema == df.schema == schemas.CANONICAL[name], name
        assert b[name].equals(expect), name
        assert b[name].n_chunks() == 1, name
    assert second.meta.notes == first.meta.notes


def test_cache_is_off_for_small_files_and_on_request(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NSYSAN_NO_CACHE", raising=False)
    path = make_nsys_sqlite(tmp_path / "t.sqlite", {"CUPTI_ACTIVITY_KIND_RUNTIME": _rows(10)})
    assert not cache.enabled(path, "sqlite", None)  # below MIN_BYTES
    assert cache.enabled(path, "sqlite", True)
    assert not cache.enabled(path, "parquetdir", True)
    monkeypatch.setenv("NSYSAN_NO_CACHE", "1")
    assert not cache.enabled(path, "sqlite", True)


def test_cache_key_changes_with_content(tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(b"a" * (3 << 20))
    k1 = cache.content_key(path)
    data = bytearray(path.read_bytes())
    data[-10] = ord("b")
    path.write_bytes(bytes(data))
    assert cache.content_key(path) != k1


def test_scale_trace_replicates_with_consistent_ids(shared_traces: Path, tmp_path: Path) -> None:
    sys.path.insert(0, str(REPO_ROOT / "bench"))
    try:
        import scale_trace
    finally:
        sys.path.pop(0)
    out = tmp_path / "x3.sqlite"
    counts = scale_trace.scale(shared_traces / SC22, out, 3)
    src = sqlite3.connect(shared_traces / SC22)
    n_kernels = src.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    span = src.execute("SELECT duration FROM ANALYSIS_DETAILS").fetchone()[0]
    src.close()
    assert counts["CUPTI_ACTIVITY_KIND_KERNEL"] == 3 * n_kernels
    def ids(path: Path, table: str) -> pl.Series:
        return SqliteSource(path).read(table, ["correlationId"])["correlationId"].drop_nulls()

    api, kern = (ids(out, f"CUPTI_ACTIVITY_KIND_{t}") for t in ("RUNTIME", "KERNEL"))
    api0, kern0 = (ids(shared_traces / SC22, f"CUPTI_ACTIVITY_KIND_{t}")
                   for t in ("RUNTIME", "KERNEL"))
    # ids stay unique per copy: 3x the distinct ids, and kernels find their launches as often
    assert api.n_unique() == 3 * api0.n_unique()
    assert kern.is_in(api.implode()).sum() == 3 * kern0.is_in(api0.implode()).sum()
    con = sqlite3.connect(out)
    assert con.execute("SELECT duration FROM ANALYSIS_DETAILS").fetchone()[0] >= 3 * span
    con.close()
    trace = open_trace(out, frame_cache=False)
    assert trace.gpu_ops.filter(pl.col("kind") == "kernel").height == 3 * n_kernels
