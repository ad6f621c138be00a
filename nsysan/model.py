"""The core types every layer shares: findings, pass results, severities, layers.

They used to live in `nsysan.passes.base` (still re-exported there); findings, reports,
comparisons and the batch catalogue use them as much as the passes do, so they sit below
every layer, next to `nsysan.errors`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import polars as pl

__all__ = ["LAYERS", "SEVERITIES", "Finding", "PassResult", "Results"]

SEVERITIES = ("info", "warning", "critical")
LAYERS = ("framework", "communication", "operator_library", "runtime_driver", "hardware", "capture")


@dataclass(frozen=True)
class Finding:
    """One diagnosis: which layer blocks the GPU, how badly, with evidence."""

    code: str  # catalogue code, e.g. "GPU_STARVATION_PERIODIC"
    severity: str  # info | warning | critical
    layer: str  # one of LAYERS
    title: str
    message: str  # one paragraph with numbers and units
    evidence: dict[str, Any] = field(default_factory=dict)  # machine-readable numbers
    device_id: int | None = None
    pid: int | None = None


@dataclass
class PassResult:
    """Named tables (each with its declared schema), findings and scalar metrics."""

    tables: dict[str, pl.DataFrame] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)

    def __repr__(self) -> str:
        tables = ", ".join(f"{n}: {df.height} rows" for n, df in self.tables.items())
        return (f"PassResult(tables={{{tables}}}, findings={len(self.findings)}, "
                f"metrics={len(self.metrics)})")


Results = Mapping[str, PassResult]
