"""What kind of file an input is: profiles are regular files or directories, nothing else;
and which profiles of a job directory to read (`job_files`)."""

from __future__ import annotations

import errno
import os
import re
import stat
from pathlib import Path

from nsysan.errors import ConfigError, TraceFormatError

_FILE_KINDS = (
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def check_openable(path: str | Path) -> None:
    """Refuse at once what is neither a regular file nor a directory: reading a named pipe
    blocks until someone writes to it (forever, for a profile), a device never ends, and a
    symlink loop or a dangling link is no profile. Raises TraceFormatError saying which."""
    path = Path(path)
    try:
        st = os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise TraceFormatError(f"{path}: symlink loop (too many levels of symbolic links); "
                                   "fix or remove the link") from None
        if exc.errno == errno.ENOENT and os.path.lexists(path):
            raise TraceFormatError(f"{path}: dangling symbolic link (its target "
                                   f"{os.readlink(path)} does not exist)") from None
        if exc.errno == errno.ENOENT:
            raise TraceFormatError(f"{path}: no such file or directory") from None
        raise TraceFormatError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode):
        return
    kind = next((what for test, what in _FILE_KINDS if test(st.st_mode)), "not a regular file")
    raise TraceFormatError(f"{path} is {kind}, not a profile: pass a .nsys-rep, .qdrep, .sqlite "
                           "file or a parquetdir export (copy the data to a file first)")


# Profiles of one job in a directory (`nsysan analyze --job DIR`).
_EXPORT_RE = re.compile(r"(?i)(\.nsys\d{4}(?:\.\d+)*)?\.(sqlite|parquetdir)$")
_REPORT_RE = re.compile(r"(?i)\.(nsys-rep|qdrep)$")
_PREFERENCE = {"sqlite": 0, "parquetdir": 1, "nsys-rep": 2, "qdrep": 2}


def job_files(directory: Path) -> list[Path]:
    """One profile per report in a job directory: a report and its exports count once
    (preferring a ``.sqlite`` export, then a parquetdir, then the report itself)."""
    from nsysan.load.parquetdir import is_parquetdir

    best: dict[str, tuple[int, str, Path]] = {}
    for p in sorted(directory.iterdir()):
        if p.name.startswith("."):
            continue
        low = p.name.lower()
        if p.is_dir():
            if not is_parquetdir(p):
                continue
            kind = "parquetdir"
        elif low.endswith(".sqlite"):
            kind = "sqlite"
        elif low.endswith((".nsys-rep", ".qdrep")):
            kind = low.rsplit(".", 1)[1]
        else:
            continue
        base = _REPORT_RE.sub("", _EXPORT_RE.sub("", p.name))
        cand = (_PREFERENCE[kind], p.name, p)
        if base not in best or cand < best[base]:
            best[base] = cand
    if not best:
        raise ConfigError(f"{directory}: no reports (.nsys-rep, .qdrep, .sqlite, parquetdir) "
                          "found for --job")
    return [best[b][2] for b in sorted(best)]
