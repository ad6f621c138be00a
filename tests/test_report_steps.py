"""findings.md breaks device time down per step when steps are known."""

from __future__ import annotations

from pathlib import Path

import polars as pl

import nsysan
from nsysan.api import write_outputs

EXAMPLE = Path(__file__).resolve().parents[1] / "fixtures" / "example_ddp.sqlite"


def test_findings_md_has_a_per_step_breakdown(tmp_path: Path) -> None:
    result = nsysan.analyze(EXAMPLE)
    text = (write_outputs(result, tmp_path) / "findings.md").read_text()
    steps = result.table("steps")
    assert steps.height > 0
    section = text.split("## Steps", 1)[1].split("\n## ", 1)[0]
    assert f"{steps.height} steps from {steps['source'][0]}" in section
    assert "| compute |" in section and "| idle |" in section
    # one row per step (the example is short enough to list them all)
    rows = [ln for ln in section.splitlines() if ln.startswith("| ") and " s | " in ln]
    assert len(rows) == steps.height
    slowest = steps.sort("duration_ns", descending=True).row(0, named=True)
    assert any(ln.startswith(f"| {slowest['step']}") for ln in rows)


def test_no_steps_section_without_steps(tmp_path: Path) -> None:
    result = nsysan.analyze(EXAMPLE, passes=["gaps", "kernels"])
    text = (write_outputs(result, tmp_path) / "findings.md").read_text()
    assert "## Steps" not in text
    assert pl.read_parquet(tmp_path / "example_ddp" / "gaps.parquet").height > 0


def test_manifest_leaves_out_captured_environment_variables(tmp_path: Path) -> None:
    trace = nsysan.open_trace(EXAMPLE)
    trace.meta.capture = {
        "PROCESS_0:ENVIRONMENT_VARIABLE": ['WANDB_API_KEY="s3cret"'],
        "RUN_DURATION_MS": ["5000"],
    }
    result = nsysan.analyze(trace, passes=["gaps"])
    manifest = (write_outputs(result, tmp_path) / "manifest.json").read_text()
    assert "RUN_DURATION_MS" in manifest
    assert "s3cret" not in manifest and "ENVIRONMENT_VARIABLE" not in manifest
