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
import os
import platform
import sys
import threading
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import polars as pl

from nsysan._version import __version__
from nsysan.frames.trace import Trace
from nsysan.load import cache
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


def _hash_now(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)  # hashlib releases the GIL on big buffers: threads overlap
    return h.hexdigest()


# Hashing the input takes about a second per GB, and the input is read (or was cached) long
# before the manifest is written: `prefetch_sha256` starts hashing when the analysis starts, in
# a daemon thread, so the hash overlaps the passes instead of adding to the wall time. A hash
# is only ever served for the exact file version it was computed from: it is keyed by the
# file's identity and stat (device, inode, size, mtime, ctime), it is discarded when the stat
# changed while hashing, and it is used once (a later manifest hashes again).
_StatKey = tuple[str, int, int, int, int, int]
_PENDING: dict[_StatKey, Future[str | None]] = {}
_PENDING_LOCK = threading.Lock()


def _stat_key(path: Path) -> _StatKey | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (os.path.abspath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns,
            st.st_ctime_ns)


def _files_of(path: Path) -> list[Path]:
    """``path`` itself when a file, its files in hashing order when a directory."""
    if path.is_file():
        return [path]
    if path.is_dir():
        return sorted(p for p in path.rglob("*") if p.is_file())
    return []


_Job = tuple[Path, _StatKey, "Future[str | None]", Path | None, list[int] | None]


def _hash_pending(jobs: list[_Job]) -> None:
    for path, key, fut, folder, identity in jobs:
        digest: str | None = None
        try:
            digest = _hash_now(path)
            # a file that changed while being hashed may have mixed contents: no answer
            if _stat_key(path) != key:
                digest = None
            elif folder is not None and identity is not None:
                cache.store_digest(folder, path, digest, identity)
        except Exception:  # the reader hashes again itself and reports the error
            digest = None
        finally:
            fut.set_result(digest)


def digest_folders(trace: Trace) -> dict[Path, Path]:
    """The input file whose sha256 its frame cache keeps (`nsysan.load.cache.stored_digest`),
    and that folder; empty without a frame cache."""
    folder = trace.meta.frame_cache
    return {Path(trace.meta.source_path): folder} if folder is not None else {}


def prefetch_sha256(paths: Iterable[Path], cached: Mapping[Path, Path] | None = None) -> None:
    """Start hashing ``paths`` (files, or every file of a directory) in a background thread
    for a manifest written later in this process (see `sha256_file`). ``cached``: file ->
    its frame cache folder (`digest_folders`), where the digest of that very version of the
    file is taken from when kept, and kept once computed."""
    jobs: list[_Job] = []
    cached = {os.path.abspath(k): v for k, v in (cached or {}).items()}
    with _PENDING_LOCK:
        for f in (f for p in paths for f in _files_of(Path(p))):
            key = _stat_key(f)
            if key is None or key in _PENDING:
                continue
            fut: Future[str | None] = Future()
            _PENDING[key] = fut
            folder = cached.get(os.path.abspath(f))
            identity = cache.file_identity(f) if folder is not None else None
            kept = cache.stored_digest(folder, f) if folder is not None else None
            if kept is not None:
                fut.set_result(kept)
            else:
                jobs.append((f, key, fut, folder, identity))
    if jobs:
        # daemon: an interrupted run does not wait for a hash nobody will read
        threading.Thread(target=_hash_pending, args=(jobs,), name="nsysan-sha256",
                         daemon=True).start()


def sha256_file(path: Path) -> str:
    """sha256 of the file's contents (the prefetched hash of this exact version, if any)."""
    key = _stat_key(path)
    with _PENDING_LOCK:
        fut = _PENDING.pop(key, None) if key is not None else None
    digest = fut.result() if fut is not None else None
    return digest if digest is not None else _hash_now(path)


def describe_path(path: Path, root: Path | None = None) -> dict[str, Any]:
    """``{path, kind, bytes, sha256}`` of a file or a directory (None fields when absent)."""
    path = Path(path)
    shown = str(path.relative_to(root)) if root is not None else str(path)
    if path.is_file():
        return {"path": shown, "kind": "file", "bytes": path.stat().st_size,
                "sha256": sha256_file(path)}
    if path.is_dir():
        files = _files_of(path)
        h = hashlib.sha256()
        size = 0
        for p in files:
            h.update(f"{p.relative_to(path).as_posix()}\0{sha256_file(p)}\n".encode())
            size += p.stat().st_size
        return {"path": shown, "kind": "dir", "bytes": size, "sha256": h.hexdigest(),
                "n_files": len(files)}
    return {"path": shown, "kind": "missing", "bytes": None, "sha256": None}


def default_inputs(trace: Trace) -> list[Path]:
    """The inputs a manifest describes unless told otherwise: what the user passed and what
    the frames were read from (once when they are the same)."""
    return list(dict.fromkeys([Path(trace.meta.path), Path(trace.meta.source_path)]))


def inputs_of(trace: Trace, info: ManifestInfo) -> list[Path]:
    """The inputs the manifest of ``trace`` describes: ``info.inputs``, else the defaults."""
    return list(info.inputs) if info.inputs is not None else default_inputs(trace)


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
    inputs = inputs_of(trace, info)
    return _clean({
        "manifest_version": MANIFEST_VERSION,
        "created_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "nsysan_version": __version__,
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
        "raw_tables": dict(meta.tables),
        "not_captured": meta.missing,
        "notes": meta.notes,
        # rows repaired or dropped per frame and rule (docs/data-quality.md)
        "quality": meta.quality_summary(),
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
