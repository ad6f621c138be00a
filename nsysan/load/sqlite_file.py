"""Checks on a file named as an nsys SQLite export, before SQLite opens it, and how it is opened.

SQLite reports a missing, unreadable, foreign or truncated file late (or not at all: a
truncated file fails only when a query reaches a missing page), so the header is read and
checked here first, with one-line errors that say what to do (`read_header`,
`check_sqlite_header`). Opening is read-only, through a URI (`file_uri`) that is
``immutable`` when the file cannot change (`read_only_file`); once open, its tables tell an
nsys export from another database (`NSYS_MARKER_TABLES`). Separate from `nsysan.load.sqlite`
because format detection and export (`nsysan.load`, `nsysan.load.export`) read headers, and
`nsysan.load.parquetdir` recognises an export by the same tables, without a `SqliteSource`.
"""

from __future__ import annotations

import os
import stat
import urllib.parse
from pathlib import Path

from nsysan.errors import TraceFormatError

SQLITE_MAGIC = b"SQLite format 3\x00"
HEADER_SIZE = 100
#: every nsys export has StringIds plus at least one of these (2020.3 exports lack the metadata
#: tables, lazy exports lack most activity tables, so any one of them is enough)
NSYS_MARKER_TABLES = (
    "ANALYSIS_DETAILS",
    "EXPORT_META_DATA",
    "META_DATA_EXPORT",
    "TARGET_INFO_SESSION_START_TIME",
    "TARGET_INFO_GPU",
    "TARGET_INFO_CUDA_STREAM",
    "ThreadNames",
    "PROCESSES",
    "NVTX_EVENTS",
    "CUPTI_ACTIVITY_KIND_KERNEL",
    "CUPTI_ACTIVITY_KIND_RUNTIME",
    "OSRT_API",
)


def read_header(path: Path, n: int = HEADER_SIZE) -> bytes:
    """The first ``n`` bytes of ``path``; any way the file cannot be read is a TraceFormatError."""
    try:
        with open(path, "rb") as fh:
            return fh.read(n)
    except FileNotFoundError:
        raise TraceFormatError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise TraceFormatError(f"{path}: is a directory, not a SQLite export") from None
    except PermissionError:
        raise TraceFormatError(
            f"{path}: permission denied; make the file readable (chmod +r) or copy it"
        ) from None
    except OSError as exc:
        raise TraceFormatError(f"{path}: cannot be read ({exc.strerror or exc})") from None


def check_sqlite_header(path: Path, header: bytes) -> None:
    """Reject empty, foreign and truncated files before SQLite sees them.

    SQLite itself accepts a truncated file and only fails (or silently returns fewer rows) when a
    query reaches the missing pages, so the size promised by the header is checked up front.
    """
    if not header:
        raise TraceFormatError(f"{path}: file is empty; re-export the report with `nsys export`")
    if not header.startswith(SQLITE_MAGIC):
        raise TraceFormatError(
            f"{path}: not a SQLite database (unrecognised header); pass an nsys SQLite export, "
            f"a .nsys-rep/.qdrep report or a parquetdir export"
        )
    if len(header) < HEADER_SIZE:
        raise TraceFormatError(f"{path}: truncated SQLite file (shorter than its header)")
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    n_pages = int.from_bytes(header[28:32], "big")
    # the in-header page count is valid only when the change counter matches "version valid for"
    counts_valid = header[24:28] == header[92:96] and n_pages > 0
    size = path.stat().st_size
    if counts_valid and size < page_size * n_pages:
        raise TraceFormatError(
            f"{path}: truncated SQLite file ({size} bytes, header says {page_size * n_pages}); "
            f"copy or re-export it"
        )


def file_uri(path: Path, immutable: bool) -> str:
    # percent-encode so that '?', '#', '%' and spaces in file names are not read as URI syntax
    quoted = urllib.parse.quote(str(path.resolve()))
    return f"file:{quoted}?mode=ro" + ("&immutable=1" if immutable else "")


def read_only_file(path: Path) -> bool:
    """True when the file is marked read-only (for root too, who ignores the permission bits).
    Such a file cannot change under us, so SQLite may skip locking (``immutable=1``)."""
    try:
        st = path.stat()
    except OSError:
        return False
    write_bits = stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH
    return not (os.access(path, os.W_OK) and st.st_mode & write_bits)


def write_ahead_log(path: Path) -> bool:
    """Whether the SQLite file ``path`` is in WAL mode (header bytes 18-19) or has a ``-wal``
    file beside it: then some of its rows may be in that other file, and facts kept for a
    version of ``path`` alone do not hold (nsys writes its exports in rollback mode)."""
    try:
        if 2 in read_header(path)[18:20]:
            return True
    except TraceFormatError:
        return True  # (unreadable now: keep nothing, adopt nothing)
    try:
        return Path(f"{path}-wal").stat().st_size > 0
    except OSError:
        return False
