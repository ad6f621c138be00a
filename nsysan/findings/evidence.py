"""Evidence records and unit formatting shared by the rules and the reports.

A finding's ``evidence`` dict always has three keys (documented in docs/findings-schema.json):

- ``metrics``: ``[{"name", "label", "value", "unit"}]`` — raw numbers in raw units
  (``ns``, ``frac``, ``count``, ``bytes``, ``B/s``, ``1/s``, ``s``); formatting happens only when
  rendering (DESIGN.md "format units only when rendering").
- ``windows``: ``[{"start_ns", "end_ns", "device_id", "label"}]`` — where to look on the timeline.
- ``offenders``: ``[{"kind", "name", "value", "unit", "count", "detail"}]`` — the top kernels,
  ranges, API calls or copies, ranked after full aggregation.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import polars as pl

UNITS = ("ns", "frac", "count", "bytes", "B/s", "1/s", "s", "per_step")
OFFENDER_KINDS = ("kernel", "nvtx_range", "api", "copy", "layer", "cause", "table", "collective")


def metric(name: str, label: str, value: float | int | None, unit: str) -> dict[str, Any]:
    if unit not in UNITS:
        raise ValueError(f"unknown unit {unit!r}")
    if isinstance(value, float) and not math.isfinite(value):
        value = None
    return {"name": name, "label": label, "value": value, "unit": unit}


def window(start_ns: int, end_ns: int, label: str, device_id: int | None = None) -> dict[str, Any]:
    return {"start_ns": int(start_ns), "end_ns": int(end_ns), "device_id": device_id,
            "label": label}


def offender(kind: str, name: str, value: float | int | None, unit: str,
             count: int | None = None, detail: str | None = None) -> dict[str, Any]:
    if kind not in OFFENDER_KINDS:
        raise ValueError(f"unknown offender kind {kind!r}")
    if unit not in UNITS:
        raise ValueError(f"unknown unit {unit!r}")
    return {"kind": kind, "name": name, "value": value, "unit": unit,
            "count": None if count is None else int(count), "detail": detail}


def evidence(metrics: Iterable[Mapping[str, Any]] = (),
             windows: Iterable[Mapping[str, Any]] = (),
             offenders: Iterable[Mapping[str, Any]] = ()) -> dict[str, Any]:
    return {"metrics": [dict(m) for m in metrics], "windows": [dict(w) for w in windows],
            "offenders": [dict(o) for o in offenders]}


#: dtypes a sort cannot order by (nested values); `ranked` leaves them out of its tie-break
_UNSORTABLE = (pl.List, pl.Array, pl.Struct, pl.Object)


def ranked(df: pl.DataFrame, by: str | Sequence[str], n: int | None = None, *,
           descending: bool | Sequence[bool] = True) -> pl.DataFrame:
    """The rows of ``df`` ranked by ``by`` (largest first unless ``descending`` says
    otherwise), the first ``n`` of them. Rows that tie on ``by`` are ranked by every other
    column, ascending (nulls last), so the ranking depends on the rows' content only: a
    group-by gives its groups in no particular order, and offenders with equal totals must
    come out the same way in every run and from every export (docs/findings.md)."""
    keys = [by] if isinstance(by, str) else list(by)
    desc = [descending] * len(keys) if isinstance(descending, bool) else list(descending)
    rest = [c for c, t in df.schema.items() if c not in keys and not isinstance(t, _UNSORTABLE)]
    order, order_desc = [*keys, *rest], [*desc, *[False] * len(rest)]
    if n is not None and df.height > n:
        # top_k selects as the sort below orders (nulls last either way) in one pass: a
        # full sort by every column of a big frame costs seconds
        df = df.top_k(n, by=order, reverse=[not d for d in order_desc])
    return df.sort(order, descending=order_desc, nulls_last=True)


def windows_from(df: pl.DataFrame, label_col: str | None, n: int,
                 label_prefix: str = "") -> list[dict[str, Any]]:
    """The ``n`` longest rows of ``df`` (``start_ns``, ``end_ns``, optional ``device_id``),
    the earlier first on a tie (then by `ranked`'s tie-break)."""
    if df.is_empty():
        return []
    top = ranked(df.with_columns((pl.col("end_ns") - pl.col("start_ns")).alias("_d")),
                 ["_d", "start_ns"], n, descending=[True, False])
    has_dev = "device_id" in top.columns
    out = []
    for row in top.iter_rows(named=True):  # at most n rows: rendering, not event processing
        label = label_prefix + (str(row[label_col]) if label_col and row[label_col] else "")
        out.append(window(row["start_ns"], row["end_ns"], label.strip() or "window",
                          row["device_id"] if has_dev else None))
    return out


# ---------------------------------------------------------------------------------------------
# Formatting (rendering only)
# ---------------------------------------------------------------------------------------------


def short(name: object, limit: int = 80) -> str:
    """A name fit for a sentence: one line, at most ``limit`` characters."""
    s = " ".join(str(name).split())
    return s if len(s) <= limit else s[: limit - 1] + "…"


def fmt_ns(ns: float | int | None) -> str:
    """A duration with a unit a person reads: ``1.23 s``, ``45.6 ms``, ``7.8 µs``, ``12 ns``."""
    if ns is None:
        return "n/a"
    a = abs(ns)
    if a >= 1e9:
        return f"{ns / 1e9:.3g} s" if a < 1e11 else f"{ns / 1e9:,.0f} s"
    if a >= 1e6:
        return f"{ns / 1e6:.3g} ms"
    if a >= 1e3:
        return f"{ns / 1e3:.3g} µs"
    return f"{ns:.0f} ns"


def fmt_frac(f: float | None) -> str:
    if f is None:
        return "n/a"
    pct = 100 * f
    return f"{pct:.1f}%" if abs(pct) >= 0.1 or pct == 0 else f"{pct:.2g}%"


def fmt_bytes(b: float | int | None) -> str:
    if b is None:
        return "n/a"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(b) >= size:
            return f"{b / size:.3g} {unit}"
    return f"{b:.0f} B"


def fmt_rate(bps: float | None) -> str:
    if bps is None:
        return "n/a"
    for unit, size in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if abs(bps) >= size:
            return f"{bps / size:.3g} {unit}"
    return f"{bps:.3g} B/s"


def fmt_value(value: Any, unit: str) -> str:
    """Format a raw evidence value by its unit."""
    if value is None:
        return "n/a"
    if unit == "ns":
        return fmt_ns(value)
    if unit == "frac":
        return fmt_frac(value)
    if unit == "bytes":
        return fmt_bytes(value)
    if unit == "B/s":
        return fmt_rate(value)
    if unit == "1/s":
        return f"{value:,.4g}/s"
    if unit == "s":
        return f"{value:.3g} s"
    if unit == "per_step":
        return f"{value:.3g}/step"
    if unit == "count":
        return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.3g}"
    return str(value)


# ---------------------------------------------------------------------------------------------
# Building findings
# ---------------------------------------------------------------------------------------------


def grade(value: float | None, warn: float, crit: float) -> str | None:
    """``critical`` / ``warning`` / None for a higher-is-worse value."""
    if value is None:
        return None
    if value >= crit:
        return "critical"
    if value >= warn:
        return "warning"
    return None


def make_finding(code: str, severity: str, message: str, ev: dict[str, Any],
                 device_id: int | None = None, pid: int | None = None):
    """A `Finding` whose layer and title come from the catalogue."""
    from nsysan.findings.catalogue import spec
    from nsysan.passes.base import SEVERITIES, Finding

    if severity not in SEVERITIES:
        raise ValueError(f"unknown severity {severity!r}")
    s = spec(code)
    return Finding(code=code, severity=severity, layer=s.layer, title=s.title,
                   message=message, evidence=ev, device_id=device_id, pid=pid)


def normalise(ev: Mapping[str, Any] | None) -> dict[str, Any]:
    """Coerce a free-form evidence dict (e.g. from a pass's own finding) to the documented
    shape: scalar numbers become metrics (unit from the key's suffix), the rest goes to
    ``extra``."""
    ev = dict(ev or {})
    if {"metrics", "windows", "offenders"} <= set(ev):
        return ev
    metrics, extra = [], {}
    for k, v in ev.items():
        if isinstance(v, bool) or not isinstance(v, int | float):
            extra[k] = v if isinstance(v, str | int | float | bool | type(None)) else str(v)
            continue
        unit = ("ns" if k.endswith("_ns") else "frac" if k.endswith("_frac")
                else "bytes" if k.endswith("bytes") else "count")
        metrics.append(metric(k, k.replace("_", " "), v, unit))
    out = evidence(metrics)
    if extra:
        out["extra"] = extra
    return out
