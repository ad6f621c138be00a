"""Fault suite: no file or folder nsysan did not write is ever removed, renamed or changed.

A workspace is laid out as a careless user or an attacker would (``-o .`` beside a folder
named like the trace, ``-o`` inside a parquetdir, a suffix-less trace, files added to an output
folder, someone's folder where an output would go, look-alikes of temporary names, a link),
every entry under it is recorded (name, inode, mtime, sha256 of the contents), and analyze,
batch, diff and check run against it. Afterwards every recorded entry is still there and
unchanged, the inputs gained nothing, and no temporary entry is left.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from outputs_helpers import (
    EXAMPLE,
    assert_untouched,
    cli,
    snapshot,
    temp_entries,
    to_parquetdir,
)

FAST = ("--passes", "gaps")
#: a real SQLite export and a real parquetdir export among the shared traces
SHARED_SQLITE = "dlprof-pyprof-nvtx/nsys_profile.sqlite"
SHARED_PARQUETDIR = "sc22-ddp-4gpu-nccl/4gpu_baseline.nsys2023.4.4.parquetdir"


def _copy_tree(src: Path, dest: Path) -> None:
    shutil.copytree(src, dest, copy_function=shutil.copyfile)  # writable, as a user's copy


def _workspace(ws: Path, sqlite: Path, parquetdir: Path | None) -> None:
    (ws / "src").mkdir(parents=True)
    (ws / "src" / "main.py").write_text("print('mine')\n")
    shutil.copyfile(sqlite, ws / "src.sqlite")
    shutil.copyfile(sqlite, ws / "myrun")  # a trace without a suffix
    if parquetdir is None:
        to_parquetdir(sqlite, ws / "run")
    else:
        _copy_tree(parquetdir, ws / "run")
    (ws / "budget.toml").write_text('rules = ["gpu_busy_frac >= 0.0"]\n')
    out = ws / "out"
    (out / "src").mkdir(parents=True)  # someone's folder where an output would go
    (out / "src" / "data.csv").write_text("1,2\n")
    (out / ".notes.tmp-x").write_text("a user's hidden file\n")
    (out / ".src.tmp-abc").mkdir()  # the temporary name of earlier versions: not ours now
    (out / ".src.tmp-abc" / "keep").write_text("k\n")
    (ws / "elsewhere").mkdir()
    (ws / "link_out").symlink_to(ws / "elsewhere")


def _run_everything(ws: Path) -> list[int]:
    """Every command of the suite, as a user in ``ws`` types it; their exit codes."""
    commands = [
        ("analyze", "src.sqlite", "-o", ".", *FAST),
        ("analyze", "run", "-o", ".", *FAST),
        ("analyze", "run", "-o", "run", *FAST),
        ("analyze", "run", "-o", "run/deeper", *FAST),
        ("analyze", "myrun", "-o", ".", *FAST),
        ("analyze", "src.sqlite", "myrun", "run", "-o", "out", *FAST),
        ("analyze", "src.sqlite", "-o", "owned", *FAST),  # user files in the owned folder
        ("analyze", "src.sqlite", "-o", "link_out", *FAST),
        ("analyze", "src.sqlite", "-o", "link_out", *FAST),  # again: replaces its own
        ("analyze", "myrun", "src.sqlite", "--job", "-o", "run"),
        ("batch", "src.sqlite", "myrun", "run", "-o", ".", "--jobs", "1", "--progress",
         "none", *FAST),
        ("batch", ".", "-o", "out", "--jobs", "1", "--progress", "none", *FAST),
        ("batch", "run", "-o", "run", "--jobs", "1", "--progress", "none", *FAST),
        ("diff", "src.sqlite", "myrun", "-o", "run"),
        ("diff", "src.sqlite", "myrun", "-o", "src"),
        ("diff", "src.sqlite", "owned/src", "-o", "owned/src"),
        ("check", "src.sqlite", "--budget", "budget.toml", "--junit", "src.sqlite"),
        ("check", "src.sqlite", "--budget", "budget.toml", "--junit", "budget.toml"),
        ("check", "src.sqlite", "--budget", "budget.toml", "--summary", "run/x.md"),
        ("baseline", "save", "src", "src.sqlite", "--store", "."),
    ]
    return [cli(*c).exit_code for c in commands]


@pytest.mark.parametrize("traces", ["fixture", "shared"])
def test_nothing_nsysan_did_not_write_is_ever_touched(
    traces: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    if traces == "shared":
        shared = request.getfixturevalue("shared_traces")
        sqlite, parquetdir = shared / SHARED_SQLITE, shared / SHARED_PARQUETDIR
    else:
        sqlite, parquetdir = EXAMPLE, None
    ws = tmp_path / "ws"
    _workspace(ws, sqlite, parquetdir)
    monkeypatch.chdir(ws)
    # a folder nsysan owns, with a user's file added to it
    assert cli("analyze", "src.sqlite", "-o", "owned", *FAST).exit_code == 0
    (ws / "owned" / "src" / "notes.txt").write_text("my notes\n")
    before = snapshot(ws)
    inputs = {name: snapshot(ws / name) for name in ("run", "src")}

    codes = _run_everything(ws)

    after = snapshot(ws)
    assert_untouched(before, after)
    assert snapshot(ws / "run") == inputs["run"], "the parquetdir gained or lost entries"
    assert [t for t in temp_entries(ws) if t not in before] == []  # (the look-alikes stay)
    # and the commands that may write did: the refusals were not everything
    assert codes.count(0) >= 4, codes
    assert (ws / "out" / "myrun" / "manifest.json").is_file()
    assert (ws / "elsewhere" / "src" / "manifest.json").is_file()
    assert (ws / "src" / "diff.md").is_file() and (ws / "src" / "main.py").is_file()
    new = sorted(set(after) - set(before))
    assert not [p for p in new if p.startswith(str(ws / "run"))]
    assert os.readlink(ws / "link_out") == str(ws / "elsewhere")
