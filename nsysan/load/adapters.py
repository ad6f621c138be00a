"""Raw nsys tables -> canonical frames (`nsysan.frames.schemas.CANONICAL`).

Every difference between nsys versions is handled here by probing tables and columns, never by
reading a version string: a column an older exporter lacks becomes a null column, an absent
table (lazy exports omit empty ones) becomes an empty frame plus an entry in
`TraceMeta.missing` saying what was not captured and how to capture it.

This module holds what every adapter shares (the `Adapter` with its cached string and enum
lookups, the table registry, the column reader that applies the data-quality contract of
`nsysan.load.quality`); GPU operations are in `adapters_gpu`, the CUDA API, sync, OS runtime
and overhead frames in `adapters_host`, NVTX in `adapters_nvtx`, the descriptive frames (GPUs,
streams, processes, threads, meta) in `adapters_info`.

Mapping rules (documented here because they are choices, not nsys facts):

- ``gpu_ops`` rows with ``start == end == 0`` are dropped: CUPTI writes 0 for a timestamp it could
  not collect, and such a row has no place on the timeline (counted as ``unrecorded``, like
  every rule of the data-quality contract: `nsysan.load.quality`, docs/data-quality.md).
- memcpy ``op_class`` by ``copyKind``: 1 HtoD, 3 HtoA, 11 unified HtoD -> ``memcpy_h2d``;
  2 DtoH, 4 AtoH, 12 unified DtoH -> ``memcpy_d2h``; 10 PtoP -> ``memcpy_p2p``; everything that
  crosses no host-device link or whose direction is unknown (8 DtoD, 13 unified DtoD, the
  array-to-array/device kinds 5-7, 9 HtoH, 0 unknown) -> ``memcpy_d2d``, the "local copy" class.
  Arrays are device memory, so only the direction matters for PCIe. ``copy_kind`` keeps the exact
  kind (``HtoH``, ``AtoD``, ``UVM_HtoD``...).
- kernel ``op_class`` is ``nccl`` when the short name starts with ``nccl`` (``ncclKernel_*`` before
  NCCL 2.19, ``ncclDevKernel_*`` after, and the older ``ncclAllReduceRingLLKernel_*``) or the
  demangled name contains ``ncclKernel_``/``ncclDevKernel_``; every other kernel is ``compute``.
- memory kinds use nsys's ``ENUM_CUDA_MEM_KIND`` numbering (not CUPTI's): the enum table's labels
  when it has rows, else the built-in copy of it; values are snake_case (``pageable``, ``pinned``,
  ``device``, ``array``, ``managed``, ``device_static``, ``managed_static``, ``unknown``).
- CUDA API names lose the ``_v<digits>`` version suffix (``cudaLaunchKernel_v7000``), never a
  driver ``_v2``; ``api_class`` follows `API_CLASS_RULES`, first match wins.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import polars as pl

from nsysan.errors import SchemaError
from nsysan.frames import schemas, schemas_host
from nsysan.frames.trace import TraceMeta
from nsysan.load.quality import FrameQuality, Session, clean_strings
from nsysan.load.source import TableSource

KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
MEMCPY = "CUPTI_ACTIVITY_KIND_MEMCPY"
MEMSET = "CUPTI_ACTIVITY_KIND_MEMSET"
RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
SYNCHRONIZATION = "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"
CUDA_TABLES = (KERNEL, MEMCPY, MEMSET, RUNTIME)
#: columns every CUPTI activity table shares and an analysis needs
COMMON_COLUMNS = ("start", "end", "deviceId", "streamId")
#: columns nsys always writes in those tables that an analysis can do without: a minimal
#: (third-party) export may lack them; they then default to NULL (globalPid: see
#: `Adapter.default_process`) and are counted as ``column_defaulted``
DEFAULTED_COLUMNS: dict[str, pl.DataType] = {
    "contextId": pl.Int64(), "correlationId": pl.Int64(), "globalPid": pl.Int64(),
}

#: canonical frame -> (raw tables it is built from, how to capture them)
FRAME_SOURCES: dict[str, tuple[tuple[str, ...], str]] = {
    "gpu_ops": ((KERNEL, MEMCPY, MEMSET), "was the profile captured with `--trace=cuda`?"),
    "cuda_api": ((RUNTIME,), "was the profile captured with `--trace=cuda`?"),
    "nvtx": (
        ("NVTX_EVENTS",),
        "was the profile captured with `--trace=nvtx`, and did the application emit NVTX?",
    ),
    "osrt": (("OSRT_API",), "was the profile captured with `--trace=osrt`?"),
    "sync": ((SYNCHRONIZATION,), "was the profile captured with `--trace=cuda`?"),
    "overhead": (("PROFILER_OVERHEAD",), "nsys recorded no profiler overhead in this capture"),
    "gpus": (
        ("TARGET_INFO_GPU",),
        "the export has no GPU descriptions (old or trimmed export); device names are unknown",
    ),
    "streams": (("TARGET_INFO_CUDA_STREAM",), "was the profile captured with `--trace=cuda`?"),
    "processes": (("PROCESSES",), "the export has no process list (nsys 2020.x exports lack it)"),
    "threads": (("ThreadNames",), "the export has no thread names"),
}

#: the raw tables whose column issues (`Adapter.read`) count in each frame's data-quality
#: entry: each table belongs to one frame, whichever frame happens to read it first
QUALITY_TABLES: dict[str, tuple[str, ...]] = {
    **{frame: raw for frame, (raw, _) in FRAME_SOURCES.items()},
    "gpu_ops": (*FRAME_SOURCES["gpu_ops"][0], "ENUM_CUDA_MEM_KIND"),
    "gpus": (*FRAME_SOURCES["gpus"][0], "TARGET_INFO_CUDA_GPU"),
    "meta": ("META_DATA_EXPORT", "EXPORT_META_DATA", "META_DATA_CAPTURE", "ANALYSIS_DETAILS",
             "TARGET_INFO_SESSION_START_TIME", "TARGET_INFO_SYSTEM_ENV"),
    # host evidence (optional frames, `schemas_host.HOST_EVIDENCE`)
    "sched": ("SCHED_EVENTS",),
    "cpu_samples": ("COMPOSITE_EVENTS",),
    "cpu_stacks": ("SAMPLING_CALLCHAINS",),
    "memory_events": ("CUDA_GPU_MEMORY_USAGE_EVENTS",),
}

LAZY_HINT = "a lazy export also omits a table when nothing of that kind was recorded"

#: copyKind -> (copy_kind, op_class); see the module docstring for the choices
COPY_KINDS: dict[int, tuple[str, str]] = {
    0: ("Unknown", "memcpy_d2d"),
    1: ("HtoD", "memcpy_h2d"),
    2: ("DtoH", "memcpy_d2h"),
    3: ("HtoA", "memcpy_h2d"),
    4: ("AtoH", "memcpy_d2h"),
    5: ("AtoA", "memcpy_d2d"),
    6: ("AtoD", "memcpy_d2d"),
    7: ("DtoA", "memcpy_d2d"),
    8: ("DtoD", "memcpy_d2d"),
    9: ("HtoH", "memcpy_d2d"),
    10: ("PtoP", "memcpy_p2p"),
    11: ("UVM_HtoD", "memcpy_h2d"),
    12: ("UVM_DtoH", "memcpy_d2h"),
    13: ("UVM_DtoD", "memcpy_d2d"),
}
#: built-in copy of nsys's ENUM_CUDA_MEM_KIND (used when the export's table is absent or empty)
MEM_KINDS: dict[int, str] = {
    0: "pageable",
    1: "pinned",
    2: "device",
    3: "array",
    4: "managed",
    5: "device_static",
    6: "managed_static",
    7: "unknown",
}
SYNC_TYPES: dict[int, str] = {
    1: "event_sync",
    2: "stream_wait_event",
    3: "stream_sync",
    4: "context_sync",
}
#: sync type from the synchronizing API's name. nsys 2020–2023 exports number ``syncType``
#: one off from their own ENUM_CUPTI_SYNC_TYPE labels (cudaDeviceSynchronize is stored as 1,
#: cudaEventSynchronize as 2, cudaStreamSynchronize and cudaStreamWaitEvent both as 3) while
#: newer exports follow the labels, so the API name is the reliable source; the enum is the
#: fallback for rows whose API call is not in the trace.
SYNC_TYPE_BY_API: tuple[tuple[str, str], ...] = (
    ("context_sync", r"^(cudaDeviceSynchronize|cudaThreadSynchronize|cuCtxSynchronize)"),
    ("stream_wait_event", r"^cu(da)?StreamWaitEvent"),
    ("stream_sync", r"^(cudaStreamSynchronize|cuStreamSynchronize|cudaStreamQuery|cuStreamQuery)"),
    ("event_sync", r"^(cudaEventSynchronize|cuEventSynchronize|cudaEventQuery|cuEventQuery)"),
)
#: CUPTI's "not applicable" marker in id columns (e.g. streamId of a context synchronization)
CUPTI_INVALID_ID = 0xFFFFFFFF
#: the CUDA id columns of the activity tables (`schemas.CUDA_ID` in the frames)
CUDA_ID_COLUMNS = ("deviceId", "contextId", "streamId", "correlationId")


def null_invalid_ids(df: pl.DataFrame, columns: Sequence[str] = CUDA_ID_COLUMNS) -> pl.DataFrame:
    """``df`` with `CUPTI_INVALID_ID` in the CUDA id ``columns`` it has made null: the id does
    not apply there (the frames hold these ids as Int32, which the marker does not fit, and a
    number would be a lie). Columns without the marker are not copied."""
    marked = [c for c in columns if c in df.columns and bool((df[c] == CUPTI_INVALID_ID).any())]
    if not marked:
        return df
    return df.with_columns(
        pl.when(pl.col(c) == CUPTI_INVALID_ID).then(None).otherwise(pl.col(c)).alias(c)
        for c in marked)

_PTSZ = r"(_ptsz|_ptds)?$"
#: (api_class, regex on the suffix-stripped name); first match wins
API_CLASS_RULES: tuple[tuple[str, str], ...] = (
    ("graph", r"^cu(da)?GraphLaunch" + _PTSZ),
    (
        "launch",
        r"^_*cu(da)?Launch(Kernel(Ex(C)?)?|CooperativeKernel(MultiDevice)?|Grid(Async)?)?" + _PTSZ,
    ),
    (
        "sync",
        r"^(cuda(Device|Thread|Stream|Event)Synchronize|cudaStreamWaitEvent"
        r"|cu(Ctx|Stream|Event)Synchronize|cuStreamWaitEvent)" + _PTSZ,
    ),
    ("memcpy", r"^cu(da)?Memcpy"),
    ("memset", r"^cu(da)?Memset"),
    (
        "malloc",
        r"^(cudaMalloc|cudaFree|cudaHostAlloc|cudaHostRegister|cudaHostUnregister"
        r"|cuMemAlloc|cuMemFree|cuMemHostAlloc|cuMemHostRegister|cuMemHostUnregister"
        r"|cuMemCreate|cuMemRelease)",
    ),
)
VERSION_SUFFIX = r"_v\d{4,}$"

#: raw text columns the adapters read (every other column they read is an integer)
TEXT_COLUMNS = frozenset({"value", "text", "name", "label", "jsonText", "busLocation", "uuid"})

PID_MASK = 0xFFFFFF
PROCESS_KEY_MASK = -(1 << 24)  # 0xFFFFFFFFFF000000 as a signed 64-bit value


def pid_of(col: str) -> pl.Expr:
    """``(globalTid >> 24) & 0xFFFFFF`` (floor division is the arithmetic shift, also for the
    negative values SQLite stores when the hardware-id byte is >= 0x80)."""
    return (pl.col(col) // (1 << 24)) & PID_MASK


def tid_of(col: str) -> pl.Expr:
    return pl.col(col) & PID_MASK


def global_pid_of(col: str) -> pl.Expr:
    return pl.col(col) & PROCESS_KEY_MASK


def missing_frames(tables: Mapping[str, int]) -> tuple[dict[str, str], list[str]]:
    """Which canonical frames cannot be built from ``tables`` (frame -> why), plus notes on
    frames that are only partly available (e.g. kernels but no memset table)."""
    missing: dict[str, str] = {}
    notes: list[str] = []
    for frame, (raw, hint) in FRAME_SOURCES.items():
        absent = [t for t in raw if t not in tables]
        if len(absent) == len(raw):
            what = "table" if len(raw) == 1 else "tables"
            missing[frame] = f"{what} {'/'.join(raw)} not found: {hint} ({LAZY_HINT})"
        elif absent:
            notes.append(
                f"table {'/'.join(absent)} not found: {frame} has none of those rows ({LAZY_HINT})"
            )
    return missing, notes


@dataclass
class Adapter:
    """Builds canonical frames from one `TableSource`; caches the lookups frames share."""

    source: TableSource
    trace_id: str
    #: filled in by `open_trace`; frames read the session end from it and add notes to it
    meta: TraceMeta | None = None
    _strings: pl.DataFrame | None = field(default=None, repr=False)
    #: the owning Trace's cached frame getter (set by `open_trace`), so a frame that needs
    #: another frame (sync needs cuda_api) reuses it instead of reading the source twice
    frame: Callable[[str], pl.DataFrame] | None = field(default=None, repr=False)
    #: the data-quality counts of each frame while it is built (`quality`)
    _quality: dict[str, FrameQuality] = field(default_factory=dict, repr=False)
    #: raw table -> column -> {rule: values}: what `read` found in the columns themselves
    _table_issues: dict[str, dict[str, dict[str, int]]] = field(default_factory=dict,
                                                                 repr=False)

    @property
    def duration_ns(self) -> int | None:
        """The session length when the export records a usable one (`Session.of`)."""
        return self.session.duration_ns

    @property
    def session(self) -> Session:
        """The session the export records, as the outside-session rule reads it."""
        meta = self.meta
        if meta is None:
            return Session(None)
        return Session.of(meta.duration_ns, meta.time_shifted)

    def note(self, text: str) -> None:
        if self.meta is not None and text not in self.meta.notes:
            self.meta.notes.append(text)

    def quality(self, frame: str) -> FrameQuality:
        """The data-quality counts of ``frame`` (being built): rules record into it."""
        return self._quality.setdefault(frame, FrameQuality())

    # -- shared helpers ------------------------------------------------------------------------
    def has(self, table: str) -> bool:
        return bool(self.source.columns(table))

    def read(
        self,
        table: str,
        required: list[str],
        optional: Mapping[str, pl.DataType] | None = None,
        defaulted: Mapping[str, pl.DataType] | None = None,
        narrow: Mapping[str, pl.DataType] | None = None,
    ) -> pl.DataFrame:
        """``required`` columns (SchemaError when one is absent) plus the ``optional`` and
        ``defaulted`` ones the table has; those it lacks come back as typed nulls. Optional
        columns are absent from some nsys versions; defaulted ones nsys always writes, so
        their absence is counted (``column_defaulted``). Every column comes back with the
        type the adapters expect (`_typed`), except that an integer column of ``narrow`` may
        come in the narrower type given there when all its values fit it
        (`source.NarrowingSource`): only for columns the caller merely compares or copies
        into a frame column of that type, never computes with."""
        optional = {**(optional or {}), **(defaulted or {})}
        have = set(self.source.columns(table))
        lacking = [c for c in required if c not in have]
        if lacking:
            raise SchemaError(
                f"table {table} in {self.source.path} lacks column {', '.join(lacking)}; the "
                f"export is incomplete or from an unsupported exporter — re-export the report"
            )
        present = [c for c in optional if c in have]
        narrowing = getattr(self.source, "read_narrowed", None) if narrow else None
        df = (narrowing(table, required + present, narrow) if narrowing is not None
              else self.source.read(table, required + present))
        df = self._typed(table, df, optional, narrow or {})
        issues = self._table_issues.setdefault(table, {})
        for c in defaulted or {}:
            if c not in have:
                issues[c] = {"column_defaulted": df.height}
        return df.with_columns(
            pl.lit(None, dtype=dtype).alias(c) for c, dtype in optional.items() if c not in have
        )

    def _typed(self, table: str, df: pl.DataFrame, declared: Mapping[str, pl.DataType],
               narrow: Mapping[str, pl.DataType]) -> pl.DataFrame:
        """``df`` with every column of the type the adapters expect (Int64, or String for
        `TEXT_COLUMNS`), whatever type the export declared: a column that holds only NULLs
        has no type in a Parquet file, and a third-party export can declare a timestamp
        TEXT or REAL. Integers written as text or as integral reals keep their value; other
        values become NULL and are counted (``value_not_integer``; ``value_not_text`` for a
        text column), with what the source itself read as NULL (`TableSource.issues`)."""
        issues = self._table_issues.setdefault(table, {})
        source_issues = self.source.issues(table)
        fixes = []
        for c, dtype in df.schema.items():
            want = declared.get(c) or (pl.String() if c in TEXT_COLUMNS else pl.Int64())
            if dtype == narrow.get(c):  # (read narrow by the source: every value fits)
                want = dtype
            counted = dict(source_issues.get(c, {}))
            if dtype != want:
                fixes.append(_as_type(c, dtype, want))
            nulled = "value_not_text" if want == pl.String() else "value_not_integer"
            issues[c] = {nulled: counted.get("nulled", 0),
                         "text_truncated": counted.get("truncated", 0)}
        if not fixes:
            return df
        before = df.null_count()
        df = df.with_columns(fixes)
        after = df.null_count()
        for c in before.columns:
            nulled = "value_not_integer" if "value_not_integer" in issues[c] else "value_not_text"
            issues[c][nulled] += int(after[c][0] - before[c][0])
        return df

    @property
    def strings(self) -> pl.DataFrame:
        """StringIds as (id, value), one value per id (`quality.clean_strings`); read once
        per trace, its counts recorded as the ``strings`` entry of ``TraceMeta.quality``."""
        if self._strings is None:
            if self.has("StringIds"):
                quality = FrameQuality()
                strings = clean_strings(self.read("StringIds", ["id", "value"]), quality)
                self._record("strings", quality, ["StringIds"], strings.height)
                self._strings = strings
            else:
                self._strings = pl.DataFrame(schema={"id": pl.Int64, "value": pl.String})
        return self._strings

    def _record(self, frame: str, quality: FrameQuality, tables: list[str], rows: int) -> None:
        """Store the counts of ``frame`` in ``meta.quality``, with the column issues `read`
        found in ``tables``."""
        for table in tables:
            for column, counts in sorted(self._table_issues.get(table, {}).items()):
                for rule, n in counts.items():
                    quality.add(rule, n, f"{table}.{column}")
        if self.meta is not None:
            self.meta.quality[frame] = quality.to_dict(rows)

    def default_process(self, df: pl.DataFrame) -> pl.DataFrame:
        """Rows of an activity table without ``globalPid`` (a minimal export) belong to the
        capture's only process with CUDA API calls when it has one; otherwise (no calls,
        several processes) they stay NULL and join no API call."""
        if df.is_empty() or df["globalPid"].null_count() < df.height:
            return df
        if self.frame is None or not self.has(RUNTIME):
            return df
        pids = self.frame("cuda_api")["global_pid"].drop_nulls().unique()
        if pids.len() != 1:
            return df
        return df.with_columns(pl.lit(pids[0], dtype=pl.Int64).alias("globalPid"))

    def resolve(self, df: pl.DataFrame, id_col: str, out: str) -> pl.DataFrame:
        """Add ``out`` = StringIds value of ``id_col`` (null when the id is null or unknown)."""
        lookup = self.strings.rename({"id": id_col, "value": out})
        return df.join(lookup, on=id_col, how="left", maintain_order="left")

    def resolve_categorical(self, df: pl.DataFrame, id_col: str, out: str) -> pl.DataFrame:
        """Add ``out`` = StringIds value of ``id_col`` as a Categorical (null when the id is
        null or unknown): only the ids ``df`` uses are looked up, and each row gets a code,
        never a copy of its text (`categorical`)."""
        return df.with_columns(categorical(pl.col(id_col), self.strings, df[id_col]).alias(out))

    def enum_labels(self, table: str, fallback: Mapping[int, str]) -> pl.DataFrame:
        """(id, label) of an ENUM_* table as snake_case labels; the built-in ``fallback`` when
        the table is absent or empty (2022.4 writes empty CUDA enums for captures without
        CUDA, 2020.x and reduced exports have none)."""
        if self.has(table):
            df = self.read(table, ["id", "label"])
            if df.height:
                return df.select(
                    pl.col("id").cast(pl.Int64),
                    pl.col("label").str.to_lowercase().str.replace_all(" ", "_").alias("label"),
                )
        return pl.DataFrame(
            {"id": list(fallback), "label": list(fallback.values())},
            schema={"id": pl.Int64, "label": pl.String},
        )

    def finish(self, df: pl.DataFrame, schema: pl.Schema) -> pl.DataFrame:
        df = df.with_columns(pl.lit(self.trace_id, dtype=pl.String).alias("trace_id"))
        return schemas.conform(df, schema)

    # -- frames --------------------------------------------------------------------------------
    def build(self, frame: str) -> pl.DataFrame:
        """The canonical frame ``frame``, empty (with its schema) when not captured."""
        builders: dict[str, tuple[str, str]] = {
            "gpu_ops": ("adapters_gpu", "build_gpu_ops"),
            "cuda_api": ("adapters_host", "build_cuda_api"),
            "nvtx": ("adapters_nvtx", "build_nvtx"),
            "osrt": ("adapters_host", "build_osrt"),
            "sync": ("adapters_host", "build_sync"),
            "overhead": ("adapters_host", "build_overhead"),
            "gpus": ("adapters_info", "build_gpus"),
            "streams": ("adapters_info", "build_streams"),
            "processes": ("adapters_info", "build_processes"),
            "threads": ("adapters_info", "build_threads"),
            "meta": ("adapters_info", "build_meta"),
            "sched": ("adapters_sched", "build_sched"),
            "cpu_samples": ("adapters_samples", "build_cpu_samples"),
            "cpu_stacks": ("adapters_samples", "build_cpu_stacks"),
            "memory_events": ("adapters_memory", "build_memory_events"),
        }
        # Imported on first use: those modules build on this one, and importing
        # adapters_nvtx (numpy) must not delay the gpu_ops frame of a prefetch thread.
        module, name = builders[frame]
        builder = getattr(importlib.import_module(f"nsysan.load.{module}"), name)
        df = builder(self)
        schema = schemas.CANONICAL.get(frame) or schemas_host.HOST_EVIDENCE[frame]
        df = df if df is not None else schemas.empty(schema)
        if frame in schemas.OPTIONAL_FRAMES and df.is_empty():
            return df  # no events: no data-quality entry (the manifest stays as it was)
        self._record(frame, self._quality.pop(frame, FrameQuality()), list(QUALITY_TABLES[frame]),
                     df.height)
        return df


def categorical(key: pl.Expr, table: pl.DataFrame, used: pl.Series | None = None,
                dtype: pl.Categorical = schemas.CAT, column: str = "") -> pl.Expr:
    """``key`` (integer) mapped through ``table`` (``id``, ``value``: unique ids) to a
    Categorical (``dtype``: the global one, or a `schemas.small_vocabulary` for ``column``),
    null where the key is null or not in the table.

    Only the lookup is cast to Categorical (restricted to the ids in ``used`` when given: a
    StringIds table holds every string of the trace), and the mapping gives every row the
    code of its value: no per-row string is ever made, so a million kernels named by a few
    hundred ~560-byte signatures cost 4 bytes each."""
    if used is not None:
        table = table.filter(pl.col("id").is_in(used.drop_nulls().unique().implode()))
    values = small_labels(table["value"], dtype, column) if dtype != schemas.CAT else (
        table["value"].cast(dtype))
    return key.replace_strict(table["id"], values, default=None)


def small_labels(values: pl.Series, dtype: pl.Categorical, column: str) -> pl.Series:
    """``values`` (String: the labels a trace uses) cast to the small vocabulary ``dtype`` of
    ``column``, once `schemas.fit_small_vocabulary` found they fit (else
    `TraceFormatError`, and the vocabulary left as it was)."""
    schemas.fit_small_vocabulary(values, dtype, column)
    return values.cast(dtype)


def enum_mapped(key: pl.Expr, mapping: Mapping[int, str], dtype: pl.Enum) -> pl.Expr:
    """``key`` (an integer code) mapped through ``mapping`` to the Enum ``dtype``; null where
    the key is null or unmapped (a label outside ``dtype`` raises: the vocabulary is closed)."""
    return key.replace_strict(mapping, default=None, return_dtype=dtype)


def _as_type(column: str, dtype: pl.DataType, want: pl.DataType) -> pl.Expr:
    """The expression that reads ``column`` (of ``dtype``) as ``want`` (Int64 or String):
    integers kept, integral finite reals and integer text converted, anything else NULL
    (also what polars makes of a column without a declared type that mixes blobs with other
    values: Binary or Object)."""
    col = pl.col(column)
    if dtype in (pl.Binary, pl.Object):
        return pl.lit(None, dtype=want).alias(column)
    if want == pl.String():
        return col.cast(pl.String, strict=False)
    if dtype == pl.String():
        return col.str.strip_chars().str.to_integer(strict=False)
    if dtype.is_float():
        fits = col.is_finite() & (col == col.round()) & (col.abs() < 2.0**63)
        return pl.when(fits).then(col).cast(want, strict=False)
    return col.cast(want, strict=False)
