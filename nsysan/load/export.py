"""Find `nsys`, export a report to SQLite (or parquetdir), cache the export, explain failures.

Cache: the export goes next to the report when that directory is writable, else into
``$NSYSAN_CACHE_DIR`` or ``~/.cache/nsysan`` (an explicit ``cache_dir`` always wins). Its name is
``<report name>.nsys<exporter version>.<size>-<mtime_ns>.sqlite`` (sizes and times in hex), so a
changed report or another nsys gets a new export and an old one is never reused by mistake. The
export is written to a temporary name and renamed into place, and whatever a failed export left
behind is removed: nsys 2022.4 exits 1 on a report from 2023.x but leaves a partial .sqlite.

A cached export is reused only when it is **valid**: the sidecar ``<export>.nsysan-export``
(written after nsys exited 0 and the export was renamed into place) records its size and mtime,
and they still match; a SQLite export's header is intact and its page count times its page size
is its size (a file cut short by a full disk or a copy fails that); every Parquet file of a
parquetdir ends with the Parquet magic. An invalid cache entry (nsysan's own, by its name) is
removed and the report exported again; a cache written before this rule has no sidecar and is
exported once more.

Version errors, as each nsys reports them (see ../shared/traces/README.md):
- 2024+ reports carry the recording version in their first bytes
  (``NVIDIA Tegra Profiler Report 2025@1@1@110-...``); that is checked before nsys runs;
- nsys 2022.4 says ``Version number is invalid: 2025@1@1@110-...`` for those;
- nsys 2022.4 fails with a protobuf parse error on 2023.x reports, whose header says only
  ``Report 1.``;
- nsys 2023.4 says ``Report was created in Nsight Systems version (...), newer than ...``.
"""

from __future__ import annotations

import functools
import glob
import json
import os
import re
import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Literal

from nsysan.errors import ConfigError, ExportError, TraceFormatError
from nsysan.load.files import check_openable
from nsysan.load.sqlite_file import SQLITE_MAGIC, read_header

ExportFormat = Literal["sqlite", "parquetdir"]
FORMATS: tuple[str, ...] = ("sqlite", "parquetdir")
REPORT_SUFFIXES = (".nsys-rep", ".qdrep")
REPORT_MAGIC = b"NVIDIA Tegra Profiler Report"
#: searched after the explicit path, $NSYSAN_NSYS and PATH (globs; newest version first)
FALLBACK_NSYS = (
    "/opt/nvidia/nsight-systems/*/bin/nsys",
    "/usr/local/cuda/bin/nsys",
    "/usr/lib/nsight-systems/bin/nsys",
)
#: first nsys that can write `--type parquetdir`
PARQUETDIR_SINCE = (2023, 4)

_HEADER_VERSION = re.compile(rb"Report (\d{4})@(\d+)@(\d+)@(\d+)")
_INVALID_VERSION = re.compile(r"Version number is invalid: (\d{4})@(\d+)@(\d+)")
_NEWER_THAN = re.compile(r"created in Nsight Systems version \(?([\d.]+)")
_VERSION = re.compile(r"(\d{4}\.\d+\.\d+(?:\.\d+)?)")


def find_nsys(explicit: str | Path | None = None) -> Path | None:
    """The nsys to use, or None when there is none.

    Order: ``explicit``, ``$NSYSAN_NSYS``, ``PATH``, then the usual install locations. A path the
    user named (argument or environment) must exist: silently using another nsys would hide the
    mistake, so that raises ExportError instead of falling through.
    """
    for named, origin in ((explicit, "--nsys"), (os.environ.get("NSYSAN_NSYS"), "NSYSAN_NSYS")):
        if named:
            path = Path(named).expanduser()
            if path.is_dir():
                path = path / "nsys"
            if not path.is_file() or not os.access(path, os.X_OK):
                raise ExportError(
                    f"{origin} points to {named}, which is not an executable nsys; fix the path "
                    f"or unset it"
                )
            # Absolute: a relative name ("./nsys" becomes "nsys" as a Path) would be looked up
            # on PATH when run, and could run another nsys than the file named.
            return path.absolute()
    on_path = shutil.which("nsys")
    if on_path:
        return Path(on_path)
    for pattern in FALLBACK_NSYS:
        hits = sorted(glob.glob(pattern), key=_version_key, reverse=True)
        for hit in hits:
            if os.access(hit, os.X_OK):
                return Path(hit)
    return None


def _version_key(text: str) -> tuple[int, ...]:
    m = _VERSION.search(text)
    return tuple(int(p) for p in m.group(1).split(".")) if m else ()


def nsys_version(nsys: Path) -> str | None:
    """Version of an nsys binary, e.g. ``2022.4.2.1`` (None when it cannot be told)."""
    try:
        st = nsys.stat()
    except OSError:
        return None
    return _nsys_version(str(nsys), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _nsys_version(nsys: str, _size: int, _mtime_ns: int) -> str | None:
    try:
        out = subprocess.run(
            [nsys, "--version"], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    m = _VERSION.search(out.stdout + out.stderr)
    return m.group(1) if m else None


def report_version(path: Path) -> str | None:
    """Nsight Systems version that recorded a report, from its header (2024+ reports only:
    older ones say just ``Report 1.``). E.g. ``2025.1.1``."""
    m = _HEADER_VERSION.search(read_header(path, 256))
    return ".".join(m.group(i).decode() for i in (1, 2, 3)) if m else None


def _short(version: str) -> str:
    """``2022.4.2.1`` -> ``2022.4.2``: the form users see in release names."""
    return ".".join(version.split(".")[:3])


def _year_release(version: str) -> tuple[int, int]:
    parts = [int(p) for p in version.split(".")[:2]]
    return parts[0], parts[1] if len(parts) > 1 else 0


def _too_new_message(recorded: str, installed: str | None) -> str:
    year, release = _year_release(recorded)
    have = _short(installed) if installed else "older"
    return (
        f"report recorded with Nsight Systems {_short(recorded)}; installed nsys is {have} — "
        f"install {year}.{release} or newer, or export on the recording machine and pass the "
        f".sqlite"
    )


def _writable_dir(path: Path) -> bool:
    # root passes os.access everywhere; a directory marked read-only for everyone (such as the
    # shared trace store) is still treated as read-only, so exports never land there
    try:
        return os.access(path, os.W_OK | os.X_OK) and bool(path.stat().st_mode & 0o222)
    except OSError:
        return False


def default_cache_dir() -> Path:
    env = os.environ.get("NSYSAN_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "nsysan"


def export_path(
    report: Path,
    exporter_version: str | None,
    fmt: ExportFormat = "sqlite",
    cache_dir: str | Path | None = None,
) -> Path:
    """Where the export of ``report`` is (or will be) cached; see the module docstring."""
    st = report.stat()
    ver = _short(exporter_version) if exporter_version else "unknown"
    name = f"{report.name}.nsys{ver}.{st.st_size:x}-{st.st_mtime_ns:x}.{fmt}"
    if cache_dir is not None:
        return Path(cache_dir).expanduser() / name
    if _writable_dir(report.parent):
        return report.parent / name
    return default_cache_dir() / name


def _check_report(report: Path) -> None:
    header = read_header(report, 64)
    if not header:
        raise TraceFormatError(f"{report}: file is empty; re-record or re-copy the report")
    if not header.startswith(REPORT_MAGIC):
        raise TraceFormatError(
            f"{report}: not an Nsight Systems report (unrecognised header); pass a .nsys-rep, "
            f".qdrep, .sqlite or an nsys parquetdir export"
        )


def _is_complete(out: Path, fmt: str) -> bool:
    """Whatever nsys wrote looks like a whole export (checked before the rename)."""
    if fmt == "parquetdir":
        return out.is_dir() and any(out.glob("*.parquet")) and parquet_files_whole(out)
    try:
        return out.is_file() and sqlite_file_whole(out)
    except (OSError, TraceFormatError):
        return False


def sqlite_file_whole(path: Path) -> bool:
    """The SQLite magic, and the size the header declares (page size x page count, when the
    header's page count is valid) equals the file's size."""
    header = read_header(path, 100)
    if len(header) < 100 or not header.startswith(SQLITE_MAGIC):
        return False
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages = int.from_bytes(header[28:32], "big")
    counter_valid = header[24:28] == header[92:96]  # else the page count is stale
    if counter_valid and pages and page_size:
        return path.stat().st_size == pages * page_size
    return True


def parquet_files_whole(directory: Path) -> bool:
    """Every ``*.parquet`` file starts and ends with the Parquet magic (a cut file lacks the
    footer)."""
    for f in directory.glob("*.parquet"):
        try:
            size = f.stat().st_size
            with open(f, "rb") as fh:
                head = fh.read(4)
                fh.seek(max(size - 4, 0))
                tail = fh.read(4)
        except OSError:
            return False
        if size < 12 or head != b"PAR1" or tail != b"PAR1":
            return False
    return True


SIDECAR_SUFFIX = ".nsysan-export"


def sidecar_path(export: Path) -> Path:
    """The marker written once ``export`` is complete (see the module docstring)."""
    return export.with_name(export.name + SIDECAR_SUFFIX)


def _stat_of(export: Path) -> dict[str, int]:
    if export.is_dir():
        files = sorted(export.glob("*.parquet"))
        return {"size": sum(f.stat().st_size for f in files), "files": len(files),
                "mtime_ns": max((f.stat().st_mtime_ns for f in files), default=0)}
    st = export.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _write_sidecar(export: Path, nsys_version: str | None) -> None:
    side = sidecar_path(export)
    tmp = side.with_name(f"{side.name}.nsysan-tmp{uuid.uuid4().hex[:8]}")
    data = {"marker": "nsysan export", "nsys_version": nsys_version, **_stat_of(export)}
    try:
        tmp.write_text(json.dumps(data, sort_keys=True) + "\n")
        os.replace(tmp, side)
    except OSError as exc:
        raise ExportError(f"cannot write {side} ({exc.strerror or exc}); free some space or set "
                          "NSYSAN_CACHE_DIR") from None
    finally:
        tmp.unlink(missing_ok=True)


def cached_export_valid(export: Path, fmt: str) -> bool:
    """A cached export nsysan may reuse: whole (`_is_complete`) and recorded by its sidecar
    with the size and mtime it still has."""
    if not export.exists():
        return False
    try:
        recorded = json.loads(sidecar_path(export).read_text())
        if not isinstance(recorded, dict) or recorded.get("marker") != "nsysan export":
            return False
        now = _stat_of(export)
    except (OSError, ValueError):
        return False
    return all(recorded.get(k) == v for k, v in now.items()) and _is_complete(export, fmt)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _failure_message(report: Path, rc: int, output: str, installed: str | None) -> str:
    have = _short(installed) if installed else "installed"
    if m := _INVALID_VERSION.search(output):
        return _too_new_message(".".join(m.groups()), installed)
    if m := _NEWER_THAN.search(output):
        return _too_new_message(m.group(1), installed)
    if "ProtobufParseException" in output or "Can't parse message" in output:
        return (
            f"{report}: nsys {have} cannot read this report (protobuf parse error); it was "
            f"probably recorded with a newer Nsight Systems — install a newer nsys, or export on "
            f"the recording machine and pass the .sqlite"
        )
    if "Unsupported export type" in output:
        return (
            f"nsys {have} cannot export parquetdir (needs nsys 2023.4 or newer); use --format "
            f"sqlite"
        )
    lines = [ln.strip() for ln in output.splitlines() if ln.strip() and "Exporting" not in ln]
    detail = lines[-1] if lines else "no output"
    return f"{report}: nsys export failed (exit {rc}): {detail}"


def export_report(
    report: str | Path,
    *,
    nsys: str | Path | None = None,
    fmt: ExportFormat = "sqlite",
    cache_dir: str | Path | None = None,
) -> Path:
    """Export an ``.nsys-rep``/``.qdrep`` with ``nsys export`` and return the cached export.

    A cached export for the same report content and nsys version is reused. Raises
    ExportError (nsys missing, too old for the report, export failed), TraceFormatError (the
    input is not a report) or ConfigError (unknown ``fmt``).
    """
    report = Path(report)
    if fmt not in FORMATS:
        raise ConfigError(f"unknown export format {fmt!r}; use one of: {', '.join(FORMATS)}")
    if os.path.lexists(report):  # (a missing report: the header read below says so)
        check_openable(report)  # a named pipe would block the header read below
    _check_report(report)
    recorded = report_version(report)
    binary = find_nsys(nsys)
    if binary is None:
        raise ExportError(
            f"{report}: nsys not found (looked at --nsys, NSYSAN_NSYS, PATH, "
            f"{', '.join(FALLBACK_NSYS)}); install Nsight Systems or set NSYSAN_NSYS, or pass "
            f"the .sqlite exported on the recording machine"
        )
    installed = nsys_version(binary)
    target = export_path(report, installed, fmt, cache_dir)
    if cached_export_valid(target, fmt):
        return target
    if target.exists() or sidecar_path(target).exists():
        # an export cut short, or one nsysan cannot vouch for: nsysan's own cache entry (the
        # name says so), exported again below
        _remove(target)
        sidecar_path(target).unlink(missing_ok=True)
    if recorded and installed and _year_release(recorded) > _year_release(installed):
        raise ExportError(_too_new_message(recorded, installed))
    if fmt == "parquetdir" and installed and _year_release(installed) < PARQUETDIR_SINCE:
        raise ExportError(
            f"nsys {_short(installed)} cannot export parquetdir (needs nsys "
            f"{PARQUETDIR_SINCE[0]}.{PARQUETDIR_SINCE[1]} or newer); use --format sqlite"
        )
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ExportError(
            f"cannot create the export cache {target.parent} ({exc.strerror or exc}); set "
            f"NSYSAN_CACHE_DIR or pass --cache-dir"
        ) from None
    # The temporary name keeps the format's suffix (nsys appends one when it is missing) and
    # matches `*.nsysan-tmp*` in .gitignore.
    tmp = target.with_name(f"{target.stem}.nsysan-tmp{uuid.uuid4().hex[:8]}{target.suffix}")
    cmd = [str(binary), "export", "--type", fmt, "--force-overwrite", "true"]
    cmd += ["--output", str(tmp), str(report)]
    try:
        try:
            proc = subprocess.run(
                cmd, capture_output=True, text=True, errors="replace", check=False
            )
        except OSError as exc:
            raise ExportError(f"cannot run {binary} ({exc.strerror or exc})") from None
        if proc.returncode != 0 or not _is_complete(tmp, fmt):
            raise ExportError(
                _failure_message(report, proc.returncode, proc.stderr + proc.stdout, installed)
            )
        os.replace(tmp, target)
        _write_sidecar(target, installed)
    finally:
        if tmp.exists():
            _remove(tmp)
    return target
