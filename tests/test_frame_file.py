"""The frame cache's file format (`nsysan.load.frame_file`): every frame comes back equal, with
its dtypes, in one chunk; dictionary columns as codes; one mapping per column; a file it did
not write is refused, and the cache then builds the frame again from the export."""

from __future__ import annotations

import os
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
from conftest import REPO_ROOT
from polars.testing import assert_frame_equal

from nsysan.frames import schemas
from nsysan.load import cache, open_trace
from nsysan.load.frame_file import read_frame, write_frame
from nsysan.load.sqlite import SqliteSource

NAMED = pl.Categorical(pl.Categories("nsysan_test_kind", physical=pl.UInt8))


def _sample() -> pl.DataFrame:
    return pl.DataFrame({
        "n": pl.Series([1, None, 3, 4], dtype=pl.Int64),
        "u": pl.Series([7, 8, None, 9], dtype=pl.UInt16),
        "cat": pl.Series(["a", None, "b", "a"], dtype=pl.Categorical),
        "named": pl.Series(["x", "y", None, "x"], dtype=NAMED),
        "enum": pl.Series(["kernel", None, "memset", "kernel"],
                          dtype=pl.Enum(["kernel", "memcpy", "memset"])),
        "text": ["p", None, "q", "r"],
        "flag": [True, None, False, True],
    })


def _stored_types(path: Path) -> dict[str, pa.DataType]:
    with pa.memory_map(str(path)) as source:
        schema = ipc.open_file(source).schema
    return {f.name: f.type for f in schema}


def test_a_frame_comes_back_equal_with_its_dtypes(tmp_path: Path) -> None:
    df = _sample()
    write_frame(df, tmp_path / "f.arrow")
    got = read_frame(tmp_path / "f.arrow")
    assert got.schema == df.schema
    assert_frame_equal(got, df)
    # the dictionary columns are stored as integer codes, nothing per row but the code
    stored = _stored_types(tmp_path / "f.arrow")
    assert all(stored[c] == pa.uint8() for c in ("cat", "named", "enum"))
    assert stored["n"] == pa.int64()


def test_codes_take_the_narrowest_width(tmp_path: Path) -> None:
    many = pl.DataFrame({"c": pl.Series([f"v{i}" for i in range(300)], dtype=pl.Categorical)})
    write_frame(many, tmp_path / "f.arrow")
    assert _stored_types(tmp_path / "f.arrow")["c"] == pa.uint16()
    assert_frame_equal(read_frame(tmp_path / "f.arrow"), many)


def test_codes_decode_to_their_own_names_after_other_categories_were_made(
        tmp_path: Path) -> None:
    # categories are global to a process: a frame written by another process (or before
    # these names existed) must decode to its names, not to whatever ids now mean
    df = pl.DataFrame({"c": pl.Series(["late", "later", None], dtype=pl.Categorical)})
    write_frame(df, tmp_path / "f.arrow")
    pl.Series([f"other{i}" for i in range(50)]).cast(pl.Categorical)
    assert read_frame(tmp_path / "f.arrow")["c"].to_list() == ["late", "later", None]


@pytest.mark.parametrize("df", [
    _sample().head(0),
    pl.DataFrame({"c": pl.Series([None, None], dtype=pl.Categorical)}),
    pl.DataFrame(),
], ids=["no rows", "all null", "no columns"])
def test_edge_frames_come_back(df: pl.DataFrame, tmp_path: Path) -> None:
    write_frame(df, tmp_path / "f.arrow")
    got = read_frame(tmp_path / "f.arrow")
    assert got.schema == df.schema and got.shape == df.shape
    assert_frame_equal(got, df)


def test_a_frame_in_several_chunks_comes_back_in_one(tmp_path: Path) -> None:
    # passes on chunked frames ran 12-15% slower (sorts, gathers and joins)
    df = pl.concat([_sample(), _sample(), _sample()], rechunk=False)
    assert df.n_chunks("all") == [3] * df.width
    write_frame(df, tmp_path / "f.arrow")
    got = read_frame(tmp_path / "f.arrow")
    assert got.n_chunks("all") == [1] * df.width
    assert_frame_equal(got, df)


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="Linux /proc only")
def test_each_column_is_its_own_mapping(tmp_path: Path) -> None:
    # a column that outlives its frame (kept by a pass's result) must not keep the whole
    # file resident; the codes' mapping goes once they are decoded
    path = tmp_path / "f.arrow"
    write_frame(_sample(), path)

    def mappings() -> int:
        with open("/proc/self/maps") as maps:
            return sum(line.rstrip().endswith(str(path)) for line in maps)

    df = read_frame(path)
    plain = [c for c, t in df.schema.items() if not isinstance(t, (pl.Categorical, pl.Enum))]
    assert mappings() == len(plain)
    kept = df.get_column("n")
    del df
    assert mappings() == 1
    del kept
    assert mappings() == 0


def test_a_file_it_did_not_write_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "f.arrow"
    pl.DataFrame({"a": [1, 2]}).write_ipc(path)  # an IPC file, without the values
    with pytest.raises(ValueError, match="not a frame file"):
        read_frame(path)
    path.write_bytes(b"not arrow at all")
    with pytest.raises((OSError, ValueError, pl.exceptions.PolarsError)):
        read_frame(path)


def test_codes_outside_the_values_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "f.arrow"
    write_frame(pl.DataFrame({"c": pl.Series(["a", "b"], dtype=pl.Categorical)}), path)
    with pa.memory_map(str(path)) as source:
        table = ipc.open_file(source).read_all()
    codes = pa.array([0, 5], pa.uint8())  # 5: no such value
    bad = pa.table({"c": codes}).replace_schema_metadata(table.schema.metadata)
    with pa.OSFile(str(path), "wb") as sink, ipc.new_file(sink, bad.schema) as writer:
        writer.write_table(bad)
    with pytest.raises(pl.exceptions.PolarsError):
        read_frame(path)


@pytest.mark.parametrize("damage", ["truncated", "garbage", "no values"])
def test_a_damaged_cache_file_is_built_again(damage: str, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NSYSAN_NO_CACHE", raising=False)
    src = REPO_ROOT / "fixtures" / "example_ddp.sqlite"
    fresh = open_trace(src, cache_dir=tmp_path, frame_cache=True).frame("gpu_ops")
    cache.flush()
    (data,) = (tmp_path / "frames").rglob("gpu_ops.arrow")
    if damage == "truncated":
        os.truncate(data, data.stat().st_size // 2)
    elif damage == "garbage":
        data.write_bytes(os.urandom(data.stat().st_size))
    else:
        pl.DataFrame({"start_ns": [1]}).write_ipc(data)
    reads: list[str] = []
    real = SqliteSource.read

    def counted(self: SqliteSource, table: str, *args: object, **kwargs: object) -> object:
        reads.append(table)
        return real(self, table, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(SqliteSource, "read", counted)
    again = open_trace(src, cache_dir=tmp_path, frame_cache=True).frame("gpu_ops")
    assert reads  # built from the export
    assert again.schema == schemas.GPU_OPS
    assert_frame_equal(again, fresh)
    cache.flush()
    assert_frame_equal(read_frame(data).drop("trace_id", strict=False),
                       fresh.drop("trace_id"))  # and stored again
