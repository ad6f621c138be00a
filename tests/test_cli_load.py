"""``nsysan export`` and ``nsysan schema`` through click: output, exit codes, error lines."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from conftest import FAKE_NSYS, NEW_HEADER, OLD_HEADER, REPO_ROOT, TOO_NEW, make_nsys_sqlite
from polars.testing import assert_frame_equal

import nsysan.load.sqlite_file as sqlite_file
from nsysan import __version__
from nsysan.cli import cli
from nsysan.errors import SchemaError
from nsysan.frames import schemas
from nsysan.load import open_trace


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, [str(a) for a in args])


def assert_one_line_error(result: Result, message: str) -> None:
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("Error: "), lines[0]
    assert message in lines[0], lines[0]


def listing(root: Path) -> set[str]:
    return {str(p) for p in root.rglob("*")}


@pytest.fixture
def fake_nsys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    nsys = tmp_path / "bin" / "nsys"
    nsys.parent.mkdir()
    nsys.write_text(FAKE_NSYS)
    nsys.chmod(0o755)
    monkeypatch.setenv("FAKE_SRC", str(make_nsys_sqlite(tmp_path / "src.sqlite", {})))
    monkeypatch.setenv("FAKE_MODE", "ok")
    monkeypatch.setenv("NSYSAN_NSYS", str(nsys))
    return nsys


def _report(path: Path, header: bytes = OLD_HEADER) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(header + b"\x00" * 64)
    return path


def _truncated(d: Path) -> Path:
    full = make_nsys_sqlite(d / "full.sqlite", {}, strings={i: "x" * 300 for i in range(300)})
    data = full.read_bytes()
    full.unlink()
    out = d / "t.sqlite"
    out.write_bytes(data[: len(data) // 3])
    return out


def _foreign(d: Path) -> Path:
    path = d / "app.sqlite"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE users (id INTEGER)")
    con.commit()
    con.close()
    return path


BAD_INPUTS = {
    "empty file": (lambda d: _write(d / "e.sqlite", b""), "file is empty"),
    "random bytes": (lambda d: _write(d / "r.sqlite", os.urandom(2048)), "not a SQLite database"),
    "random bytes, any suffix": (lambda d: _write(d / "r.bin", os.urandom(2048)), "not an Nsight"),
    "truncated SQLite": (_truncated, "truncated SQLite file"),
    "SQLite but not nsys": (_foreign, "not an Nsight Systems export: no StringIds / no nsys"),
    "directory": (lambda d: _mkdir(d / "dir"), "is a directory, not a profile: pass a .nsys-rep"),
    "missing path": (lambda d: d / "missing.sqlite", "no such file or directory"),
    "report, not a report": (lambda d: _write(d / "r.nsys-rep", os.urandom(512)), "not an Nsight"),
    "qdstrm": (lambda d: _write(d / "r.qdstrm", b"QDSTRM" + bytes(64)), "QdstrmImporter"),
}


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _mkdir(path: Path) -> Path:
    path.mkdir()
    (path / "notes.txt").write_text("no parquet here")
    return path


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_schema_bad_inputs(tmp_path: Path, case: str) -> None:
    make, message = BAD_INPUTS[case]
    work = tmp_path / "in"
    work.mkdir()
    path = make(work)
    before = listing(tmp_path)
    assert_one_line_error(run("schema", path), message)
    assert listing(tmp_path) == before


def test_schema_unreadable_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = make_nsys_sqlite(tmp_path / "t.sqlite", {})

    def denied(file, *args, **kwargs):
        if Path(file) == path:
            raise PermissionError(13, "Permission denied", str(file))
        return open(file, *args, **kwargs)

    monkeypatch.setattr(sqlite_file, "open", denied, raising=False)
    assert_one_line_error(run("schema", path), "permission denied")


def test_report_too_new_for_installed_nsys(fake_nsys: Path, tmp_path: Path) -> None:
    report = _report(tmp_path / "r" / "new.nsys-rep", NEW_HEADER)
    before = listing(tmp_path)
    assert_one_line_error(run("schema", report), TOO_NEW)
    assert_one_line_error(run("export", report), TOO_NEW)
    assert listing(tmp_path) == before


def test_nsys_missing_for_a_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NSYSAN_NSYS", str(tmp_path / "nowhere" / "nsys"))
    monkeypatch.setenv("PATH", "")
    report = _report(tmp_path / "r" / "run.nsys-rep")
    before = listing(tmp_path)
    assert_one_line_error(run("export", report), "NSYSAN_NSYS points to")
    assert_one_line_error(run("schema", report), "NSYSAN_NSYS points to")
    assert listing(tmp_path) == before


def test_export_failing_half_way(fake_nsys: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("FAKE_MODE", "partial")
    report = _report(tmp_path / "r" / "run.nsys-rep")
    before = listing(tmp_path)
    assert_one_line_error(run("export", report), "nsys export failed (exit 1)")
    assert listing(tmp_path) == before


def test_export_prints_one_path_per_report_and_reports_failures(fake_nsys, tmp_path) -> None:
    good = [_report(tmp_path / "r" / f"run{i}.nsys-rep") for i in range(2)]
    bad = tmp_path / "r" / "missing.nsys-rep"
    result = run("export", good[0], bad, good[1], "--cache-dir", tmp_path / "cache")
    assert result.exit_code == 1
    paths = [Path(p) for p in result.stdout.splitlines()]
    assert [p.name.split(".nsys2022")[0] for p in paths] == ["run0.nsys-rep", "run1.nsys-rep"]
    assert all(p.parent == tmp_path / "cache" and p.is_file() for p in paths)
    assert result.stderr.strip().splitlines() == [f"Error: {bad}: no such file"]


def test_export_default_cache_next_to_the_report(fake_nsys, tmp_path) -> None:
    report = _report(tmp_path / "r" / "run.nsys-rep")
    result = run("export", report, "--nsys", fake_nsys)
    assert result.exit_code == 0, result.output
    assert Path(result.stdout.strip()).parent == report.parent


def test_no_cuda_tables_loads_but_require_cuda_refuses(tmp_path: Path) -> None:
    path = make_nsys_sqlite(
        tmp_path / "cpu.sqlite",
        {"NVTX_EVENTS": [{"start": 1, "end": 2, "eventType": 59, "globalTid": 1, "text": "a"}]},
    )
    result = run("schema", path)
    assert result.exit_code == 0, result.output
    assert "gpu_ops    no   tables CUPTI_ACTIVITY_KIND_KERNEL" in result.stdout
    assert "`--trace=cuda`" in result.stdout
    assert open_trace(path).gpu_ops.is_empty()
    with pytest.raises(
        SchemaError,
        match=r"has no CUDA activity tables \(.* absent or empty\): record with --trace=cuda",
    ):
        open_trace(path, require_cuda=True)


def test_recorded_cpu_only_fixture_has_no_cuda(tmp_path: Path) -> None:
    fixture = REPO_ROOT / "fixtures" / "cpu_nvtx_osrt.sqlite"
    if not fixture.exists():
        pytest.skip("fixtures/cpu_nvtx_osrt.sqlite not present")
    result = run("schema", fixture, "--json")
    assert result.exit_code == 0, result.output
    info = json.loads(result.stdout)
    assert not info["frames"]["gpu_ops"]["captured"]
    assert info["frames"]["nvtx"]["captured"] and info["frames"]["osrt"]["captured"]
    with pytest.raises(SchemaError):
        open_trace(fixture, require_cuda=True)


@pytest.mark.shared
def test_schema_on_a_real_trace(shared_traces: Path) -> None:
    path = shared_traces / "sc22-ddp-4gpu-nccl" / "4gpu_baseline.nsys-rep.nsys2022.4.2.sqlite"
    text = run("schema", path)
    assert text.exit_code == 0, text.output
    assert "exporter:  nsys 2022.4.2.1, schema 3.0.0" in text.stdout
    assert "CUPTI_ACTIVITY_KIND_KERNEL 22564" in text.stdout
    assert "osrt       no   table OSRT_API not found" in text.stdout
    info = json.loads(run("schema", path, "--json").stdout)
    assert info["trace_id"] == "4gpu_baseline"
    assert info["duration_ns"] == 1837074135
    assert info["session_start_utc"] == "2022-11-11T00:14:37+00:00"
    assert info["frames"]["gpu_ops"]["tables"] == {
        "CUPTI_ACTIVITY_KIND_KERNEL": 22564,
        "CUPTI_ACTIVITY_KIND_MEMCPY": 2003,
        "CUPTI_ACTIVITY_KIND_MEMSET": 1593,
    }
    assert info["tables"]["NVTX_EVENTS"] == 10123


@pytest.mark.shared
@pytest.mark.nsys
def test_real_report_too_new(shared_traces: Path, nsys_bin: Path, tmp_path: Path) -> None:
    report = tmp_path / "report1_ee4fcf30.nsys-rep"
    report.write_bytes((shared_traces / "fuser-nvfuser" / report.name).read_bytes())
    before = listing(tmp_path)
    assert_one_line_error(
        run("schema", report, "--nsys", nsys_bin),
        "report recorded with Nsight Systems 2025.1.1; installed nsys is 2022.4",
    )
    assert listing(tmp_path) == before


def test_version_and_usage_errors() -> None:
    result = run("--version")
    assert result.exit_code == 0 and __version__ in result.stdout
    assert run("export").exit_code == 2  # no report
    assert run("export", "x.nsys-rep", "--format", "hdf").exit_code == 2
    assert run("schema").exit_code == 2


@pytest.mark.shared
@pytest.mark.nsys
@pytest.mark.slow
def test_nsysan_export_of_sc22_gives_the_committed_frames(
    shared_traces: Path, nsys_bin: Path, tmp_path: Path
) -> None:
    report = shared_traces / "sc22-ddp-4gpu-nccl" / "4gpu_baseline.nsys-rep"
    committed = report.with_name(report.name + ".nsys2022.4.2.sqlite")
    result = run("export", report, "--nsys", nsys_bin, "--cache-dir", tmp_path / "cache")
    assert result.exit_code == 0, result.output
    out = Path(result.stdout.strip())
    assert out.parent == tmp_path / "cache"  # never next to the read-only shared report
    ours, theirs = open_trace(out, trace_id="sc22"), open_trace(committed, trace_id="sc22")
    for name in schemas.CANONICAL:
        if name != "meta":
            assert_frame_equal(ours.frame(name), theirs.frame(name))
