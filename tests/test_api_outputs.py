"""`analyze_to_dir` draws the findings while the Parquet tables are written: the files must be
those of `analyze` followed by `write_outputs`, and the manifest's timings complete and in
order."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from nsysan.api import analyze, analyze_to_dir, write_outputs
from nsysan.load import open_trace
from nsysan.testing.scenarios import build

PASS_ORDER = ["steps", "gaps", "overlap", "attribution", "kernels", "nccl", "host"]


@pytest.fixture(scope="module")
def trace_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path, _ = build("exposed_allreduce", tmp_path_factory.mktemp("in"))
    return path


def _same_outputs(a: Path, b: Path) -> None:
    assert sorted(p.name for p in a.iterdir()) == sorted(p.name for p in b.iterdir())
    for table in a.glob("*.parquet"):
        assert pl.read_parquet(table).equals(pl.read_parquet(b / table.name)), table.name
    for doc in ("findings.md", "report.html"):
        assert (a / doc).read_text(encoding="utf-8") == (b / doc).read_text(encoding="utf-8")
    ja, jb = (json.loads((d / "findings.json").read_text(encoding="utf-8")) for d in (a, b))
    assert ja == jb


def test_findings_drawn_beside_the_tables_equal_the_sequential_outputs(
    trace_path: Path, tmp_path: Path
) -> None:
    result, together = analyze_to_dir(open_trace(trace_path, frame_cache=False),
                                      tmp_path / "together", samples_per_step=32)
    assert result.diagnosis is not None and result.findings
    alone = analyze(open_trace(trace_path, frame_cache=False), samples_per_step=32,
                    hash_inputs=True)
    _same_outputs(write_outputs(alone, tmp_path / "sequential"), together)
    timings = json.loads((together / "manifest.json").read_text(encoding="utf-8"))["timings_s"]
    assert list(timings) == ["open", *PASS_ORDER, "findings", "write_parquet", "write_report"]


def test_caller_timings_replace_the_analysis_ones(trace_path: Path, tmp_path: Path) -> None:
    _, out = analyze_to_dir(trace_path, tmp_path, timings_s={"open": 12.5},
                            passes=["gaps"], findings=False)
    timings = json.loads((out / "manifest.json").read_text(encoding="utf-8"))["timings_s"]
    assert timings["open"] == 12.5
    assert "gaps" in timings and "attribution" not in timings
    # without findings in the analysis, the report still carries them (as write_outputs does)
    assert (out / "findings.json").is_file()


def test_a_failure_while_drawing_findings_leaves_no_output(
    trace_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import nsysan.api as api

    def broken(*args: object) -> None:
        raise RuntimeError("findings failed")

    monkeypatch.setattr(api, "_diagnose", broken)
    with pytest.raises(RuntimeError, match="findings failed"):
        analyze_to_dir(trace_path, tmp_path)
    # the tables were being written beside the findings: their temporary directory is gone too
    assert list(tmp_path.iterdir()) == []
