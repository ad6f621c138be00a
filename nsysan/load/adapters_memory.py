"""The ``memory_events`` frame: CUDA memory-usage events (``--cuda-memory-usage=true``).

Source: ``CUDA_GPU_MEMORY_USAGE_EVENTS`` (in exports from nsys 2022.x on; usually present and
empty, or absent in a lazy export, when the option was off). Across schema generations:

- ``memoryOperationType`` → ``ENUM_CUDA_DEV_MEM_EVENT_OPER`` (0 allocation, 1 deallocation);
  a third-party reader also knows the column as ``operationType``, read as a fallback.
- ``memKind`` → ``ENUM_CUDA_MEM_KIND`` as snake_case labels (the built-in copy when the
  export's enum is absent or empty).
- The local memory-pool columns (``localMemoryPool{Address,Size,UtilizedSize}``) are
  optional: an export without them gives null pool columns.

Only the columns the memory pass reads are read (a capture holds millions of events). The
link of each event to the CUDA API call that made it and to the NVTX range around that call
is a join on ``(global_pid, correlation_id)`` that the pass makes with the trace's shared
op-key services (`nsysan.passes.memory.linked_events`). Rows are sorted by content (time,
then every other column), never by the export's row order.
"""

from __future__ import annotations

import polars as pl

from nsysan.frames import schemas
from nsysan.frames.order import break_ties
from nsysan.load.adapters import (
    MEM_KINDS,
    Adapter,
    categorical,
    enum_mapped,
    global_pid_of,
    null_invalid_ids,
    pid_of,
)
from nsysan.load.quality import drop_duplicate_rows, drop_impossible

TABLE = "CUDA_GPU_MEMORY_USAGE_EVENTS"
#: ENUM_CUDA_DEV_MEM_EVENT_OPER
OPERATIONS = {0: "alloc", 1: "free"}
#: optional raw columns -> canonical names
_OPTIONAL = {
    "correlationId": "correlation_id",
    "localMemoryPoolAddress": "pool_address",
    "localMemoryPoolSize": "pool_size_bytes",
    "localMemoryPoolUtilizedSize": "pool_utilized_bytes",
}


def build_memory_events(adapter: Adapter) -> pl.DataFrame | None:
    if not adapter.has(TABLE):
        return None
    cols = set(adapter.source.columns(TABLE))
    oper = "memoryOperationType" if "memoryOperationType" in cols else "operationType"
    df = adapter.read(TABLE, ["start", "globalPid", "deviceId", "bytes", "memKind", oper],
                      {c: pl.Int64() for c in _OPTIONAL})
    if df.is_empty():
        return None
    quality = adapter.quality("memory_events")
    df = drop_impossible(df, quality, adapter.session, start="start", end="start")
    df = null_invalid_ids(drop_duplicate_rows(df, quality, start="start"))
    kinds = adapter.enum_labels("ENUM_CUDA_MEM_KIND", MEM_KINDS)
    df = df.with_columns(
        categorical(pl.col("memKind"), kinds.rename({"label": "value"})).alias("mem_kind"),
        enum_mapped(pl.col(oper), OPERATIONS, schemas.MEMORY_OP).alias("op"),
        global_pid_of("globalPid").alias("global_pid"),
        pid_of("globalPid").alias("pid"),
    ).rename({"start": "start_ns", "deviceId": "device_id", **_OPTIONAL})
    df = adapter.finish(df, schemas.MEMORY_EVENTS)
    return break_ties(df.sort("start_ns", maintain_order=True), ["start_ns"])
