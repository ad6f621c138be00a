"""The frame cache's disk space: what it holds (`entries`), removing some of it (`prune`), and
the bound every analysis keeps it to (`keep_bounded`, ``$NSYSAN_CACHE_MAX``).

Why: a cached trace takes about 30% of its export's size (uncompressed Arrow files,
`nsysan.load.frame_file`: 2.7 GB for a 10M-kernel trace), every analysis of a big SQLite export
writes one by default, and the folders of earlier versions of a file, of nsysan or of the cache
layout are never read again. Without a bound, an archive analysed in batch fills the disk.

What is nsysan's: only the folders ``<cache>/frames/<source name>.<24 hex digits>`` (the
layout of `nsysan.load.cache`) and, inside them, only the files the cache writes there
(`OWN_FILES`; temporary files of a write in progress only once they are an hour old). Anything
else, in the cache dir or inside those folders, is left as it is, and so is a folder that still
holds something after nsysan's files are gone. A folder's last use is its modification time:
an analysis that opens it touches it (`keep_bounded`), and writing its files changes it.

Concurrent analyses are safe: a frame whose files are removed while another analysis maps them
stays readable there (the inode lives until it is unmapped), and one whose files vanish before
they are read is built from the export again.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from nsysan.errors import ConfigError
from nsysan.frames import schemas, schemas_host
from nsysan.load.cache import COUNTS_FILE, DIGEST_FILE, FRAME_FILES, KEY_BYTES

#: the environment variable of the bound (a size: ``20G``, ``500M``, a number of bytes; or
#: ``none`` for no bound)
MAX_ENV = "NSYSAN_CACHE_MAX"
#: the bound when ``$NSYSAN_CACHE_MAX`` is not set: seven 10M-kernel traces
DEFAULT_MAX_BYTES = 20 << 30
#: a temporary file younger than this may be a write in progress: never removed
TEMPORARY_AGE_S = 3600

_FOLDER = re.compile(rf"(?P<source>.+)\.(?P<key>[0-9a-f]{{{2 * KEY_BYTES}}})")


def _either(names: Iterable[str]) -> str:
    return "|".join(re.escape(n) for n in sorted(names))


#: the frames the cache keeps (their files are named after them)
_FRAMES = _either({*schemas.CANONICAL, *schemas_host.HOST_EVIDENCE})
_SOURCE_FACTS = _either((DIGEST_FILE, COUNTS_FILE))
#: the names of the files `nsysan.load.cache` writes in a trace's folder (``.parquet``: the
#: frames of cache revisions before 13; ``.tmp``: its writes in progress), matched whole
OWN_FILES = re.compile(
    rf"(?:{_FRAMES})(?:{_either((*FRAME_FILES, '.parquet'))})"
    rf"|{_SOURCE_FACTS}"
    rf"|\.(?:{_FRAMES}|{_SOURCE_FACTS})\.[0-9a-f]{{32}}\.tmp"
)
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*(?:([KMGT])I?B?|B)?")


@dataclass(frozen=True)
class CacheEntry:
    """One trace's cached frames: its folder, the name of the export it was read from, the
    bytes of nsysan's files in it, and when it was last used (seconds since the epoch)."""

    folder: Path
    source_name: str
    bytes: int
    last_used: float


def parse_size(text: str, what: str = MAX_ENV) -> int | None:
    """``text`` (``20G``, ``1.5GB``, ``500M``, ``4096``; ``none`` for no bound) in bytes, or
    None for no bound; `ConfigError` naming ``what`` otherwise."""
    value = text.strip().upper()
    if value in ("NONE", "UNLIMITED"):
        return None
    match = _SIZE.fullmatch(value)
    if not match:
        raise ConfigError(f"{what} is {text!r}, not a size: give bytes or a number with K, M, "
                          "G or T (e.g. 20G), or none for no bound")
    # (in integers: a float would round sizes above 2**53 and overflow on long digit strings)
    whole, _, fraction = match.group(1).partition(".")
    return int(whole + fraction) * _UNITS[match.group(2) or ""] // 10 ** len(fraction)


def max_bytes() -> int | None:
    """The bound of the frame cache: ``$NSYSAN_CACHE_MAX`` when set, else
    `DEFAULT_MAX_BYTES`; None for no bound."""
    text = os.environ.get(MAX_ENV, "").strip()
    return parse_size(text) if text else DEFAULT_MAX_BYTES


def entries(root: Path) -> list[CacheEntry]:
    """The traces cached under ``root`` (a cache's ``frames`` folder), least recently used
    first (then by folder name: the order never depends on the directory's)."""
    found = []
    try:
        folders = [p for p in root.iterdir() if _FOLDER.fullmatch(p.name) and p.is_dir()
                   and not p.is_symlink()]
    except OSError:  # (no cache yet, or not readable: nothing of it can be listed)
        return []
    for folder in folders:
        try:
            used = folder.stat().st_mtime
        except OSError:
            continue  # (removed meanwhile)
        size = _contents(folder, time.time())[1]
        match = _FOLDER.fullmatch(folder.name)
        assert match is not None
        found.append(CacheEntry(folder, match["source"], size, used))
    return sorted(found, key=lambda e: (e.last_used, e.folder.name))


@dataclass(frozen=True)
class Removal:
    """What pruning did to one cached trace (in a dry run: would do): the ``bytes`` of
    nsysan's files removed from its folder, and whether the folder stays (``folder_kept``:
    it holds files nsysan did not write, or a write in progress younger than
    `TEMPORARY_AGE_S`, which are never removed)."""

    entry: CacheEntry
    bytes: int
    folder_kept: bool

    @property
    def folder(self) -> Path:
        return self.entry.folder


def prune(root: Path, *, max_total: int | None = None, older_than_s: float | None = None,
          everything: bool = False, keep: Path | None = None, dry_run: bool = False
          ) -> list[Removal]:
    """Remove the cached traces under ``root``: all of them (``everything``), those unused
    for ``older_than_s`` seconds, then the least recently used until the rest take at most
    ``max_total`` bytes (what a trace's removal would leave, a write in progress, still
    counts); never the folder ``keep`` (the one an analysis is using). Only nsysan's files
    are removed (module docstring). Returns what was removed (with ``dry_run``: what would
    be), least recently used first."""
    now = time.time()
    cached = entries(root)
    total = sum(e.bytes for e in cached)
    chosen = []
    for entry in (e for e in cached if e.folder != keep):
        old = older_than_s is not None and now - entry.last_used > older_than_s
        if everything or old or (max_total is not None and total > max_total):
            plan, own, stays = _contents(entry.folder, now)
            if not plan and stays:
                continue  # (nothing of nsysan's to remove there: not a removal)
            chosen.append(Removal(entry, sum(plan.values()), stays))
            # (what the folder will hold, from this listing: a file written since `entries`
            # counted it is then not taken off a total it was never in)
            total += own - chosen[-1].bytes - entry.bytes
    if dry_run:
        return chosen
    return [Removal(r.entry, *_remove(r.folder, now)) for r in chosen]


def keep_bounded(folder: Path) -> None:
    """Mark ``folder`` (a trace's cache folder an analysis is opening) as used now, and keep the
    cache it is in within `max_bytes` by removing the least recently used other traces
    first. The folder itself may take the cache over the bound until another one is used."""
    limit = max_bytes()
    with contextlib.suppress(OSError):  # (not there yet: writing its files marks it)
        os.utime(folder)
    if limit is not None:
        prune(folder.parent, max_total=limit, keep=folder)


def _prunable(name: str, st: os.stat_result, now: float) -> bool:
    """Whether a prune removes the entry ``name`` of a cache folder (``st``: its stat, links
    not followed): one of nsysan's own regular files, but not a temporary file younger than
    `TEMPORARY_AGE_S` (a write in progress)."""
    return (OWN_FILES.fullmatch(name) is not None and stat.S_ISREG(st.st_mode)
            and not (name.endswith(".tmp") and now - st.st_mtime < TEMPORARY_AGE_S))


def _contents(folder: Path, now: float) -> tuple[dict[str, int], int, bool]:
    """What a prune of ``folder`` would do, from one listing: the files it removes with
    their sizes (`_prunable`), the bytes of all of nsysan's files there, and whether the
    folder stays (it holds anything else)."""
    found, own, stays = {}, 0, False
    try:
        names = os.listdir(folder)
    except OSError:
        return found, own, False
    for name in names:
        try:
            st = os.stat(folder / name, follow_symlinks=False)
        except OSError:
            continue  # (removed meanwhile)
        if OWN_FILES.fullmatch(name) and stat.S_ISREG(st.st_mode):
            own += st.st_size
        if _prunable(name, st, now):
            found[name] = st.st_size
        else:
            stays = True
    return found, own, stays


def _remove(folder: Path, now: float) -> tuple[int, bool]:
    """Remove nsysan's files in ``folder`` (`_prunable`), then the folder when nothing else
    is left in it; (bytes removed, whether the folder stays). A folder that stays keeps its
    time of last use: removing files from it would otherwise make it the most recently used
    trace of the cache, the last the bound removes. Unless a file appeared in it meanwhile
    (another analysis writing there: its use is newer); a mere touch by another analysis
    in the same moment cannot be told from the removals, and is then undone (its frames are
    then pruned sooner: a rebuild, never a wrong result)."""
    # Through the folder's own descriptor, opened without following a link: a folder
    # replaced by a link since it was listed is left alone, not followed out of the cache.
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return 0, os.path.lexists(folder)  # (removed meanwhile, or now a link)
    removed = 0
    try:
        used = os.fstat(fd)
        names = os.listdir(fd)
        gone = set()
        for name in names:
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                if not _prunable(name, st, now):
                    continue
                os.unlink(name, dir_fd=fd)
                removed += st.st_size
                gone.add(name)
            except OSError:
                pass  # (removed by another analysis, or not ours to remove)
        try:
            folder.rmdir()  # (only when nothing else is left in it)
            return removed, False
        except OSError:
            with contextlib.suppress(OSError):
                if set(os.listdir(fd)) <= set(names) - gone:
                    os.utime(fd, ns=(used.st_atime_ns, used.st_mtime_ns))
            return removed, True
    finally:
        os.close(fd)
