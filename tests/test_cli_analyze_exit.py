"""The ``nsysan`` process: early opening of the first trace, and the fast exit of `cli.main`.

These run the real entry point in a subprocess: `main` ends with `os._exit`, so what they
check (exit status, output written to a pipe, order of errors) is only visible from outside.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from nsysan.api import analyze, start

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "fixtures" / "example_ddp.sqlite"


def nsysan(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nsysan", *args], capture_output=True,
                          text=True, check=False, timeout=300)


def test_status_and_piped_output_survive_the_fast_exit(tmp_path: Path) -> None:
    done = nsysan("analyze", str(EXAMPLE), "-o", str(tmp_path), "--fail-on", "warning")
    assert done.returncode == 3, done.stderr
    # stdout is a pipe (block-buffered): the summary line is there only if it was flushed
    assert done.stdout.strip().endswith(f"-> {tmp_path / 'example_ddp'}")
    assert (tmp_path / "example_ddp" / "manifest.json").is_file()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "temp dirs left"


def test_usage_errors_come_before_errors_of_the_early_opened_trace(tmp_path: Path) -> None:
    done = nsysan("analyze", str(tmp_path / "nope.sqlite"), "-o", str(tmp_path / "out"),
                  "--passes", "nope")
    assert done.returncode == 1
    assert done.stderr.startswith("Error: ") and "unknown pass 'nope'" in done.stderr
    done = nsysan("analyze", str(tmp_path / "nope.sqlite"), "-o", str(tmp_path / "out"))
    assert done.returncode == 1 and "nope.sqlite" in done.stderr


def test_click_usage_error_status_and_long_output() -> None:
    assert nsysan("analyze").returncode == 2  # missing argument: click's usage status
    done = nsysan("passes", "--json")
    assert done.returncode == 0 and done.stdout.rstrip().endswith("]")


def test_a_started_trace_is_analysed_without_starting_again() -> None:
    trace = start(EXAMPLE, hash_inputs=True)
    assert start(trace) is trace
    result = analyze(trace, passes=["gaps"])
    assert result.trace is trace and "gaps" in result.tables
    assert analyze(EXAMPLE, passes=["gaps"]).table("gaps").equals(result.table("gaps"))
