"""Owned outputs: nsysan writes, replaces or deletes only what it wrote itself.

The rule (user-facing description: docs/outputs.md):

* Every folder nsysan makes holds a **marker**, ``.nsysan-output.json``: the kind of output
  (``analysis``, ``job``, ``baseline``; ``diff`` for the files of ``nsysan diff -o``), the nsysan
  version, the inputs it was made from (real paths; size and sha256 when known) and every file
  nsysan wrote there. Folders written by earlier versions, before markers existed, are
  recognised by their ``manifest.json`` listing every file in them (`legacy_analysis`).
* An existing folder is **replaced only when its marker says nsysan wrote it**, as the same kind
  of output, from the same input (the same real path, or the same content at another path: a
  moved archive), and nothing else is in it. Otherwise nothing is touched and `OutputError`
  says why and what to do; files someone added to a folder nsysan wrote are named, never
  removed.
* An output that **is, contains or lies inside an input** is refused (`InputPaths`).
* A folder is written under a temporary name, ``.<name>.nsysan-tmp-<host>-<pid>-<random>``,
  that holds the marker from its first moment, and is swapped into place when complete (an
  atomic exchange where the kernel has one), so a folder under the final name is always
  complete. Only entries with that name, a marker inside (or nothing at all), written by a
  process of this host that is no longer alive, are ever cleaned up (`clean_stale`).
* Every file is written atomically, and a failure of the file system becomes one
  `OutputError` line, after what was half-written has been removed (`nsysan.report.atomic`).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nsysan._version import __version__
from nsysan.errors import OutputError
from nsysan.report.atomic import (
    TEMP_NAME,
    atomic_write,
    host_tag,
    is_stale_temp,
    temp_prefix,
    umask,
    write_errors,
)

MARKER = ".nsysan-output.json"
MARKER_FORMAT = 1
#: nsysan.batch.state's done marker, written into a finished folder (named here: the report
#: layer sits below batch)
BATCH_MARKER = ".nsysan-done.json"
MANIFEST = "manifest.json"
_OWN_NAMES = frozenset({MARKER, BATCH_MARKER})
_SHOWN = 5  # foreign names listed in a message
_AT_FDCWD = -100
_RENAME_NOREPLACE, _RENAME_EXCHANGE = 1, 2

#: a recogniser of folders an earlier nsysan wrote without a marker: the files it wrote there
#: (relative paths), or None when the folder is not one
Legacy = Callable[[Path], "frozenset[str] | None"]


def shown(names: Sequence[str]) -> str:
    """Names for a one-line message: control characters replaced, at most `_SHOWN` of them."""
    clean = ["".join(c if c.isprintable() else "?" for c in n) for n in names[:_SHOWN]]
    more = f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else ""
    return ", ".join(clean) + more


def real(path: str | os.PathLike[str]) -> str:
    return os.path.realpath(os.fspath(path))


def _entries(folder: Path, rel: str = "") -> Iterator[str]:
    """Everything under ``folder`` as relative paths, sorted: files, links and other non-folders,
    and empty folders; links are not followed."""
    with os.scandir(folder) as it:
        found = sorted(it, key=lambda e: e.name)
    if not found and rel:
        yield rel
    for e in found:
        r = f"{rel}/{e.name}" if rel else e.name
        if e.is_dir(follow_symlinks=False):
            yield from _entries(Path(e.path), r)
        else:
            yield r


def write_marker(folder: Path, doc: Mapping[str, Any]) -> None:
    text = json.dumps({"nsysan_output": MARKER_FORMAT, **doc}, indent=1, sort_keys=True,
                      ensure_ascii=False) + "\n"
    atomic_write(folder / MARKER, text)


def read_marker(folder: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The marker of ``folder``, or None when it has none (or an unreadable one)."""
    try:
        with open(Path(folder) / MARKER, encoding="utf-8") as fh:
            doc = json.load(fh)
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("nsysan_output") != MARKER_FORMAT:
        return None
    return doc


# --- who wrote a folder ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Owner:
    """What a folder says about the nsysan run that wrote it."""

    kind: str
    inputs: tuple[Mapping[str, Any], ...]  # {"path", "bytes", "sha256"}; () when unknown
    files: frozenset[str] | None  # what nsysan wrote there; None: all of it (a temp folder)
    legacy: bool = False

    def owns(self, rel: str) -> bool:
        if self.files is None or rel in self.files:
            return True
        base = rel.rpartition("/")[2]
        return base in _OWN_NAMES or TEMP_NAME.match(base) is not None


def legacy_analysis(folder: Path) -> frozenset[str] | None:
    """An analysis folder written before markers existed: its manifest.json lists every file."""
    try:
        with open(folder / MANIFEST, encoding="utf-8") as fh:
            doc = json.load(fh)
    except (OSError, ValueError):
        return None
    if not (isinstance(doc, dict) and "manifest_version" in doc and "nsysan_version" in doc
            and isinstance(doc.get("outputs"), list)):
        return None
    listed = {o.get("path") for o in doc["outputs"] if isinstance(o, dict)}
    return frozenset({MANIFEST, *(p for p in listed if isinstance(p, str))})


def legacy_files(allowed: Callable[[str], bool], required: str) -> Legacy:
    """A recogniser of folders an earlier nsysan wrote without a marker, for outputs without a
    manifest: a folder holding ``required`` and otherwise only files named as ``allowed``."""

    def recognise(folder: Path) -> frozenset[str] | None:
        names = {r for r in _entries(folder) if r.rpartition("/")[2] not in _OWN_NAMES}
        ok = required in names and all("/" not in n and allowed(n) for n in names)
        return frozenset(names) if ok else None

    return recognise


def _legacy_inputs(folder: Path) -> tuple[Mapping[str, Any], ...]:
    try:
        with open(folder / MANIFEST, encoding="utf-8") as fh:
            inputs = json.load(fh).get("inputs") or []
    except (OSError, ValueError, AttributeError):
        return ()
    return tuple(i for i in inputs if isinstance(i, dict) and isinstance(i.get("path"), str))


def owner_of(folder: Path, legacy: Legacy | None = None) -> Owner | None:
    """Who wrote ``folder``: its marker, else what ``legacy`` recognises; None: not nsysan."""
    doc = read_marker(folder)
    if doc is not None:
        files = doc.get("files")
        inputs = doc.get("inputs") or []
        return Owner(
            kind=str(doc.get("kind")),
            inputs=tuple(i for i in inputs if isinstance(i, dict)),
            files=frozenset(files) if isinstance(files, list) else None,
        )
    if legacy is None:
        return None
    files = legacy(folder)
    if files is None:
        return None
    inputs = _legacy_inputs(folder) if legacy is legacy_analysis else ()
    return Owner(kind="", inputs=inputs, files=files, legacy=True)


def foreign_entries(folder: Path, owner: Owner) -> list[str]:
    """Top-level names in ``folder`` that hold something nsysan did not write, sorted."""
    return sorted({r.partition("/")[0] for r in _entries(folder) if not owner.owns(r)})


def _size(path: Path) -> int:
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return path.stat().st_size


def same_input(owner: Owner, inputs: Sequence[Path]) -> bool:
    """``owner`` recorded one of ``inputs`` (the same real path), or the same content as the
    first of them at another path (compared by size, then sha256). A folder that recorded no
    input (written before markers existed, without a manifest) counts as the same."""
    if not owner.inputs or not inputs:
        return True
    recorded = {real(i["path"]) for i in owner.inputs if isinstance(i.get("path"), str)}
    if recorded & {real(p) for p in inputs}:
        return True
    first = owner.inputs[0]
    digest, size = first.get("sha256"), first.get("bytes")
    if not isinstance(digest, str) or not isinstance(size, int):
        return False
    try:
        if _size(Path(inputs[0])) != size:
            return False
        from nsysan.report.manifest import describe_path  # (manifest needs this module)

        return describe_path(Path(inputs[0]))["sha256"] == digest
    except OSError:
        return False


class InputPaths:
    """The inputs of one invocation, to refuse an output that is, contains or lies inside
    one of them (real paths compared; a check costs the depth of the output path)."""

    def __init__(self, paths: Iterable[str | os.PathLike[str]]):
        self._inputs: dict[str, str] = {}
        self._under: dict[str, str] = {}  # each folder above an input -> that input
        for p in paths:
            r = real(p)
            self._inputs.setdefault(r, os.fspath(p))
            for parent in Path(r).parents:
                self._under.setdefault(str(parent), os.fspath(p))

    def conflict(self, output: str | os.PathLike[str], *, holding: bool = True) -> str | None:
        """Why ``output`` may not be written (None: it may); ``holding=False`` allows an
        output folder that holds inputs (a batch output root beside its traces)."""
        r = real(output)
        if r in self._inputs:
            return f"it is the input {self._inputs[r]}"
        if holding and r in self._under:
            return f"it contains the input {self._under[r]}"
        for parent in Path(r).parents:
            if str(parent) in self._inputs:
                return f"it lies inside the input {self._inputs[str(parent)]}"
        return None

    def check(self, output: str | os.PathLike[str], option: str = "-o", *,
              holding: bool = True) -> None:
        why = self.conflict(output, holding=holding)
        if why is not None:
            raise OutputError(f"{output}: refusing to write there: {why}; choose another "
                              f"{option}")


def check_not_in_export(folder: Path, option: str = "-o") -> None:
    """Refuse to write into (or under) an nsys parquetdir export, an input of this run or not:
    its loader would take nsysan's Parquet files for tables of the capture."""
    from nsysan.load.parquetdir import is_parquetdir

    for p in (Path(real(folder)), *Path(real(folder)).parents):
        if is_parquetdir(p):
            raise OutputError(f"{folder}: refusing to write there: it lies inside the nsys "
                              f"parquetdir export {p}; choose another {option}")


# --- replacing a folder ------------------------------------------------------------------------
def check_replaceable(final: Path, *, kind: str, inputs: Sequence[Path], option: str = "-o",
                      legacy: Legacy | None = None, same_input_only: bool = True) -> None:
    """Raise `OutputError` unless ``final`` is absent or a folder nsysan may replace: written
    by nsysan as ``kind`` output (from one of ``inputs`` when ``same_input_only``), holding
    nothing else."""
    try:
        st = os.lstat(final)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        raise OutputError(f"{final} is a symbolic link: nsysan replaces only folders it wrote; "
                          f"remove the link or choose another {option}")
    if not stat.S_ISDIR(st.st_mode):
        raise OutputError(f"{final} exists and is not a folder nsysan wrote: move it away or "
                          f"choose another {option}")
    owner = owner_of(final, legacy)
    if owner is None:
        raise OutputError(f"{final} exists and was not written by nsysan (it has no {MARKER}): "
                          f"nsysan does not replace it; move it away or choose another {option}")
    if owner.files is None:  # a temporary folder's marker under a final name: not finished
        raise OutputError(f"{final} holds unfinished nsysan outputs (its marker lists no "
                          f"files): move it away or choose another {option}")
    if not owner.legacy and owner.kind != kind:
        raise OutputError(f"{final} holds nsysan {owner.kind} outputs, not {kind} outputs: "
                          f"choose another {option}")
    if same_input_only and not same_input(owner, inputs):
        was = owner.inputs[0].get("path")
        raise OutputError(f"{final} holds the outputs of another input ({was}): choose another "
                          f"{option}, or remove {final} to replace it")
    foreign = foreign_entries(final, owner)
    if foreign:
        raise OutputError(f"{final} holds files nsysan did not write ({shown(foreign)}): "
                          f"nsysan replaces a folder it wrote only when nothing else is in it; "
                          f"move them out, or choose another {option}")


def _renameat2(src: Path, dst: Path, flags: int) -> bool | None:
    """Linux renameat2; None where the kernel, the C library or the file system lacks it."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return None
    if fn(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), flags) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return None
    raise OSError(code, os.strerror(code), str(dst))


def remove_owned(folder: Path, legacy: Legacy | None = None) -> list[str]:
    """Delete what nsysan wrote in ``folder`` (per its marker) and the folder itself when
    nothing else is left in it; returns what was left (someone else's), which stays put."""
    owner = owner_of(folder, legacy)
    if owner is None:
        return ["(not nsysan's)"]
    if owner.files is None:  # a temporary folder: all of it is nsysan's
        shutil.rmtree(folder)
        return []
    left = []
    for rel in _entries(folder):
        if rel == MARKER:
            continue
        if not owner.owns(rel):
            left.append(rel)
            continue
        path = folder / rel
        if path.is_dir() and not path.is_symlink():
            path.rmdir()
        else:
            path.unlink()
    if left:
        return left  # the marker stays: the folder is still recognisably nsysan's
    (folder / MARKER).unlink(missing_ok=True)
    for dirpath, _, _ in sorted(os.walk(folder), key=lambda w: -len(w[0])):
        os.rmdir(dirpath)
    return []


def clean_stale(root: str | os.PathLike[str], *, files: bool = False) -> list[Path]:
    """Remove the temporary folders (with ``files``, also the temporary files) that nsysan
    processes of this host, dead now, left in ``root``. Only an entry with nsysan's temporary
    name is considered, and a folder only with a marker inside, or with nothing but such dead
    temporary files (a process killed while it wrote the folder's first marker leaves the
    marker's temporary file alone in it), or nothing at all."""
    removed: list[Path] = []
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except OSError:
        return removed
    for e in entries:
        if not e.name.startswith(".") or not is_stale_temp(e.name):
            continue
        path = Path(e.path)
        with contextlib.suppress(OSError):  # (another process may clean it at the same time)
            if e.is_dir(follow_symlinks=False):
                if read_marker(path) is not None and not remove_owned(path):
                    removed.append(path)
                elif _only_stale_files(path):
                    for inner in os.scandir(path):
                        os.unlink(inner.path)
                    path.rmdir()
                    removed.append(path)
            elif files and e.is_file(follow_symlinks=False):
                path.unlink()
                removed.append(path)
    return removed


def _only_stale_files(folder: Path) -> bool:
    """True when ``folder`` holds nothing but files with nsysan's temporary name of a dead
    process of this host (or nothing at all)."""
    return all(e.is_file(follow_symlinks=False) and is_stale_temp(e.name)
               for e in os.scandir(folder))


@dataclass
class OwnedFolder:
    """A folder being (re)written: the outputs go into ``tmp``; `commit` puts them in place of
    ``final``, `abort` removes them."""

    final: Path
    tmp: Path
    kind: str
    inputs: tuple[Path, ...]
    option: str = "-o"
    legacy: Legacy | None = None
    same_input_only: bool = True
    committed: bool = False

    def _check(self) -> None:
        check_replaceable(self.final, kind=self.kind, inputs=self.inputs, option=self.option,
                          legacy=self.legacy, same_input_only=self.same_input_only)

    def commit(self, described: Sequence[Mapping[str, Any]] = ()) -> Path:
        """Record what was written (``described``: size and sha256 of the inputs, in order,
        where known) and swap ``tmp`` into place of ``final``."""
        with write_errors(self.final, self.option):
            inputs = []
            for i, p in enumerate(self.inputs):
                d = described[i] if i < len(described) else {}
                inputs.append({"path": real(p), "bytes": d.get("bytes"),
                               "sha256": d.get("sha256")})
            write_marker(self.tmp, {
                "kind": self.kind, "nsysan_version": __version__, "inputs": inputs,
                "files": [r for r in _entries(self.tmp) if r != MARKER],
            })
            self._check()  # again: something may have appeared there meanwhile
            if os.path.lexists(self.final):
                self._replace()
            else:
                if _renameat2(self.tmp, self.final, _RENAME_NOREPLACE) is None:
                    os.rename(self.tmp, self.final)
                self.committed = True
        return self.final

    def _replace(self) -> None:
        if _renameat2(self.tmp, self.final, _RENAME_EXCHANGE):
            self.committed = True
            remove_owned(self.tmp, self.legacy)  # the old folder, under the temporary name
            return
        old = Path(tempfile.mkdtemp(prefix=temp_prefix(self.final.name, "old"),
                                    dir=self.final.parent))
        os.rmdir(old)  # only its (unique) name was wanted
        os.rename(self.final, old)
        os.rename(self.tmp, self.final)
        self.committed = True
        remove_owned(old, self.legacy)

    def abort(self) -> None:
        """Remove the temporary folder after a failure (nothing once committed: the name may
        then hold the replaced folder, whose removal keeps what is not nsysan's)."""
        if not self.committed:
            shutil.rmtree(self.tmp, ignore_errors=True)


def prepare(root: str | os.PathLike[str], name: str, *, kind: str,
            inputs: Iterable[str | os.PathLike[str]], protect: InputPaths | None = None,
            option: str = "-o", legacy: Legacy | None = None,
            same_input_only: bool = True) -> OwnedFolder:
    """Check that ``root/name`` may be (re)written with ``kind`` outputs of ``inputs`` and
    make its temporary folder (marked as nsysan's from the start). Raises `OutputError`,
    touching nothing, when it may not; ``protect``: every input of the invocation (default:
    ``inputs``), none of which the folder may be, contain or lie inside."""
    root_path = Path(root)
    final = root_path / name
    paths = tuple(Path(p) for p in inputs)
    folder: OwnedFolder | None = None
    with write_errors(final, option):
        for given in (InputPaths(paths), protect):
            if given is not None:
                given.check(final, option)
        check_not_in_export(root_path, option)
        root_path.mkdir(parents=True, exist_ok=True)
        check_replaceable(final, kind=kind, inputs=paths, option=option, legacy=legacy,
                          same_input_only=same_input_only)
        clean_stale(root_path)
        tmp = Path(tempfile.mkdtemp(prefix=temp_prefix(name), dir=root_path))
        folder = OwnedFolder(final, tmp, kind, paths, option, legacy, same_input_only)
        try:
            os.chmod(tmp, 0o777 & ~umask())  # mkdtemp makes it private; outputs are for readers
            write_marker(tmp, {"kind": kind, "state": "writing",
                                "writer": {"host": host_tag(), "pid": os.getpid()}})
        except BaseException:
            folder.abort()
            raise
    return folder


@contextlib.contextmanager
def replacing(root: str | os.PathLike[str], name: str, **kwargs: Any) -> Iterator[OwnedFolder]:
    """`prepare` ``root/name``; the block writes into ``folder.tmp`` and calls ``commit``;
    whatever fails in it, the temporary folder is removed (file-system failures become
    `OutputError`)."""
    folder = prepare(root, name, **kwargs)
    try:
        with write_errors(folder.final, folder.option):
            yield folder
    finally:
        folder.abort()
