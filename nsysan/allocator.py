"""How soon polars' allocator gives freed memory back to the operating system.

Why: polars allocates through its own jemalloc, which keeps the pages of freed buffers for
reuse: "dirty" for 500 ms, then "muzzy" (``MADV_FREE``: still counted in the process's
resident set) for another 1000 ms, by the settings polars applies when it is imported. An
analysis frees one phase's transients (a frame build's read and sort, a pass's
intermediates) and allocates the next phase's within that time, so the freed pages of
several phases were resident at once: on the 1M-kernel copy they were ~160 MB of its
~1 GB peak (bench/RESULTS.md, "jemalloc decay"). With dirty pages purged after 100 ms and
no muzzy stage, the peak is that much lower for ~2% more wall time; purging at once
(``dirty_decay_ms:0``) costs ~20% (page faults on every reuse).

jemalloc reads its settings when it first allocates, so they must be in the environment
before polars is imported: `tune_polars_allocator` is called by ``nsysan/__init__.py``
before anything imports polars, and does nothing when polars is already imported or when
``_RJEM_MALLOC_CONF`` is set (a user's own settings win; set it empty for polars'
defaults). Polars appends the variable's value to its own defaults, so ours override them.
"""

from __future__ import annotations

import os
import sys

#: the environment variable polars' jemalloc (built with the ``_rjem_`` prefix) reads
JEMALLOC_ENV = "_RJEM_MALLOC_CONF"
#: dirty pages purged 100 ms after they are freed, straight to the OS (no muzzy stage)
DECAY = "dirty_decay_ms:100,muzzy_decay_ms:0"


def tune_polars_allocator() -> bool:
    """Set `DECAY` for polars' jemalloc when it can still take effect and the user has not
    chosen settings of their own; True when it was set."""
    if "polars" in sys.modules or JEMALLOC_ENV in os.environ:
        return False
    os.environ[JEMALLOC_ENV] = DECAY
    return True
