"""What the catalog keeps of one analysis: summary metrics and one row per finding.

Computed from the in-memory `AnalysisResult` (its output tables, declared in
`nsysan.frames.schemas`, and its findings) — never by re-reading files just written. Each
metric has one fixed definition, independent of how a pass names its own scalar metrics, so
catalog columns mean the same thing across nsysan versions:

=====================  ======================================================================
``n_steps``            rows of ``steps``
``step_mean_ns``       mean ``duration_ns`` of the steady-state steps (``warmup`` false; all
``step_p50_ns``        steps when every step is warm-up), median and 95th percentile (linear
``step_p95_ns``        interpolation), rounded to integer ns
``gpu_busy_frac``      Σ busy_ns / Σ span_ns over devices (``overlap_summary``; else the
                       device-scope ``gap_summary``)
``idle_ns``            Σ idle_ns over devices (same sources)
``idle_frac``          Σ idle_ns / Σ span_ns
``nccl_ns``            Σ nccl_ns (union of NCCL kernels per device)
``exposed_nccl_ns``    Σ exposed_nccl_ns: NCCL active and compute not
``hidden_nccl_frac``   1 − exposed_nccl_ns / nccl_ns (null without NCCL)
``h2d_unoverlapped_ns`` Σ h2d_unoverlapped_ns
``n_gaps``, ``gaps_ns``  device-scope gaps at or above the threshold (``gap_summary``)
``top_layer``          ``layers`` row with the largest exclusive GPU time (``domain:name`` when
``top_layer_frac``     the domain is not the default one) and its ``exclusive_frac``
``verdict``            the diagnosis verdict when findings ran
``n_findings``, ``n_warning``, ``n_critical``  counts of findings
=====================  ======================================================================

A metric whose source table is absent is null (not zero). Every scalar metric the passes
report themselves is kept as well, in ``extra`` (JSON in the catalog).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import polars as pl

METRIC_COLUMNS: tuple[str, ...] = (
    "n_steps",
    "step_mean_ns",
    "step_p50_ns",
    "step_p95_ns",
    "gpu_busy_frac",
    "idle_ns",
    "idle_frac",
    "nccl_ns",
    "exposed_nccl_ns",
    "hidden_nccl_frac",
    "h2d_unoverlapped_ns",
    "n_gaps",
    "gaps_ns",
    "top_layer",
    "top_layer_frac",
    "verdict",
    "n_findings",
    "n_warning",
    "n_critical",
)

#: For ``catalog query --regressed``: +1 when a larger value is worse, -1 when smaller is worse.
WORSE_WHEN: dict[str, int] = {
    "step_mean_ns": 1,
    "step_p50_ns": 1,
    "step_p95_ns": 1,
    "gpu_busy_frac": -1,
    "idle_ns": 1,
    "idle_frac": 1,
    "nccl_ns": 1,
    "exposed_nccl_ns": 1,
    "hidden_nccl_frac": -1,
    "h2d_unoverlapped_ns": 1,
    "n_gaps": 1,
    "gaps_ns": 1,
    "top_layer_frac": 1,
    "n_findings": 1,
    "n_warning": 1,
    "n_critical": 1,
}

_UNIT_SUFFIXES = (
    ("_ns", "ns"),
    ("_us", "us"),
    ("_ms", "ms"),
    ("_s", "s"),
    ("_frac", "frac"),
    ("_pct", "%"),
    ("_bytes", "B"),
    ("_gbps", "GB/s"),
    ("_bps", "B/s"),
    ("_hz", "Hz"),
)


def json_safe(value: Any) -> Any:
    """Plain JSON types only (NaN/inf become null); unknown objects become strings."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [json_safe(v) for v in value]
    if hasattr(value, "item") and callable(value.item):  # numpy / polars scalars
        try:
            return json_safe(value.item())
        except (TypeError, ValueError):
            pass
    return str(value)


def _sum(df: pl.DataFrame, col: str) -> int | None:
    if col not in df.columns or df.is_empty():
        return None
    value = df.get_column(col).sum()
    return None if value is None else int(value)


def _ratio(num: int | None, den: int | None) -> float | None:
    if num is None or not den:
        return None
    return num / den


def _step_metrics(steps: pl.DataFrame | None) -> dict[str, Any]:
    if steps is None:
        return {}
    out: dict[str, Any] = {"n_steps": steps.height}
    if steps.is_empty():
        return out
    steady = steps.filter(~pl.col("warmup").fill_null(False))
    if steady.is_empty():
        steady = steps
    d = steady.get_column("duration_ns").drop_nulls().cast(pl.Float64)
    if d.is_empty():
        return out
    stats = {
        "step_mean_ns": d.mean(),
        "step_p50_ns": d.median(),
        "step_p95_ns": d.quantile(0.95, interpolation="linear"),
    }
    out.update({k: None if v is None else round(v) for k, v in stats.items()})
    return out


def _device_metrics(tables: Mapping[str, pl.DataFrame]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    gap_summary = tables.get("gap_summary")
    if gap_summary is not None:
        dev = gap_summary.filter(pl.col("scope") == "device")
        if not dev.is_empty():
            out["n_gaps"] = _sum(dev, "n_gaps")
            out["gaps_ns"] = _sum(dev, "gaps_ns")
            span, idle = _sum(dev, "span_ns"), _sum(dev, "idle_ns")
            out["idle_ns"] = idle
            out["idle_frac"] = _ratio(idle, span)
            out["gpu_busy_frac"] = _ratio(_sum(dev, "busy_ns"), span)
    ov = tables.get("overlap_summary")
    if ov is not None and not ov.is_empty():
        # overlap_summary is the primary source: its states tile the device span exactly.
        span = _sum(ov, "span_ns")
        idle = _sum(ov, "idle_ns")
        nccl = _sum(ov, "nccl_ns")
        exposed = _sum(ov, "exposed_nccl_ns")
        out["gpu_busy_frac"] = _ratio(_sum(ov, "busy_ns"), span)
        out["idle_ns"] = idle
        out["idle_frac"] = _ratio(idle, span)
        out["nccl_ns"] = nccl
        out["exposed_nccl_ns"] = exposed
        out["hidden_nccl_frac"] = (
            None if not nccl or exposed is None else 1.0 - exposed / nccl
        )
        out["h2d_unoverlapped_ns"] = _sum(ov, "h2d_unoverlapped_ns")
    return out


def _layer_metrics(layers: pl.DataFrame | None) -> dict[str, Any]:
    if layers is None or layers.is_empty():
        return {}
    top = layers.sort(
        ["exclusive_gpu_ns", "domain", "name"], descending=[True, False, False], nulls_last=True
    ).row(0, named=True)
    domain = top.get("domain") or ""
    name = top.get("name") or ""
    return {
        "top_layer": f"{domain}:{name}" if domain else name,
        "top_layer_frac": top.get("exclusive_frac"),
    }


def _verdict(diagnosis: Any) -> str | None:
    verdict = getattr(diagnosis, "verdict", None)
    if verdict is None or isinstance(verdict, str):
        return verdict
    for attr in ("kind", "verdict", "label", "name", "code"):
        value = getattr(verdict, attr, None)
        if isinstance(value, str):
            return value
    if isinstance(verdict, Mapping):
        for key in ("kind", "verdict", "label", "name"):
            if isinstance(verdict.get(key), str):
                return verdict[key]
    return str(verdict)


def summary_metrics(
    tables: Mapping[str, pl.DataFrame], findings: list[Any], diagnosis: Any = None
) -> dict[str, Any]:
    """The fixed catalog metrics (see the module docstring); absent sources give None."""
    out: dict[str, Any] = dict.fromkeys(METRIC_COLUMNS)
    out.update(_step_metrics(tables.get("steps")))
    out.update(_device_metrics(tables))
    out.update(_layer_metrics(tables.get("layers")))
    out["verdict"] = _verdict(diagnosis)
    severities = [getattr(f, "severity", None) for f in findings]
    out["n_findings"] = len(findings)
    out["n_warning"] = severities.count("warning")
    out["n_critical"] = severities.count("critical")
    return {k: json_safe(v) for k, v in out.items()}


def extra_metrics(metrics: Mapping[str, Any], diagnosis: Any = None) -> dict[str, Any]:
    """Everything else worth keeping: the passes' own scalars (``pass.name``), the diagnosis
    baseline items (``baseline.key``, whole-trace ones) and the verdict's reason."""
    out: dict[str, Any] = dict(metrics)
    items = getattr(getattr(diagnosis, "baseline", None), "items", None) or []
    for item in items:
        if getattr(item, "device_id", None) is None and getattr(item, "key", None):
            out[f"baseline.{item.key}"] = getattr(item, "value", None)
    reason = getattr(getattr(diagnosis, "verdict", None), "reason", None)
    if isinstance(reason, str):
        out["verdict.reason"] = reason
    return json_safe(out)


def _unit_of(key: str) -> str:
    for suffix, unit in _UNIT_SUFFIXES:
        if key.endswith(suffix):
            return unit
    return ""


def key_metric(evidence: Mapping[str, Any]) -> tuple[str | None, float | None, str | None]:
    """The one number a finding row shows: ``(name, value, unit)``.

    The documented evidence layout (docs/findings-schema.json) lists
    ``metrics: [{"name", "label", "value", "unit"}]`` with the headline number first: the first
    one with a value is the key metric. For free-form evidence: an explicit
    ``metric``/``value``/``unit`` wins, else the first numeric entry, its unit read from the
    key's suffix (``_ns`` → ns, ``_frac`` → frac, ...).
    """
    listed = evidence.get("metrics")
    if isinstance(listed, list):
        for m in listed:
            val = m.get("value") if isinstance(m, Mapping) else None
            if isinstance(val, (int, float)) and not isinstance(val, bool) and math.isfinite(val):
                return str(m.get("name")), float(val), str(m.get("unit") or "")
    value = evidence.get("value")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        name = evidence.get("metric")
        unit = evidence.get("unit")
        return (str(name) if name is not None else "value", float(value),
                str(unit) if unit is not None else "")
    for key, val in evidence.items():
        if isinstance(val, (int, float)) and not isinstance(val, bool) and math.isfinite(val):
            return str(key), float(val), _unit_of(str(key))
    return None, None, None


def finding_rows(findings: list[Any]) -> list[dict[str, Any]]:
    """One JSON-ready dict per finding, in the diagnosis order (``seq`` keeps it)."""
    rows = []
    for seq, f in enumerate(findings):
        evidence = getattr(f, "evidence", None) or {}
        name, value, unit = key_metric(evidence)
        rows.append(
            {
                "seq": seq,
                "code": getattr(f, "code", None),
                "layer": getattr(f, "layer", None),
                "severity": getattr(f, "severity", None),
                "title": getattr(f, "title", None),
                "message": getattr(f, "message", None),
                "metric_name": name,
                "metric_value": value,
                "metric_unit": unit,
                "device_id": getattr(f, "device_id", None),
                "pid": getattr(f, "pid", None),
                "evidence": json_safe(evidence),
            }
        )
    return rows
