"""Give memory the C heap holds but no longer uses back to the operating system.

Why: polars allocates with its own jemalloc, but the Arrow buffers of a SQLite read (the ADBC
driver), numpy arrays and pyarrow's conversions come from glibc's malloc, which keeps freed
blocks in its arenas for reuse. A frame build or a pass frees hundreds of MB of them that the
next phase, allocating through jemalloc, never reuses: on a 1M-kernel trace the process's
peak was ~150 MB higher than what it held (bench/RESULTS.md, "Issue 21 (memory)"). `trim`
asks glibc to return them (``malloc_trim``); elsewhere (another libc) it does nothing.
"""

from __future__ import annotations

import ctypes
import sys


def trim() -> None:
    """Return the free memory of glibc's heaps to the OS; a few ms, and nothing to do on
    other C libraries."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None)
        release = libc.malloc_trim
    except (OSError, AttributeError):  # not glibc
        return
    release(0)
