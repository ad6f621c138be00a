"""Option and input validation: finite numbers, distinct job inputs and ranks, options that
--job cannot honour, relative --nsys paths, cached exports that were cut short, and diffs of
runs on different GPUs."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import REPO_ROOT
from test_export import _calls, _report, fake_nsys  # noqa: F401 - fake_nsys is a fixture

from nsysan.cli import cli
from nsysan.errors import ConfigError
from nsysan.load import open_trace
from nsysan.load.export import export_report, find_nsys

EXAMPLE = REPO_ROOT / "fixtures" / "example_ddp.sqlite"


def run(*args: str):
    return CliRunner().invoke(cli, [str(a) for a in args])


def assert_one_line_error(res, code: int, *needles: str) -> None:
    assert res.exit_code == code, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    for needle in needles:
        assert needle in res.output, res.output


# ---------------------------------------------------------------------------------------------
# finite numbers
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "NaN"])
@pytest.mark.parametrize("option", ["--samples-per-step", "--tokens-per-step"])
def test_analyze_per_step_options_must_be_finite(tmp_path: Path, option: str,
                                                 value: str) -> None:
    res = run("analyze", EXAMPLE, "-o", tmp_path / "out", option, value)
    assert_one_line_error(res, 2, "is not a finite number")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("args", "needle"), [
    (["diff", EXAMPLE, EXAMPLE, "--min-effect", "nan"], "is not a finite number"),
    (["diff", EXAMPLE, EXAMPLE, "--confidence", "inf"], "is not a finite number"),
    (["diff", EXAMPLE, EXAMPLE, "--samples-per-step", "nan"], "is not a finite number"),
    (["batch", EXAMPLE, "-o", "OUT", "--tokens-per-step", "inf"], "is not a finite number"),
    (["catalog", "query", "--catalog", "OUT", "--regressed", "gpu_busy_frac", "--by-ratio",
      "nan"], "is not a finite number"),
    (["catalog", "query", "--catalog", "OUT", "--regressed", "gpu_busy_frac", "--min-delta",
      "-inf"], "is not a finite number"),
])
def test_float_options_of_every_command_must_be_finite(tmp_path: Path, args: list,
                                                       needle: str) -> None:
    args = [str(tmp_path / "out") if a == "OUT" else a for a in args]
    assert_one_line_error(run(*args), 2, needle)


@pytest.mark.parametrize(("setting", "needle"), [
    ("gaps.min_cause_frac=nan", "is not a finite number"),
    ("gaps.min_cause_frac=inf", "is not a finite number"),
    ("gaps.min_gap_ns=1e999", "is not a finite number"),  # was an OverflowError traceback
    ("nccl.low_busbw_gbps=-inf", "is not a finite number"),
])
def test_set_float_params_must_be_finite(tmp_path: Path, setting: str, needle: str) -> None:
    res = run("analyze", EXAMPLE, "-o", tmp_path / "out", "--set", setting)
    assert_one_line_error(res, 1, "Error:", needle)


def test_library_rejects_nan_per_step_values() -> None:
    from nsysan.api import analyze

    for value in (float("nan"), float("inf")):
        with pytest.raises(ConfigError, match="must be positive and finite"):
            analyze(EXAMPLE, samples_per_step=value)


# ---------------------------------------------------------------------------------------------
# --job
# ---------------------------------------------------------------------------------------------
def test_job_refuses_the_same_file_twice(tmp_path: Path) -> None:
    res = run("analyze", "--job", EXAMPLE, EXAMPLE, "-o", tmp_path / "out")
    assert_one_line_error(res, 1, "Error:", "are the same file")
    link = tmp_path / "link.sqlite"
    link.symlink_to(EXAMPLE)
    res = run("analyze", "--job", EXAMPLE, link, "-o", tmp_path / "out")
    assert_one_line_error(res, 1, "are the same file")
    copy = tmp_path / "copy.sqlite"
    shutil.copyfile(EXAMPLE, copy)
    res = run("analyze", "--job", EXAMPLE, copy, "-o", tmp_path / "out")
    assert_one_line_error(res, 1, "have the same content")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("rank_map", "needle"), [
    ("a.sqlite=0,b.sqlite=0", "gives rank 0 to both"),
    ("a.sqlite=0,a.sqlite=1", "names 'a.sqlite' twice"),
    ("a.sqlite=x", "expected FILE=RANK"),
    ("=1", "expected FILE=RANK"),
])
def test_job_rank_map_must_be_distinct(tmp_path: Path, rank_map: str, needle: str) -> None:
    a, b = tmp_path / "a.sqlite", tmp_path / "b.sqlite"
    shutil.copyfile(EXAMPLE, a)
    shutil.copyfile(REPO_ROOT / "fixtures" / "example_layers.sqlite", b)
    res = run("analyze", "--job", a, b, "-o", tmp_path / "out", "--rank-map", rank_map)
    assert_one_line_error(res, 1, "Error:", needle)


@pytest.mark.parametrize("extra", [["--passes", "gaps"], ["--set", "gaps.min_gap_ns=1"],
                                   ["--samples-per-step", "8"], ["--tokens-per-step", "8"]])
def test_job_rejects_options_it_cannot_honour(tmp_path: Path, extra: list[str]) -> None:
    b = tmp_path / "b.sqlite"
    shutil.copyfile(REPO_ROOT / "fixtures" / "example_layers.sqlite", b)
    res = run("analyze", "--job", EXAMPLE, b, "-o", tmp_path / "out", *extra)
    assert_one_line_error(res, 2, extra[0], "cannot be used with --job")


# ---------------------------------------------------------------------------------------------
# --nsys and the export cache
# ---------------------------------------------------------------------------------------------
def test_relative_nsys_is_taken_from_the_cwd_not_path(fake_nsys: Path, tmp_path: Path,  # noqa: F811
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    impostor = tmp_path / "elsewhere" / "nsys"
    impostor.parent.mkdir()
    impostor.write_text("#!/bin/sh\necho impostor >> \"$FAKE_LOG.impostor\"\nexit 7\n")
    impostor.chmod(0o755)
    monkeypatch.setenv("PATH", f"{impostor.parent}:/usr/bin:/bin")
    monkeypatch.chdir(fake_nsys.parent)
    assert find_nsys("./nsys") == fake_nsys
    assert find_nsys("nsys") == fake_nsys  # a file named on the command line, not PATH's
    report = _report(tmp_path / "r")
    out = export_report(report, nsys="./nsys")
    assert open_trace(out).meta.tables["StringIds"] == 1
    assert _calls(tmp_path) == 1
    assert not Path(str(tmp_path / "calls.log") + ".impostor").exists()


def _cut(path: Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def test_cut_short_cached_export_is_exported_again(fake_nsys: Path, tmp_path: Path,  # noqa: F811
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    src = tmp_path / "big.sqlite"
    shutil.copyfile(EXAMPLE, src)  # several pages, so that a cut is visible in the header
    monkeypatch.setenv("FAKE_SRC", str(src))
    report = _report(tmp_path / "r")
    out = export_report(report, nsys=fake_nsys)
    assert _calls(tmp_path) == 1
    assert export_report(report, nsys=fake_nsys) == out and _calls(tmp_path) == 1  # reused
    _cut(out)  # e.g. the disk filled up while a copy of the cache was made
    assert export_report(report, nsys=fake_nsys) == out
    assert _calls(tmp_path) == 2  # invalid: exported again
    assert out.stat().st_size == src.stat().st_size
    assert not open_trace(out).gpu_ops.is_empty()


def test_cached_export_without_its_marker_is_exported_again(fake_nsys: Path,  # noqa: F811
                                                            tmp_path: Path) -> None:
    from nsysan.load.export import sidecar_path

    report = _report(tmp_path / "r")
    out = export_report(report, nsys=fake_nsys)
    assert sidecar_path(out).is_file()
    sidecar_path(out).unlink()  # e.g. an export of an older nsysan, or a copy of the file
    assert export_report(report, nsys=fake_nsys) == out
    assert _calls(tmp_path) == 2
    assert sidecar_path(out).is_file()
    with open(out, "ab") as fh:  # changed after the marker was written
        fh.write(b"\0" * 4096)
    export_report(report, nsys=fake_nsys)
    assert _calls(tmp_path) == 3


def test_batch_does_not_take_export_markers_for_traces(fake_nsys: Path,  # noqa: F811
                                                       tmp_path: Path) -> None:
    from nsysan.batch.discover import discover

    report = _report(tmp_path / "r")
    export_report(report, nsys=fake_nsys)
    assert [t.path for t in discover([tmp_path / "r"])] == [report.resolve()]
    assert [t.path for t in discover([str(tmp_path / "r" / "*")])] == [report.resolve()]


# ---------------------------------------------------------------------------------------------
# diff of runs on different GPUs
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def two_and_one_gpu(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from nsysan.testing.scenarios import build

    d = tmp_path_factory.mktemp("gpus")
    two, _ = build("multi_device", d, steps=12)
    one = d / "one_gpu.sqlite"
    shutil.copyfile(two, one)
    con = sqlite3.connect(one)
    for table in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY",
                  "CUPTI_ACTIVITY_KIND_MEMSET"):
        if con.execute("SELECT count(*) FROM sqlite_master WHERE name = ?", (table,)).fetchone()[0]:
            con.execute(f"DELETE FROM {table} WHERE deviceId = 1")
    con.commit()
    con.close()
    return two, one


def test_diff_of_different_gpu_sets_is_not_comparable(two_and_one_gpu, tmp_path: Path) -> None:
    two, one = two_and_one_gpu
    res = run("diff", two, one, "--fail-on-regression", "-o", tmp_path / "d")
    assert res.exit_code == 4, res.output
    assert "different devices: BASE has GPU 0, 1, NEW has GPU 0" in res.output
    assert "--devices 0" in res.output
    assert "different devices" in (tmp_path / "d" / "diff.md").read_text()


def test_diff_of_selected_devices(two_and_one_gpu) -> None:
    import json

    two, one = two_and_one_gpu
    res = run("diff", two, one, "--devices", "0", "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["comparable"] is True
    assert doc["base"]["info"]["devices"] == [0] and doc["base"]["info"]["all_devices"] == [0, 1]
    rows = {(r["metric"], r["stat"]): r for r in doc["metrics"]}
    # totals over every GPU: never a verdict while the GPU sets differ
    kernels = [r for r in doc["metrics"] if r["kind"] == "kernel"]
    assert kernels and all(r["verdict"] == "not comparable" for r in kernels)
    assert rows[("gpu_busy_frac", "mean")]["verdict"] != "not comparable"
    res = run("diff", two, one, "--devices", "1", "--fail-on-regression")
    assert res.exit_code == 4 and "--devices 1: not in NEW" in res.output
    assert_one_line_error(run("diff", two, one, "--devices", "0,0"), 2, "names a device twice")
    assert_one_line_error(run("diff", two, one, "--devices", "gpu0"), 2, "expected device ids")


def test_diff_of_the_same_gpus_is_unchanged_by_the_check(two_and_one_gpu) -> None:
    two, _ = two_and_one_gpu
    res = run("diff", two, two, "--fail-on-regression")
    assert res.exit_code == 0, res.output
