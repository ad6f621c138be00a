"""Open any form of an Nsight Systems profile as a `Trace` of canonical frames.

Accepted inputs: a report (``.nsys-rep``, ``.qdrep``: exported with `nsys export` and cached,
see `export`), a SQLite export (``.sqlite``) or a parquetdir export (a directory of
``<TABLE>.parquet`` files). Files are recognised by their first bytes, not their suffix.
"""

from __future__ import annotations

import re
from pathlib import Path

from nsysan.errors import SchemaError, TraceFormatError
from nsysan.frames.trace import Trace, TraceMeta
from nsysan.load.adapters import CUDA_TABLES, Adapter, missing_frames
from nsysan.load.adapters_info import read_metadata
from nsysan.load.export import REPORT_MAGIC, REPORT_SUFFIXES, export_report, report_version
from nsysan.load.files import check_openable
from nsysan.load.source import TableSource
from nsysan.load.sqlite import SqliteSource
from nsysan.load.sqlite_file import SQLITE_MAGIC, read_header, write_ahead_log

__all__ = ["check_openable", "open_source", "open_trace", "trace_id_for"]

#: suffixes that name an export or a report rather than the run (stripped by `trace_id_for`)
_EXPORT_SUFFIX = re.compile(
    r"(\.nsys\d{4}(\.\d+)*(\.[0-9a-f]+-[0-9a-f]+)?)?"  # .nsys2022.4.2[.<size>-<mtime>]
    r"\.(sqlite3?|db|parquetdir|nsys-rep|qdrep|qdstrm)$",
    re.IGNORECASE,
)
SQLITE_SUFFIXES = (".sqlite", ".sqlite3", ".db")
_UNSAFE = re.compile(r"[^A-Za-z0-9._+-]+")


def trace_id_for(path: str | Path) -> str:
    """A readable, filesystem-safe id for a profile: its file name without export suffixes.

    ``4gpu_baseline.nsys-rep.nsys2022.4.2.sqlite`` -> ``4gpu_baseline``; ``run 1.qdrep`` ->
    ``run_1``. Suffixes are stripped repeatedly (report suffix, then exporter version, then
    format), other characters than letters, digits and ``._+-`` become ``_``. The same run
    exported twice (``x.sqlite``, ``x.nsys-rep.nsys2022.4.2.sqlite``) gets the same id, and ids
    are not unique across directories: a batch over several directories should prefix the
    parent directory's name (that is why this is a separate function).
    """
    name = Path(path).name
    while True:
        stripped = _EXPORT_SUFFIX.sub("", name)
        if stripped == name or not stripped:
            break
        name = stripped
    safe = _UNSAFE.sub("_", name).strip("._")
    return safe or "trace"


def _directory_source(path: Path) -> TableSource:
    try:
        has_parquet = any(p.suffix == ".parquet" for p in path.iterdir())
    except OSError as exc:
        raise TraceFormatError(f"{path}: cannot list the directory ({exc.strerror})") from None
    if not has_parquet:
        raise TraceFormatError(
            f"{path} is a directory, not a profile: pass a .nsys-rep, .qdrep, .sqlite or an nsys "
            f"parquetdir export"
        )
    # imported here: the parquetdir reader is only needed for directory inputs
    from nsysan.load.parquetdir import ParquetDirSource

    return ParquetDirSource(path)


def open_source(
    path: str | Path,
    *,
    nsys: str | Path | None = None,
    cache_dir: str | Path | None = None,
) -> tuple[TableSource, str | None]:
    """The raw-table source for ``path`` and the version that recorded it (when known).

    Reports are exported first (cached); nsys is needed only for them.
    """
    path = Path(path)
    check_openable(path)
    if path.is_dir():
        return _directory_source(path), None
    header = read_header(path)
    suffix = path.suffix.lower()
    # the header decides; the suffix only picks the more helpful error for a damaged file
    is_sqlite = header.startswith(SQLITE_MAGIC)
    if header.startswith(REPORT_MAGIC) or (suffix in REPORT_SUFFIXES and not is_sqlite):
        exported = export_report(path, nsys=nsys, cache_dir=cache_dir)
        return SqliteSource(exported), report_version(path)
    if is_sqlite or not header or suffix in SQLITE_SUFFIXES:
        return SqliteSource(path), None  # SqliteSource explains empty and truncated files
    if suffix == ".qdstrm":
        raise TraceFormatError(
            f"{path} is an unfinished capture stream (.qdstrm): convert it to .nsys-rep with "
            f"QdstrmImporter, then pass that"
        )
    raise TraceFormatError(
        f"{path}: not an Nsight Systems profile (unrecognised header); pass a .nsys-rep, .qdrep, "
        f".sqlite or an nsys parquetdir export"
    )


def open_trace(
    path: str | Path,
    *,
    nsys: str | Path | None = None,
    trace_id: str | None = None,
    require_cuda: bool = False,
    cache_dir: str | Path | None = None,
    frame_cache: bool | None = None,
) -> Trace:
    """Open a profile: probe what it holds now, read each canonical frame on first use.

    ``frame_cache``: keep a mapped copy of the frames for repeat analyses (`nsysan.load.cache`;
    None = only for big SQLite exports, unless ``$NSYSAN_NO_CACHE`` is set).

    ``trace.meta`` says what could not be loaded (``missing``: frame -> why and how to capture
    it), other caveats (``notes``) and every raw table with its row count (``tables``). With
    ``require_cuda`` a profile without any CUDA activity table raises SchemaError (the analyze
    command needs them); otherwise such a profile opens with empty CUDA frames.
    """
    path = Path(path)
    source, recorded = open_source(path, nsys=nsys, cache_dir=cache_dir)
    from nsysan.load import cache

    folder = None
    if isinstance(source, SqliteSource) and cache.enabled(source.path, source.format,
                                                          frame_cache):
        folder = cache.folder_for(source.path, cache_dir)
        from nsysan.load.cache_space import keep_bounded

        keep_bounded(folder)  # (before this analysis may add a trace's frames to the cache)
        _counts_from_cache(source, folder)
    tables = source.tables()
    # empty tables count as absent: a non-lazy export of a CPU-only capture has them all
    if require_cuda and not any(tables.has_rows(t) for t in CUDA_TABLES):
        source.close()
        raise SchemaError(
            f"{path} has no CUDA activity tables (CUPTI_ACTIVITY_KIND_KERNEL/MEMCPY/MEMSET/"
            f"RUNTIME absent or empty): record with --trace=cuda"
        )
    trace_id = trace_id or trace_id_for(path)
    adapter = Adapter(source, trace_id)
    info = read_metadata(adapter)
    missing, partial = missing_frames(tables)
    meta = TraceMeta(
        trace_id=trace_id,
        path=path,
        source_path=source.path,
        source_format=source.format,
        exporter_version=info["exporter_version"],
        schema_version=info["schema_version"],
        recorded_version=recorded,
        session_start_utc_ns=info["session_start_utc_ns"],
        duration_ns=info["duration_ns"],
        time_shifted=info["time_shifted"],
        tables=tables,
        capture=info["capture"],
        missing=missing,
        notes=[*info["notes"], *partial],
    )
    adapter.meta = meta
    loader = adapter.build
    if folder is not None:
        loader = cache.cached_loader(adapter.build, meta, folder)
    trace = Trace(meta, loader)
    adapter.frame = trace.frame
    return trace


def _counts_from_cache(source: SqliteSource, folder: Path) -> None:
    """Give ``source`` the table counts its frame cache ``folder`` keeps for this version of
    the file; else have them kept there once counted. (An analysis served by the cache reads
    the export for nothing else: counting walks all of it.)"""
    from nsysan.load import cache

    if write_ahead_log(source.path):  # rows may sit in the -wal file: not this file's counts
        return
    kept = cache.stored_counts(folder, source.path)
    if kept is not None and source.adopt_counts(kept):
        return
    identity = cache.file_identity(source.path)  # before counting starts
    if identity is not None:
        path = source.path
        source.tables().when_counted(
            lambda counts: cache.store_counts(folder, path, counts, identity))

