"""``findings.json``: the diagnosis for machines, in a stable, versioned schema.

The schema is docs/findings-schema.json (JSON Schema 2020-12), ``schema_version`` "1". Within a
schema version fields are only ever added (as optional); renaming or removing a field, or
changing a unit, bumps the version. Times are integer nanoseconds on the session timeline,
shares are fractions in [0, 1], as in the Parquet tables.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from nsysan._version import __version__
from nsysan.frames.trace import Trace
from nsysan.passes.base import SEVERITIES
from nsysan.report.atomic import atomic_write as atomic_write  # (the writers import it here)

SCHEMA_VERSION = "1"
FINDINGS_JSON = "findings.json"


def _clean(obj: Any) -> Any:
    """JSON-safe: NaN/inf -> null, tuples -> lists, paths -> str, numpy scalars -> python."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_clean(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "item") and not isinstance(obj, str | bytes):  # numpy scalar
        return _clean(obj.item())
    return obj


def findings_document(diagnosis: Any, trace: Trace,
                      images: Sequence[str] = ()) -> dict[str, Any]:
    """The findings.json document of one diagnosis (a plain dict, JSON-ready)."""
    d = diagnosis.to_dict()
    counts = {s: sum(1 for f in diagnosis.findings if f.severity == s) for s in SEVERITIES}
    meta = trace.meta
    note = diagnosis.attribution_note()
    doc = {
        "schema_version": SCHEMA_VERSION,
        "generator": {"name": "nsysan", "version": __version__},
        "trace": {
            "trace_id": meta.trace_id,
            "path": str(meta.path),
            "source_format": meta.source_format,
            "exporter_version": meta.exporter_version,
            "export_schema_version": meta.schema_version,
        },
        "verdict": d["verdict"],
        "baseline": d["baseline"],
        "summary": {"n_findings": len(diagnosis.findings),
                    **{f"n_{s}": counts[s] for s in SEVERITIES},
                    "worst": diagnosis.worst()},
        "findings": d["findings"],
        "not_found": d["not_found"],
        "not_evaluated": d["not_evaluated"],
        "attribution": {"available": note is None, "note": note},
        "images": list(images),
        "params": d["params"],
    }
    return _clean(doc)


def write_findings_json(out_dir: Path, diagnosis: Any, trace: Trace,
                        images: Sequence[str] = ()) -> Path:
    doc = findings_document(diagnosis, trace, images)
    text = json.dumps(doc, indent=2, ensure_ascii=False, allow_nan=False) + "\n"
    return atomic_write(Path(out_dir) / FINDINGS_JSON, text)
