"""What a comparison reads about one run, from an `AnalysisResult` or an output directory.

`RunData` holds exactly the pass tables (only the columns the metric model uses), the parts of
the manifest and of findings.json that matter for comparability, and the analysis options.
Both constructors produce the same content for the same analysis — the metric values derived
from them are identical (a test writes a result, reads it back, and compares), so a diff of two
traces, of two output directories or of a trace against a stored baseline is the same diff.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from nsysan.errors import ConfigError, SchemaError

#: table -> the columns the metric model reads (everything else stays on disk)
COLUMNS: dict[str, tuple[str, ...]] = {
    "steps": ("step", "start_ns", "end_ns", "duration_ns", "source", "warmup", "gpu_busy_frac",
              "idle_ns", "exposed_nccl_ns", "h2d_unoverlapped_ns"),
    "overlap": ("device_id", "step", "state", "duration_ns"),
    "overlap_summary": ("device_id", "span_ns", "busy_ns"),
    "gaps": ("scope", "device_id", "start_ns", "end_ns", "cause", "cause_detail", "step"),
    "attribution": ("domain", "name", "proj_start_ns", "n_gpu_ops", "exclusive_gpu_ns"),
    "kernels": ("short_name", "op_class", "count", "total_ns"),
    "nccl": ("op", "step", "duration_ns", "exposed_ns", "busbw_gbps"),
}
MANIFEST_JSON = "manifest.json"
FINDINGS_JSON = "findings.json"


@dataclass
class RunData:
    """One analysed run, as the comparison sees it."""

    trace_id: str
    source: str  # what was read: the trace path or the output directory
    tables: dict[str, pl.DataFrame]
    capture: dict[str, list[str]] = field(default_factory=dict)  # nsys capture settings
    not_captured: dict[str, str] = field(default_factory=dict)  # canonical frame -> why
    options: dict[str, Any] = field(default_factory=dict)  # samples_per_step, tokens_per_step
    exporter_version: str | None = None
    findings: list[dict[str, Any]] = field(default_factory=list)  # code, severity, title
    notes: dict[str, str | None] = field(default_factory=dict)  # baseline item key -> note
    #: the attribution pass grouped numbered range names into layers (``step 12`` -> ``step
    #: N``, ``aten::mm, op_id = 7`` -> ``aten::mm``); per-step layers group the same way
    group_numbered: bool = False

    def table(self, name: str) -> pl.DataFrame | None:
        return self.tables.get(name)

    @classmethod
    def from_result(cls, result: Any, source: str | None = None) -> RunData:
        """From an `nsysan.api.AnalysisResult` (no I/O)."""
        tables = {name: _select(df, name) for name, df in result.tables.items()
                  if name in COLUMNS}
        meta = result.trace.meta
        findings: list[dict[str, Any]] = []
        notes: dict[str, str | None] = {}
        if result.diagnosis is not None:
            from nsysan.report.jsonout import findings_document

            doc = findings_document(result.diagnosis, result.trace)
            findings, notes = _from_findings(doc)
        return cls(
            trace_id=result.trace_id,
            source=source or str(meta.path),
            tables=tables,
            capture={k: list(v) for k, v in (meta.capture or {}).items()},
            not_captured=dict(meta.missing or {}),
            options={k: v for k, v in (result.options or {}).items()},
            exporter_version=meta.exporter_version,
            findings=findings,
            notes=notes,
            group_numbered=bool(getattr((result.params or {}).get("attribution"),
                                        "group_numbered", False)),
        )

    @classmethod
    def from_dir(cls, directory: str | Path) -> RunData:
        """From an ``nsysan analyze`` output directory (``OUT/<trace_id>/``)."""
        d = Path(directory)
        manifest_path = d / MANIFEST_JSON
        if not manifest_path.is_file():
            raise ConfigError(f"{d}: not an nsysan analyze output directory (no {MANIFEST_JSON})")
        try:
            manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise SchemaError(f"{manifest_path}: unreadable manifest ({exc}); re-run "
                              "`nsysan analyze`") from None
        tables = {}
        for name, cols in COLUMNS.items():
            path = d / f"{name}.parquet"
            if path.is_file():
                try:
                    tables[name] = pl.read_parquet(path, columns=list(cols))
                except (pl.exceptions.PolarsError, OSError) as exc:
                    raise SchemaError(f"{path}: unreadable or missing columns ({exc}); re-run "
                                      "`nsysan analyze`") from None
        findings: list[dict[str, Any]] = []
        notes: dict[str, str | None] = {}
        fpath = d / FINDINGS_JSON
        if fpath.is_file():
            try:
                findings, notes = _from_findings(json.loads(fpath.read_text(encoding="utf-8")))
            except json.JSONDecodeError as exc:
                raise SchemaError(f"{fpath}: invalid JSON ({exc})") from None
        nsys = manifest.get("nsys") or {}
        return cls(
            trace_id=str(manifest.get("trace_id") or d.name),
            source=str(d),
            tables=tables,
            capture={k: list(v) for k, v in (nsys.get("capture") or {}).items()},
            not_captured=dict(manifest.get("not_captured") or {}),
            options=dict(manifest.get("options") or {}),
            exporter_version=nsys.get("exporter_version"),
            findings=findings,
            notes=notes,
            # absent: written before the attribution pass grouped names (exact names)
            group_numbered=bool(((manifest.get("passes") or {}).get("attribution") or {})
                                .get("group_numbered", False)),
        )


def _select(df: pl.DataFrame, name: str) -> pl.DataFrame:
    cols = [c for c in COLUMNS[name] if c in df.columns]
    return df.select(cols)


def _from_findings(doc: Mapping[str, Any]) -> tuple[list[dict[str, Any]], dict[str, str | None]]:
    findings = [{"code": f.get("code"), "severity": f.get("severity"), "title": f.get("title")}
                for f in doc.get("findings") or []]
    items = (doc.get("baseline") or {}).get("items") or []
    notes = {i["key"]: i.get("note") for i in items if i.get("device_id") is None}
    return findings, notes


def is_output_dir(path: Path) -> bool:
    return path.is_dir() and (path / MANIFEST_JSON).is_file()


def find_output_dir(path: Path) -> Path | None:
    """``path`` itself when it is an output directory, or its only output subdirectory (an
    ``analyze -o OUT`` root holding one trace); else None."""
    if is_output_dir(path):
        return path
    if path.is_dir():
        subs = [p for p in sorted(path.iterdir()) if is_output_dir(p)]
        if len(subs) == 1:
            return subs[0]
        if len(subs) > 1:
            names = ", ".join(p.name for p in subs[:5])
            raise ConfigError(f"{path} holds {len(subs)} analyses ({names}, ...): name one of "
                              "its subdirectories")
    return None
