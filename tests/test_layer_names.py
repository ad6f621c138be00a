"""Layers group range names that differ only in numbers or PyTorch argument suffixes."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

import nsysan
from nsysan.passes.attribution import layer_name

EXAMPLE = Path(__file__).resolve().parents[1] / "fixtures" / "example_ddp.sqlite"


@pytest.mark.parametrize(
    ("name", "layer"),
    [
        ("step 12", "step N"),
        ("Step#3", "Step#N"),
        ("layers.3.mlp", "layers.N.mlp"),
        ("aten::mm, op_id = 7", "aten::mm"),
        ("aten::addmm, seq = 12, sizes = [[64, 128], [128]]", "aten::addmm"),
        ("conv2d", "conv2d"),  # digits inside a word are part of the name
        ("fc1", "fc1"),
        ("DataLoader.__next__", "DataLoader.__next__"),
        ("ncclAllReduce, comm 3", "ncclAllReduce, comm N"),  # not a `key = value` suffix
    ],
)
def test_layer_name(name: str, layer: str) -> None:
    got = pl.select(layer_name(pl.lit(name))).item()
    assert got == layer


def test_step_ranges_form_one_layer_unless_disabled() -> None:
    trace = nsysan.open_trace(EXAMPLE)
    steps = trace.nvtx.filter(pl.col("name").cast(pl.String).str.starts_with("step ")).height
    assert steps > 1
    grouped = nsysan.analyze(trace, passes=["attribution"], findings=False).table("layers")
    row = grouped.filter(pl.col("name") == "step N")
    assert row.height == 1 and row["instances"][0] == steps
    assert not grouped["name"].str.contains(r"^step \d+$").any()
    per_name = nsysan.analyze(trace, passes=["attribution"], findings=False,
                              settings={"attribution.group_numbered": "false"}).table("layers")
    assert per_name.filter(pl.col("name").str.contains(r"^step \d+$")).height == steps
