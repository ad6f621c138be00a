"""Output ownership (docs/outputs.md): nsysan replaces only folders it wrote, for the same
input, with nothing else in them; never an input; distinct inputs never share a folder.

Each case of issue 16 (part 1: data loss through ``-o``; part 2: collisions) runs the command
as a user would and checks, with a snapshot of names, inodes, mtimes and contents, that
nothing nsysan did not write was removed, renamed or changed.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from outputs_helpers import (
    EXAMPLE,
    assert_untouched,
    cli,
    dead_pid,
    one_error_line,
    snapshot,
    temp_entries,
    to_parquetdir,
)

FAST = ("--passes", "gaps")  # ownership does not depend on the passes: the quickest run


@pytest.fixture
def workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The issue's layout: a project folder ``p`` with a source folder ``src`` holding
    ``main.py``, and the trace ``src.sqlite`` beside it; the current folder is ``p``."""
    p = tmp_path / "p"
    (p / "src").mkdir(parents=True)
    (p / "src" / "main.py").write_text("x\n")
    shutil.copy(EXAMPLE, p / "src.sqlite")
    monkeypatch.chdir(p)
    return p


# --- 1. data loss through -o -----------------------------------------------------------------
def test_dash_o_dot_never_replaces_a_folder_named_like_the_trace(workspace: Path) -> None:
    before = snapshot(workspace)
    done = cli("analyze", "src.sqlite", "-o", ".")
    assert done.exit_code == 1
    line = one_error_line(done.stderr)
    assert "src exists and was not written by nsysan" in line and "choose another -o" in line
    assert (workspace / "src" / "main.py").read_text() == "x\n"
    assert_untouched(before, snapshot(workspace))
    assert temp_entries(workspace) == []


def test_a_parquetdir_input_is_never_the_output(workspace: Path) -> None:
    run = to_parquetdir(EXAMPLE, workspace / "run")
    before = snapshot(workspace)
    done = cli("analyze", "run", "-o", ".", *FAST)
    assert done.exit_code == 1
    assert "refusing to write there: it is the input run" in one_error_line(done.stderr)
    done = cli("analyze", "run", "-o", "run", *FAST)  # inside the parquetdir: refused too
    assert done.exit_code == 1
    assert "it lies inside the input run" in one_error_line(done.stderr)
    done = cli("batch", "run", "-o", ".", "--jobs", "1", "--progress", "none", *FAST)
    assert done.exit_code == 1 and "it is the input" in done.stdout
    after = snapshot(workspace)
    assert_untouched({k: v for k, v in before.items() if k.startswith(str(run))}, after)
    assert_untouched(before, {**after, str(workspace): before[str(workspace)]})
    assert temp_entries(workspace) == []


def test_a_suffixless_trace_is_never_renamed(workspace: Path) -> None:
    shutil.copy(EXAMPLE, workspace / "myrun")
    before = snapshot(workspace)
    done = cli("analyze", "myrun", "-o", ".", *FAST)
    assert done.exit_code == 1
    assert "it is the input myrun" in one_error_line(done.stderr)
    assert_untouched(before, snapshot(workspace))
    assert sorted(os.listdir(workspace)) == ["myrun", "src", "src.sqlite"]


def test_files_added_to_an_output_folder_are_never_removed(workspace: Path) -> None:
    assert cli("analyze", "src.sqlite", "-o", "out", *FAST).exit_code == 0
    (workspace / "out" / "src" / "notes.txt").write_text("mine\n")
    (workspace / "out" / "src" / "plots").mkdir()
    before = snapshot(workspace)
    done = cli("analyze", "src.sqlite", "-o", "out", *FAST)
    assert done.exit_code == 1
    line = one_error_line(done.stderr)
    assert "holds files nsysan did not write (notes.txt, plots)" in line
    assert_untouched(before, snapshot(workspace))
    # moved out of it, the folder is nsysan's alone again: re-analysis replaces it
    (workspace / "out" / "src" / "notes.txt").rename(workspace / "notes.txt")
    (workspace / "out" / "src" / "plots").rmdir()
    assert cli("analyze", "src.sqlite", "-o", "out", *FAST).exit_code == 0
    assert (workspace / "notes.txt").read_text() == "mine\n"


def test_the_same_input_replaces_its_own_folder(workspace: Path) -> None:
    assert cli("analyze", "src.sqlite", "-o", "out", *FAST).exit_code == 0
    first = (workspace / "out" / "src" / ".nsysan-output.json").read_text()
    assert cli("analyze", "src.sqlite", "-o", "out").exit_code == 0  # now with every pass
    marker = json.loads((workspace / "out" / "src" / ".nsysan-output.json").read_text())
    assert marker["kind"] == "analysis" and "findings.md" in marker["files"]
    assert marker["inputs"][0]["path"] == str(workspace / "src.sqlite")
    assert json.loads(first)["inputs"] == marker["inputs"]
    assert sorted(marker["files"]) == sorted(
        p.name for p in (workspace / "out" / "src").iterdir() if not p.name.startswith("."))
    assert temp_entries(workspace) == []


def test_an_existing_link_or_file_at_the_output_is_refused(workspace: Path) -> None:
    (workspace / "out").mkdir()
    (workspace / "elsewhere").mkdir()
    (workspace / "out" / "src").symlink_to(workspace / "elsewhere")
    before = snapshot(workspace)
    done = cli("analyze", "src.sqlite", "-o", "out", *FAST)
    assert done.exit_code == 1 and "is a symbolic link" in one_error_line(done.stderr)
    (workspace / "out" / "src").unlink()
    (workspace / "out" / "src").write_text("a file\n")
    done = cli("analyze", "src.sqlite", "-o", "out", *FAST)
    assert done.exit_code == 1 and "is not a folder nsysan wrote" in one_error_line(done.stderr)
    assert (workspace / "out" / "src").read_text() == "a file\n"
    assert_untouched({k: v for k, v in before.items() if "out/src" not in k},
                     snapshot(workspace))


def test_only_nsysans_own_stale_temporary_folders_are_cleaned(workspace: Path) -> None:
    from nsysan.report.atomic import host_tag

    out = workspace / "out"
    out.mkdir()
    stale = out / f".src.nsysan-tmp-{host_tag()}-{dead_pid()}-x1"
    stale.mkdir()
    (stale / ".nsysan-output.json").write_text('{"nsysan_output": 1, "state": "writing"}')
    (stale / "gaps.parquet").write_bytes(b"half")
    live = out / f".src.nsysan-tmp-{host_tag()}-{os.getpid()}-x2"  # this process: alive
    live.mkdir()
    (live / ".nsysan-output.json").write_text('{"nsysan_output": 1, "state": "writing"}')
    unmarked = out / f".src.nsysan-tmp-{host_tag()}-{dead_pid()}-x3"  # no marker: not ours
    unmarked.mkdir()
    (unmarked / "data.csv").write_text("1\n")
    other_host = out / f".src.nsysan-tmp-00000000-{dead_pid()}-x4"  # maybe alive elsewhere
    other_host.mkdir()
    (other_host / ".nsysan-output.json").write_text('{"nsysan_output": 1}')
    (out / ".notes.tmp-x").write_text("a user's\n")
    (out / ".draft.old-1").mkdir()
    keep = snapshot(live, unmarked, other_host, out / ".draft.old-1")
    assert cli("analyze", "src.sqlite", "-o", "out", *FAST).exit_code == 0
    assert not stale.exists()
    assert_untouched(keep, snapshot(live, unmarked, other_host, out / ".draft.old-1"))
    assert (out / ".notes.tmp-x").read_text() == "a user's\n"
    done = cli("batch", "src.sqlite", "-o", "out", "--jobs", "1", "--progress", "none", *FAST)
    assert done.exit_code == 0, done.output
    assert_untouched(keep, snapshot(live, unmarked, other_host, out / ".draft.old-1"))
    assert (out / ".notes.tmp-x").read_text() == "a user's\n"


def test_folders_of_earlier_versions_are_recognised_by_their_manifest(workspace: Path) -> None:
    assert cli("analyze", "src.sqlite", "-o", "out", *FAST).exit_code == 0
    folder = workspace / "out" / "src"
    (folder / ".nsysan-output.json").unlink()  # as an nsysan without markers left it
    assert cli("analyze", "src.sqlite", "-o", "out", *FAST).exit_code == 0
    assert (folder / ".nsysan-output.json").is_file()
    (folder / ".nsysan-output.json").unlink()
    (folder / "mine.txt").write_text("x")  # a file its manifest does not list
    done = cli("analyze", "src.sqlite", "-o", "out", *FAST)
    assert done.exit_code == 1 and "(mine.txt)" in one_error_line(done.stderr)


# --- 2. collisions ----------------------------------------------------------------------------
def test_distinct_inputs_of_one_invocation_never_share_a_folder(workspace: Path) -> None:
    shutil.copy(EXAMPLE, workspace / "a b.sqlite")
    shutil.copy(EXAMPLE, workspace / "a_b.sqlite")
    done = cli("analyze", "a b.sqlite", "a_b.sqlite", "-o", "out", *FAST)
    assert done.exit_code == 1
    line = one_error_line(done.stderr)
    assert "2 inputs (a b.sqlite, a_b.sqlite) would all write out/a_b" in line
    assert not (workspace / "out").exists() or list((workspace / "out").iterdir()) == []
    # the same file named twice (here through a link) is one input: analysed, not refused
    (workspace / "again.sqlite").symlink_to(workspace / "a_b.sqlite")
    assert cli("analyze", "a_b.sqlite", "again.sqlite", "-o", "out", *FAST).exit_code == 0


def test_a_folder_owned_for_another_input_is_not_overwritten(workspace: Path) -> None:
    (workspace / "x").mkdir()
    shutil.copy(EXAMPLE, workspace / "x" / "a b.sqlite")
    layers = Path(__file__).resolve().parents[1] / "fixtures" / "example_layers.sqlite"
    shutil.copy(layers, workspace / "a_b.sqlite")  # another trace, the same id
    assert cli("analyze", "x/a b.sqlite", "-o", "out", *FAST).exit_code == 0
    before = snapshot(workspace / "out")
    done = cli("analyze", "a_b.sqlite", "-o", "out", *FAST)
    assert done.exit_code == 1
    line = one_error_line(done.stderr)
    assert f"holds the outputs of another input ({workspace / 'x' / 'a b.sqlite'})" in line
    assert_untouched(before, snapshot(workspace / "out"))
    # the same content at another path (an archive moved) is the same input
    shutil.copy(workspace / "x" / "a b.sqlite", workspace / "a_b.sqlite")
    assert cli("analyze", "a_b.sqlite", "-o", "out", *FAST).exit_code == 0


def test_batch_reports_a_foreign_output_folder_as_a_failed_trace(workspace: Path) -> None:
    (workspace / "traces").mkdir()
    shutil.copy(EXAMPLE, workspace / "traces" / "one.sqlite")
    shutil.copy(EXAMPLE, workspace / "traces" / "two.sqlite")
    (workspace / "out" / "two.sqlite").mkdir(parents=True)  # someone's folder, the id's name
    (workspace / "out" / "two.sqlite" / "keep.txt").write_text("k")
    before = snapshot(workspace / "out" / "two.sqlite")
    done = cli("batch", "traces", "-o", "out", "--jobs", "1", "--progress", "none", *FAST)
    assert done.exit_code == 1
    assert "1 ok, 1 failed" in done.stdout
    assert "FAILED two.sqlite: OutputError:" in done.stdout
    assert "was not written by nsysan" in done.stdout
    assert_untouched(before, snapshot(workspace / "out" / "two.sqlite"))
    assert (workspace / "out" / "one.sqlite" / ".nsysan-output.json").is_file()


def test_batch_never_writes_over_an_input_in_its_output_root(workspace: Path) -> None:
    d = workspace / "d"
    d.mkdir()
    shutil.copy(EXAMPLE, d / "x.sqlite")
    shutil.copy(EXAMPLE, d / "y.sqlite")
    before = snapshot(d)
    # the ids are x.sqlite and y.sqlite (relative to d): OUT/<id> would be the inputs
    done = cli("batch", "d/x.sqlite", "d/y.sqlite", "-o", "d", "--jobs", "1",
               "--progress", "none", *FAST)
    assert done.exit_code == 1 and "0 ok, 2 failed" in done.stdout
    assert done.stdout.count("it is the input") == 2
    after = snapshot(d)
    assert_untouched({k: v for k, v in before.items() if k.endswith(".sqlite")}, after)


def test_batch_gives_inputs_with_one_id_their_own_folders(workspace: Path) -> None:
    shutil.copy(EXAMPLE, workspace / "a b.sqlite")
    shutil.copy(EXAMPLE, workspace / "a_b.sqlite")
    done = cli("batch", "a b.sqlite", "a_b.sqlite", "-o", "out", "--jobs", "1",
               "--progress", "none", *FAST)
    assert done.exit_code == 0 and "2 ok" in done.stdout, done.output
    folders = sorted(p for p in os.listdir(workspace / "out") if p.startswith("a_b"))
    assert len(folders) == 2
    paths = {json.loads((workspace / "out" / f / ".nsysan-output.json").read_text())
             ["inputs"][0]["path"] for f in folders}
    assert paths == {str(workspace / "a b.sqlite"), str(workspace / "a_b.sqlite")}
