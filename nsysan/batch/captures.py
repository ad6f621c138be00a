"""One capture, one trace: a report and its exports beside it are the same recording.

An archive often keeps a report (``x.nsys-rep``, ``x.qdrep``) next to its exports: nsys's own
default (``x.sqlite``), the versioned names this project's traces use
(``x.nsys-rep.nsys2023.4.4.sqlite``, ``x.nsys2023.4.4.parquetdir``). Analysing each would
count the capture several times, and a report the installed nsys cannot read would fail
although its export analyses fine. `group_captures` puts the forms of one capture together;
one of them is analysed, the others are its **aliases**.

Which files are one capture (in one directory, by name only):

- a report ``R`` (``STEM.nsys-rep`` / ``STEM.qdrep``) and the exports named ``R.nsysVER.sqlite``
  or ``R.nsysVER.parquetdir``: their report's name is in theirs (also when the report itself
  is not there);
- an export named after the stem only (``STEM.sqlite``, ``STEM.nsysVER.sqlite``,
  ``STEM.nsysVER.parquetdir``) joins the capture of ``STEM`` when exactly one capture has that
  stem; when two do (``x.nsys-rep`` and ``x.qdrep`` side by side) it cannot be told whose it is,
  and stays a trace of its own.

Which form is analysed (the first that applies): a whole export (`export_is_whole`: an intact
SQLite file, or a parquetdir whose Parquet files are whole), the newest exporter version first
(a name without one last), SQLite before parquetdir, then by name; else the report (exported by
nsysan); else the first export (which then fails with its reason).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

_REPORT = re.compile(r"^(?P<stem>.+)\.(?P<ext>nsys-rep|qdrep)$", re.IGNORECASE)
_VERSION = r"\.nsys(?P<ver>\d{4}(?:\.\d+)*)"
_EXPORT_OF_REPORT = re.compile(
    rf"^(?P<report>.+\.(?:nsys-rep|qdrep)){_VERSION}\.(?P<fmt>sqlite|parquetdir)$", re.IGNORECASE)
_EXPORT_OF_STEM = re.compile(rf"^(?P<stem>.+?)(?:{_VERSION})?\.(?P<fmt>sqlite|parquetdir)$",
                             re.IGNORECASE)


@dataclass(frozen=True)
class Capture:
    """The forms of one recording: ``key`` names it (the report's path, present or not, for a
    grouped capture; the file itself otherwise), ``path`` is the form to analyse."""

    key: Path
    path: Path
    aliases: tuple[Path, ...] = ()


def export_is_whole(path: Path) -> bool:
    """An export that can be analysed as it is (see `nsysan.load.export`)."""
    from nsysan.errors import NsysanError
    from nsysan.load.export import parquet_files_whole, sqlite_file_whole

    try:
        if path.is_dir():
            return any(path.glob("*.parquet")) and parquet_files_whole(path)
        return path.is_file() and sqlite_file_whole(path)
    except (OSError, NsysanError):
        return False


def _version(text: str | None) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(".")) if text else ()


def _preference(path: Path) -> tuple:
    """Sort key of an export: newest exporter first, SQLite before parquetdir, then name."""
    m = _EXPORT_OF_REPORT.match(path.name) or _EXPORT_OF_STEM.match(path.name)
    ver = _version(m.group("ver")) if m else ()
    fmt = m.group("fmt").lower() if m else ""
    newest_first = (*(-v for v in ver), 1) if ver else (2,)
    return (newest_first, fmt != "sqlite", path.name)


def _choose(report: Path | None, exports: list[Path]) -> tuple[Path, tuple[Path, ...]]:
    ordered = sorted(exports, key=_preference)
    whole = [p for p in ordered if export_is_whole(p)]
    if whole:
        chosen = whole[0]
    elif report is not None:
        chosen = report
    else:
        chosen = ordered[0]
    forms = ([report] if report is not None else []) + ordered
    return chosen, tuple(p for p in forms if p != chosen)


def group_captures(paths: Sequence[Path]) -> list[Capture]:
    """``paths`` (resolved, distinct) as captures, in the order their first form came."""
    key_of: dict[Path, Path] = {}
    stems: dict[tuple[Path, str], set[Path]] = {}
    for p in paths:  # every capture key a report or a report-named export implies
        if m := _REPORT.match(p.name):
            key = p
        elif m := _EXPORT_OF_REPORT.match(p.name):
            key = p.parent / m.group("report")
        else:
            continue
        key_of[p] = key
        stems.setdefault((p.parent, _REPORT.match(key.name).group("stem")), set()).add(key)
    for p in paths:  # exports named after the stem: join a capture when it is unambiguous
        if p in key_of:
            continue
        m = _EXPORT_OF_STEM.match(p.name)
        keys = stems.get((p.parent, m.group("stem")), set()) if m else set()
        if len(keys) == 1:
            key_of[p] = next(iter(keys))
    members: dict[Path, list[Path]] = {}
    order: list[Path] = []
    for p in paths:
        key = key_of.get(p, p)
        if key not in members:
            members[key] = []
            order.append(key)
        members[key].append(p)
    out = []
    for key in order:
        forms = members[key]
        if len(forms) == 1:  # one form: a trace of its own, named by itself
            out.append(Capture(forms[0], forms[0]))
            continue
        report = key if key in forms else None
        chosen, aliases = _choose(report, [p for p in forms if p != key])
        out.append(Capture(key, chosen, aliases))
    return out
