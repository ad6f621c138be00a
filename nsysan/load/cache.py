"""Optional cache of canonical frames, so a repeat analysis of a big SQLite export skips
SQLite.

Why: reading a SQLite export is row by row (even through ADBC), while a cached frame is
columnar and memory-mapped (`nsysan.load.frame_file`: its numeric columns are not even
copied); a 10M-kernel trace's frames load in under a second instead of ~50 s
(bench/RESULTS.md).

Layout: ``<cache dir>/frames/<source name>.<key>/<frame>.arrow`` and ``<frame>.values.arrow``
(`nsysan.load.frame_file`) plus ``<frame>.notes.json``
(the loading notes the frame's build added to ``TraceMeta.notes`` and the data-quality counts
it added to ``TraceMeta.quality``, replayed on a cache hit so results stay identical), and
facts about the source valid for one version of it (``source.sha256.json``,
``source.tables.json``: `stored_digest`, `stored_counts`). The cache dir is
``$NSYSAN_CACHE_DIR`` or ``~/.cache/nsysan`` (an explicit ``cache_dir`` wins), never the
input's directory. ``key`` hashes the nsysan version and `FRAMES_REVISION`, the
file's size and mtime and a sample of its content (first and last MiB, 32 blocks of 64 KiB
spread over the file): hashing all of a 2 GB export would cost more than reading it.

When: by default only SQLite sources of at least ``MIN_BYTES`` (small traces load in well
under a second; caching them would only fill the disk); ``frame_cache=True`` forces it,
``False`` or ``$NSYSAN_NO_CACHE=1`` (CLI: ``--no-cache``) turns it off. Each file is written
to a temporary name and renamed, so concurrent analyses never read a partial file; a cache file
that cannot be read is rebuilt from the source. The analysis that writes a frame keeps the
mapped copy, not the frame it built (`_written_and_mapped`). Its disk space is bounded by
`nsysan.load.cache_space` (``$NSYSAN_CACHE_MAX``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import polars as pl

from nsysan.frames import schemas, schemas_host
from nsysan.frames.trace import TRACE_ID, TraceMeta
from nsysan.load.frame_file import file_identity, read_frame, write_frame

MIN_BYTES = 64 << 20
#: bumped whenever a frame's content or the cache layout changes within one nsysan version (part
#: of the key): a cache written before must not be served (2: content-derived NVTX ids and row
#: order; 3: the data-quality counts in the notes file; 4: cpu_stacks symbol/module and cpu_samples
#: leaf_symbol/leaf_module Categorical; 5: cpu_samples.stack_layer instead of n_frames,
#: thread states Categorical; 6: the text of the event frames Categorical or Enum; 7: OS ids,
#: CPUs, launch geometry and API return values Int32; 8: CUDA device, context, stream and
#: correlation ids Int32; 9: those ids UInt32, as CUPTI records them; 10: stored without
#: the trace_id column, added back on load; 11: launch dimensions but grid x UInt16, CPUs Int16;
#: 12: copy kinds, memory kinds and thread states as one-byte small vocabularies; 13: Arrow IPC
#: files of one batch, mapped, their dictionary values beside them, instead of LZ4 Parquet)
FRAMES_REVISION = 13
_SAMPLE = 64 << 10
_EDGE = 1 << 20
_BLOCKS = 32


def enabled(source_path: Path, source_format: str, frame_cache: bool | None) -> bool:
    """Whether frames of this source are cached (module docstring, "When"). Unless the cache
    is turned off, a ``$NSYSAN_CACHE_MAX`` that is not a size raises `ConfigError` whatever
    the source's size: set wrong, it must fail the first analysis, not the first big one."""
    if frame_cache is False or os.environ.get("NSYSAN_NO_CACHE", "") not in ("", "0"):
        return False
    from nsysan.load.cache_space import max_bytes

    max_bytes()
    if source_format != "sqlite":
        return False  # a parquetdir export is already Parquet
    if frame_cache:
        return True
    try:
        return source_path.stat().st_size >= MIN_BYTES
    except OSError:
        return False


#: bytes of `content_key`'s digest (its folder names end with twice as many hex digits)
KEY_BYTES = 12


def content_key(path: Path) -> str:
    """Version + size + mtime + sampled content of ``path`` (see the module docstring)."""
    from nsysan._version import __version__

    st = path.stat()
    h = hashlib.blake2b(digest_size=KEY_BYTES)
    h.update(f"{__version__}|{FRAMES_REVISION}|{st.st_size}|{st.st_mtime_ns}".encode())
    with open(path, "rb") as fh:
        h.update(fh.read(_EDGE))
        if st.st_size > 2 * _EDGE:
            for i in range(_BLOCKS):
                fh.seek(_EDGE + (st.st_size - 2 * _EDGE) * i // _BLOCKS)
                h.update(fh.read(_SAMPLE))
            fh.seek(st.st_size - _EDGE)
            h.update(fh.read(_EDGE))
    return h.hexdigest()


def cache_root(cache_dir: str | Path | None) -> Path:
    from nsysan.load.export import default_cache_dir

    base = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    return base / "frames"


def folder_for(source_path: Path, cache_dir: str | Path | None) -> Path:
    """The cache folder of this version of ``source_path`` (it may not exist yet)."""
    return cache_root(cache_dir) / f"{source_path.name}.{content_key(source_path)}"


def cached_loader(
    build: Callable[[str], pl.DataFrame], meta: TraceMeta, folder: Path
) -> Callable[[str], pl.DataFrame]:
    """Wrap a frame builder: read ``<frame>.arrow`` from ``folder`` (`folder_for`) when
    cached, else build and store it there. The folder is recorded in ``meta.frame_cache``
    (the source's digest and table counts are kept there too: `stored_digest`,
    `stored_counts`)."""
    meta.frame_cache = folder

    def load(frame: str) -> pl.DataFrame:
        data, values, notes = (folder / f"{frame}{suffix}" for suffix in FRAME_FILES)
        if data.is_file() and values.is_file() and notes.is_file():
            try:
                df = read_frame(data, values)
                _check_schema(df, frame)
                added = json.loads(notes.read_text())
                texts, quality = list(added["notes"]), dict(added["quality"])
            except BaseException as exc:
                if not _cache_failure(exc):
                    raise
                # damaged or concurrently replaced: rebuild below
            else:
                for text in texts:
                    if text not in meta.notes:
                        meta.notes.append(text)
                for name, counts in quality.items():
                    meta.quality.setdefault(name, counts)
                return _with_trace_id(df, meta.trace_id)
        before = set(meta.notes)
        df = build(frame)
        # the frame's own counts, and those of the StringIds lookup it may have read first
        # (the same in every file that has them: replaying one is enough)
        added = {"notes": [t for t in meta.notes if t not in before],
                 "quality": {k: meta.quality[k] for k in (frame, "strings")
                             if k in meta.quality}}
        mapped = _written_and_mapped(df.drop(TRACE_ID, strict=False), folder, frame, added)
        if mapped is None:  # (a read-only or full cache dir only costs speed)
            return df
        del df  # (the caller's only other reference is gone with this function)
        return _with_trace_id(mapped, meta.trace_id)

    return load


def _with_trace_id(df: pl.DataFrame, trace_id: str) -> pl.DataFrame:
    # the id is the caller's, not the first run's (stored without it), and a constant
    # column: nothing per row (`nsysan.frames.trace._at_rest`)
    df = df.drop(TRACE_ID, strict=False)
    df.insert_column(0, pl.lit(trace_id, dtype=pl.String).alias(TRACE_ID))
    return df


def _cache_failure(exc: BaseException) -> bool:
    """``exc`` is a cache file that cannot be written or read back as a frame (damaged,
    malformed, replaced meanwhile, a full disk; polars' panics on such a file included),
    which costs only speed; not an interruption or an error of the frame's build."""
    kinds: tuple[type[BaseException], ...] = (
        OSError, ValueError, KeyError, TypeError, pl.exceptions.PolarsError,
        pl.exceptions.PanicException)
    arrow = sys.modules.get("pyarrow")  # (imported by `frame_file` when it reads or writes)
    if arrow is not None:
        kinds += (arrow.ArrowException,)
    return isinstance(exc, kinds)


#: a cached frame's files: its data, its dictionary columns' values, its loading notes
FRAME_FILES = (".arrow", ".values.arrow", ".notes.json")


def _check_schema(df: pl.DataFrame, frame: str) -> None:
    """Raise ValueError unless ``df`` has the columns and dtypes of a fresh build of
    ``frame`` (its canonical schema, stored without the trace id): a damaged label of an
    Enum, say, reads back as another Enum instead of failing."""
    canonical = schemas.CANONICAL.get(frame) or schemas_host.HOST_EVIDENCE.get(frame)
    if canonical is None:
        return
    expected = [(name, dtype) for name, dtype in canonical.items() if name != TRACE_ID]
    if list(df.schema.items()) != expected:
        raise ValueError(f"cached {frame} does not have the frame's schema")


def _written_and_mapped(df: pl.DataFrame, folder: Path, frame: str, added: dict
                        ) -> pl.DataFrame | None:
    """``df`` written to temporary files in ``folder``, flushed to the disk, and read back
    from them, mapped: the frame the analysis keeps (None when they cannot be written,
    flushed or read back). A background thread then renames them into place (`_commit`).

    Why the analysis keeps the mapped copy, not the frame it built: the built frame's
    memory is the process's own until the frame is released, while a mapped column is
    resident only where it is read (a pass reads a few columns of a frame), and its pages
    are the page cache's, which the kernel may reclaim and read again. A first analysis
    then holds what a repeat analysis from the cache holds (bench/RESULTS.md).

    Why flushed before it is mapped: pages the kernel failed to write back (an I/O error,
    no space on a thinly provisioned disk) may later be read again from the disk as zeros;
    flushed first, such a failure is the write's, and the analysis keeps the frame it
    built. The flush costs nothing measurable on 1M kernels (bench/RESULTS.md)."""
    tmp, tmp_values = (folder / f".{frame}.{uuid.uuid4().hex}.tmp" for _ in range(2))
    try:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            write_frame(df, tmp, tmp_values)
            mapped = read_frame(tmp, tmp_values)
            _check_schema(mapped, frame)
        except BaseException:
            _remove_quietly(tmp, tmp_values)  # (the failure to report is the write's)
            raise
    except BaseException as exc:
        if not _cache_failure(exc):
            raise
        return None
    # `flush` waits for the commit, and so does interpreter exit (executor threads are
    # joined at shutdown); a temporary file unlinked on failure stays readable while mapped
    # (and, flushed, whole)
    _pending[:] = [f for f in _pending if not f.done()]
    _pending.append(_writer().submit(_commit, tmp, tmp_values, folder, frame, added))
    return mapped


def _commit(tmp: Path, tmp_values: Path, folder: Path, frame: str, added: dict) -> None:
    """Put the files `_written_and_mapped` wrote (and flushed) in place, with the frame's
    notes; on failure remove them (a later analysis builds the frame again). Raises nothing:
    the analysis already has its frame, and a cache that cannot be written or cleaned (a
    full, read-only or vanished cache dir) only costs speed."""
    data, values, notes = (folder / f"{frame}{suffix}" for suffix in FRAME_FILES)
    tmp_notes = folder / f".{frame}.{uuid.uuid4().hex}.tmp"
    try:
        os.replace(tmp_values, values)
        os.replace(tmp, data)
        tmp_notes.write_text(json.dumps(added))
        os.replace(tmp_notes, notes)
    except OSError:
        pass
    finally:
        _remove_quietly(tmp, tmp_values, tmp_notes)


def _remove_quietly(*paths: Path) -> None:
    """Remove ``paths`` where they still exist; a file that cannot be removed stays (nsysan
    removes it later, `nsysan.load.cache_space`, once it is an hour old)."""
    for path in paths:
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)


#: facts about the source kept beside its frames, each valid for one version of the file:
#: its sha256 (`stored_digest`) and the row count of every table (`stored_counts`)
DIGEST_FILE = "source.sha256.json"
COUNTS_FILE = "source.tables.json"


def _kept(folder: Path, name: str, path: Path, key: str) -> object:
    """``key`` of the JSON file ``name`` in ``folder`` when it was written for this very
    version of ``path`` (`file_identity`); else None."""
    try:
        data = json.loads((folder / name).read_text())
    except (OSError, ValueError):
        return None
    ident = file_identity(path)
    if not isinstance(data, dict) or ident is None or data.get("file") != ident:
        return None
    return data.get(key)


def _keep(folder: Path, name: str, path: Path, identity: list[int], key: str,
          value: object) -> None:
    """Write ``{file: identity, key: value}`` as ``name`` in ``folder`` when ``path`` is still
    the version ``identity`` (to a temporary name, then renamed); a failed write only costs
    the next computation."""
    if file_identity(path) != identity:
        return
    tmp = folder / f".{name}.{uuid.uuid4().hex}.tmp"
    try:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps({"file": identity, key: value}))
            os.replace(tmp, folder / name)
        finally:
            tmp.unlink(missing_ok=True)
    except OSError:  # (e.g. the cache dir is a file: the unlink fails too)
        pass


def stored_digest(folder: Path, path: Path) -> str | None:
    """The sha256 of ``path`` kept in its frame cache ``folder``, when it was computed from
    this very version of the file (`file_identity`); else None.

    Why: manifest.json records the input's sha256, ~1 s per GB to compute; an analysis whose
    frames come from the cache does not read the input otherwise (hashing it took 7 s of CPU
    for a 9 GB export, beside ~50 s of the analysis on 2 cores)."""
    digest = _kept(folder, DIGEST_FILE, path, "sha256")
    return digest if isinstance(digest, str) and len(digest) == 64 else None


def store_digest(folder: Path, path: Path, digest: str, identity: list[int]) -> None:
    """Keep ``digest``, computed from the version ``identity`` of ``path``, in its frame
    cache ``folder`` (the frames of that trace are cached there in the same analysis), when
    the file is still that version; a failed write only costs the next hash."""
    _keep(folder, DIGEST_FILE, path, identity, "sha256", digest)


def stored_counts(folder: Path, path: Path) -> dict[str, int] | None:
    """The row count of every table of ``path`` kept in its frame cache ``folder``, when
    counted in this very version of the file (`file_identity`); else None.

    Why: the counts (manifest.json's raw tables, the passes' sizing) take a ``count(*)`` of
    every table, which walks all of an export: 3 s of CPU for a 9 GB one whose pages are in
    memory, 14 s when they are not, in an analysis that otherwise reads only the cache."""
    counts = _kept(folder, COUNTS_FILE, path, "tables")
    if not isinstance(counts, dict) or not all(
            isinstance(k, str) and type(v) is int and v >= 0 for k, v in counts.items()):
        return None
    return counts


def store_counts(folder: Path, path: Path, counts: dict[str, int],
                 identity: list[int]) -> None:
    """Keep ``counts``, counted in the version ``identity`` of ``path``, in its frame cache
    ``folder`` when the file is still that version."""
    _keep(folder, COUNTS_FILE, path, identity, "tables", counts)


_executor: ThreadPoolExecutor | None = None
_pending: list[Future[None]] = []


def _writer() -> ThreadPoolExecutor:
    global _executor
    if _executor is None:
        _executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nsysan-cache")
    return _executor


def _after_fork() -> None:
    # a forked worker (batch) inherits the executor object but not its thread
    global _executor
    _executor = None
    _pending.clear()


os.register_at_fork(after_in_child=_after_fork)


def flush() -> None:
    """Wait until every cache file queued so far is written."""
    while _pending:
        _pending.pop().result()
