"""What kind of file an input is: profiles are regular files or directories, nothing else."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from nsysan.errors import TraceFormatError

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
