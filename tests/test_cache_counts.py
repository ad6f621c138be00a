"""The table counts of a SQLite export kept in its frame cache (`nsysan.load.cache.stored_counts`):
an analysis served by the cache does not walk the whole export to count its tables again,
the counts it serves are those of that very version of the file, and anything else is
counted again."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest
from export_mutations import EXAMPLE, copy_export

from nsysan.load import cache, open_trace
from nsysan.load.sqlite import SqliteSource


def _true_counts(path: Path) -> dict[str, int]:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        names = [r[0] for r in con.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'")]
        return {t: con.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0] for t in names}
    finally:
        con.close()


def _open(src: Path, tmp_path: Path, **kw):
    return open_trace(src, frame_cache=True, cache_dir=tmp_path / "cache", **kw)


def _counted_in_background(monkeypatch) -> list[Path]:
    """Every count of a whole file from now on (the background `count(*)` of each table)."""
    counted: list[Path] = []
    real = SqliteSource._count_in_background

    def spy(self: SqliteSource):
        counted.append(self.path)
        return real(self)

    monkeypatch.setattr(SqliteSource, "_count_in_background", spy)
    return counted


def _wait_for_kept(folder: Path) -> None:
    """The counts are kept by the counting thread once its count ends."""
    import time

    for _ in range(500):
        if (folder / cache.COUNTS_FILE).is_file():
            return
        time.sleep(0.01)
    raise AssertionError("the counts were never kept")


def test_counts_are_kept_once_and_then_served(tmp_path: Path, monkeypatch) -> None:
    src = copy_export(EXAMPLE, tmp_path / "in" / "t.sqlite")
    want = _true_counts(src)
    counted = _counted_in_background(monkeypatch)

    first = _open(src, tmp_path)
    assert dict(first.meta.tables) == want and counted == [src]
    folder = first.meta.frame_cache
    assert folder is not None
    # kept before the counts were handed out: a process that exits once it has read them
    # (the CLI ends with os._exit) has kept them
    assert cache.stored_counts(folder, src) == want

    second = _open(src, tmp_path)
    assert second.meta.frame_cache == folder
    assert dict(second.meta.tables) == want and counted == [src]  # not counted again
    assert list(second.meta.tables) == list(first.meta.tables)  # the same order


def test_another_version_of_the_file_is_counted_again(tmp_path: Path, monkeypatch) -> None:
    src = copy_export(EXAMPLE, tmp_path / "in" / "t.sqlite")
    folder = _open(src, tmp_path).meta.frame_cache
    _wait_for_kept(folder)
    # the same bytes, size and modification time: the same frame folder; only the change
    # time (any write, chmod or utime sets it) says this may be another version
    st = src.stat()
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert cache.stored_counts(folder, src) is None
    counted = _counted_in_background(monkeypatch)
    trace = _open(src, tmp_path)
    assert trace.meta.frame_cache == folder
    assert dict(trace.meta.tables) == _true_counts(src) and counted == [src]
    assert cache.stored_counts(folder, src) == _true_counts(src)  # kept again, for this one


def test_a_rewritten_file_is_counted_again(tmp_path: Path, monkeypatch) -> None:
    src = copy_export(EXAMPLE, tmp_path / "in" / "t.sqlite")
    folder = _open(src, tmp_path).meta.frame_cache
    _wait_for_kept(folder)
    st = src.stat()
    con = sqlite3.connect(src)
    con.execute("DELETE FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE rowid = "
                "(SELECT max(rowid) FROM CUPTI_ACTIVITY_KIND_KERNEL)")
    con.commit()
    con.close()
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert src.stat().st_size == st.st_size
    assert cache.stored_counts(folder, src) is None
    counted = _counted_in_background(monkeypatch)
    trace = _open(src, tmp_path)
    assert dict(trace.meta.tables) == _true_counts(src) and counted == [src]
    assert trace.meta.tables["CUPTI_ACTIVITY_KIND_KERNEL"] == \
        _true_counts(EXAMPLE)["CUPTI_ACTIVITY_KIND_KERNEL"] - 1


def _with(counts: dict[str, int], change: str) -> object:
    """The true counts with one thing wrong (the StringIds count, or the tables named)."""
    out: dict[str, object] = dict(counts)
    if change == "missing":
        del out["StringIds"]
    elif change == "extra":
        out["NOT_A_TABLE"] = 1
    else:
        out["StringIds"] = json.loads(change)
    return out


@pytest.mark.parametrize("change", ["-1", "1.5", "true", "null", '"3"', "[3]", "missing",
                                    "extra"])
def test_damaged_kept_counts_are_not_believed(tmp_path: Path, monkeypatch, change: str) -> None:
    src = copy_export(EXAMPLE, tmp_path / "in" / "t.sqlite")
    folder = _open(src, tmp_path).meta.frame_cache
    _wait_for_kept(folder)
    want = _true_counts(src)
    (folder / cache.COUNTS_FILE).write_text(json.dumps(
        {"file": cache.file_identity(src), "tables": _with(want, change)}))
    if change not in ("missing", "extra"):  # (those two are turned down by the source)
        assert cache.stored_counts(folder, src) is None
    counted = _counted_in_background(monkeypatch)
    trace = _open(src, tmp_path)
    assert dict(trace.meta.tables) == want and counted == [src]


@pytest.mark.parametrize("text", ["not json", '["a list"]', '{"file": [1, 2], "tables": {}}',
                                  '{"tables": {"StringIds": 1}}'])
def test_unreadable_kept_counts_are_not_believed(tmp_path: Path, text: str) -> None:
    src = copy_export(EXAMPLE, tmp_path / "in" / "t.sqlite")
    (tmp_path / cache.COUNTS_FILE).write_text(text)
    assert cache.stored_counts(tmp_path, src) is None


def test_counts_of_a_write_ahead_log_database_are_not_kept(tmp_path: Path,
                                                             monkeypatch) -> None:
    """In WAL mode a table's rows may sit in the -wal file beside the export, which the file's
    version does not cover: such a file is counted every time."""
    src = copy_export(EXAMPLE, tmp_path / "in" / "t.sqlite")
    con = sqlite3.connect(src)
    assert con.execute("PRAGMA journal_mode=WAL").fetchone()[0] == "wal"
    con.close()
    counted = _counted_in_background(monkeypatch)
    for _ in range(2):
        trace = _open(src, tmp_path)
        assert dict(trace.meta.tables) == _true_counts(src)
    assert counted == [src, src]
    assert not (trace.meta.frame_cache / cache.COUNTS_FILE).exists()


def test_an_unusable_cache_dir_costs_only_the_count(tmp_path: Path, caplog) -> None:
    """A cache dir that is a file: the counts are right, nothing is kept, nothing is logged
    (an error in the counting thread's callback would print a traceback)."""
    src = copy_export(EXAMPLE, tmp_path / "in" / "t.sqlite")
    (tmp_path / "cache").write_text("a file, not a folder")
    trace = _open(src, tmp_path)
    assert dict(trace.meta.tables) == _true_counts(src)
    assert not caplog.records


def test_no_counts_are_kept_without_a_frame_cache(tmp_path: Path, monkeypatch) -> None:
    src = copy_export(EXAMPLE, tmp_path / "in" / "t.sqlite")
    monkeypatch.setenv("NSYSAN_CACHE_DIR", str(tmp_path / "cache"))
    trace = open_trace(src, frame_cache=False)
    assert dict(trace.meta.tables) == _true_counts(src)
    assert trace.meta.frame_cache is None and not (tmp_path / "cache").exists()


def test_a_failed_count_keeps_nothing(tmp_path: Path, monkeypatch, caplog) -> None:
    """A count that fails (here: the file is gone) raises where the counts are read, and
    leaves no counts behind and nothing in the log (a callback that raised would be logged
    with its traceback)."""
    src = copy_export(EXAMPLE, tmp_path / "in" / "t.sqlite")
    from concurrent.futures import Future

    def failing(self: SqliteSource) -> Future:
        fut: Future = Future()
        fut.set_exception(OSError("gone"))
        return fut

    monkeypatch.setattr(SqliteSource, "_count_in_background", failing)
    trace = _open(src, tmp_path)
    with pytest.raises(OSError):
        dict(trace.meta.tables)
    assert not (trace.meta.frame_cache / cache.COUNTS_FILE).exists()
    assert not caplog.records
