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


def test_step_state_groups_match_the_patterns_row_by_row() -> None:
    """The state -> group mapping (patterns tested once per distinct state) gives the means
    that testing every row gives, also with null and unknown states."""
    from nsysan.findings.evidence import fmt_ns
    from nsysan.report.markdown import _STATE_GROUPS, _steps

    steps = pl.DataFrame({"step": [0, 1, 2], "source": ["nvtx"] * 3,
                          "warmup": [True, False, False], "start_ns": [0, 10, 20],
                          "duration_ns": [10, 10, 10], "gpu_busy_frac": [0.5, 0.6, 0.7],
                          "idle_ns": [1, 2, 3], "exposed_nccl_ns": [0, 1, 0],
                          "h2d_unoverlapped_ns": [0, 0, 1]})
    overlap = pl.DataFrame(
        {"step": [0, 1, 1, 1, 2, 2, 2, None, 2],
         "state": ["compute", "compute+nccl", "nccl", "idle", "h2d", None, "weird", "idle",
                   "compute"],
         "duration_ns": [5, 3, 2, 4, 7, 6, 1, 100, 8]},
        schema={"step": pl.Int64, "state": pl.String, "duration_ns": pl.Int64})
    lines = _steps(steps, overlap)
    group = pl.lit("other")
    for label, pattern in reversed(_STATE_GROUPS):
        group = pl.when(pl.col("state").str.contains(pattern)).then(pl.lit(label)).otherwise(
            group)
    per_row = (overlap.filter(pl.col("step").is_in([1, 2])).with_columns(group.alias("g"))
               .group_by("step", "g").agg(pl.col("duration_ns").sum()))
    for label, _ in _STATE_GROUPS:
        rows = per_row.filter(pl.col("g") == label)
        if rows.height:
            mean = rows["duration_ns"].sum() / 2
            assert f"| {label} | {fmt_ns(mean)} |" in lines
    assert "| idle | 2 ns |" in lines  # step 1's 4 ns and step 2's none, over 2 steps
