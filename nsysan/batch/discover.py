"""Turn ``nsysan batch`` inputs (files, directories, globs) into a list of unique traces.

Rules (simple and predictable on purpose):

* A **file** named on the command line is one trace, whatever its suffix (the loader decides
  whether it is usable; an unusable file becomes a failed run, not a silent omission).
* A **directory** is searched recursively, in sorted order, for ``*.nsys-rep``, ``*.qdrep`` and
  ``*.sqlite`` files; every match is one trace. A report and its own export side by side
  (``x.nsys-rep`` and ``x.nsys-rep.nsys2022.4.2.sqlite``) are two traces. Hidden entries
  (``.name``) are skipped, and so is the batch output directory. So are nsysan's own export
  cache entries (``x.nsys-rep.nsys2022.4.2.<size>-<mtime>.sqlite``, written next to a report
  when its directory is writable, see `nsysan.load.export`) and their ``.nsysan-tmp`` files:
  they are the same trace as the report, and would otherwise appear as new traces on a rerun.
* An **nsys parquetdir** export (a directory holding ``StringIds.parquet`` or
  ``CUPTI_ACTIVITY_KIND_*.parquet``) is one trace and is not descended into — whether named
  directly or found while searching.
* A **glob** (``*``, ``?``, ``[``; ``**`` recursive; hidden names only when the pattern says
  so) expands to files and directories handled as above, minus nsysan's export cache entries.
  A glob or path that matches nothing is a `ConfigError`.
* The same file reached twice (two inputs, symlinks) is one trace.

Trace ids: the path relative to the common root of all traces, with ``/`` replaced by
``__`` and every character outside ``[A-Za-z0-9._+-]`` by ``_`` (leading dots dropped), e.g.
``sc22-ddp-4gpu-nccl__4gpu_baseline.nsys-rep``. Suffixes are kept, so a report and its export
get different ids. If two paths still map to one id, each gets ``-<8 hex of sha1(path)>``
appended; ids longer than 150 characters are cut and get the same suffix.
"""

from __future__ import annotations

import glob
import hashlib
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from nsysan.errors import ConfigError
from nsysan.load.export import SIDECAR_SUFFIX
from nsysan.load.parquetdir import is_parquetdir

TRACE_SUFFIXES = (".nsys-rep", ".qdrep", ".sqlite")
_GLOB_CHARS = re.compile(r"[*?\[]")
_UNSAFE = re.compile(r"[^A-Za-z0-9._+-]")
# nsysan.load.export's cache name: <report>.nsys<version>.<size hex>-<mtime_ns hex>.<format>
_EXPORT_CACHE = re.compile(
    r"\.(nsys-rep|qdrep)\.nsys(?:[\d.]+|unknown)\.[0-9a-f]+-[0-9a-f]+\.(sqlite|parquetdir)$"
)
_MAX_ID = 150


@dataclass(frozen=True)
class TraceInput:
    """One trace of a batch: a stable id, the resolved input path and its form."""

    trace_id: str
    path: Path
    format: str  # nsys-rep | qdrep | sqlite | parquetdir | other

    @property
    def group(self) -> str:
        """The directory part of the id ("" for traces at the root), used to compare peers."""
        head, sep, _ = self.trace_id.rpartition("__")
        return head if sep else ""


def trace_format(path: Path) -> str:
    if path.is_dir():
        return "parquetdir"
    name = path.name.lower()
    for suffix in TRACE_SUFFIXES:
        if name.endswith(suffix):
            return suffix[1:]
    return "other"


def _is_own_cache(name: str) -> bool:
    return (bool(_EXPORT_CACHE.search(name)) or ".nsysan-tmp" in name
            or name.endswith(SIDECAR_SUFFIX))


def _walk(root: Path, exclude: set[Path]) -> Iterable[Path]:
    """Trace files and parquetdirs under ``root``, depth first in sorted order."""
    if root in exclude:
        return
    if is_parquetdir(root):
        yield root
        return
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except OSError as exc:
        raise ConfigError(f"cannot list directory {root}: {exc.strerror}") from None
    for entry in entries:
        if entry.name.startswith(".") or _is_own_cache(entry.name):
            continue
        path = Path(entry.path)
        if entry.is_dir():
            yield from _walk(path, exclude)
        elif entry.is_file() and entry.name.lower().endswith(TRACE_SUFFIXES):
            yield path


def _expand(item: str | os.PathLike[str], exclude: set[Path]) -> list[Path]:
    text = os.fspath(item)
    path = Path(text).expanduser()
    if path.exists():
        matches = [path]
    elif _GLOB_CHARS.search(text):
        matches = [
            Path(m)
            for m in sorted(glob.glob(os.path.expanduser(text), recursive=True))
            if not _is_own_cache(os.path.basename(m))
        ]
        if not matches:
            raise ConfigError(f"input glob {text!r} matches nothing")
    else:
        raise ConfigError(f"input {text!r} does not exist")
    found: list[Path] = []
    for match in matches:
        resolved = match.resolve()
        if resolved.is_dir():
            found.extend(p.resolve() for p in _walk(resolved, exclude))
        elif resolved.is_file():
            # Named explicitly (or by a glob): a trace whatever its suffix.
            found.append(resolved)
    return found


def _safe_id(rel: str) -> str:
    parts = [p for p in rel.replace(os.sep, "/").split("/") if p not in ("", ".")]
    text = "__".join(_UNSAFE.sub("_", p) for p in parts).lstrip(".")
    return text or "trace"


def _with_hash(text: str, path: Path) -> str:
    digest = hashlib.sha1(os.fsencode(path)).hexdigest()[:8]
    return f"{text[: _MAX_ID - 9]}-{digest}"


def assign_ids(paths: Sequence[Path]) -> list[TraceInput]:
    """Unique, filesystem-safe trace ids for resolved ``paths`` (see the module docstring)."""
    if not paths:
        return []
    parents = [str(p.parent) for p in paths]
    root = Path(os.path.commonpath(parents)) if len(paths) > 1 else paths[0].parent
    ids = [_safe_id(os.path.relpath(p, root)) for p in paths]
    counts: dict[str, int] = {}
    for tid in ids:
        counts[tid] = counts.get(tid, 0) + 1
    out = []
    for path, tid in zip(paths, ids, strict=True):
        if counts[tid] > 1 or len(tid) > _MAX_ID:
            tid = _with_hash(tid, path)
        out.append(TraceInput(trace_id=tid, path=path, format=trace_format(path)))
    return out


def discover(
    inputs: Iterable[str | os.PathLike[str]], *, exclude: Iterable[str | os.PathLike[str]] = ()
) -> list[TraceInput]:
    """All traces named by ``inputs``, unique by resolved path, in input order, with ids."""
    excluded = {Path(e).resolve() for e in exclude}
    seen: set[Path] = set()
    paths: list[Path] = []
    items = list(inputs)
    if not items:
        raise ConfigError("no inputs: name trace files, directories or globs")
    for item in items:
        for path in _expand(item, excluded):
            if path not in seen:
                seen.add(path)
                paths.append(path)
    return assign_ids(paths)
