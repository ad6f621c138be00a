"""Turn ``nsysan batch`` inputs (files, directories, globs) into a list of unique traces.

Rules (simple and predictable on purpose):

* A **file** named on the command line is one trace, whatever its suffix (the loader decides
  whether it is usable; an unusable file becomes a failed run, not a silent omission).
* A **directory** is searched recursively, in sorted order, for ``*.nsys-rep``, ``*.qdrep`` and
  ``*.sqlite`` files; every match is one trace — except that a report and its own exports side
  by side (``x.nsys-rep``, ``x.nsys-rep.nsys2022.4.2.sqlite``, ``x.sqlite``, a
  ``x.nsys2023.4.4.parquetdir``) are **one capture**: one trace, whose other forms are its
  aliases (rules and the form analysed: `nsysan.batch.captures`). Hidden entries
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
* The same file reached twice (two inputs, symlinks) is one trace; a directory reached again
  through a symlink (a loop) is searched once.
* What is neither a regular file nor a directory — a named pipe, a socket, a device, a symlink
  loop, a dangling link — is never read while searching (a pipe would block the batch): when
  it is named as an input, or found in a directory under a trace suffix, it is a trace that
  fails with the reason (`nsysan.load.check_openable`), never silently dropped.

Trace ids: the path relative to the common root of all traces, with ``/`` replaced by
``__`` and every character outside ``[A-Za-z0-9._+-]`` by ``_`` (leading dots dropped), e.g.
``sc22-ddp-4gpu-nccl__4gpu_baseline.nsys-rep``; a capture of several forms takes the id of its
report's path (whichever form is analysed). Suffixes are kept. If two paths still map to one
id, each gets ``-<8 hex of sha1(path)>`` appended; ids longer than 150 characters are cut and
get the same suffix.
"""

from __future__ import annotations

import glob
import hashlib
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from nsysan.batch.captures import Capture, group_captures
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
    #: the capture's other forms (a report and its exports: `nsysan.batch.captures`)
    aliases: tuple[Path, ...] = ()

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


def _resolved(path: Path) -> Path:
    """``path`` with symlinks resolved; a symlink loop (which ``resolve`` refuses) or a
    dangling link as is (its own name identifies it, not its missing target)."""
    if not os.path.exists(path):
        return path.absolute()
    try:
        return path.resolve()
    except (OSError, RuntimeError):
        return path.absolute()


def _walk(root: Path, exclude: set[Path], seen: set[tuple[int, int]] | None = None
          ) -> Iterable[Path]:
    """Trace files and parquetdirs under ``root``, depth first in sorted order; each directory
    once (``seen``: device and inode of the directories entered)."""
    if root in exclude:
        return
    seen = set() if seen is None else seen
    try:
        st = root.stat()
    except OSError as exc:
        raise ConfigError(f"cannot list directory {root}: {exc.strerror}") from None
    if (st.st_dev, st.st_ino) in seen:  # reached again through a symlink
        return
    seen.add((st.st_dev, st.st_ino))
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
        try:
            is_dir, is_file = entry.is_dir(), entry.is_file()
        except OSError:  # e.g. a symlink loop on some filesystems
            is_dir = is_file = False
        if is_dir:
            yield from _walk(path, exclude, seen)
        elif entry.name.lower().endswith(TRACE_SUFFIXES):
            # a regular file, or something that only looks like one (a pipe, a socket, a
            # symlink loop or a dangling link): a trace either way, which fails with the
            # reason instead of vanishing
            yield path if is_file else path.absolute()


def _expand(item: str | os.PathLike[str], exclude: set[Path]) -> list[Path]:
    text = os.fspath(item)
    path = Path(text).expanduser()
    if path.exists() or os.path.lexists(path):  # (a symlink loop or a dangling link too)
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
        resolved = _resolved(match)
        if resolved.is_dir():
            found.extend(_resolved(p) for p in _walk(resolved, exclude))
        else:
            # Named explicitly (or by a glob): a trace whatever its suffix, and whatever it
            # is (a pipe or a loop fails as a trace, with the reason).
            found.append(resolved)
    return found


def _safe_id(rel: str) -> str:
    parts = [p for p in rel.replace(os.sep, "/").split("/") if p not in ("", ".")]
    text = "__".join(_UNSAFE.sub("_", p) for p in parts).lstrip(".")
    return text or "trace"


def _with_hash(text: str, path: Path) -> str:
    digest = hashlib.sha1(os.fsencode(path)).hexdigest()[:8]
    return f"{text[: _MAX_ID - 9]}-{digest}"


def assign_ids(paths: Sequence[Path],
               captures: Sequence[Capture] | None = None) -> list[TraceInput]:
    """Unique, filesystem-safe trace ids for resolved ``paths`` (see the module docstring);
    with ``captures`` (one per path: ``paths`` are their keys), each trace is its capture's
    chosen form with its aliases."""
    if not paths:
        return []
    parents = [str(p.parent) for p in paths]
    root = Path(os.path.commonpath(parents)) if len(paths) > 1 else paths[0].parent
    ids = [_safe_id(os.path.relpath(p, root)) for p in paths]
    counts: dict[str, int] = {}
    for tid in ids:
        counts[tid] = counts.get(tid, 0) + 1
    out = []
    forms = captures if captures is not None else [Capture(p, p) for p in paths]
    for path, tid, cap in zip(paths, ids, forms, strict=True):
        if counts[tid] > 1 or len(tid) > _MAX_ID:
            tid = _with_hash(tid, path)
        out.append(TraceInput(trace_id=tid, path=cap.path, format=trace_format(cap.path),
                              aliases=cap.aliases))
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
    captures = group_captures(paths)
    return assign_ids([c.key for c in captures], captures)
