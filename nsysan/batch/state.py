"""Resumability: what makes a finished trace skippable, and the marker that says it finished.

The **skip key** of a trace is sha256 over canonical JSON of

* the sha256 of the input content (a file streamed in 1 MiB chunks; a parquetdir as every
  file's relative name, size and content, in sorted order),
* the nsysan version,
* the canonical JSON of the analysis parameters: the resolved pass list, every pass's full
  params dataclass (defaults included, so a changed default also invalidates) and the
  per-step options.

A trace is done when ``OUT/<trace_id>/.nsysan-done.json`` exists and holds the same key. The
marker is written **last**, after `nsysan.api.write_outputs` has renamed the finished output
directory into place, with its own temp-file + rename; so an interrupted run leaves either no
directory, a directory without a marker (redone on the next run), or a complete one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from nsysan._version import __version__

MARKER = ".nsysan-done.json"
MARKER_VERSION = 1
_CHUNK = 1 << 20


def _update_from_file(h: Any, path: Path) -> None:
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            h.update(view[:n])


def content_sha256(path: str | os.PathLike[str]) -> str:
    """sha256 of a file's bytes, or of a directory's files (relative names, sizes, bytes)."""
    p = Path(path)
    h = hashlib.sha256()
    if p.is_dir():
        files = sorted(
            (f for f in p.rglob("*") if f.is_file()), key=lambda f: f.relative_to(p).as_posix()
        )
        for f in files:
            # Name and size delimit each file, so moving bytes between files changes the hash.
            h.update(f"{f.relative_to(p).as_posix()}\0{f.stat().st_size}\0".encode())
            _update_from_file(h, f)
    else:
        _update_from_file(h, p)
    return h.hexdigest()


def input_bytes(path: str | os.PathLike[str]) -> int:
    p = Path(path)
    if p.is_dir():
        return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
    return p.stat().st_size


def tree_bytes(path: str | os.PathLike[str]) -> int:
    """Total size of the files under ``path`` (0 when it does not exist)."""
    p = Path(path)
    if not p.exists():
        return 0
    return input_bytes(p)


def canonical_json(obj: Any) -> str:
    """Deterministic JSON: sorted keys, no whitespace, tuples as lists, dataclasses as dicts."""

    def default(o: Any) -> Any:
        if dataclasses.is_dataclass(o) and not isinstance(o, type):
            return dataclasses.asdict(o)
        if isinstance(o, (set, frozenset)):
            return sorted(o)
        if isinstance(o, os.PathLike):
            return os.fspath(o)
        return repr(o)

    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=default)


def analysis_params(
    passes: Iterable[str] | None,
    settings: Mapping[str, str] | None,
    options: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The effective analysis parameters, as JSON-ready data (raises ConfigError when invalid).

    Resolving here, in the coordinating process, rejects a bad ``--passes``/``--set`` before any
    worker starts, and makes the skip key depend on values rather than on how they were spelled.
    """
    from nsysan.passes import registry

    specs = registry.resolve(passes)
    params = registry.build_params(specs, settings)
    data = {
        "passes": [s.name for s in specs],
        "params": {name: dataclasses.asdict(p) for name, p in params.items()},
        "options": {k: v for k, v in sorted((options or {}).items()) if v is not None},
    }
    # Round-trip so tuples become lists: the key must not depend on Python container types.
    return json.loads(canonical_json(data))


def skip_key(input_sha256: str, params: Mapping[str, Any], version: str | None = None) -> str:
    payload = {
        "input_sha256": input_sha256,
        "nsysan_version": version or __version__,
        "params": params,
    }
    return hashlib.sha256(canonical_json(payload).encode()).hexdigest()


def read_marker(out_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The done marker of an output directory, or None when absent or unreadable."""
    path = Path(out_dir) / MARKER
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def is_done(out_dir: str | os.PathLike[str], key: str) -> dict[str, Any] | None:
    """The marker when ``out_dir`` holds finished outputs for exactly this skip ``key``."""
    marker = read_marker(out_dir)
    if marker is None or marker.get("skip_key") != key:
        return None
    return marker


def write_marker(out_dir: str | os.PathLike[str], payload: Mapping[str, Any]) -> Path:
    """Write the marker atomically (temp file, fsync, rename, fsync of the directory); a
    failure of the file system (a full disk) is an `OutputError`, the outputs stay."""
    from nsysan.report.atomic import temp_prefix, write_errors

    d = Path(out_dir)
    with write_errors(d):
        return _write_marker(d, payload, temp_prefix(MARKER))


def _write_marker(d: Path, payload: Mapping[str, Any], prefix: str) -> Path:
    final = d / MARKER
    data = json.dumps({"marker_version": MARKER_VERSION, **payload}, indent=1, sort_keys=True,
                      default=str)
    # nsysan's temporary name: one left by a kill is recognisably nsysan's inside the folder
    fd, tmp = tempfile.mkstemp(prefix=prefix, dir=d)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes it 0600; the outputs around it are readable
        os.replace(tmp, final)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    _fsync_dir(d)
    return final


def _fsync_dir(d: Path) -> None:
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some filesystems do not support fsync on directories
        pass
    finally:
        os.close(fd)


def clean_stale(out_root: str | os.PathLike[str]) -> list[Path]:
    """Remove the temporary folders that killed nsysan processes left in ``out_root``.

    Only nsysan's own are ever touched: an entry with nsysan's temporary name, holding its
    output marker (or nothing), whose writer process on this host is dead (see
    `nsysan.report.ownership.clean_stale`); a live writer's folder is never removed, and a
    look-alike such as a user's ``.notes.tmp-x`` neither.
    """
    from nsysan.report.ownership import clean_stale as clean_owned

    return clean_owned(out_root)


class BatchLock:
    """An exclusive lock on an output directory, so two batches never write one OUT at once.

    Uses ``flock`` on ``OUT/.nsysan-batch.lock``: the kernel drops it when the process dies,
    so a killed batch never leaves a stale lock behind.
    """

    def __init__(self, out_root: str | os.PathLike[str]):
        self.path = Path(out_root) / ".nsysan-batch.lock"
        self._fd: int | None = None

    def __enter__(self) -> BatchLock:
        import fcntl

        from nsysan.errors import ConfigError
        from nsysan.report.atomic import write_errors

        with write_errors(self.path.parent):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise ConfigError(
                f"another nsysan batch is writing to {self.path.parent}; wait for it or use "
                "another -o directory"
            ) from None
        self._fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
