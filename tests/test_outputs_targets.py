"""Files in places the user names (docs/outputs.md, "Files in folders you name"): the diff
files of ``nsysan diff -o DIR``, the JUnit report and the step summary of ``nsysan check``.
nsysan replaces only files it wrote, never an input, and refuses before any analysis."""

from __future__ import annotations

import subprocess
from pathlib import Path

from outputs_helpers import (
    EXAMPLE,
    LAYERS,
    assert_untouched,
    cli,
    one_error_line,
    snapshot,
    temp_entries,
    tmpfs,
)

FAST = ("--passes", "gaps")


def _budget(path: Path) -> Path:
    path.write_text('rules = ["gpu_busy_frac >= 0.1"]\n')
    return path


def test_step_summary_pointing_to_a_folder(tmp_path: Path) -> None:
    budget = _budget(tmp_path / "budget.toml")
    done = cli("check", EXAMPLE, "--budget", budget,
               env={"GITHUB_STEP_SUMMARY": str(tmp_path)})
    assert done.exit_code == 1
    line = one_error_line(done.stderr)
    assert line == f"Error: {tmp_path} is a folder: give $GITHUB_STEP_SUMMARY a file path"
    assert done.stdout == ""  # refused before the analysis


def test_step_summary_unwritable(tmp_path: Path) -> None:
    mnt = tmp_path / "mnt"
    budget = _budget(tmp_path / "budget.toml")
    with tmpfs(mnt, "1m"):
        (mnt / "summary.md").write_text("## earlier step\n")
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
        done = cli("check", EXAMPLE, "--budget", budget,
                   env={"GITHUB_STEP_SUMMARY": str(mnt / "summary.md")})
        assert done.exit_code == 1
        assert "(read-only file system): choose a writable $GITHUB_STEP_SUMMARY" in \
            one_error_line(done.stderr)
        assert (mnt / "summary.md").read_text() == "## earlier step\n"


def test_check_never_writes_over_its_inputs_or_a_foreign_file(tmp_path: Path) -> None:
    budget = _budget(tmp_path / "budget.toml")
    before = snapshot(tmp_path)
    for option, target, message in (
            ("--junit", budget, "it is the input"),
            ("--summary", budget, "it is the input"),
            ("--junit", EXAMPLE, "it is the input")):
        done = cli("check", EXAMPLE, "--budget", budget, option, target)
        assert done.exit_code == 1 and message in one_error_line(done.stderr), option
    (tmp_path / "report.xml").write_text("<results>someone else's</results>\n")
    done = cli("check", EXAMPLE, "--budget", budget, "--junit", tmp_path / "report.xml")
    assert done.exit_code == 1
    assert "report.xml exists and was not written by nsysan" in one_error_line(done.stderr)
    assert_untouched(before, snapshot(tmp_path))
    # its own report (and an empty file) it replaces
    (tmp_path / "report.xml").write_text("")
    assert cli("check", EXAMPLE, "--budget", budget, "--junit",
               tmp_path / "report.xml").exit_code == 0
    assert cli("check", EXAMPLE, "--budget", budget, "--junit",
               tmp_path / "report.xml").exit_code == 0
    assert (tmp_path / "report.xml").read_text().count("<testsuites") == 1


def test_diff_replaces_only_its_own_files(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "diff.md").write_text("my notes\n")
    (out / "other.txt").write_text("x\n")
    before = snapshot(out)
    done = cli("diff", EXAMPLE, LAYERS, "-o", out)
    assert done.exit_code == 1
    assert "diff.md already there and not written by nsysan" in one_error_line(done.stderr)
    assert done.stdout == ""  # refused before the analyses
    assert_untouched(before, snapshot(out))
    (out / "diff.md").unlink()
    assert cli("diff", EXAMPLE, LAYERS, "-o", out).exit_code == 0
    assert cli("diff", EXAMPLE, EXAMPLE, "-o", out).exit_code == 0  # its own: replaced
    assert (out / "other.txt").read_text() == "x\n"
    assert temp_entries(out) == []
    # an analysis folder is not a place for diff files
    assert cli("analyze", EXAMPLE, "-o", tmp_path / "an", *FAST).exit_code == 0
    done = cli("diff", EXAMPLE, EXAMPLE, "-o", tmp_path / "an" / "example_ddp")
    assert done.exit_code == 1 and "holds nsysan analysis outputs" in one_error_line(done.stderr)


def test_baseline_store_replaces_only_baselines_it_wrote(tmp_path: Path) -> None:
    store = tmp_path / "store"
    (store / "main").mkdir(parents=True)
    (store / "main" / "main.py").write_text("x\n")  # a folder named like the baseline
    before = snapshot(store)
    done = cli("baseline", "save", "main", EXAMPLE, "--store", store)
    assert done.exit_code == 1
    assert "main exists and was not written by nsysan" in one_error_line(done.stderr)
    assert "choose another --store" in done.stderr
    assert_untouched(before, snapshot(store))
    assert cli("baseline", "save", "ddp", EXAMPLE, "--store", store).exit_code == 0
    assert cli("baseline", "save", "ddp", LAYERS, "--store", store).exit_code == 0  # replaced
    (store / "ddp" / "notes.txt").write_text("mine\n")
    done = cli("baseline", "save", "ddp", EXAMPLE, "--store", store)
    assert done.exit_code == 1 and "(notes.txt)" in one_error_line(done.stderr)
    assert (store / "ddp" / "notes.txt").read_text() == "mine\n"
    assert temp_entries(store) == []
