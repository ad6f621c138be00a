"""What a profile holds, as JSON-ready data: the library side of ``nsysan schema``.

`describe` is built from `TraceMeta` only, so describing a trace reads no frame (its
``quality`` covers the frames loaded so far); `describe_path` loads every frame first, so that
the data-quality counts of the whole profile are known (docs/data-quality.md).
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

from nsysan.errors import NsysanError
from nsysan.frames import schemas
from nsysan.frames.trace import Trace
from nsysan.load import open_trace
from nsysan.load.adapters import FRAME_SOURCES
from nsysan.load.adapters_info import EXPORT_META_TABLES

#: raw tables the ``meta`` frame reads
META_TABLES = (
    *EXPORT_META_TABLES,
    "META_DATA_CAPTURE",
    "ANALYSIS_DETAILS",
    "TARGET_INFO_SESSION_START_TIME",
    "TARGET_INFO_SYSTEM_ENV",
)


def describe(trace: Trace) -> dict[str, Any]:
    """Versions, session, canonical frames (captured or why not, with the raw tables feeding
    them), notes, the data-quality counts of the frames loaded so far, and every raw table
    with its row count."""
    meta = trace.meta
    frames: dict[str, Any] = {}
    for frame in schemas.CANONICAL:
        raw = FRAME_SOURCES[frame][0] if frame in FRAME_SOURCES else META_TABLES
        frames[frame] = {
            "captured": frame not in meta.missing,
            "tables": {t: meta.tables[t] for t in raw if t in meta.tables},
            "missing": meta.missing.get(frame),
        }
    start = None
    if meta.session_start_utc_ns is not None:
        start = dt.datetime.fromtimestamp(meta.session_start_utc_ns / 1e9, tz=dt.timezone.utc)
    return {
        "trace_id": meta.trace_id,
        "path": str(meta.path),
        "source_path": str(meta.source_path),
        "source_format": meta.source_format,
        "exporter_version": meta.exporter_version,
        "schema_version": meta.schema_version,
        "recorded_version": meta.recorded_version,
        "session_start_utc": start.isoformat(timespec="seconds") if start else None,
        "duration_ns": meta.duration_ns,
        "frames": frames,
        "notes": list(meta.notes),
        "quality": meta.quality_summary(),
        "tables": dict(sorted(meta.tables.items())),
    }


def describe_path(
    path: str | Path, *, nsys: str | Path | None = None, cache_dir: str | Path | None = None
) -> dict[str, Any]:
    """`describe` of the profile at ``path`` (a report is exported first), with every frame
    loaded: a frame that cannot be built (e.g. a required column is absent) says why in its
    ``error`` instead of failing the description."""
    trace = open_trace(path, nsys=nsys, cache_dir=cache_dir)
    errors = {}
    for name in schemas.CANONICAL:
        try:
            trace.frame(name)
        except NsysanError as exc:
            errors[name] = " ".join(str(exc).split())
    info = describe(trace)
    for name, why in errors.items():
        info["frames"][name]["error"] = why
    return info
