"""Give memory the C heap holds but no longer uses back to the operating system.

Why: polars allocates with its own jemalloc, but the Arrow buffers of a SQLite read (the ADBC
driver), numpy arrays and pyarrow's conversions come from glibc's malloc, which keeps freed
blocks in its arenas for reuse. A frame build or a pass frees hundreds of MB of them that the
next phase, allocating through jemalloc, never reuses: on a 1M-kernel trace the process's
peak was ~150 MB higher than what it held (bench/RESULTS.md, "Issue 21 (memory)"). `trim`
asks glibc to return them (``malloc_trim``) after every frame build, pass and finding rule;
elsewhere (another libc) it does nothing.

glibc also gives each thread that allocates its own arena (up to 8 per core), and a block
freed in one arena is reused only by the threads of that arena: an analysis' frame builders,
pass workers and writers each kept their own freed blocks until the next trim. The
``nsysan`` command stops new arenas (`share_one_arena`): its threads share the main one (and
the few the imports' threads made). On the 1M-kernel copy that lowered the peak by ~5%; with
the trims, ~7% for 1-2% more wall time (bench/RESULTS.md). A library does not change how its
host process allocates, so importing nsysan leaves this alone.
"""

from __future__ import annotations

import ctypes
import os
import sys

#: glibc's ``mallopt`` parameter for the most arenas (``M_ARENA_MAX`` in malloc.h)
_M_ARENA_MAX = -8
#: the environment variable glibc reads for the same setting when the process starts ...
ARENA_ENV = "MALLOC_ARENA_MAX"
#: ... and the tunable that sets it too (in ``GLIBC_TUNABLES``)
ARENA_TUNABLE = "glibc.malloc.arena_max"


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None)
    except OSError:
        return None


def share_one_arena() -> bool:
    """Let glibc make no more arenas (``M_ARENA_MAX`` 1): threads started from now on share
    the ones there are; True when set. Nothing when ``MALLOC_ARENA_MAX`` or the arena
    tunable is set (the user's choice, which glibc already applied) or the C library is not
    glibc. For the ``nsysan`` command's own process, before the analysis starts its threads.

    glibc reads the limit once, when a thread first needs an arena while more than 8 exist:
    after that, the setting is accepted and ignored. The imports make a few (4 here), far
    from that."""
    if ARENA_ENV in os.environ or ARENA_TUNABLE in os.environ.get("GLIBC_TUNABLES", ""):
        return False
    libc = _libc()
    setting = getattr(libc, "mallopt", None)
    if setting is None or not hasattr(libc, "malloc_trim"):  # (not glibc)
        return False
    return bool(setting(_M_ARENA_MAX, 1))


def trim() -> None:
    """Return the free memory of glibc's heaps to the OS; a few ms, and nothing to do on
    other C libraries."""
    release = getattr(_libc(), "malloc_trim", None)
    if release is not None:  # (else not glibc)
        release(ctypes.c_size_t(0))  # (no padding kept at the top of the heap)
