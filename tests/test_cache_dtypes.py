"""The frame cache gives back exactly the frames it stored: every column with the dtype of a
freshly built frame (Categorical names and Enum labels stay Categorical and the same Enum,
`nsysan.frames.schemas` conventions), values equal."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from conftest import REPO_ROOT
from polars.testing import assert_frame_equal

from nsysan.frames import schemas, schemas_host
from nsysan.load import cache, open_trace
from nsysan.load.sqlite import SqliteSource

FIXTURES = REPO_ROOT / "fixtures"
ALL_FRAMES = {**schemas.CANONICAL, **schemas_host.HOST_EVIDENCE}


@pytest.mark.parametrize("name", ["example_ddp.sqlite", "cpu_host_sampling.sqlite",
                                  "cpu_nvtx_osrt.sqlite"])
def test_cached_frames_have_the_dtypes_of_built_ones(name: str, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NSYSAN_NO_CACHE", raising=False)
    src = FIXTURES / name
    built = open_trace(src, cache_dir=tmp_path, frame_cache=True)
    fresh = {frame: built.frame(frame) for frame in ALL_FRAMES}
    cache.flush()  # files are written in the background
    folder = next((tmp_path / "frames").iterdir())
    # every frame as its data and its dictionary values (`nsysan.load.frame_file`)
    assert {p.name for p in folder.glob("*.arrow")} == {
        f"{frame}{suffix}" for frame in ALL_FRAMES for suffix in (".arrow", ".values.arrow")}

    again = open_trace(src, cache_dir=tmp_path, frame_cache=True)

    def boom(*args: object) -> None:
        raise AssertionError("a cache hit must not read SQLite")

    # (the metadata was read by the open; `read` goes through `read_narrowed`)
    monkeypatch.setattr(SqliteSource, "read_narrowed", boom)
    for frame, schema in ALL_FRAMES.items():
        got = again.frame(frame)
        assert fresh[frame].schema == schema, frame
        assert got.schema == schema, frame
        assert_frame_equal(got, fresh[frame])


def test_encoded_columns_survive_the_cache_with_values_outside_the_first_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Categories are global: a second trace's frames, read from the cache after other names
    # were made, decode to their own names (no code is stored as a bare integer).
    monkeypatch.delenv("NSYSAN_NO_CACHE", raising=False)
    src = FIXTURES / "example_layers.sqlite"
    fresh = open_trace(src, cache_dir=tmp_path, frame_cache=True).frame("nvtx")
    cache.flush()
    pl.Series(["unrelated", "names", "made", "between"]).cast(schemas.CAT)
    got = open_trace(src, cache_dir=tmp_path, frame_cache=True).frame("nvtx")
    assert got.schema["name"] == schemas.CAT
    assert got["name"].to_list() == fresh["name"].to_list()
    assert got["style"].dtype == schemas.NVTX_STYLE


def test_the_cache_stores_no_trace_id_and_serves_the_callers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the id is the caller's (a file renamed or opened with --trace-id), not the first run's
    monkeypatch.delenv("NSYSAN_NO_CACHE", raising=False)
    src = FIXTURES / "example_ddp.sqlite"
    first = open_trace(src, cache_dir=tmp_path, frame_cache=True).frame("gpu_ops")
    cache.flush()
    folder = next((tmp_path / "frames").iterdir())
    assert "trace_id" not in pl.read_ipc_schema(folder / "gpu_ops.arrow")
    again = open_trace(src, cache_dir=tmp_path, frame_cache=True, trace_id="renamed")
    got = again.frame("gpu_ops")
    assert got.schema == schemas.GPU_OPS
    assert got["trace_id"].unique().to_list() == ["renamed"]
    assert_frame_equal(got.drop("trace_id"), first.drop("trace_id"))
