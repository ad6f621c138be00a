"""What every pass is: a pure function (trace, params, earlier results) -> PassResult."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from nsysan.frames.trace import Trace

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


Results = Mapping[str, PassResult]
PassFn = Callable[[Trace, Any, Results], PassResult]


@dataclass(frozen=True)
class PassSpec:
    """A registered pass.

    ``params`` is a frozen dataclass type whose defaults are the pass defaults; ``tables`` maps
    each output table to its schema; ``requires`` names passes whose results ``run`` reads
    (they run first; ``after`` names passes used only when they are also selected).
    """

    name: str
    description: str
    params: type
    tables: Mapping[str, pl.Schema]
    run: PassFn
    requires: tuple[str, ...] = ()
    after: tuple[str, ...] = ()
