"""One capture, one row: a report and its exports beside it are analysed once, from the best
form (an existing export rather than a failing re-export), the others kept as aliases."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import FAKE_NSYS, OLD_HEADER, REPO_ROOT

from nsysan.batch.catalog import Catalog, catalog_url
from nsysan.batch.discover import discover
from nsysan.batch.run import run_batch

EXAMPLE = REPO_ROOT / "fixtures" / "example_ddp.sqlite"


@pytest.fixture
def failing_nsys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An nsys that cannot read any report (as nsys 2022.4 on a 2023.x report)."""
    nsys = tmp_path / "bin" / "nsys"
    nsys.parent.mkdir()
    nsys.write_text(FAKE_NSYS)
    nsys.chmod(0o755)
    monkeypatch.setenv("FAKE_MODE", "protobuf")
    monkeypatch.setenv("FAKE_LOG", str(tmp_path / "calls.log"))
    monkeypatch.delenv("NSYSAN_NSYS", raising=False)
    return nsys


def _calls(tmp_path: Path) -> int:
    log = tmp_path / "calls.log"
    return len(log.read_text().splitlines()) if log.exists() else 0


def _aliases(out: Path) -> dict[str, list[str] | None]:
    with Catalog(catalog_url(None, out)) as cat:
        rows = cat.read(lambda c: c.exec_driver_sql(
            "SELECT trace_id, aliases_json FROM traces").all())
    return {t: (json.loads(a) if a else None) for t, a in rows}


def test_report_and_its_export_are_one_capture(failing_nsys: Path, tmp_path: Path) -> None:
    archive = tmp_path / "archive"
    archive.mkdir()
    report = archive / "x.nsys-rep"
    report.write_bytes(OLD_HEADER + b"\0" * 64)
    export = archive / "x.nsys-rep.nsys2023.4.4.sqlite"
    shutil.copyfile(EXAMPLE, export)
    (traces,) = [discover([archive])]
    assert [(t.trace_id, t.path.name, [a.name for a in t.aliases]) for t in traces] == [
        ("x.nsys-rep", export.name, ["x.nsys-rep"])]
    out = tmp_path / "out"
    summary = run_batch([archive], out, jobs=1, nsys=str(failing_nsys), progress=False)
    assert [(r.trace_id, r.status, Path(r.input_path).name) for r in summary.records] == [
        ("x.nsys-rep", "ok", export.name)]
    assert _calls(tmp_path) == 0  # the report was never exported: its export was analysed
    assert summary.exit_code == 0
    assert _aliases(out) == {"x.nsys-rep": [str(report.resolve())]}
    # resumable as before: the second run skips the capture
    again = run_batch([archive], out, jobs=1, nsys=str(failing_nsys), progress=False)
    assert [r.status for r in again.records] == ["skipped"]


def test_every_form_of_a_capture_joins_it(tmp_path: Path) -> None:
    from nsysan.batch.captures import group_captures

    d = tmp_path / "d"
    d.mkdir()
    names = ["run.nsys-rep", "run.nsys-rep.nsys2022.4.2.sqlite",
             "run.nsys-rep.nsys2023.4.4.sqlite", "run.sqlite", "other.sqlite"]
    for n in names:
        if n.endswith(".sqlite"):
            shutil.copyfile(EXAMPLE, d / n)
        else:
            (d / n).write_bytes(OLD_HEADER)
    pq = d / "run.nsys2023.4.4.parquetdir"
    pq.mkdir()
    caps = group_captures(sorted([*(d / n for n in names), pq]))
    got = {c.key.name: (c.path.name, sorted(a.name for a in c.aliases)) for c in caps}
    assert got == {
        # the newest exporter's SQLite export is analysed (the parquetdir here is empty)
        "run.nsys-rep": ("run.nsys-rep.nsys2023.4.4.sqlite",
                         sorted(["run.nsys-rep", "run.nsys-rep.nsys2022.4.2.sqlite",
                                 "run.sqlite", "run.nsys2023.4.4.parquetdir"])),
        "other.sqlite": ("other.sqlite", []),
    }


def test_a_stem_shared_by_two_reports_is_not_guessed(tmp_path: Path) -> None:
    from nsysan.batch.captures import group_captures

    d = tmp_path / "d"
    d.mkdir()
    for n in ("x.nsys-rep", "x.qdrep"):
        (d / n).write_bytes(OLD_HEADER)
    shutil.copyfile(EXAMPLE, d / "x.sqlite")
    shutil.copyfile(EXAMPLE, d / "x.qdrep.nsys2022.4.2.sqlite")
    got = {c.key.name: (c.path.name, [a.name for a in c.aliases])
           for c in group_captures(sorted(d.iterdir()))}
    assert got == {
        "x.nsys-rep": ("x.nsys-rep", []),
        "x.qdrep": ("x.qdrep.nsys2022.4.2.sqlite", ["x.qdrep"]),
        "x.sqlite": ("x.sqlite", []),  # whose export it is cannot be told
    }


def test_a_cut_short_export_does_not_win_over_the_report(tmp_path: Path) -> None:
    from nsysan.batch.captures import group_captures

    d = tmp_path / "d"
    d.mkdir()
    (d / "x.nsys-rep").write_bytes(OLD_HEADER)
    data = EXAMPLE.read_bytes()
    (d / "x.nsys-rep.nsys2023.4.4.sqlite").write_bytes(data[: len(data) // 2])
    (cap,) = group_captures(sorted(d.iterdir()))
    assert cap.path.name == "x.nsys-rep"
    assert [a.name for a in cap.aliases] == ["x.nsys-rep.nsys2023.4.4.sqlite"]


@pytest.mark.shared
def test_shared_archive_layouts(shared_traces: Path, failing_nsys: Path, tmp_path: Path) -> None:
    """The shared traces hold exactly these layouts: a report recorded by 2023.1 (which nsys
    2022.4 cannot read) with its author's export and a newer export, and a report with a
    parquetdir export named after its stem."""
    archive = tmp_path / "archive"
    for rel in ("memfusion-trt-resnet/report1.nsys-rep",
                "memfusion-trt-resnet/report1.sqlite",
                "memfusion-trt-resnet/report1.nsys-rep.nsys2023.4.4.sqlite",
                "dlprof-pyprof-nvtx/nsys_profile.nsys-rep",
                "dlprof-pyprof-nvtx/nsys_profile.sqlite",
                "dlprof-pyprof-nvtx/nsys_profile.nsys-rep.nsys2022.4.2.sqlite",
                "nsysai-h100-2gpu/mfu_2gpu_before.sqlite"):
        (archive / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shared_traces / rel, archive / rel)
    out = tmp_path / "out"
    summary = run_batch([archive], out, jobs=1, nsys=str(failing_nsys), progress=False)
    got = {r.trace_id: (r.status, Path(r.input_path).name) for r in summary.records}
    assert got == {
        "memfusion-trt-resnet__report1.nsys-rep": ("ok", "report1.nsys-rep.nsys2023.4.4.sqlite"),
        "dlprof-pyprof-nvtx__nsys_profile.nsys-rep": (
            "ok", "nsys_profile.nsys-rep.nsys2022.4.2.sqlite"),
        "nsysai-h100-2gpu__mfu_2gpu_before.sqlite": ("ok", "mfu_2gpu_before.sqlite"),
    }
    assert _calls(tmp_path) == 0
    aliases = _aliases(out)
    assert sorted(Path(a).name for a in aliases["memfusion-trt-resnet__report1.nsys-rep"]) == [
        "report1.nsys-rep", "report1.sqlite"]
    assert aliases["nsysai-h100-2gpu__mfu_2gpu_before.sqlite"] is None


@pytest.mark.shared
def test_shared_traces_discover_one_row_per_capture(shared_traces: Path) -> None:
    traces = discover([shared_traces])
    by_id = {t.trace_id: t for t in traces}
    vit = by_id["sc23-vit-train-nvtx__4workers.nsys-rep"]
    assert vit.path.name == "4workers.nsys-rep.nsys2023.4.4.sqlite"
    assert sorted(a.name for a in vit.aliases) == ["4workers.nsys-rep",
                                                   "4workers.nsys2023.4.4.parquetdir"]
    # no form of a grouped capture is a trace of its own
    alias_paths = {a for t in traces for a in t.aliases}
    assert not alias_paths & {t.path for t in traces}
    # sc22: the .nsys-rep and the .qdrep captures stay apart; the stem-named parquetdir beside
    # both cannot be told apart, so it stays a trace of its own
    sc22 = sorted(t for t in by_id if t.startswith("sc22"))
    assert sc22 == ["sc22-ddp-4gpu-nccl__4gpu_baseline.nsys-rep",
                    "sc22-ddp-4gpu-nccl__4gpu_baseline.nsys2023.4.4.parquetdir",
                    "sc22-ddp-4gpu-nccl__4gpu_baseline.qdrep"]
