"""The one-read path of big tables (`nsysan.load.sqlite_bulk`): number columns go batch by
batch into their final buffers, and whatever they hold the frame equals the row path's."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import polars as pl
import pytest

from nsysan.load import sqlite as sqlite_source
from nsysan.load import sqlite_bulk
from nsysan.load.sqlite import SqliteSource

DDL = "k INTEGER, a INTEGER NOT NULL, b INTEGER, x REAL"
COLUMNS = ["k", "a", "b", "x"]


def _table(path: Path, rows: list[tuple], rowids: list[int] | None = None) -> Path:
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT)")  # an nsys
    con.execute("CREATE TABLE ANALYSIS_DETAILS (duration INTEGER)")  # file
    con.execute(f"CREATE TABLE T ({DDL})")
    if rowids is None:
        con.executemany("INSERT INTO T VALUES (?, ?, ?, ?)", rows)
    else:
        con.executemany("INSERT INTO T (rowid, k, a, b, x) VALUES (?, ?, ?, ?, ?)",
                        [(r, *row) for r, row in zip(rowids, rows, strict=True)])
    con.commit()
    con.close()
    return path


def _read(path: Path, monkeypatch: pytest.MonkeyPatch, *, bulk: bool):
    """(frame, what `read_bulk` answered: None when it declined) on one path."""
    answers: list[object] = []
    orig = sqlite_bulk.read_bulk
    monkeypatch.setattr(sqlite_bulk, "read_bulk",
                        lambda *a: answers.append(r := orig(*a)) or r)
    monkeypatch.setattr(sqlite_source, "BULK_MIN_ROWS", 1 if bulk else 10**12)
    if bulk:
        monkeypatch.delenv("NSYSAN_NO_ADBC", raising=False)
    else:
        monkeypatch.setenv("NSYSAN_NO_ADBC", "1")
    source = SqliteSource(path)
    try:
        return source.read("T", COLUMNS), answers, source.issues("T")
    finally:
        source.close()


def _rows(n: int) -> list[tuple]:
    # NULLs first in k (a whole first batch of them), scattered in b, never in a
    return [(None if i < 250 else i * 3, i, None if i % 7 == 0 else -i, i / 4) for i in range(n)]


@pytest.mark.parametrize("batch_rows", [100, 1 << 16])
def test_numbers_read_in_batches_equal_the_row_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, batch_rows: int
) -> None:
    monkeypatch.setattr(sqlite_bulk, "BATCH_ROWS", batch_rows)
    path = _table(tmp_path / "t.sqlite", _rows(1000))
    bulk, answers, _ = _read(path, monkeypatch, bulk=True)
    rows, _, _ = _read(path, monkeypatch, bulk=False)
    assert answers and answers[0] is not None  # the batch path answered
    assert bulk.equals(rows) and bulk.schema == rows.schema
    assert bulk.schema == pl.Schema({"k": pl.Int64, "a": pl.Int64, "b": pl.Int64,
                                     "x": pl.Float64})
    assert bulk["k"].null_count() == 250 and bulk["b"].null_count() == 143


def test_a_column_of_nulls_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sqlite_bulk, "BATCH_ROWS", 64)
    path = _table(tmp_path / "t.sqlite", [(None, i, None, None) for i in range(300)])
    bulk, answers, _ = _read(path, monkeypatch, bulk=True)
    rows, _, _ = _read(path, monkeypatch, bulk=False)
    assert answers[0] is not None
    assert bulk.equals(rows) and bulk["b"].null_count() == 300 and bulk.height == 300


@pytest.mark.parametrize("rowids", ["negative", "sparse", "huge"])
def test_rowids_that_do_not_count_the_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rowids: str
) -> None:
    """The buffers are sized by the largest rowid: a table with rowids below 1 has more
    rows than that (the buffers grow), one with gaps fewer (the columns are cut to size);
    huge rowids reserve no more than `FIRST_CAPACITY` rows."""
    monkeypatch.setattr(sqlite_bulk, "BATCH_ROWS", 100)
    n = 1000
    ids = {"negative": list(range(-n + 10, 10)), "sparse": [i * 50 + 1 for i in range(n)],
           "huge": [(1 << 62) + i for i in range(n)]}[rowids]
    path = _table(tmp_path / "t.sqlite", _rows(n), rowids=ids)
    bulk, answers, _ = _read(path, monkeypatch, bulk=True)
    rows, _, _ = _read(path, monkeypatch, bulk=False)
    assert answers[0] is not None
    assert bulk.height == n and bulk.equals(rows)
    if rowids == "huge":
        monkeypatch.setattr(sqlite_bulk, "FIRST_CAPACITY", 64)  # (and grown from there)
        again, answers, _ = _read(path, monkeypatch, bulk=True)
        assert answers[0] is not None and again.equals(rows)


@pytest.mark.parametrize("bad", ["12x", 2.5, b"\x01"])
def test_a_value_of_another_type_reads_the_table_the_other_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bad: object
) -> None:
    """SQLite stores any value in an INTEGER column: the batch path refuses it (however late
    it comes), and the row path reads it as NULL and counts it."""
    monkeypatch.setattr(sqlite_bulk, "BATCH_ROWS", 100)
    rows_in = _rows(1000)
    rows_in[777] = (rows_in[777][0], rows_in[777][1], bad, rows_in[777][3])
    path = _table(tmp_path / "t.sqlite", rows_in)
    bulk, answers, issues = _read(path, monkeypatch, bulk=True)
    rows, _, _ = _read(path, monkeypatch, bulk=False)
    assert answers == [None]
    assert bulk.equals(rows) and bulk["b"][777] is None
    assert issues["b"]["nulled"] == 1


def test_the_batch_buffers_refuse_a_batch_of_another_shape() -> None:
    import pyarrow as pa

    buffers = sqlite_bulk._Buffers(["a", "b"], [pl.Int64(), pl.Int64()], 10)
    with pytest.raises(sqlite_bulk.UnexpectedColumn):
        buffers.append(pa.record_batch({"a": [1]}))
    with pytest.raises(sqlite_bulk.UnexpectedColumn):
        buffers.append(pa.record_batch({"a": [1], "b": ["text"]}))
    with pytest.raises(sqlite_bulk.UnexpectedColumn):
        sqlite_bulk._Buffers(["s"], [pl.String()], 10)


def _read_narrowed(path: Path, narrow: dict[str, pl.DataType]) -> pl.DataFrame:
    source = SqliteSource(path)
    try:
        return source.read_narrowed("T", COLUMNS, narrow)
    finally:
        source.close()


def test_columns_asked_narrow_come_narrow_while_their_values_fit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Values at the narrow type's bounds fit; NULLs stay NULL; a REAL column asked narrow
    and a column not asked come as read."""
    monkeypatch.setattr(sqlite_bulk, "BATCH_ROWS", 100)
    monkeypatch.setattr(sqlite_source, "BULK_MIN_ROWS", 1)
    rows = [(None if i % 5 == 0 else i % 65536, 65535 - i, -(1 << 31) + i if i % 7 else None,
             i / 4) for i in range(1000)]
    path = _table(tmp_path / "t.sqlite", rows)
    got = _read_narrowed(path, {"k": pl.UInt16(), "a": pl.UInt16(), "b": pl.Int32(),
                                "x": pl.Int8()})
    assert got.schema == pl.Schema({"k": pl.UInt16, "a": pl.UInt16, "b": pl.Int32,
                                    "x": pl.Float64})
    as_read, _, _ = _read(path, monkeypatch, bulk=False)
    assert got.cast(as_read.schema).equals(as_read)
    assert got["k"].null_count() == 200 and got["b"].null_count() == 143


@pytest.mark.parametrize("late", [-1, 1 << 16, 1 << 40])
def test_a_value_that_does_not_fit_widens_its_column_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, late: int
) -> None:
    """A value beyond the narrow type, however late it comes, gives the column as Int64 with
    every value, of earlier batches too, exactly as read: nothing is ever cut."""
    monkeypatch.setattr(sqlite_bulk, "BATCH_ROWS", 100)
    monkeypatch.setattr(sqlite_source, "BULK_MIN_ROWS", 1)
    rows = _rows(1000)
    rows[777] = (rows[777][0], late, rows[777][2], rows[777][3])
    path = _table(tmp_path / "t.sqlite", rows)
    got = _read_narrowed(path, {"a": pl.UInt16(), "k": pl.UInt16()})
    as_read, _, _ = _read(path, monkeypatch, bulk=False)
    assert got.schema["a"] == pl.Int64 and got["a"][777] == late
    assert got.schema["k"] == pl.UInt16  # (another column stays narrow)
    assert got.cast(as_read.schema).equals(as_read)


def test_a_table_with_text_and_the_row_path_come_as_int64(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Text tables keep the one-table read, which does not narrow; nor does the row path."""
    monkeypatch.setattr(sqlite_source, "BULK_MIN_ROWS", 1)
    monkeypatch.delenv("NSYSAN_NO_ADBC", raising=False)
    path = tmp_path / "t.sqlite"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT)")  # (an nsys
    con.execute("CREATE TABLE ANALYSIS_DETAILS (duration INTEGER)")  # file)
    con.execute("CREATE TABLE T (a INTEGER, s TEXT)")
    con.executemany("INSERT INTO T VALUES (?, ?)", [(i, f"s{i}") for i in range(300)])
    con.commit()
    con.close()
    source = SqliteSource(path)
    try:
        got = source.read_narrowed("T", ["a", "s"], {"a": pl.UInt16()})
    finally:
        source.close()
    assert got.schema == pl.Schema({"a": pl.Int64, "s": pl.String}) and got["a"].sum() == 44850
    path = _table(tmp_path / "n.sqlite", _rows(300))
    monkeypatch.setenv("NSYSAN_NO_ADBC", "1")
    assert _read_narrowed(path, {"a": pl.UInt16()}).schema["a"] == pl.Int64


def test_the_buffers_widen_after_null_batches_and_growth() -> None:
    """A narrow column widened after a batch of NULLs only and after the buffers grew past
    their first size keeps every value and every NULL."""
    import pyarrow as pa

    buffers = sqlite_bulk._Buffers(["a"], [pl.Int64()], 4, {"a": pl.UInt8()})
    batches = [[None, None, None], [1, 255, None], [7, 8, 9, 10, 11], [300, -1]]
    for values in batches:
        buffers.append(pa.record_batch({"a": pa.array(values, pa.int64())}))
    got = buffers.frame()["a"]
    assert got.dtype == pl.Int64
    assert got.to_list() == [v for values in batches for v in values]
