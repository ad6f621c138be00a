"""The ``memory_events`` frame: CUDA memory-usage events (``--cuda-memory-usage=true``).

Source: ``CUDA_GPU_MEMORY_USAGE_EVENTS`` (in exports from nsys 2022.x on; usually present and
empty, or absent in a lazy export, when the option was off). Across schema generations:

- ``memoryOperationType`` → ``ENUM_CUDA_DEV_MEM_EVENT_OPER`` (0 allocation, 1 deallocation);
  a third-party reader also knows the column as ``operationType``, read as a fallback.
- ``memKind`` → ``ENUM_CUDA_MEM_KIND`` as snake_case labels (the built-in copy when the
  export's enum is absent or empty).
- The local memory-pool columns (``localMemoryPool{Address,ReleaseThreshold,Size,
  UtilizedSize}``, ``importedMemoryPoolAddress``) and ``streamId`` are optional: an export
  without them gives null pool columns.

Each event is joined to the CUDA API call that made it on ``(global_pid, correlation_id)``
(the thread, the call's name and bounds), and to the innermost NVTX range open around that
call on the same thread (inclusive containment, the rule of the attribution pass): the
allocation site. Rows are sorted by content (time, then every other column), never by the
export's row order.
"""

from __future__ import annotations

import polars as pl

from nsysan.frames import schemas
from nsysan.frames.containment import innermost_enclosing
from nsysan.load.adapters import MEM_KINDS, Adapter, global_pid_of, pid_of
from nsysan.load.quality import drop_duplicate_rows, drop_impossible

TABLE = "CUDA_GPU_MEMORY_USAGE_EVENTS"
#: ENUM_CUDA_DEV_MEM_EVENT_OPER
OPERATIONS = {0: "alloc", 1: "free"}
#: optional raw columns -> canonical names
_OPTIONAL = {
    "contextId": "context_id",
    "address": "address",
    "name": "name",
    "correlationId": "correlation_id",
    "localMemoryPoolAddress": "pool_address",
    "localMemoryPoolReleaseThreshold": "pool_release_threshold_bytes",
    "localMemoryPoolSize": "pool_size_bytes",
    "localMemoryPoolUtilizedSize": "pool_utilized_bytes",
    "importedMemoryPoolAddress": "imported_pool_address",
}


def build_memory_events(adapter: Adapter) -> pl.DataFrame | None:
    if not adapter.has(TABLE):
        return None
    cols = set(adapter.source.columns(TABLE))
    oper = "memoryOperationType" if "memoryOperationType" in cols else "operationType"
    optional: dict[str, pl.DataType] = {c: pl.Int64() for c in _OPTIONAL if c != "name"}
    optional["name"] = pl.String()
    df = adapter.read(TABLE, ["start", "globalPid", "deviceId", "bytes", "memKind", oper],
                      optional)
    if df.is_empty():
        return None
    quality = adapter.quality("memory_events")
    df = drop_impossible(df, quality, adapter.session, start="start", end="start")
    df = drop_duplicate_rows(df, quality, start="start")
    kinds = adapter.enum_labels("ENUM_CUDA_MEM_KIND", MEM_KINDS).rename(
        {"id": "memKind", "label": "mem_kind"})
    df = (
        df.join(kinds, on="memKind", how="left", maintain_order="left")
        .with_columns(
            pl.col(oper).replace_strict(OPERATIONS, default=None, return_dtype=pl.String)
            .alias("op"),
            global_pid_of("globalPid").alias("global_pid"),
            pid_of("globalPid").alias("pid"),
        )
        .rename({"start": "start_ns", "deviceId": "device_id", **_OPTIONAL})
    )
    df = _join_calls(adapter, df)
    df = _join_sites(adapter, df)
    order = ["start_ns", "device_id", "pid", "mem_kind", "op", "address", "bytes",
             "correlation_id", "context_id", "pool_address", "pool_size_bytes",
             "pool_utilized_bytes", "name"]
    df = df.sort(order, nulls_last=True, maintain_order=True)
    return adapter.finish(df, schemas.MEMORY_EVENTS)


def _join_calls(adapter: Adapter, df: pl.DataFrame) -> pl.DataFrame:
    """The thread, name and bounds of the API call of each event (null when not traced)."""
    api = adapter.frame("cuda_api") if adapter.frame is not None else None
    if api is None or api.is_empty():
        return df.with_columns(
            pl.lit(None, pl.Int64).alias("global_tid"), pl.lit(None, pl.Int64).alias("tid"),
            pl.lit(None, pl.String).alias("api_name"),
            pl.lit(None, pl.Int64).alias("api_start_ns"),
            pl.lit(None, pl.Int64).alias("api_end_ns"))
    calls = (api.lazy()
             .join(df.lazy().select("global_pid", "correlation_id").unique(),
                   on=["global_pid", "correlation_id"], how="semi")
             .select("global_pid", "correlation_id", "global_tid", "tid",
                     pl.col("name").alias("api_name"), pl.col("start_ns").alias("api_start_ns"),
                     pl.col("end_ns").alias("api_end_ns"))
             .collect())  # cuda_api keeps one call per (process, correlation id)
    return df.join(calls, on=["global_pid", "correlation_id"], how="left",
                   maintain_order="left")


def _join_sites(adapter: Adapter, df: pl.DataFrame) -> pl.DataFrame:
    """The innermost NVTX range (same thread) enclosing each event's API call."""
    none = df.with_columns(pl.lit(None, pl.Int64).alias("nvtx_range_id"),
                           pl.lit(None, pl.String).alias("nvtx_name"))
    if adapter.frame is None or not adapter.has("NVTX_EVENTS") \
            or df["api_start_ns"].null_count() == df.height:
        return none
    nvtx = adapter.frame("nvtx")
    ranges = nvtx.filter((pl.col("style") != "mark") & pl.col("end_ns").is_not_null()
                         & (pl.col("end_global_tid").is_null()
                            | (pl.col("end_global_tid") == pl.col("global_tid"))))
    if ranges.is_empty():
        return none
    queries = df.select(
        pl.int_range(pl.len(), dtype=pl.Int64).alias("_row"), "global_tid",
        pl.col("api_start_ns").alias("start_ns"), pl.col("api_end_ns").alias("end_ns"),
    ).filter(pl.col("global_tid").is_not_null())
    site = innermost_enclosing(
        queries, ranges.select("global_tid", "range_id", "start_ns", "end_ns", "depth"),
        by=["global_tid"], query_id="_row", range_id="range_id", depth="depth",
    ).collect()
    site = site.join(ranges.select("range_id", pl.col("name").alias("nvtx_name")),
                     on="range_id", how="left").select(
        "_row", pl.col("range_id").alias("nvtx_range_id"), "nvtx_name")
    return (df.with_row_index("_row").with_columns(pl.col("_row").cast(pl.Int64))
            .join(site, on="_row", how="left", maintain_order="left").drop("_row"))
