"""Environment and user errors at write time are one line ``Error: ...``, exit 1, with what to
do, and leave nothing half-written (issue 16, part 3); an internal error in one trace of a
multi-trace run does not stop the others (part 4)."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from outputs_helpers import (
    EXAMPLE,
    assert_untouched,
    cli,
    one_error_line,
    snapshot,
    temp_entries,
    tmpfs,
)

FAST = ("--passes", "gaps")


# --- the file system refuses -------------------------------------------------------------------
def test_output_path_under_a_regular_file(tmp_path: Path) -> None:
    (tmp_path / "file.txt").write_text("x")
    done = cli("analyze", EXAMPLE, "-o", tmp_path / "file.txt" / "out", *FAST)
    assert done.exit_code == 1
    assert "a part of the path is a regular file" in one_error_line(done.stderr)
    done = cli("batch", EXAMPLE, "-o", tmp_path / "file.txt" / "out", "--progress", "none")
    assert done.exit_code == 1
    assert "a part of the path is a regular file" in one_error_line(done.stderr)
    assert sorted(os.listdir(tmp_path)) == ["file.txt"]


def test_read_only_output_folder(tmp_path: Path) -> None:
    mnt = tmp_path / "mnt"
    with tmpfs(mnt, "2m"):
        assert cli("analyze", EXAMPLE, "-o", mnt, *FAST).exit_code == 0
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
        before = snapshot(mnt)
        for args in (("analyze", EXAMPLE, "-o", mnt, *FAST),
                     ("analyze", EXAMPLE, "-o", mnt / "new", *FAST),
                     ("batch", EXAMPLE, "-o", mnt, "--progress", "none", *FAST),
                     ("diff", EXAMPLE, EXAMPLE, "-o", mnt / "diff")):
            done = cli(*args)
            assert done.exit_code == 1, args
            line = one_error_line(done.stderr)
            assert "(read-only file system): choose a writable -o" in line, line
        assert_untouched(before, snapshot(mnt))
        assert sorted(os.listdir(mnt)) == ["example_ddp"]


@pytest.mark.parametrize("command", ["analyze", "batch"])
def test_disk_full_leaves_nothing_half_written(tmp_path: Path, command: str) -> None:
    mnt = tmp_path / "mnt"
    with tmpfs(mnt, "240k"):  # the catalog fits, the outputs (about 450 kB) do not
        (mnt / "kept.txt").write_text("already there\n")
        before = snapshot(mnt)
        extra = ("--progress", "none") if command == "batch" else ()
        done = cli(command, EXAMPLE, "-o", mnt, *extra)
        assert done.exit_code == 1
        if command == "analyze":
            line = one_error_line(done.stderr)
        else:  # a failed row: its one-line message
            [line] = [x for x in done.stdout.splitlines() if x.startswith("FAILED")]
        assert "(no space left on the device): free space there or choose another -o" in line
        assert_untouched(before, snapshot(mnt))
        left = sorted(os.listdir(mnt))
        assert left == (["kept.txt"] if command == "analyze" else
                        [".nsysan-batch.lock", "catalog.db", "kept.txt"])
        assert temp_entries(mnt) == []


def test_a_full_disk_under_the_batch_catalog_is_one_line(tmp_path: Path) -> None:
    mnt = tmp_path / "mnt"
    with tmpfs(mnt, "12k"):  # not even the catalog fits
        done = cli("batch", EXAMPLE, "-o", mnt, "--progress", "none")
        assert done.exit_code == 1
        line = one_error_line(done.stderr)
        assert line.startswith(f"Error: catalog sqlite:///{mnt}/catalog.db: ") and \
            "choose another --catalog" in line
        assert temp_entries(mnt) == []


def test_any_os_error_while_writing_is_one_line(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    import nsysan.report.markdown as markdown

    def broken(path: Path, data: str | bytes) -> Path:
        raise OSError(errno.EIO, "Input/output error", str(path))

    monkeypatch.setattr(markdown, "atomic_write", broken)
    done = cli("analyze", EXAMPLE, "-o", tmp_path / "out")
    assert done.exit_code == 1
    line = one_error_line(done.stderr)
    assert line.endswith("out/example_ddp: cannot write (input/output error): choose another -o")
    assert os.listdir(tmp_path / "out") == []


def test_an_os_error_no_command_expected_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    import nsysan.load.describe as describe

    def broken(*args: object, **kwargs: object) -> None:
        raise PermissionError(errno.EACCES, "Permission denied", "/some/where")

    monkeypatch.setattr(describe, "describe_path", broken)
    done = cli("schema", EXAMPLE)
    assert done.exit_code == 1
    assert one_error_line(done.stderr) == "Error: /some/where: Permission denied"


# --- 4. an internal error in one trace ----------------------------------------------------------
def _crash_on(monkeypatch: pytest.MonkeyPatch, trace_id: str) -> None:
    import nsysan.api as api

    real = api._diagnose

    def diagnose(result: api.AnalysisResult, *context: object) -> object:
        if result.trace_id == trace_id:
            raise RuntimeError("boom in the findings")
        return real(result, *context)

    monkeypatch.setattr(api, "_diagnose", diagnose)


def _three_traces(root: Path) -> list[Path]:
    root.mkdir()
    paths = [root / f"{name}.sqlite" for name in ("one", "bad", "three")]
    for p in paths:
        shutil.copy(EXAMPLE, p)
    return paths


def test_a_crash_in_one_trace_does_not_stop_the_others(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    _crash_on(monkeypatch, "bad")
    paths = _three_traces(tmp_path / "in")
    done = cli("analyze", *paths, "-o", tmp_path / "out")
    assert done.exit_code == 1
    assert one_error_line(done.stderr) == (
        f"Error: {paths[1]}: internal error: RuntimeError: boom in the findings (please report "
        "it; NSYSAN_DEBUG=1 prints the traceback)")
    assert [line.split(";")[0] for line in done.stdout.splitlines()] == ["one", "three"]
    assert sorted(os.listdir(tmp_path / "out")) == ["one", "three"]
    debug = cli("analyze", paths[1], "-o", tmp_path / "out", env={"NSYSAN_DEBUG": "1"})
    assert debug.exit_code == 1
    assert debug.stderr.startswith("Error: ") and "Traceback (most recent call last)" in \
        debug.stderr and debug.stderr.rstrip().endswith("RuntimeError: boom in the findings")


def test_a_usage_error_still_stops_at_once(tmp_path: Path) -> None:
    paths = _three_traces(tmp_path / "in")
    done = cli("analyze", *paths, "-o", tmp_path / "out", "--samples-per-step", "-1")
    assert done.exit_code == 1
    assert "--samples-per-step must be positive" in one_error_line(done.stderr)
    assert not (tmp_path / "out").exists() or os.listdir(tmp_path / "out") == []


def test_batch_isolates_a_crash_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _crash_on(monkeypatch, "bad.sqlite")
    _three_traces(tmp_path / "in")
    done = cli("batch", tmp_path / "in", "-o", tmp_path / "out", "--jobs", "1",
               "--progress", "none", *FAST)
    assert done.exit_code == 1
    assert "2 ok, 1 failed" in done.stdout
    assert ("FAILED bad.sqlite: RuntimeError: internal error: RuntimeError: boom in the "
            "findings") in done.stdout
    assert sorted(p for p in os.listdir(tmp_path / "out") if not p.startswith(".")) == [
        "catalog.db", "one.sqlite", "three.sqlite"]
    assert temp_entries(tmp_path / "out") == []
