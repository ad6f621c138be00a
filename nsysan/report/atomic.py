"""Atomic files, nsysan's temporary names, and file-system failures as one line.

* `atomic_write` writes a file through a temporary file beside it and a rename, so a reader
  never sees a half-written file, and the temporary file is gone after any failure.
* Temporary names (`temp_prefix`) say who made them: ``.<name>.nsysan-tmp-<host>-<pid>-<random>``
  (8 hex digits of the host name's sha1, the process id); `is_stale_temp` tells the ones of
  processes of this host that are no longer alive, which nobody will finish.
* `write_errors` turns a failure of the file system (permissions, read-only, full, a path
  under a regular file; polars' I/O errors too) into one `OutputError` that says what to do.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

from nsysan.errors import OutputError

#: temporary (and, where the kernel cannot exchange two folders, replaced) names nsysan uses
TEMP_NAME = re.compile(
    r"^\.(?P<name>.+)\.nsysan-(?:tmp|old)-(?P<host>[0-9a-f]{8})-(?P<pid>[0-9]+)-[a-z0-9_]+$")


# --- names ------------------------------------------------------------------------------------
def host_tag() -> str:
    """8 hex digits naming this host in temporary names (a process id means nothing on another
    host sharing the file system)."""
    return hashlib.sha1(socket.gethostname().encode()).hexdigest()[:8]


def temp_prefix(name: str, what: str = "tmp") -> str:
    """The start of a temporary name for ``name`` made by this process (`tempfile` adds a
    random end)."""
    return f".{name}.nsysan-{what}-{host_tag()}-{os.getpid()}-"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: alive, someone else's
        return True
    try:  # a zombie (killed, not yet reaped) writes nothing more
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rpartition(b")")[2].split()[:1] != [b"Z"]
    except OSError:
        return True


def is_stale_temp(name: str) -> bool:
    """``name`` is one of nsysan's temporary names, of a process of this host that has died."""
    m = TEMP_NAME.match(name)
    return m is not None and m["host"] == host_tag() and not _pid_alive(int(m["pid"]))


# --- errors -----------------------------------------------------------------------------------
_REASONS = {
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "read-only file system",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.ENOTDIR: "a part of the path is a regular file, not a folder",
    errno.EEXIST: "a file of that name is in the way",
    errno.EISDIR: "it is a folder",
    errno.ENAMETOOLONG: "file name too long",
    errno.ELOOP: "too many levels of symbolic links",
}
_OS_ERROR = re.compile(r"os error (\d+)")


def os_errno(exc: BaseException) -> int | None:
    """The errno of an OSError, or of a polars I/O error (which carries it in its text)."""
    if isinstance(exc, OSError) and exc.errno is not None:
        return exc.errno
    if isinstance(exc, OSError) or type(exc).__module__.startswith("polars"):
        m = _OS_ERROR.search(str(exc))
        if m:
            return int(m[1])
        return errno.EIO if isinstance(exc, OSError) else None
    return None


def write_error_message(exc: BaseException, target: str | os.PathLike[str],
                        option: str = "-o") -> str:
    code = os_errno(exc)
    reason = _REASONS.get(code or 0) or (os.strerror(code) if code else str(exc))
    if code in (errno.ENOSPC, errno.EDQUOT):
        todo = f"free space there or choose another {option}"
    elif code in (errno.EROFS, errno.EACCES, errno.EPERM):
        todo = f"choose a writable {option} or fix its permissions"
    else:
        todo = f"choose another {option}"
    return f"{target}: cannot write ({reason.lower()}): {todo}"


def output_error(exc: BaseException, target: str | os.PathLike[str],
                 option: str = "-o") -> OutputError | None:
    """The `OutputError` of a file-system failure about ``target`` (None for any other
    exception, which stays what it is)."""
    if isinstance(exc, OutputError) or os_errno(exc) is None:
        return None
    return OutputError(write_error_message(exc, target, option))


@contextlib.contextmanager
def write_errors(target: str | os.PathLike[str], option: str = "-o") -> Iterator[None]:
    """Turn a file-system failure inside the block into one `OutputError` about ``target``."""
    try:
        yield
    except Exception as exc:
        error = output_error(exc, target, option)
        if error is None:
            raise
        raise error from None


# --- files --------------------------------------------------------------------------------------
def umask() -> int:
    try:  # read, not set: setting it, even for a moment, races with other threads' files
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_PIECE = 1 << 20  # characters of a text encoded at a time


def atomic_write(path: str | os.PathLike[str], data: str | bytes | list[str | bytes]) -> Path:
    """Write ``data`` (or, one after the other, each of a list of pieces) to ``path`` through
    a temporary file beside it and a rename, so readers never see a half-written file; the
    temporary file is gone after any failure. Text is UTF-8."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=temp_prefix(path.name), dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            for piece in data if isinstance(data, list) else [data]:
                if isinstance(piece, bytes):
                    fh.write(piece)
                    continue
                # a long text is encoded a MB at a time: never held again as one bytes copy
                for at in range(0, len(piece), _PIECE):
                    fh.write(piece[at:at + _PIECE].encode("utf-8"))
        os.chmod(tmp, 0o666 & ~umask())  # mkstemp makes it private; outputs are for readers
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return path


def temp_file(path: Path) -> Path:
    """A new empty temporary file beside ``path`` for a writer that needs a path (polars)."""
    fd, tmp = tempfile.mkstemp(prefix=temp_prefix(path.name), dir=path.parent)
    os.close(fd)
    os.chmod(tmp, 0o666 & ~umask())
    return Path(tmp)
