"""``manifest.json``: provenance of one analysis output directory.

What produced the outputs (nsysan, Python, polars versions, the command), from which inputs
(paths, sizes, sha256 — a directory input such as a parquetdir is hashed as the sorted list of
its files' relative paths and hashes), as exported by which nsys (exporter and export schema
versions, capture settings, raw tables and their row counts, what was not captured), with which
parameters (every pass's and the findings' thresholds), how long each step took, and the
outputs written (relative path, size, sha256).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import platform
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import polars as pl

import nsysan
from nsysan.frames.trace import Trace
from nsysan.report.jsonout import _clean, atomic_write

MANIFEST_JSON = "manifest.json"
MANIFEST_VERSION = "1"
_CHUNK = 1 << 20


@dataclass
class ManifestInfo:
    """What the caller knows that the trace does not: parameters, timings, command line."""

    params: Mapping[str, Any] = field(default_factory=dict)  # pass -> params dataclass / dict
    timings_s: Mapping[str, float] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)  # e.g. samples_per_step
    argv: Sequence[str] | None = None
    inputs: Sequence[Path] | None = None  # default: the trace's path and source path
    findings_params: Any = None


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def describe_path(path: Path, root: Path | None = None) -> dict[str, Any]:
    """``{path, kind, bytes, sha256}`` of a file or a directory (None fields when absent)."""
    path = Path(path)
    shown = str(path.relative_to(root)) if root is not None else str(path)
    if path.is_file():
        return {"path": shown, "kind": "file", "bytes": path.stat().st_size,
                "sha256": sha256_file(path)}
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file())
        h = hashlib.sha256()
        size = 0
        for p in files:
            h.update(f"{p.relative_to(path).as_posix()}\0{sha256_file(p)}\n".encode())
            size += p.stat().st_size
        return {"path": shown, "kind": "dir", "bytes": size, "sha256": h.hexdigest(),
                "n_files": len(files)}
    return {"path": shown, "kind": "missing", "bytes": None, "sha256": None}


def _params_dict(p: Any) -> Any:
    if dataclasses.is_dataclass(p) and not isinstance(p, type):
        return dataclasses.asdict(p)
    if isinstance(p, Mapping):
        return {k: _params_dict(v) for k, v in p.items()}
    return p


def build_manifest(trace: Trace, info: ManifestInfo | None = None,
                   outputs: Iterable[Path] = (), out_dir: Path | None = None) -> dict[str, Any]:
    info = info or ManifestInfo()
    meta = trace.meta
    inputs = list(info.inputs) if info.inputs is not None else list(
        dict.fromkeys([Path(meta.path), Path(meta.source_path)]))
    return _clean({
        "manifest_version": MANIFEST_VERSION,
        "created_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "nsysan_version": nsysan.__version__,
        "python": platform.python_version(),
        "polars": pl.__version__,
        "platform": platform.platform(),
        "command": list(info.argv) if info.argv is not None else list(sys.argv),
        "trace_id": meta.trace_id,
        "inputs": [describe_path(p) for p in inputs],
        "source": {"path": str(meta.source_path), "format": meta.source_format},
        "nsys": {
            "exporter_version": meta.exporter_version,
            "export_schema_version": meta.schema_version,
            "recorded_version": meta.recorded_version,
            "session_start_utc_ns": meta.session_start_utc_ns,
            "duration_ns": meta.duration_ns,
            # environment variables can hold secrets; the meta frame leaves them out too
            "capture": {k: v for k, v in meta.capture.items() if "ENVIRONMENT_VARIABLE" not in k},
        },
        "raw_tables": meta.tables,
        "not_captured": meta.missing,
        "notes": meta.notes,
        "passes": {name: _params_dict(p) for name, p in info.params.items()},
        "findings_params": _params_dict(info.findings_params),
        "options": dict(info.options),
        "timings_s": {k: round(float(v), 6) for k, v in info.timings_s.items()},
        "outputs": [describe_path(p, out_dir) for p in outputs],
    })


def write_manifest(out_dir: Path, trace: Trace, info: ManifestInfo | None = None,
                   outputs: Iterable[Path] | None = None) -> Path:
    """Write manifest.json; ``outputs`` defaults to every other file in ``out_dir``."""
    out_dir = Path(out_dir)
    if outputs is None:
        outputs = sorted(p for p in out_dir.rglob("*") if p.is_file()
                         and p.name != MANIFEST_JSON and not p.name.startswith("."))
    doc = build_manifest(trace, info, outputs, out_dir)
    return atomic_write(out_dir / MANIFEST_JSON,
                        json.dumps(doc, indent=2, ensure_ascii=False, allow_nan=False) + "\n")
