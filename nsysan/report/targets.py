"""Outputs into places the user named: the files of ``nsysan diff -o DIR`` in a folder that
may be the user's own, the JUnit report of ``nsysan check --junit FILE`` and the summary it
appends to (``--summary``, ``$GITHUB_STEP_SUMMARY``).

The ownership rule of `nsysan.report.ownership` applies file by file: nsysan replaces a file
only when it wrote it (the folder's marker lists it, or for a single file, `write_file`'s
``is_ours`` recognises its content), never writes over or into an input, and appends only to
regular files (or character devices such as /dev/stdout). Failures are one `OutputError`.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from nsysan._version import __version__
from nsysan.errors import OutputError
from nsysan.report.atomic import atomic_write, temp_file, write_errors
from nsysan.report.ownership import (
    MARKER,
    InputPaths,
    Legacy,
    check_not_in_export,
    clean_stale,
    legacy_analysis,
    owner_of,
    read_marker,
    real,
    shown,
    write_marker,
)


def check_files(folder: str | os.PathLike[str], files: Iterable[str], *, kind: str,
                names: Sequence[str], inputs: Iterable[str | os.PathLike[str]] = (),
                option: str = "-o", legacy: Legacy | None = None) -> set[str]:
    """Raise `OutputError` when `write_files` would refuse to write ``files`` (names) into
    ``folder``; else the names nsysan wrote there before."""
    out = Path(folder)
    with write_errors(out, option):
        InputPaths(inputs).check(out, option)
        check_not_in_export(out, option)
        if not os.path.lexists(out):
            return set()
        if not out.is_dir():
            raise OutputError(f"{out} is not a folder: choose another {option}")
        owner = owner_of(out, legacy)
        other = (owner.kind if owner is not None and not owner.legacy else
                 "analysis" if owner is None and legacy_analysis(out) is not None else kind)
        if other != kind:
            raise OutputError(f"{out} holds nsysan {other} outputs: write the {kind} files "
                              f"elsewhere (another {option})")
        ours = set(owner.files or ()) if owner is not None else set()
        clash = [n for n in names if os.path.lexists(out / n) and n not in ours]
        if clash:
            raise OutputError(f"{out}: {shown(clash)} already there and not written by "
                              f"nsysan: move them away, or choose another {option}")
        for n in files:
            if os.path.lexists(out / n) and not (out / n).is_file():
                raise OutputError(f"{out / n} is not a regular file: move it away, or choose "
                                  f"another {option}")
    return ours


def write_files(folder: str | os.PathLike[str], files: Mapping[str, bytes | str], *,
                kind: str, names: Sequence[str], inputs: Iterable[str | os.PathLike[str]] = (),
                option: str = "-o", legacy: Legacy | None = None) -> list[Path]:
    """Write ``files`` (name -> content) into ``folder``, which may be the user's own (made
    when absent). Of the names nsysan may write there (``names``), one that exists is
    replaced only when the folder's marker lists it as nsysan's; the others it wrote there
    before and does not write now are removed, so the set stays consistent. Each file is
    written atomically; the marker is updated before any file is replaced and after."""
    out = Path(folder)
    inputs = list(inputs)
    created = False
    with write_errors(out, option):
        ours = check_files(out, files, kind=kind, names=names, inputs=inputs, option=option,
                           legacy=legacy)
        if not os.path.lexists(out):
            out.mkdir(parents=True)
            created = True
        elif read_marker(out) is not None:
            clean_stale(out, files=True)
        temps: dict[str, Path] = {}
        done = False
        try:
            for n, data in files.items():
                temps[n] = temp_file(out / n)
                temps[n].write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
            doc = {"kind": kind, "nsysan_version": __version__,
                   "inputs": [{"path": real(p)} for p in inputs]}
            write_marker(out, {**doc, "files": sorted(ours | set(files))})
            for n, tmp in temps.items():
                os.replace(tmp, out / n)
            for n in sorted(ours - set(files)):
                if n in names and (out / n).is_file():
                    (out / n).unlink()
            write_marker(out, {**doc, "files": sorted(files)})
            done = True
        finally:
            for tmp in temps.values():
                tmp.unlink(missing_ok=True)
            if created and not done:  # the folder it made for nothing: gone again
                (out / MARKER).unlink(missing_ok=True)
                with contextlib.suppress(OSError):
                    out.rmdir()
    return [out / n for n in files]


def _target(path: Path, inputs: Iterable[str | os.PathLike[str]], option: str,
            appending: bool) -> os.stat_result | None:
    """Refuse to write ``path`` when it is (or lies inside) an input or is not a file nsysan
    may write; its stat when it exists."""
    try:
        st: os.stat_result | None = os.stat(path)
    except FileNotFoundError:
        st = None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise OutputError(f"{path} is a folder: give {option} a file path")
    InputPaths(inputs).check(path, option)
    if st is None or not stat.S_ISCHR(st.st_mode):  # (/dev/stdout lies in no export)
        check_not_in_export(path.parent, option)
    if st is None:
        return None
    if not (stat.S_ISREG(st.st_mode) or (appending and stat.S_ISCHR(st.st_mode))):
        raise OutputError(f"{path} is not a regular file: give {option} another path")
    return st


def check_file(path: str | os.PathLike[str], *, inputs: Iterable[str | os.PathLike[str]] = (),
               option: str, is_ours: Callable[[Path], bool] | None = None,
               appending: bool = False) -> None:
    """Raise `OutputError` now, before any analysis, when `write_file` (`append_file` with
    ``appending``) would refuse ``path``."""
    p = Path(path)
    with write_errors(p, option):
        st = _target(p, inputs, option, appending)
        if (st is not None and not appending and st.st_size and is_ours is not None
                and not is_ours(p)):
            raise OutputError(f"{p} exists and was not written by nsysan: move it away, or "
                              f"give {option} another path")


def write_file(path: str | os.PathLike[str], data: str | bytes, *,
               inputs: Iterable[str | os.PathLike[str]] = (), option: str,
               is_ours: Callable[[Path], bool] | None = None) -> Path:
    """Write ``data`` to ``path`` atomically; an existing file is replaced only when empty or
    when ``is_ours`` recognises it as one nsysan wrote (any file when None)."""
    inputs = list(inputs)
    check_file(path, inputs=inputs, option=option, is_ours=is_ours)
    with write_errors(path, option):
        return atomic_write(Path(path), data)


def append_file(path: str | os.PathLike[str], text: str, *,
                inputs: Iterable[str | os.PathLike[str]] = (), option: str) -> Path:
    """Append ``text`` to ``path`` (made when absent, with its folder)."""
    p = Path(path)
    inputs = list(inputs)
    check_file(p, inputs=inputs, option=option, appending=True)
    with write_errors(p, option):
        p.parent.mkdir(parents=True, exist_ok=True)
        with open(p, "a", encoding="utf-8") as fh:
            fh.write(text)
    return p
