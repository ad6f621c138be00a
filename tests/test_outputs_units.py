"""The building blocks of output ownership (nsysan.report.ownership / atomic / targets), case
by case: what counts as an input conflict, what is nsysan's in a folder, what may be cleaned,
how a folder is swapped in, how file-system errors read."""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path

import polars as pl
import pytest
from outputs_helpers import dead_pid

from nsysan.errors import OutputError
from nsysan.report import ownership
from nsysan.report.atomic import (
    atomic_write,
    host_tag,
    is_stale_temp,
    os_errno,
    write_error_message,
    write_errors,
)
from nsysan.report.ownership import MARKER, InputPaths, clean_stale, prepare, remove_owned


def _marker(folder: Path, **doc: object) -> None:
    (folder / MARKER).write_text(json.dumps({"nsysan_output": 1, **doc}))


@pytest.mark.parametrize(
    ("output", "why"),
    [
        ("in/trace.sqlite", "it is the input"),
        ("in", "it contains the input"),
        (".", "it contains the input"),
        ("in/export/sub", "it lies inside the input"),
        ("in/export", "it is the input"),
        ("in/trace.sqlite/x", "it lies inside the input"),
        ("in/other", None),
        ("elsewhere/trace.sqlite", None),
    ],
)
def test_input_conflicts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, output: str,
                         why: str | None) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "in" / "export").mkdir(parents=True)
    (tmp_path / "in" / "trace.sqlite").write_bytes(b"x")
    (tmp_path / "link").symlink_to(tmp_path / "in")
    paths = InputPaths(["link/trace.sqlite", "in/export"])  # real paths are compared
    got = paths.conflict(output)
    assert (got is None) if why is None else (got is not None and got.startswith(why))
    assert paths.conflict("in", holding=False) is None  # a batch root beside its traces


def test_stale_temporary_names() -> None:
    mine = f".x.nsysan-tmp-{host_tag()}-{dead_pid()}-abc_1"
    assert is_stale_temp(mine)
    assert not is_stale_temp(f".x.nsysan-tmp-{host_tag()}-{os.getpid()}-abc")  # alive
    assert not is_stale_temp(f".x.nsysan-tmp-ffffffff-{dead_pid()}-abc")  # another host
    assert not is_stale_temp(".x.tmp-abc") and not is_stale_temp("x.nsysan-tmp-1-2-3")


def test_clean_stale_removes_only_nsysans_dead_temporaries(tmp_path: Path) -> None:
    tag = f"{host_tag()}-{dead_pid()}"
    writing = tmp_path / f".a.nsysan-tmp-{tag}-w"
    writing.mkdir()
    _marker(writing, state="writing")
    (writing / "t.parquet").write_bytes(b"1")
    empty = tmp_path / f".b.nsysan-tmp-{tag}-e"  # killed between mkdir and its marker
    empty.mkdir()
    old = tmp_path / f".c.nsysan-old-{tag}-o"  # a replaced folder, partly removed
    old.mkdir()
    _marker(old, kind="analysis", files=["t.parquet", "u.parquet"])
    (old / "t.parquet").write_bytes(b"1")
    (old / "someone.txt").write_text("x")  # not listed: stays, and so does its folder
    unmarked = tmp_path / f".d.nsysan-tmp-{tag}-u"
    unmarked.mkdir()
    (unmarked / "data").write_text("x")
    file_temp = tmp_path / f".e.json.nsysan-tmp-{tag}-f"
    file_temp.write_text("half")
    half_marker = tmp_path / f".f.nsysan-tmp-{tag}-m"  # killed while writing its marker
    half_marker.mkdir()
    (half_marker / f"{MARKER}.nsysan-tmp-{tag}-x").write_text('{"nsysan_ou')
    other = tmp_path / f".g.nsysan-tmp-{tag}-o"  # a stale temporary file beside data: kept
    other.mkdir()
    (other / f"{MARKER}.nsysan-tmp-{tag}-x").write_text("{")
    (other / "data").write_text("x")
    alive = tmp_path / f".h.nsysan-tmp-{tag}-a"  # the temporary file of a live writer: kept
    alive.mkdir()
    (alive / f"{MARKER}.nsysan-tmp-{host_tag()}-{os.getpid()}-x").write_text("{")
    assert clean_stale(tmp_path) == [writing, empty, half_marker]
    assert (other / "data").exists() and any(alive.iterdir())
    assert sorted(os.listdir(old)) == [MARKER, "someone.txt"]
    assert (unmarked / "data").exists() and file_temp.exists()
    assert clean_stale(tmp_path, files=True) == [file_temp]


def test_remove_owned_keeps_what_is_not_listed(tmp_path: Path) -> None:
    folder = tmp_path / "f"
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "a.parquet").write_bytes(b"1")
    (folder / "b.md").write_text("b")
    (folder / ".nsysan-done.json").write_text("{}")
    _marker(folder, kind="analysis", files=["sub/a.parquet", "b.md"])
    assert remove_owned(folder) == []
    assert not folder.exists()
    folder.mkdir()
    (folder / "b.md").write_text("b")
    (folder / "mine").write_text("m")
    _marker(folder, kind="analysis", files=["b.md"])
    assert remove_owned(folder) == ["mine"]
    assert sorted(os.listdir(folder)) == [MARKER, "mine"]
    assert remove_owned(tmp_path) == ["(not nsysan's)"]  # no marker: nothing is touched


@pytest.mark.parametrize("exchange", [True, False])
def test_a_folder_is_swapped_in_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      exchange: bool) -> None:
    if not exchange:  # a kernel or file system without renameat2: two renames
        monkeypatch.setattr(ownership, "_renameat2", lambda *args: None)
    src = tmp_path / "t.sqlite"
    src.write_bytes(b"trace")
    for content in ("first", "second"):
        folder = prepare(tmp_path / "out", "t", kind="analysis", inputs=[src])
        assert json.loads((folder.tmp / MARKER).read_text())["state"] == "writing"
        assert stat.S_IMODE(folder.tmp.stat().st_mode) & 0o755 == 0o755
        (folder.tmp / "r.md").write_text(content)
        assert folder.commit() == tmp_path / "out" / "t"
        folder.abort()  # after the commit: nothing
    assert (tmp_path / "out" / "t" / "r.md").read_text() == "second"
    assert sorted(os.listdir(tmp_path / "out")) == ["t"]
    marker = json.loads((tmp_path / "out" / "t" / MARKER).read_text())
    assert marker["files"] == ["r.md"] and marker["inputs"][0]["path"] == str(src)


def test_a_failed_write_removes_its_temporary_folder(tmp_path: Path) -> None:
    src = tmp_path / "t.sqlite"
    src.write_bytes(b"trace")
    with pytest.raises(RuntimeError), ownership.replacing(
            tmp_path / "out", "t", kind="job", inputs=[src]) as folder:
        (folder.tmp / "x").write_text("half")
        raise RuntimeError("boom")
    assert os.listdir(tmp_path / "out") == []


def test_atomic_write_leaves_no_temporary_file(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    atomic_write(tmp_path / "a.txt", "one")
    assert stat.S_IMODE((tmp_path / "a.txt").stat().st_mode) == 0o666 & ~_umask()

    def broken(src: object, dst: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", broken)
    with pytest.raises(OSError):
        atomic_write(tmp_path / "a.txt", "two")
    assert os.listdir(tmp_path) == ["a.txt"]
    assert (tmp_path / "a.txt").read_text() == "one"


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def test_atomic_write_of_pieces_is_that_of_the_text(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A list of pieces (report.html's) is written one after the other, long texts a part at
    a time: the bytes are those of the joined text, whatever falls on a part's boundary."""
    from nsysan.report import atomic

    monkeypatch.setattr(atomic, "_PIECE", 3)
    pieces: list[str | bytes] = ["<p>", "é€😀" * 5, b"raw", "", "tail\n"]
    atomic_write(tmp_path / "a", pieces)
    text = "".join(p if isinstance(p, str) else p.decode() for p in pieces)
    assert (tmp_path / "a").read_bytes() == text.encode("utf-8")
    atomic_write(tmp_path / "b", text)
    assert (tmp_path / "b").read_bytes() == text.encode("utf-8")
    atomic_write(tmp_path / "c", [])
    assert (tmp_path / "c").read_bytes() == b""


def test_write_errors_name_the_output_and_what_to_do(tmp_path: Path) -> None:
    cases = {
        errno.ENOSPC: "(no space left on the device): free space there or choose another -o",
        errno.EDQUOT: "(disk quota exceeded): free space there",
        errno.EROFS: "(read-only file system): choose a writable -o",
        errno.EACCES: "(permission denied): choose a writable -o or fix its permissions",
        errno.ENOTDIR: "(a part of the path is a regular file, not a folder): choose another",
        errno.EIO: "(input/output error): choose another -o",
    }
    for code, text in cases.items():
        message = write_error_message(OSError(code, os.strerror(code)), "out/t")
        assert message.startswith("out/t: cannot write ") and text in message, message
    # polars carries the errno in its text only
    polars_error = pl.exceptions.ComputeError("parquet: underlying IO error: No space left on "
                                              "device (os error 28)")
    assert os_errno(polars_error) == errno.ENOSPC
    assert os_errno(pl.exceptions.ComputeError("a bug")) is None
    assert os_errno(ValueError("os error 28")) is None
    with pytest.raises(OutputError, match="no space left"), write_errors("out/t"):
        raise polars_error
    with pytest.raises(ValueError), write_errors("out/t"):  # not the file system's: as it is
        raise ValueError("a bug")


def test_a_full_disk_at_the_batch_marker_is_an_output_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from nsysan.batch import state

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OutputError, match="no space left on the device"):
        state.write_marker(tmp_path, {"skip_key": "k"})
    assert os.listdir(tmp_path) == []  # no temporary file left either


def test_a_marker_without_a_file_list_under_a_final_name_is_not_replaced(tmp_path: Path) -> None:
    src = tmp_path / "t.sqlite"
    src.write_bytes(b"trace")
    (tmp_path / "out" / "t").mkdir(parents=True)
    _marker(tmp_path / "out" / "t", kind="analysis", state="writing")
    (tmp_path / "out" / "t" / "data.csv").write_text("someone's\n")
    with pytest.raises(OutputError, match="unfinished nsysan outputs"):
        prepare(tmp_path / "out", "t", kind="analysis", inputs=[src])
    assert sorted(os.listdir(tmp_path / "out" / "t")) == [MARKER, "data.csv"]
