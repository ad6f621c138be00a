"""SqliteSource: validation of the input file and typed, ordered column reads."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import polars as pl
import pytest
from conftest import make_nsys_sqlite

import nsysan.load.sqlite as sqlite_mod
import nsysan.load.sqlite_file as sqlite_file
from nsysan.errors import SchemaError, TraceFormatError
from nsysan.load.sqlite import SqliteSource


def _nsys(path: Path) -> Path:
    return make_nsys_sqlite(
        path,
        {
            "CUPTI_ACTIVITY_KIND_RUNTIME": [
                {
                    "start": 30,
                    "end": 40,
                    "eventClass": 0,
                    "globalTid": 7,
                    "nameId": 1,
                    "returnValue": 0,
                    "correlationId": 3,
                },
                {
                    "start": 10,
                    "end": 20,
                    "eventClass": 1,
                    "globalTid": 7,
                    "nameId": 2,
                    "returnValue": 0,
                    "correlationId": None,
                },
            ]
        },
        strings={1: "cudaLaunchKernel_v7000", 2: "cuCtxSynchronize"},
    )


def test_reads_requested_columns_in_row_order_with_declared_dtypes(tmp_path: Path) -> None:
    src = SqliteSource(_nsys(tmp_path / "t.sqlite"))
    df = src.read("CUPTI_ACTIVITY_KIND_RUNTIME", ["end", "start", "correlationId"])
    assert df.columns == ["end", "start", "correlationId"]
    assert df.schema == pl.Schema({"end": pl.Int64, "start": pl.Int64, "correlationId": pl.Int64})
    assert df.to_dict(as_series=False) == {
        "end": [40, 20],
        "start": [30, 10],
        "correlationId": [3, None],
    }
    strings = src.read("StringIds", ["value"])
    assert strings.schema == pl.Schema({"value": pl.String})


def test_tables_columns_and_missing_things(tmp_path: Path) -> None:
    src = SqliteSource(_nsys(tmp_path / "t.sqlite"))
    assert src.tables() == {"ANALYSIS_DETAILS": 1, "CUPTI_ACTIVITY_KIND_RUNTIME": 2, "StringIds": 2}
    assert src.columns("StringIds") == ["id", "value"]
    assert src.columns("NVTX_EVENTS") == []
    with pytest.raises(SchemaError, match="table NVTX_EVENTS not found"):
        src.read("NVTX_EVENTS", ["start"])
    with pytest.raises(SchemaError, match="has no column nope"):
        src.read("StringIds", ["id", "nope"])
    empty = src.read("CUPTI_ACTIVITY_KIND_RUNTIME", ["start"]).clear()
    assert empty.schema == pl.Schema({"start": pl.Int64})


def test_value_that_does_not_fit_its_declared_type_becomes_null(tmp_path: Path) -> None:
    # SQLite is dynamically typed: an INTEGER column can hold text, a TEXT column a blob
    path = make_nsys_sqlite(
        tmp_path / "t.sqlite",
        {"PROCESSES": [{"globalPid": 1, "pid": "oops", "name": "a"}, {"globalPid": 2, "pid": 5}]},
    )
    df = SqliteSource(path).read("PROCESSES", ["globalPid", "pid", "name"])
    assert df["pid"].to_list() == [None, 5]
    assert df["name"].to_list() == ["a", None]


def test_text_that_is_not_utf8_is_read_with_replacement(tmp_path: Path) -> None:
    path = make_nsys_sqlite(tmp_path / "t.sqlite", {})
    con = sqlite3.connect(path)
    con.execute("INSERT INTO StringIds VALUES (1, CAST(X'6f6bff' AS TEXT))")  # 'ok' + bad byte
    con.commit()
    con.close()
    src = SqliteSource(path)
    assert src.read("StringIds", ["value"])["value"].to_list() == ["ok\ufffd"]
    # the connection is back to the fast text path afterwards
    assert src._con.text_factory is str


def test_large_tables_are_read_in_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sqlite_mod, "CHUNK_ROWS", 3)
    path = make_nsys_sqlite(tmp_path / "t.sqlite", {}, strings={i: f"s{i}" for i in range(10)})
    df = SqliteSource(path).read("StringIds", ["id", "value"])
    assert df["id"].to_list() == list(range(10))
    assert df["value"].to_list() == [f"s{i}" for i in range(10)]


def test_file_names_with_uri_characters(tmp_path: Path) -> None:
    odd = tmp_path / "dir with space" / "a?b#c%20.sqlite"
    odd.parent.mkdir()
    src = SqliteSource(_nsys(odd))
    assert src.tables()["StringIds"] == 2


def test_read_only_file_opens_immutable_and_reads(tmp_path: Path) -> None:
    path = _nsys(tmp_path / "t.sqlite")
    os.chmod(path, 0o444)
    assert sqlite_file.read_only_file(path)
    assert SqliteSource(path).tables()["StringIds"] == 2
    os.chmod(path, 0o644)
    assert not sqlite_file.read_only_file(path)


def _truncated(tmp_path: Path) -> Path:
    full = _nsys(tmp_path / "full.sqlite")
    con = sqlite3.connect(full)  # make it several pages long
    con.executemany("INSERT INTO StringIds VALUES (?, ?)", [(i, "x" * 200) for i in range(3, 200)])
    con.commit()
    con.close()
    data = full.read_bytes()
    out = tmp_path / "truncated.sqlite"
    out.write_bytes(data[: len(data) // 2])
    return out


BAD_FILES = {
    "empty": (lambda d: _write(d / "e.sqlite", b""), "file is empty"),
    "random bytes": (lambda d: _write(d / "r.sqlite", os.urandom(4096)), "not a SQLite database"),
    "short header": (lambda d: _write(d / "s.sqlite", b"SQLite format 3\x00abc"), "truncated"),
    "truncated": (_truncated, "truncated SQLite file"),
    "not nsys": (
        lambda d: _foreign_db(d / "f.sqlite"),
        "is a SQLite database but not an Nsight Systems export: no StringIds",
    ),
    "missing": (lambda d: d / "nope.sqlite", "no such file"),
    "directory": (lambda d: d, "is a directory"),
}


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _foreign_db(path: Path) -> Path:
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE users (id INTEGER, name TEXT)")
    con.commit()
    con.close()
    return path


@pytest.mark.parametrize("case", list(BAD_FILES))
def test_unusable_files_raise_one_line_trace_format_errors(tmp_path: Path, case: str) -> None:
    make, message = BAD_FILES[case]
    path = make(tmp_path)
    with pytest.raises(TraceFormatError, match=message) as info:
        SqliteSource(path)
    assert "\n" not in str(info.value)
    assert str(path) in str(info.value)


def test_unreadable_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _nsys(tmp_path / "t.sqlite")

    def denied(file, *args, **kwargs):
        if Path(file) == path:
            raise PermissionError(13, "Permission denied", str(file))
        return open(file, *args, **kwargs)

    monkeypatch.setattr(sqlite_file, "open", denied, raising=False)
    with pytest.raises(TraceFormatError, match="permission denied"):
        SqliteSource(path)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_unreadable_file_for_real(tmp_path: Path) -> None:
    path = _nsys(tmp_path / "t.sqlite")
    path.chmod(0)
    with pytest.raises(TraceFormatError, match="permission denied"):
        SqliteSource(path)
