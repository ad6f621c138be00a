"""nsys discovery, export, cache and failure handling.

Most tests drive a fake ``nsys`` (a shell script) so that every failure mode is reproducible
without Nsight Systems; the tests marked ``nsys`` run the real one on the shared reports.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from conftest import (
    FAKE_NSYS,
    NEW_HEADER,
    NO_SHARED,
    OLD_HEADER,
    PROTOBUF,
    TOO_NEW,
    make_nsys_sqlite,
    shared_files,
)
from polars.testing import assert_frame_equal

import nsysan.load.export as export_mod
from nsysan.errors import ConfigError, ExportError, TraceFormatError
from nsysan.frames import schemas
from nsysan.load import open_trace
from nsysan.load.export import export_path, export_report, find_nsys, report_version


@pytest.fixture
def fake_nsys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    nsys = bindir / "nsys"
    nsys.write_text(FAKE_NSYS)
    nsys.chmod(0o755)
    src = make_nsys_sqlite(tmp_path / "src.sqlite", {}, strings={1: "x"})
    monkeypatch.setenv("FAKE_SRC", str(src))
    monkeypatch.setenv("FAKE_LOG", str(tmp_path / "calls.log"))
    monkeypatch.setenv("FAKE_MODE", "ok")
    monkeypatch.delenv("NSYSAN_NSYS", raising=False)
    return nsys


def _calls(tmp_path: Path) -> int:
    log = tmp_path / "calls.log"
    return len(log.read_text().splitlines()) if log.exists() else 0


def _report(directory: Path, header: bytes = OLD_HEADER, name: str = "run.nsys-rep") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_bytes(header + b"\x00" * 64)
    return path


def _listing(*dirs: Path) -> set[str]:
    return {str(p) for d in dirs if d.exists() for p in d.rglob("*")}


# --- finding nsys ---------------------------------------------------------------------------


def test_find_nsys_order(fake_nsys: Path, tmp_path: Path, monkeypatch) -> None:
    other = tmp_path / "other" / "nsys"
    other.parent.mkdir()
    shutil.copy(fake_nsys, other)
    monkeypatch.setenv("PATH", str(fake_nsys.parent))
    assert find_nsys() == fake_nsys  # PATH
    monkeypatch.setenv("NSYSAN_NSYS", str(other))
    assert find_nsys() == other  # the environment beats PATH
    assert find_nsys(fake_nsys) == fake_nsys  # the argument beats both
    assert find_nsys(fake_nsys.parent) == fake_nsys  # a directory holding nsys is fine


def test_find_nsys_install_locations_newest_first(fake_nsys, tmp_path, monkeypatch) -> None:
    for version in ("2022.4.2", "2024.6.1", "2023.4.4"):
        target = tmp_path / "opt" / version / "bin" / "nsys"
        target.parent.mkdir(parents=True)
        shutil.copy(fake_nsys, target)
    monkeypatch.setenv("PATH", "")
    monkeypatch.setattr(export_mod, "FALLBACK_NSYS", (str(tmp_path / "opt/*/bin/nsys"),))
    assert find_nsys() == tmp_path / "opt" / "2024.6.1" / "bin" / "nsys"
    monkeypatch.setattr(export_mod, "FALLBACK_NSYS", ())
    assert find_nsys() is None


@pytest.mark.parametrize("var", ["argument", "NSYSAN_NSYS"])
def test_named_nsys_that_does_not_exist_is_an_error(tmp_path, monkeypatch, var) -> None:
    bogus = tmp_path / "no" / "nsys"
    if var == "NSYSAN_NSYS":
        monkeypatch.setenv("NSYSAN_NSYS", str(bogus))
        with pytest.raises(ExportError, match=r"NSYSAN_NSYS points to .* not an executable nsys"):
            find_nsys()
    else:
        with pytest.raises(ExportError, match="--nsys points to"):
            find_nsys(bogus)


def test_nsys_not_found_for_a_report(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("NSYSAN_NSYS", raising=False)
    monkeypatch.setenv("PATH", "")
    monkeypatch.setattr(export_mod, "FALLBACK_NSYS", ())
    report = _report(tmp_path / "r")
    before = _listing(tmp_path)
    with pytest.raises(ExportError, match=r"nsys not found .* set NSYSAN_NSYS"):
        export_report(report)
    assert _listing(tmp_path) == before


def test_sqlite_input_needs_no_nsys(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("NSYSAN_NSYS", str(tmp_path / "missing"))
    monkeypatch.setenv("PATH", "")
    path = make_nsys_sqlite(tmp_path / "t.sqlite", {}, strings={1: "x"})
    assert open_trace(path).meta.source_path == path


# --- versions and cache paths -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("header", "version"),
    [
        (NEW_HEADER, "2025.1.1"),
        (OLD_HEADER, None),
        (b"NVIDIA Tegra Profiler Report 2024@6@1@90-x", "2024.6.1"),
    ],
)
def test_report_version_from_header(tmp_path, header, version) -> None:
    assert report_version(_report(tmp_path, header)) == version


def test_export_path_rules(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("NSYSAN_CACHE_DIR", str(tmp_path / "cache"))
    report = _report(tmp_path / "writable")
    st = report.stat()
    key = f"run.nsys-rep.nsys2022.4.2.{st.st_size:x}-{st.st_mtime_ns:x}.sqlite"
    assert export_path(report, "2022.4.2.1") == report.parent / key
    assert export_path(report, "2022.4.2.1", cache_dir=tmp_path / "x") == tmp_path / "x" / key
    assert export_path(report, "2023.4.4.54").name != key  # another exporter, another export
    stamp = f"{st.st_size:x}-{st.st_mtime_ns:x}"
    assert (
        export_path(report, None, "parquetdir").name
        == f"run.nsys-rep.nsysunknown.{stamp}.parquetdir"
    )
    report.parent.chmod(0o555)  # read-only for everyone: even root must not write there
    try:
        assert export_path(report, "2022.4.2.1") == tmp_path / "cache" / key
    finally:
        report.parent.chmod(0o755)
    os.utime(report, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    assert export_path(report, "2022.4.2.1").name != key  # a changed report is re-exported


# --- exporting with a fake nsys -----------------------------------------------------------------


def test_export_writes_next_to_report_and_reuses_the_cache(fake_nsys, tmp_path) -> None:
    report = _report(tmp_path / "r")
    out = export_report(report, nsys=fake_nsys)
    assert out.parent == report.parent and out.suffix == ".sqlite"
    assert open_trace(out).meta.tables["StringIds"] == 1
    assert export_report(report, nsys=fake_nsys) == out
    assert _calls(tmp_path) == 1  # second call: cache hit, nsys not run
    os.utime(report, ns=(1, 1))
    assert export_report(report, nsys=fake_nsys) != out
    assert _calls(tmp_path) == 2
    assert not list(report.parent.glob("*nsysan-tmp*"))


def test_open_trace_on_a_report_exports_it(fake_nsys, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("NSYSAN_NSYS", str(fake_nsys))
    report = _report(tmp_path / "r", name="4gpu_baseline.nsys-rep")
    tr = open_trace(report, cache_dir=tmp_path / "cache")
    assert tr.trace_id == "4gpu_baseline"
    assert tr.meta.path == report
    assert tr.meta.source_path.parent == tmp_path / "cache"


FAILURES = {
    "partial file then exit 1": (
        "partial",
        OLD_HEADER,
        r"nsys export failed \(exit 1\): Exportation error: boom",
    ),
    "exit 0 without output": ("silent", OLD_HEADER, r"nsys export failed \(exit 0\): no output"),
    "version invalid (2022.4 on 2025.5)": (
        "invalid",
        OLD_HEADER,
        "report recorded with Nsight Systems 2025.5.1; installed nsys is 2022.4.2 — install "
        "2025.5 or newer",
    ),
    "protobuf error (2022.4 on 2023.x)": ("protobuf", OLD_HEADER, PROTOBUF),
    "header says too new": ("ok", NEW_HEADER, TOO_NEW),
}


@pytest.mark.parametrize("case", list(FAILURES))
@pytest.mark.parametrize("where", ["next to report", "cache dir"])
def test_failed_exports_raise_and_leave_nothing(fake_nsys, tmp_path, monkeypatch, case, where):
    mode, header, message = FAILURES[case]
    monkeypatch.setenv("FAKE_MODE", mode)
    report = _report(tmp_path / "r", header)
    cache = tmp_path / "cache"
    cache.mkdir()
    before = _listing(report.parent, cache)
    with pytest.raises(ExportError, match=message) as info:
        export_report(report, nsys=fake_nsys, cache_dir=cache if where == "cache dir" else None)
    assert "\n" not in str(info.value)
    assert _listing(report.parent, cache) == before
    if case == "header says too new":
        assert _calls(tmp_path) == 0  # refused before running nsys


def test_parquetdir_needs_a_newer_nsys(fake_nsys, tmp_path) -> None:
    with pytest.raises(
        ExportError, match=r"nsys 2022.4.2 cannot export parquetdir .* --format sqlite"
    ):
        export_report(_report(tmp_path / "r"), nsys=fake_nsys, fmt="parquetdir")
    assert _calls(tmp_path) == 0


def test_bad_arguments(fake_nsys, tmp_path) -> None:
    with pytest.raises(ConfigError, match="unknown export format 'hdf'"):
        export_report(_report(tmp_path / "r"), nsys=fake_nsys, fmt="hdf")  # type: ignore[arg-type]
    junk = tmp_path / "junk.nsys-rep"
    junk.write_bytes(os.urandom(256))
    with pytest.raises(TraceFormatError, match="not an Nsight Systems report"):
        export_report(junk, nsys=fake_nsys)
    empty = tmp_path / "empty.nsys-rep"
    empty.write_bytes(b"")
    with pytest.raises(TraceFormatError, match="file is empty"):
        export_report(empty, nsys=fake_nsys)


def test_unwritable_cache_is_an_export_error(fake_nsys, tmp_path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(ExportError, match="cannot create the export cache"):
        export_report(_report(tmp_path / "r"), nsys=fake_nsys, cache_dir=blocker / "sub")


# --- the real nsys on the shared reports --------------------------------------------------------

#: reports too new for nsys 2022.4, and how it says so
TOO_NEW_REPORTS = {
    "fuser-nvfuser/report1_ee4fcf30.nsys-rep": TOO_NEW,
    "jax-cuda-examples-pdl/pdl_2p2c.nsys-rep": (
        "report recorded with Nsight Systems 2025.5.1; installed nsys is 2022.4.2 — install "
        "2025.5 or newer"
    ),
    "sc23-vit-train-nvtx/4workers.nsys-rep": PROTOBUF,
    "memfusion-trt-resnet/report1.nsys-rep": PROTOBUF,
}

#: reports nsys 2022.4 exports, each with the 2022.4.2 export committed next to it
EXPORTABLE = [
    f
    for f in shared_files("*/*.nsys-rep", "*/*.qdrep")
    if f != NO_SHARED and f not in TOO_NEW_REPORTS
]


def _installed_2022_4(nsys_bin: Path) -> None:
    version = export_mod.nsys_version(nsys_bin) or "unknown"
    if not version.startswith("2022.4"):
        pytest.skip(f"expectations are for nsys 2022.4; installed is {version}")


@pytest.mark.shared
@pytest.mark.nsys
@pytest.mark.slow
@pytest.mark.parametrize("rel", EXPORTABLE or [NO_SHARED])
def test_real_export_equals_the_committed_export(shared_traces, nsys_bin, tmp_path, rel) -> None:
    if rel == NO_SHARED:
        pytest.fail("no exportable reports found")
    _installed_2022_4(nsys_bin)
    report = tmp_path / Path(rel).name
    shutil.copy(shared_traces / rel, report)  # export into the copy's directory, not ../shared
    out = export_report(report, nsys=nsys_bin)
    assert out.parent == tmp_path
    committed = shared_traces / f"{rel}.nsys2022.4.2.sqlite"
    ours, theirs = open_trace(out, trace_id="t"), open_trace(committed, trace_id="t")
    assert ours.meta.tables == theirs.meta.tables
    for name in schemas.CANONICAL:
        if name != "meta":
            assert_frame_equal(ours.frame(name), theirs.frame(name))
    assert not list(tmp_path.glob("*nsysan-tmp*"))


@pytest.mark.shared
@pytest.mark.nsys
@pytest.mark.parametrize("rel", list(TOO_NEW_REPORTS))
def test_real_too_new_reports(shared_traces, nsys_bin, tmp_path, rel) -> None:
    _installed_2022_4(nsys_bin)
    report = tmp_path / "copy" / Path(rel).name
    report.parent.mkdir()
    shutil.copy(shared_traces / rel, report)
    cache = tmp_path / "cache"
    with pytest.raises(ExportError, match=TOO_NEW_REPORTS[rel]):
        open_trace(report, nsys=nsys_bin, cache_dir=cache)
    assert sorted(p.name for p in report.parent.iterdir()) == [report.name]
    assert not cache.exists() or not any(cache.iterdir())


def test_export_cache_is_isolated_in_tests() -> None:
    # the session fixture in conftest points the default cache at a temporary directory
    assert "nsysan-cache" in os.environ["NSYSAN_CACHE_DIR"]
    assert export_mod.default_cache_dir() == Path(os.environ["NSYSAN_CACHE_DIR"])
