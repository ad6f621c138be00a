"""Raw nsys tables -> canonical frames (`nsysan.frames.schemas.CANONICAL`).

Every difference between nsys versions is handled here by probing tables and columns, never by
reading a version string: a column an older exporter lacks becomes a null column, an absent
table (lazy exports omit empty ones) becomes an empty frame plus an entry in
`TraceMeta.missing` saying what was not captured and how to capture it.

This module holds what every adapter shares (the `Adapter` with its cached string and enum
lookups, the table registry) and the CUDA API, sync, OS runtime and overhead frames; GPU
operations are in `adapters_gpu`, NVTX in `adapters_nvtx`, the descriptive frames (GPUs,
streams, processes, threads, meta) in `adapters_info`.

Mapping rules (documented here because they are choices, not nsys facts):

- ``gpu_ops`` rows with ``start == end == 0`` are dropped: CUPTI writes 0 for a timestamp it could
  not collect, and such a row has no place on the timeline.
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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import polars as pl

from nsysan.errors import SchemaError
from nsysan.frames import schemas
from nsysan.frames.order import break_ties
from nsysan.frames.trace import TraceMeta
from nsysan.load.source import TableSource

KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
MEMCPY = "CUPTI_ACTIVITY_KIND_MEMCPY"
MEMSET = "CUPTI_ACTIVITY_KIND_MEMSET"
RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
SYNCHRONIZATION = "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"
CUDA_TABLES = (KERNEL, MEMCPY, MEMSET, RUNTIME)
#: columns every CUPTI activity table shares
COMMON_COLUMNS = ("start", "end", "deviceId", "contextId", "streamId", "correlationId", "globalPid")

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


def sort_by_time(df: pl.DataFrame, start: str = "start_ns", end: str = "end_ns") -> pl.DataFrame:
    """``df`` sorted by (start, end), rows with the same start and end by every other column
    (`nsysan.frames.order`): the order depends on the rows' content, never on the export's
    physical row order.

    Sorting by start alone is cheaper (one key) and gives the same order whenever the rows that
    share a start already have non-decreasing ends, which a vectorised check confirms; only
    otherwise is the two-key sort needed."""
    by_start = df.sort(start, maintain_order=True)
    s, e = by_start[start], by_start[end]
    if ((s == s.shift(1)) & (e < e.shift(1))).any():
        by_start = df.sort(start, end, maintain_order=True)
    return break_ties(by_start, [start, end])


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

    @property
    def duration_ns(self) -> int | None:
        return self.meta.duration_ns if self.meta is not None else None

    def note(self, text: str) -> None:
        if self.meta is not None and text not in self.meta.notes:
            self.meta.notes.append(text)

    # -- shared helpers ------------------------------------------------------------------------
    def has(self, table: str) -> bool:
        return bool(self.source.columns(table))

    def read(
        self, table: str, required: list[str], optional: Mapping[str, pl.DataType] | None = None
    ) -> pl.DataFrame:
        """``required`` columns (SchemaError when one is absent) plus the ``optional`` ones the
        table has; optional columns it lacks come back as typed nulls."""
        optional = optional or {}
        have = set(self.source.columns(table))
        lacking = [c for c in required if c not in have]
        if lacking:
            raise SchemaError(
                f"table {table} in {self.source.path} lacks column {', '.join(lacking)}; the "
                f"export is incomplete or from an unsupported exporter — re-export the report"
            )
        present = [c for c in optional if c in have]
        df = self.source.read(table, required + present)
        # A column that holds only NULLs has no type in a Parquet file (polars reads it as
        # Null); give it the type joins and the schema expect.
        df = df.with_columns(
            pl.col(c).cast(optional.get(c) or (pl.String if c in TEXT_COLUMNS else pl.Int64))
            for c, dtype in df.schema.items()
            if dtype == pl.Null
        )
        return df.with_columns(
            pl.lit(None, dtype=dtype).alias(c) for c, dtype in optional.items() if c not in have
        )

    @property
    def strings(self) -> pl.DataFrame:
        """StringIds as (id, value); read once per trace."""
        if self._strings is None:
            if self.has("StringIds"):
                self._strings = self.read("StringIds", ["id", "value"]).with_columns(
                    pl.col("id").cast(pl.Int64), pl.col("value").cast(pl.String)
                )
            else:
                self._strings = pl.DataFrame(schema={"id": pl.Int64, "value": pl.String})
        return self._strings

    def resolve(self, df: pl.DataFrame, id_col: str, out: str) -> pl.DataFrame:
        """Add ``out`` = StringIds value of ``id_col`` (null when the id is null or unknown)."""
        lookup = self.strings.rename({"id": id_col, "value": out})
        return df.join(lookup, on=id_col, how="left", maintain_order="left")

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
        builders: dict[str, Callable[[Adapter], pl.DataFrame | None] | tuple[str, str]] = {
            "gpu_ops": ("adapters_gpu", "build_gpu_ops"),
            "cuda_api": Adapter.cuda_api,
            "nvtx": ("adapters_nvtx", "build_nvtx"),
            "osrt": Adapter.osrt,
            "sync": Adapter.sync,
            "overhead": Adapter.overhead,
            "gpus": ("adapters_info", "build_gpus"),
            "streams": ("adapters_info", "build_streams"),
            "processes": ("adapters_info", "build_processes"),
            "threads": ("adapters_info", "build_threads"),
            "meta": ("adapters_info", "build_meta"),
        }
        builder = builders[frame]
        if isinstance(builder, tuple):
            # Imported on first use: those modules build on this one, and importing
            # adapters_nvtx (numpy) must not delay the gpu_ops frame of a prefetch thread.
            module, name = builder
            builder = getattr(importlib.import_module(f"nsysan.load.{module}"), name)
        df = builder(self)
        return df if df is not None else schemas.empty(schemas.CANONICAL[frame])

    def cuda_api(self) -> pl.DataFrame | None:
        if not self.has(RUNTIME):
            return None
        df = self.read(
            RUNTIME,
            ["start", "end", "globalTid", "correlationId", "nameId"],
            {"eventClass": pl.Int64(), "returnValue": pl.Int64()},
        )
        # Sort the integer rows first (fewer columns to move); then classify each distinct
        # name once (regexes on hundreds of names, not on every call) and map the results
        # back through one lookup index: a join would copy the whole frame once more.
        df = sort_by_time(df, "start", "end")
        names = self.resolve(df.select("nameId").unique(), "nameId", "raw_name")
        name = pl.col("raw_name").str.replace(VERSION_SUFFIX, "")
        api_class = pl.lit("other")
        for cls, pattern in reversed(API_CLASS_RULES):
            api_class = pl.when(name.str.contains(pattern)).then(pl.lit(cls)).otherwise(api_class)
        by_name = (
            pl.when(name.str.contains(r"^_*cuda"))
            .then(pl.lit("runtime"))
            .when(name.str.starts_with("cu"))
            .then(pl.lit("driver"))
            .otherwise(pl.lit("runtime"))
        )
        names = names.select(name.alias("name"), api_class.alias("api_class"),
                             by_name.alias("_layer"), "nameId")
        at = df["nameId"].replace_strict(
            names["nameId"], pl.int_range(names.height, eager=True), default=None,
            return_dtype=pl.UInt32,
        )
        df = df.with_columns(names[c].gather(at) for c in ("name", "api_class", "_layer"))
        layer = (  # labels of at most 12 bytes: polars stores them inline, nothing is copied
            pl.when(pl.col("eventClass") == 0)
            .then(pl.lit("runtime"))
            .when(pl.col("eventClass") == 1)
            .then(pl.lit("driver"))
            .otherwise(pl.col("_layer").fill_null(pl.lit("runtime")))
        )
        df = df.select(
            start_ns="start",
            end_ns="end",
            global_tid="globalTid",
            global_pid=global_pid_of("globalTid"),
            pid=pid_of("globalTid"),
            tid=tid_of("globalTid"),
            correlation_id="correlationId",
            name="name",
            api_class=pl.col("api_class").fill_null(pl.lit("other")),
            layer=layer,
            return_value="returnValue",
        )
        return self.finish(df, schemas.CUDA_API)

    def sync(self) -> pl.DataFrame | None:
        if not self.has(SYNCHRONIZATION):
            return None
        df = self.read(SYNCHRONIZATION, [*COMMON_COLUMNS], {"syncType": pl.Int64()})
        types = pl.DataFrame(
            {"syncType": list(SYNC_TYPES), "sync_type": list(SYNC_TYPES.values())},
            schema={"syncType": pl.Int64, "sync_type": pl.String},
        )

        def valid(c: str) -> pl.Expr:
            return pl.when(pl.col(c) == CUPTI_INVALID_ID).then(None).otherwise(pl.col(c))

        df = df.join(types, on="syncType", how="left", maintain_order="left").select(
            start_ns="start",
            end_ns="end",
            global_pid="globalPid",
            pid=pid_of("globalPid"),
            device_id=valid("deviceId"),
            context_id=valid("contextId"),
            stream_id=valid("streamId"),
            correlation_id="correlationId",
            sync_type=pl.col("sync_type").fill_null(pl.lit("unknown")),
        )
        df = self._sync_type_from_api(df)
        return self.finish(sort_by_time(df), schemas.SYNC)

    def _sync_type_from_api(self, df: pl.DataFrame) -> pl.DataFrame:
        """Replace the enum-derived sync type by the one the synchronizing API names."""
        if df.is_empty() or self.frame is None or not self.has(RUNTIME):
            return df
        # The one-key filter first: it keeps the two-key join to the few calls that can match
        # (on 10M kernels, 17M API calls vs 1M synchronisations).
        api = (
            self.frame("cuda_api")
            .select("global_pid", "correlation_id", "name")
            .filter(pl.col("correlation_id").is_in(df["correlation_id"].unique().implode()))
        )
        by_api = pl.lit(None, dtype=pl.String)
        for label, pattern in reversed(SYNC_TYPE_BY_API):
            by_api = pl.when(pl.col("name").str.contains(pattern)).then(pl.lit(label)).otherwise(
                by_api
            )
        labels = api.select("name").unique().with_columns(by_api.alias("_by_api"))
        api = api.join(
            df.select("global_pid", "correlation_id").unique(),
            on=["global_pid", "correlation_id"],
            how="semi",
        ).join(labels, on="name", how="left", maintain_order="left").select(
            "global_pid", "correlation_id", "_by_api"
        )
        api = api.unique(["global_pid", "correlation_id"], keep="first", maintain_order=True)
        return (
            df.join(api, on=["global_pid", "correlation_id"], how="left", maintain_order="left")
            .with_columns(pl.coalesce("_by_api", "sync_type").alias("sync_type"))
            .drop("_by_api")
        )

    def osrt(self) -> pl.DataFrame | None:
        if not self.has("OSRT_API"):
            return None
        df = self.read(
            "OSRT_API", ["start", "end", "globalTid", "nameId"], {"eventClass": pl.Int64()}
        )
        # eventClass 31/32 rows are zero-length "profiling started/finished" markers, not calls
        df = df.filter(pl.col("eventClass").is_null() | (pl.col("eventClass") == 27))
        df = self.resolve(df, "nameId", "name").select(
            start_ns="start",
            end_ns="end",
            global_tid="globalTid",
            pid=pid_of("globalTid"),
            tid=tid_of("globalTid"),
            name="name",
        )
        return self.finish(sort_by_time(df), schemas.OSRT)

    def overhead(self) -> pl.DataFrame | None:
        if not self.has("PROFILER_OVERHEAD"):
            return None
        df = self.read("PROFILER_OVERHEAD", ["start", "end", "globalTid", "nameId"])
        df = self.resolve(df, "nameId", "name").select(
            start_ns="start",
            end_ns="end",
            global_tid="globalTid",
            pid=pid_of("globalTid"),
            name="name",
        )
        return self.finish(sort_by_time(df), schemas.OVERHEAD)
