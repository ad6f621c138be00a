"""Reports: findings.md opens with verdict and baseline, findings.json validates against the
documented schema, the pictures are real images, manifest.json records provenance, and every
file is written atomically."""

from __future__ import annotations

import copy
import hashlib
import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from types import SimpleNamespace

import jsonschema
import numpy as np
import pytest
from findings_cases import _steps, healthy, scenario
from PIL import Image

from nsysan.findings import diagnose
from nsysan.report.jsonout import findings_document
from nsysan.report.manifest import ManifestInfo, describe_path
from nsysan.report.markdown import render_markdown
from nsysan.report.plots import _coverage
from nsysan.report.write import write_report

SCHEMA = json.loads((Path(__file__).resolve().parent.parent / "docs" / "findings-schema.json")
                    .read_text(encoding="utf-8"))


def _validate(doc: dict) -> None:
    jsonschema.Draft202012Validator(SCHEMA).validate(doc)


@pytest.fixture(scope="module")
def starved_report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Path]]:
    tmp_path = tmp_path_factory.mktemp("report")
    src = tmp_path / "input.sqlite"
    src.write_bytes(b"not really sqlite, but hashed")
    tr, res = scenario("starved_input")
    tr.meta.path = tr.meta.source_path = src
    out = tmp_path / "out"
    info = ManifestInfo(params={"gaps": {"min_gap_ns": 1_000_000}}, timings_s={"gaps": 0.5},
                        argv=["nsysan", "analyze", str(src)])
    return out, write_report(out, tr, res, diagnose(tr, res), info)


def test_files_written_atomically(starved_report) -> None:
    out, written = starved_report
    names = sorted(p.name for p in written)
    assert names == sorted(["findings.md", "findings.json", "manifest.json", "report.html",
                            "timeline_device0.png"])
    assert sorted(p.name for p in out.iterdir()) == names  # no temp files left behind


def test_markdown_opens_with_verdict_and_baseline(starved_report) -> None:
    out, _ = starved_report
    md = (out / "findings.md").read_text(encoding="utf-8")
    lines = md.splitlines()
    assert lines[0] == "# nsysan findings — t"
    assert lines[2].startswith("**Verdict: input-bound.**")
    assert md.index("## Baseline") < md.index("## Findings")
    assert "| step time (mean) | 10 ms |" in md
    assert "[CRITICAL] GPU starves periodically" in md
    assert "Layer: **framework**" in md and "**Advice:**" in md and "**Quick check:**" in md
    assert "![GPU utilisation, gaps and overlap states, device 0](timeline_device0.png)" in md
    assert "Per-layer attribution is unavailable" in md  # no NVTX ranges were given


def test_findings_json_validates(starved_report) -> None:
    out, _ = starved_report
    doc = json.loads((out / "findings.json").read_text(encoding="utf-8"))
    _validate(doc)
    assert doc["schema_version"] == "1"
    assert doc["verdict"]["label"] == "input-bound"
    assert doc["summary"]["worst"] == "critical"
    assert doc["findings"][0]["code"] == "GPU_STARVATION_PERIODIC"
    assert "timeline_device0.png" in doc["images"]


@pytest.mark.parametrize(
    "breakage",
    [
        lambda d: d["findings"][0]["evidence"].update(metrics=[]),  # no evidence
        lambda d: d["findings"][0].update(layer="python"),
        lambda d: d["findings"][0]["evidence"]["metrics"][0].update(unit="ms"),
        lambda d: d.update(schema_version="2"),
        lambda d: d["verdict"].update(label="fast"),
        lambda d: d.pop("baseline"),
    ],
)
def test_schema_rejects_broken_documents(breakage) -> None:
    tr, res = scenario("starved_input")
    doc = findings_document(diagnose(tr, res), tr)
    _validate(doc)
    broken = copy.deepcopy(doc)
    breakage(broken)
    with pytest.raises(jsonschema.ValidationError):
        _validate(broken)


@pytest.mark.parametrize("name", ["healthy", "exposed_allreduce", "launch_bound",
                                  "pageable_copies", "sync_in_loop", "memory_churn"])
def test_every_scenario_document_validates(name: str) -> None:
    tr, res = scenario(name)
    _validate(findings_document(diagnose(tr, res, samples_per_step=8), tr))


def test_png_timeline_is_an_image(starved_report) -> None:
    out, _ = starved_report
    with Image.open(out / "timeline_device0.png") as im:
        im.verify()
    with Image.open(out / "timeline_device0.png") as im:
        assert im.format == "PNG" and im.size[0] >= 800 and im.size[1] >= 300
        pixels = np.asarray(im.convert("L"))
    assert len(np.unique(pixels)) > 10  # not a blank canvas


def test_html_is_self_contained(starved_report) -> None:
    out, _ = starved_report
    page = (out / "report.html").read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and "<svg" in page and "<title>gap " in page
    assert "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "https://" not in page and "<script src" not in page
    svgs = re.findall(r"<svg.*?</svg>", page, re.S)
    assert svgs
    for svg in svgs:  # well-formed, so browsers render every hover title
        ET.fromstring(svg)


def test_manifest_records_provenance(starved_report) -> None:
    out, written = starved_report
    m = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    src = out.parent / "input.sqlite"
    assert m["inputs"] == [{"path": str(src), "kind": "file", "bytes": src.stat().st_size,
                            "sha256": hashlib.sha256(src.read_bytes()).hexdigest()}]
    assert m["passes"] == {"gaps": {"min_gap_ns": 1_000_000}}
    assert m["findings_params"]["comm_warn_frac"] == 0.1
    assert m["timings_s"]["gaps"] == 0.5 and "write_report" in m["timings_s"]
    assert m["command"] == ["nsysan", "analyze", str(src)]
    outputs = {o["path"]: o for o in m["outputs"]}
    assert set(outputs) == {p.name for p in written} - {"manifest.json"}
    md = out / "findings.md"
    assert outputs["findings.md"]["sha256"] == hashlib.sha256(md.read_bytes()).hexdigest()


def test_directory_inputs_are_hashed_by_content(tmp_path: Path) -> None:
    d = tmp_path / "x.parquetdir"
    (d / "sub").mkdir(parents=True)
    (d / "a.parquet").write_bytes(b"a")
    (d / "sub" / "b.parquet").write_bytes(b"b")
    first = describe_path(d)
    assert first["kind"] == "dir" and first["n_files"] == 2 and first["bytes"] == 2
    (d / "a.parquet").write_bytes(b"A")
    assert describe_path(d)["sha256"] != first["sha256"]


def test_report_with_layers_and_without_nvtx(tmp_path: Path) -> None:
    import polars as pl

    c = healthy()
    c.layers = pl.DataFrame({"domain": ["", ""], "name": ["forward", "backward"],
                             "instances": [16, 16], "n_gpu_ops": [100, 200],
                             "gpu_busy_ns": [6_000_000, 9_000_000],
                             "exclusive_gpu_ns": [6_000_000, 9_000_000],
                             "exclusive_frac": [0.4, 0.6]})
    tr, res = c.build(_steps())
    written = {p.name for p in write_report(tmp_path, tr, res, diagnose(tr, res))}
    assert "layers.png" in written
    with Image.open(tmp_path / "layers.png") as im:
        im.verify()
    md = (tmp_path / "findings.md").read_text(encoding="utf-8")
    assert "| backward | 16 | 200 | 9 ms | 60.0% |" in md
    assert "![GPU time per layer](layers.png)" in md
    # the same run with no NVTX at all: attribution unavailable, and why
    tr2, res2 = scenario("exposed_allreduce")
    d2 = diagnose(tr2, res2)
    md2 = render_markdown(d2, tr2)
    assert "Per-layer attribution is unavailable: NVTX was not traced" in md2
    doc = findings_document(d2, tr2)
    assert doc["attribution"]["available"] is False and "NVTX" in doc["attribution"]["note"]


def test_write_report_accepts_an_analysis_result(tmp_path: Path) -> None:
    tr, res = scenario("launch_bound")
    result = SimpleNamespace(trace=tr, results=res, params={},
                             diagnosis=diagnose(tr, res, samples_per_step=4),
                             timings_s={"open": 0.1}, options={"samples_per_step": 4})
    written = write_report(tmp_path, result)
    doc = json.loads((tmp_path / "findings.json").read_text(encoding="utf-8"))
    _validate(doc)
    assert doc["verdict"]["label"] == "launch-bound"
    keys = {i["key"]: i["value"] for i in doc["baseline"]["items"]}
    assert keys["samples_per_s"] == pytest.approx(400.0)
    assert (tmp_path / "manifest.json") in written


@pytest.mark.parametrize(
    ("starts", "ends", "edges", "expected"),
    [
        ([], [], [0, 10], [0.0]),
        ([0], [10], [0, 5, 10], [1.0, 1.0]),
        ([2], [4], [0, 5, 10], [0.4, 0.0]),
        ([4, 8], [6, 12], [0, 5, 10], [0.2, 0.6]),  # straddles a bin edge, runs past the end
        ([-5], [3], [0, 5], [0.6]),  # starts before the first edge
    ],
    ids=["empty", "full", "inside", "straddle", "before"],
)
def test_bin_coverage(starts, ends, edges, expected) -> None:
    got = _coverage(np.array(starts, dtype=np.int64), np.array(ends, dtype=np.int64),
                    np.array(edges, dtype=np.int64))
    assert got == pytest.approx(expected)


def test_the_reports_render_findings_and_do_not_draw_them(tmp_path):
    """Drawing findings is the analysis' part (`nsysan.api`): a report without them is a
    caller's mistake, said at once."""
    tr, res = healthy().build(_steps())
    with pytest.raises(TypeError, match="needs the diagnosis"):
        write_report(tmp_path, tr, res)
