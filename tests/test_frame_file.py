"""The frame cache's file format (`nsysan.load.frame_file`): every frame comes back equal, with
its dtypes, in one chunk; dictionary columns as codes; one mapping per column; a file it did
not write is refused, and the cache then builds the frame again from the export."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
from conftest import REPO_ROOT
from polars.testing import assert_frame_equal

from nsysan.frames import schemas
from nsysan.load import cache, frame_file, open_trace
from nsysan.load.frame_file import TOKEN_COLUMN, VALUE_PREFIX, read_frame, write_frame
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


def _write(df: pl.DataFrame, tmp_path: Path) -> Path:
    write_frame(df, tmp_path / "f.arrow", tmp_path / "f.values.arrow")
    return tmp_path / "f.arrow"


def _read(tmp_path: Path) -> pl.DataFrame:
    return read_frame(tmp_path / "f.arrow", tmp_path / "f.values.arrow")


def _stored_types(path: Path) -> dict[str, pa.DataType]:
    with pa.memory_map(str(path)) as source:
        schema = ipc.open_file(source).schema
    return {f.name: f.type for f in schema}


def test_a_frame_comes_back_equal_with_its_dtypes(tmp_path: Path) -> None:
    df = _sample()
    _write(df, tmp_path)
    got = _read(tmp_path)
    assert got.schema == df.schema
    assert_frame_equal(got, df)
    # the dictionary columns are stored as integer codes, nothing per row but the code
    stored = _stored_types(tmp_path / "f.arrow")
    assert all(stored[c] == pa.uint8() for c in ("cat", "named", "enum"))
    assert stored["n"] == pa.int64()


def test_codes_take_the_narrowest_width(tmp_path: Path) -> None:
    many = pl.DataFrame({"c": pl.Series([f"v{i}" for i in range(300)], dtype=pl.Categorical)})
    _write(many, tmp_path)
    assert _stored_types(tmp_path / "f.arrow")["c"] == pa.uint16()
    assert_frame_equal(_read(tmp_path), many)


def test_codes_decode_to_their_own_names_after_other_categories_were_made(
        tmp_path: Path) -> None:
    # categories are global to a process: a frame written by another process (or before
    # these names existed) must decode to its names, not to whatever ids now mean
    df = pl.DataFrame({"c": pl.Series(["late", "later", None], dtype=pl.Categorical)})
    _write(df, tmp_path)
    pl.Series([f"other{i}" for i in range(50)]).cast(pl.Categorical)
    assert _read(tmp_path)["c"].to_list() == ["late", "later", None]


@pytest.mark.parametrize("df", [
    _sample().head(0),
    pl.DataFrame({"c": pl.Series([None, None], dtype=pl.Categorical)}),
    pl.DataFrame(),
], ids=["no rows", "all null", "no columns"])
def test_edge_frames_come_back(df: pl.DataFrame, tmp_path: Path) -> None:
    _write(df, tmp_path)
    got = _read(tmp_path)
    assert got.schema == df.schema and got.shape == df.shape
    assert_frame_equal(got, df)


def test_a_frame_in_several_chunks_comes_back_in_one(tmp_path: Path) -> None:
    # passes on chunked frames ran 12-15% slower (sorts, gathers and joins)
    df = pl.concat([_sample(), _sample(), _sample()], rechunk=False)
    assert df.n_chunks("all") == [3] * df.width
    _write(df, tmp_path)
    got = _read(tmp_path)
    assert got.n_chunks("all") == [1] * df.width
    assert_frame_equal(got, df)


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="Linux /proc only")
def test_each_column_is_its_own_mapping(tmp_path: Path) -> None:
    # a column that outlives its frame (kept by a pass's result) must not keep the whole
    # file resident; the codes' mapping goes once they are decoded
    path = _write(_sample(), tmp_path)

    def mappings() -> int:
        with open("/proc/self/maps") as maps:
            return sum(line.rstrip().endswith(str(path)) for line in maps)

    df = _read(tmp_path)
    plain = [c for c, t in df.schema.items() if not isinstance(t, (pl.Categorical, pl.Enum))]
    assert mappings() == len(plain)
    kept = df.get_column("n")
    del df
    assert mappings() == 1
    del kept
    assert mappings() == 0


def _rewrite_data(tmp_path: Path, table: pa.Table) -> None:
    """Replace the data file by ``table``, keeping the token that pairs it with its values."""
    path = tmp_path / "f.arrow"
    with pa.memory_map(str(path)) as source:
        metadata = ipc.open_file(source).schema.metadata
    table = table.replace_schema_metadata(metadata)
    with pa.OSFile(str(path), "wb") as sink, ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)


def _rewrite_values(tmp_path: Path, change) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "f.values.arrow"
    change(pl.read_ipc(path)).write_ipc(path)


def test_files_it_did_not_write_together_are_refused(tmp_path: Path) -> None:
    _write(_sample(), tmp_path)
    write_frame(_sample(), tmp_path / "g.arrow", tmp_path / "g.values.arrow")
    with pytest.raises(ValueError, match="not the pair"):  # another write's values
        read_frame(tmp_path / "f.arrow", tmp_path / "g.values.arrow")
    pl.DataFrame({"a": [1, 2]}).write_ipc(tmp_path / "f.arrow")  # IPC, but no token
    with pytest.raises(ValueError, match="not a frame file"):
        _read(tmp_path)
    (tmp_path / "f.arrow").write_bytes(b"not arrow at all")
    with pytest.raises((OSError, ValueError, pl.exceptions.PolarsError)):
        _read(tmp_path)


def _token(df: pl.DataFrame) -> pl.Series:
    return df.get_column(TOKEN_COLUMN)


@pytest.mark.parametrize("change", [
    lambda v: v.clear(),  # no row
    lambda v: pl.concat([v, v]),  # two rows
    lambda v: v.with_columns(pl.lit(None, pl.List(pl.Categorical)).alias(VALUE_PREFIX + "cat")),
    lambda v: v.with_columns(pl.lit(7).alias(VALUE_PREFIX + "cat")),  # not a list
    lambda v: v.with_columns(pl.lit(["a", "b"]).alias(VALUE_PREFIX + "cat")),  # strings
    lambda v: v.with_columns(pl.lit(["a"]).cast(pl.List(pl.Categorical)).alias("cat")),
    lambda v: v.drop(VALUE_PREFIX + "cat"),  # codes without their values
    lambda v: v.with_columns(pl.lit(["a"]).cast(pl.List(pl.Categorical)).alias(
        VALUE_PREFIX + "absent")),  # values of a column the frame lacks
], ids=["no row", "two rows", "null list", "not a list", "strings", "unprefixed",
        "missing", "extra"])
def test_values_it_did_not_write_are_refused(change, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    _write(_sample(), tmp_path)
    _rewrite_values(tmp_path, change)
    with pytest.raises(ValueError):
        _read(tmp_path)


def test_codes_outside_the_values_or_signed_are_refused(tmp_path: Path) -> None:
    _write(pl.DataFrame({"c": pl.Series(["a", "b"], dtype=pl.Categorical)}), tmp_path)
    _rewrite_data(tmp_path, pa.table({"c": pa.array([0, 5], pa.uint8())}))  # 5: no value
    with pytest.raises(pl.exceptions.PolarsError):
        _read(tmp_path)
    # a signed code would wrap (gather takes -1 as the last value): refused, not decoded
    _rewrite_data(tmp_path, pa.table({"c": pa.array([0, -1], pa.int8())}))
    with pytest.raises(ValueError, match="codes of 'c' are"):
        _read(tmp_path)


def test_a_file_replaced_while_read_is_refused(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    # columns are mapped one at a time: a writer's rename between two of them (another
    # analysis storing the same frame) must not give a frame mixed from two files
    path = _write(_sample(), tmp_path)
    write_frame(_sample(), tmp_path / "g.arrow", tmp_path / "g.values.arrow")
    real = pl.read_ipc
    calls: list[int] = []

    def replacing(*args: object, **kwargs: object) -> pl.DataFrame:
        calls.append(1)
        if len(calls) == 3:  # (the values, the first column, then the replacement)
            os.replace(tmp_path / "g.arrow", path)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(pl, "read_ipc", replacing)
    with pytest.raises(ValueError, match="replaced while it was read"):
        _read(tmp_path)


def _cached(tmp_path: Path) -> tuple[pl.DataFrame, Path]:
    src = REPO_ROOT / "fixtures" / "example_ddp.sqlite"
    fresh = open_trace(src, cache_dir=tmp_path, frame_cache=True).frame("gpu_ops")
    cache.flush()
    (data,) = (tmp_path / "frames").rglob("gpu_ops.arrow")
    # a copy in memory: the frame is mapped from the file the tests damage in place (a file
    # cut short under a mapping kills the process that reads it: SIGBUS)
    copy = io.BytesIO()
    fresh.write_ipc(copy)
    return pl.read_ipc(copy, memory_map=False), data


def _enum_label_damaged(data: Path) -> None:
    # one byte of an Enum label changed: still a valid file, decoded to another Enum
    values = data.with_name("gpu_ops.values.arrow")
    v = pl.read_ipc(values)
    kinds = v.get_column(VALUE_PREFIX + "kind")[0].cast(pl.String).to_list()
    damaged = pl.Enum([k.replace("kernel", "kernal") for k in kinds])
    v.with_columns(pl.Series(VALUE_PREFIX + "kind", [pl.Series(kinds).str.replace(
        "kernel", "kernal").cast(damaged)])).write_ipc(values)


def _panicking_values(data: Path) -> None:
    raise pl.exceptions.PanicException("a polars panic on a malformed file")


@pytest.mark.parametrize("damage", ["truncated", "garbage", "no token", "no values file",
                                    "enum label", "panic"])
def test_a_damaged_cache_file_is_built_again(damage: str, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NSYSAN_NO_CACHE", raising=False)
    fresh, data = _cached(tmp_path)
    if damage == "truncated":
        os.truncate(data, data.stat().st_size // 2)
    elif damage == "garbage":
        data.write_bytes(os.urandom(data.stat().st_size))
    elif damage == "no token":
        pl.DataFrame({"start_ns": [1]}).write_ipc(data)
    elif damage == "no values file":
        data.with_name("gpu_ops.values.arrow").unlink()
    elif damage == "enum label":
        _enum_label_damaged(data)
    else:
        monkeypatch.setattr(cache, "read_frame", lambda *a: _panicking_values(data))
    reads: list[str] = []
    real = SqliteSource.read_narrowed  # (every whole-table read goes through it)

    def counted(self: SqliteSource, table: str, *args: object, **kwargs: object) -> object:
        reads.append(table)
        return real(self, table, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(SqliteSource, "read_narrowed", counted)
    again = open_trace(REPO_ROOT / "fixtures" / "example_ddp.sqlite", cache_dir=tmp_path,
                       frame_cache=True).frame("gpu_ops")
    assert reads  # built from the export
    assert again.schema == schemas.GPU_OPS
    assert_frame_equal(again, fresh)
    cache.flush()
    assert_frame_equal(read_frame(data, data.with_name("gpu_ops.values.arrow")),
                       fresh.drop("trace_id"))  # and stored again


@pytest.mark.parametrize("failure", [OSError("disk full"),
                                     pl.exceptions.PanicException("a polars panic"),
                                     pa.ArrowInvalid("bad")])
def test_a_failed_cache_write_only_costs_speed(failure: BaseException, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NSYSAN_NO_CACHE", raising=False)

    def failing(df: pl.DataFrame, path: Path, values_path: Path, **_: object) -> None:
        path.write_bytes(b"partial")  # a half-written temporary file
        raise failure

    monkeypatch.setattr(cache, "write_frame", failing)
    src = REPO_ROOT / "fixtures" / "example_ddp.sqlite"
    frame = open_trace(src, cache_dir=tmp_path, frame_cache=True).frame("gpu_ops")
    cache.flush()  # raises nothing
    assert frame.schema == schemas.GPU_OPS
    assert not [p for p in (tmp_path / "frames").rglob("*") if p.is_file()
                and p.name.startswith(".")]  # no temporary file left
    assert not list((tmp_path / "frames").rglob("gpu_ops*"))


def _mapped_files() -> set[str]:
    with open("/proc/self/maps") as maps:
        return {line.split(maxsplit=5)[5].strip() for line in maps
                if len(line.split(maxsplit=5)) == 6}


def test_a_first_analysis_keeps_the_frames_it_cached_mapped(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    # the built frame is written, read back mapped and kept: the analysis holds what a
    # repeat one from the cache holds; the files are put in place in the background
    monkeypatch.delenv("NSYSAN_NO_CACHE", raising=False)
    src = REPO_ROOT / "fixtures" / "example_ddp.sqlite"
    built = open_trace(src, frame_cache=False).frame("gpu_ops")
    first = open_trace(src, cache_dir=tmp_path, frame_cache=True).frame("gpu_ops")
    assert_frame_equal(first, built)
    mapped = _mapped_files()
    assert any(m.startswith(str(tmp_path)) and "gpu_ops" in m for m in mapped), "not mapped"
    cache.flush()
    folder = next((tmp_path / "frames").iterdir())
    assert sorted(p.name for p in folder.iterdir() if p.name.startswith("gpu_ops")) == [
        "gpu_ops.arrow", "gpu_ops.notes.json", "gpu_ops.values.arrow"]
    assert not [p for p in folder.iterdir() if p.name.startswith(".")]
    assert_frame_equal(first, built)  # still readable after the rename
    again = open_trace(src, cache_dir=tmp_path, frame_cache=True).frame("gpu_ops")
    assert_frame_equal(again, built)


def test_a_cached_frame_is_on_the_disk_before_it_is_mapped(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    # pages the kernel failed to write back could later read as zeros from a mapping: the
    # files are flushed first, so that such a failure is the write's (the test below)
    monkeypatch.delenv("NSYSAN_NO_CACHE", raising=False)
    flushed: set[Path] = set()
    mapped_after_flush: list[bool] = []
    real_flush, real_read = frame_file.make_durable, cache.read_frame

    def flush(*paths: Path) -> None:
        real_flush(*paths)
        flushed.update(paths)

    def read(path: Path, values_path: Path) -> pl.DataFrame:
        mapped_after_flush.append(path in flushed and values_path in flushed)
        return real_read(path, values_path)

    monkeypatch.setattr(frame_file, "make_durable", flush)
    monkeypatch.setattr(cache, "read_frame", read)
    src = REPO_ROOT / "fixtures" / "example_ddp.sqlite"
    open_trace(src, cache_dir=tmp_path, frame_cache=True).frame("gpu_ops")
    cache.flush()
    assert mapped_after_flush == [True]


def test_a_failed_flush_keeps_the_frame_as_built(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NSYSAN_NO_CACHE", raising=False)

    def failing(*paths: Path) -> None:
        raise OSError("I/O error")

    monkeypatch.setattr(frame_file, "make_durable", failing)
    src = REPO_ROOT / "fixtures" / "example_ddp.sqlite"
    frame = open_trace(src, cache_dir=tmp_path, frame_cache=True).frame("gpu_ops")
    cache.flush()  # raises nothing
    assert not any(str(tmp_path) in m for m in _mapped_files())  # the frame as built
    assert_frame_equal(frame, open_trace(src, frame_cache=False).frame("gpu_ops"))
    assert not [p for p in (tmp_path / "frames").rglob("*") if p.is_file()
                and p.name.startswith(".")]
    assert not list((tmp_path / "frames").rglob("gpu_ops*"))


def test_a_failed_commit_leaves_no_file_and_a_readable_frame(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    monkeypatch.delenv("NSYSAN_NO_CACHE", raising=False)
    real = os.replace

    def failing_rename(a: object, b: object) -> None:
        if str(b).endswith("gpu_ops.arrow"):
            raise OSError("no space left")
        real(a, b)  # type: ignore[arg-type]

    monkeypatch.setattr(cache.os, "replace", failing_rename)
    src = REPO_ROOT / "fixtures" / "example_ddp.sqlite"
    frame = open_trace(src, cache_dir=tmp_path, frame_cache=True).frame("gpu_ops")
    cache.flush()  # raises nothing
    assert not [p for p in (tmp_path / "frames").rglob("*") if p.is_file()
                and p.name.startswith(".")]  # no temporary file left
    assert not list((tmp_path / "frames").rglob("gpu_ops.arrow"))
    # the kept frame maps a file that is now unlinked: still whole
    assert_frame_equal(frame, open_trace(src, frame_cache=False).frame("gpu_ops"))


def _undeletable_temporaries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Temporary cache files cannot be removed (a read-only or append-only cache dir)."""
    real_unlink = Path.unlink

    def unlink(self: Path, missing_ok: bool = False) -> None:
        if self.name.endswith(".tmp"):
            raise PermissionError(1, "Operation not permitted", str(self))
        real_unlink(self, missing_ok=missing_ok)

    monkeypatch.setattr(Path, "unlink", unlink)


def test_a_commit_that_cannot_clean_up_raises_nothing(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # the analysis has its frame: a cache dir that refuses both the rename and the removal
    # of the temporary files costs speed, never the analysis (nor its exit status)
    monkeypatch.delenv("NSYSAN_NO_CACHE", raising=False)

    def failing_rename(a: object, b: object) -> None:
        raise OSError("read-only file system")

    monkeypatch.setattr(cache.os, "replace", failing_rename)
    _undeletable_temporaries(monkeypatch)
    src = REPO_ROOT / "fixtures" / "example_ddp.sqlite"
    frame = open_trace(src, cache_dir=tmp_path, frame_cache=True).frame("gpu_ops")
    cache.flush()  # raises nothing
    assert_frame_equal(frame, open_trace(src, frame_cache=False).frame("gpu_ops"))


def test_an_interrupted_write_is_not_taken_for_a_cache_failure(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the temporary files' removal failing must not replace the interruption by an OSError,
    # which the cache would swallow as its own failure
    monkeypatch.delenv("NSYSAN_NO_CACHE", raising=False)

    def interrupted(df: pl.DataFrame, path: Path, values_path: Path) -> None:
        path.write_bytes(b"partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(cache, "write_frame", interrupted)
    _undeletable_temporaries(monkeypatch)
    src = REPO_ROOT / "fixtures" / "example_ddp.sqlite"
    with pytest.raises(KeyboardInterrupt):
        open_trace(src, cache_dir=tmp_path, frame_cache=True).frame("gpu_ops")


def test_a_frame_that_does_not_read_back_is_kept_as_built(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    monkeypatch.delenv("NSYSAN_NO_CACHE", raising=False)

    def unreadable(*_: object) -> pl.DataFrame:
        raise ValueError("not a frame file")

    monkeypatch.setattr(cache, "read_frame", unreadable)
    src = REPO_ROOT / "fixtures" / "example_ddp.sqlite"
    frame = open_trace(src, cache_dir=tmp_path, frame_cache=True).frame("gpu_ops")
    cache.flush()
    assert_frame_equal(frame, open_trace(src, frame_cache=False).frame("gpu_ops"))
    assert not [p for p in (tmp_path / "frames").rglob("*") if p.is_file()
                and p.name.startswith(".")]
    assert not list((tmp_path / "frames").rglob("gpu_ops*"))


def test_an_analysis_without_the_cache_does_not_import_pyarrow(tmp_path: Path) -> None:
    # pyarrow (~20 ms and ~26 MB to import) is for the cache's files and the bulk reads of big
    # tables: a small trace's analysis does without it
    src = REPO_ROOT / "fixtures" / "example_ddp.sqlite"
    code = ("import sys, nsysan; nsysan.analyze(sys.argv[1]); "
            "print('pyarrow' in sys.modules)")
    env = {**os.environ, "NSYSAN_NO_CACHE": "1", "NSYSAN_CACHE_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", code, str(src)], env=env, capture_output=True,
                          text=True, check=True)
    assert done.stdout.strip().splitlines()[-1] == "False"
