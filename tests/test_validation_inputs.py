"""Inputs that are not regular files: a named pipe is refused at once (reading it blocked
forever), batch lists pipes, symlink loops and dangling links as failed rows (it dropped them,
or died with a traceback), and a directory reached again through a symlink is searched once."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO_ROOT

from nsysan.batch.discover import discover
from nsysan.batch.run import run_batch
from nsysan.errors import TraceFormatError
from nsysan.load import open_trace

EXAMPLE = REPO_ROOT / "fixtures" / "example_ddp.sqlite"
needs_fifo = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes here")


def _nsysan(*args: str | Path, timeout: float = 120) -> subprocess.CompletedProcess:
    """The CLI in a child process: a hang fails the test after ``timeout`` instead of
    blocking the suite."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run([sys.executable, "-m", "nsysan", *map(str, args)], env=env,
                          capture_output=True, text=True, timeout=timeout)


@needs_fifo
@pytest.mark.parametrize("name", ["run.sqlite", "run.nsys-rep", "run"])
def test_analyze_refuses_a_named_pipe_at_once(tmp_path: Path, name: str) -> None:
    fifo = tmp_path / name
    os.mkfifo(fifo)
    try:
        res = _nsysan("analyze", fifo, "-o", tmp_path / "out", timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("nsysan analyze blocked on a named pipe")
    assert res.returncode == 1, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), res.stderr
    assert "named pipe (FIFO)" in lines[0] and str(fifo) in lines[0]
    assert not (tmp_path / "out").exists()


def test_loader_names_what_an_input_is(tmp_path: Path) -> None:
    loop = tmp_path / "loop.sqlite"
    loop.symlink_to(loop)
    with pytest.raises(TraceFormatError, match="symlink loop"):
        open_trace(loop)
    dangling = tmp_path / "dangling.sqlite"
    dangling.symlink_to(tmp_path / "gone.sqlite")
    with pytest.raises(TraceFormatError, match="dangling symbolic link"):
        open_trace(dangling)
    with pytest.raises(TraceFormatError, match="no such file or directory"):
        open_trace(tmp_path / "absent.sqlite")
    if Path("/dev/null").exists():
        with pytest.raises(TraceFormatError, match="character device"):
            open_trace("/dev/null")


@pytest.fixture
def odd_archive(tmp_path: Path) -> Path:
    root = tmp_path / "archive"
    (root / "sub").mkdir(parents=True)
    shutil.copyfile(EXAMPLE, root / "good.sqlite")
    if hasattr(os, "mkfifo"):
        os.mkfifo(root / "pipe.sqlite")
    (root / "loop.sqlite").symlink_to(root / "loop.sqlite")
    (root / "dangling.nsys-rep").symlink_to(root / "nowhere.nsys-rep")
    (root / "sub" / "up").symlink_to(root)  # a directory loop
    (root / "sub" / "again").symlink_to(root / "sub")
    return root


def test_batch_lists_odd_files_as_failed_rows(odd_archive: Path, tmp_path: Path) -> None:
    found = {t.trace_id for t in discover([odd_archive])}
    expected = {"good.sqlite", "loop.sqlite", "dangling.nsys-rep"}
    if hasattr(os, "mkfifo"):
        expected.add("pipe.sqlite")
    assert found == expected  # the directory loops were searched once, nothing twice
    summary = run_batch([odd_archive], tmp_path / "out", jobs=1, progress=False)
    rows = {r.trace_id: r for r in summary.records}
    assert set(rows) == expected
    assert rows["good.sqlite"].status == "ok"
    reasons = {"loop.sqlite": "symlink loop", "dangling.nsys-rep": "dangling symbolic link",
               "pipe.sqlite": "named pipe (FIFO)"}
    for tid in expected - {"good.sqlite"}:
        assert rows[tid].status == "failed", tid
        assert rows[tid].error_type == "TraceFormatError", tid
        assert reasons[tid] in rows[tid].error_message, rows[tid].error_message
        assert rows[tid].error_detail is None  # an expected failure, not an internal error
    assert summary.exit_code == 1


@needs_fifo
def test_batch_on_the_cli_does_not_hang_or_trace_back(odd_archive: Path,
                                                      tmp_path: Path) -> None:
    pipe = odd_archive / "pipe.sqlite"
    try:
        res = _nsysan("batch", odd_archive, pipe, odd_archive / "loop.sqlite", "-o",
                      tmp_path / "out", "--jobs", "1", "--progress", "none", timeout=180)
    except subprocess.TimeoutExpired:
        pytest.fail("nsysan batch blocked")
    assert res.returncode == 1, res.stderr
    assert "Traceback" not in res.stderr + res.stdout
    assert "FAILED pipe.sqlite: TraceFormatError:" in res.stdout
    assert "FAILED loop.sqlite: TraceFormatError:" in res.stdout


@needs_fifo
def test_export_and_job_refuse_odd_inputs(tmp_path: Path) -> None:
    from nsysan.load.export import export_report

    fifo = tmp_path / "run.nsys-rep"
    os.mkfifo(fifo)
    with pytest.raises(TraceFormatError, match="named pipe"):
        export_report(fifo)  # the header read blocked before
    loop = tmp_path / "loop.sqlite"
    loop.symlink_to(loop)
    res = _nsysan("analyze", "--job", loop, EXAMPLE, "-o", tmp_path / "out", timeout=120)
    assert res.returncode == 1 and "symlink loop" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr
