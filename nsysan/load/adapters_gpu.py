"""The ``gpu_ops`` frame: kernels, memcpys and memsets of an nsys export (rules in `adapters`).

Built for big traces: the integer rows of the three tables are concatenated and sorted first,
and every text column is then an integer key mapped through a small lookup to a Categorical
(or an Enum), so no string is copied per op and no regex runs per op (`build_gpu_ops`)."""

from __future__ import annotations

import polars as pl

from nsysan.errors import TraceFormatError
from nsysan.frames import schemas
from nsysan.frames.conform import select_narrowed
from nsysan.frames.order import sort_by_time_in_place
from nsysan.load.adapters import (
    COMMON_COLUMNS,
    COPY_KINDS,
    DEFAULTED_COLUMNS,
    KERNEL,
    MEM_KINDS,
    MEMCPY,
    MEMSET,
    Adapter,
    categorical,
    enum_mapped,
    null_invalid_ids,
    pid_of,
)
from nsysan.load.quality import drop_duplicate_rows, drop_impossible

#: gpu_ops ``kind`` by the code each part is tagged with while the rows are still integers
_OP_KINDS = ("kernel", "memcpy", "memset")
#: integer columns gpu_ops reads from one of its three tables (absent tables leave them null)
_OP_INT_COLUMNS = (
    "shortName", "demangledName", "gridX", "gridY", "gridZ", "blockX", "blockY", "blockZ",
    "graphNodeId", "bytes", "copyKind", "srcKind", "_dst",
)
#: gpu_ops columns that are a raw column copied as it is: read in the frame's narrow type
#: (`Adapter.read`'s ``narrow``), since nothing before the final select computes with them
_COPIED = dict(
    device_id="deviceId", context_id="contextId", stream_id="streamId",
    correlation_id="correlationId",
    grid_x="gridX", grid_y="gridY", grid_z="gridZ",
    block_x="blockX", block_y="blockY", block_z="blockZ",
)
_NARROW = {raw: schemas.GPU_OPS[out] for out, raw in _COPIED.items()}


def build_gpu_ops(adapter: Adapter) -> pl.DataFrame | None:
    # Integer rows of the three tables are concatenated, filtered and sorted first; names
    # and labels are then mapped from small lookups (StringIds, enums) column by column.
    # So the sort moves no strings, no regex runs per op, and no join copies the frame
    # (on 1M kernels this halves the time and the peak memory of building the frame).
    tables = (_kernels(adapter), _memcpys(adapter), _memsets(adapter))
    parts = [part for part in tables if part is not None]
    if not parts:
        return None
    # Each step below copies ~20 columns (GBs on 10M kernels), so inputs are released as
    # soon as they are copied, and the filter runs only when it removes something.
    # (not rechunked: the sort below gathers every column into one chunk anyway)
    ops = pl.concat(parts, how="diagonal_relaxed")
    del parts, tables
    quality = adapter.quality("gpu_ops")
    unrecorded = (ops["start"] == 0) & (ops["end"] == 0)
    if unrecorded.any():
        quality.add("unrecorded", int(unrecorded.sum()))
        ops = ops.filter(~unrecorded.fill_null(False))
    del unrecorded
    ops = ops.with_columns(  # columns of a table the export lacks
        pl.lit(None, pl.Int64).alias(c) for c in _OP_INT_COLUMNS if c not in ops.columns
    )
    ops = drop_impossible(ops, quality, adapter.session)
    ops = adapter.default_process(ops)
    ops = sort_by_time_in_place(ops, "start", "end")  # (ops: this function's own frame)
    ops = drop_duplicate_rows(ops, quality, start="start")
    ops = null_invalid_ids(ops)
    # Every text column is an integer key mapped once through a small lookup cast to
    # Categorical (`adapters.categorical`): each row holds a 4-byte code, no string is
    # copied per op (as String, each row held a 16-byte view into the lookup's names: the
    # frame of 1M kernels held 288 MB, now 179 MB); the closed vocabularies (kind,
    # op_class) map to their Enums.
    kind = pl.col("_kind")
    labels, memset_key = _labels(adapter, ops)
    copy_key = -2 - pl.col("copyKind")  # memcpy labels sit below memset_key (-1)

    def by_kind(kernel: pl.Expr, memcpy: pl.Expr) -> pl.Expr:
        key = pl.when(kind == 0).then(kernel).when(kind == 1).then(memcpy)
        return key.otherwise(memset_key)

    mem = adapter.enum_labels("ENUM_CUDA_MEM_KIND", MEM_KINDS).rename({"label": "value"})
    # (only the kinds the ops use: their labels join a small vocabulary, `schemas.MEMORY_KIND`)
    mem_used = pl.concat([ops["srcKind"], ops["_dst"]])
    classes = {-1: "memset", 0: "nccl", 1: "compute",
               **{-2 - k: c for k, (_, c) in COPY_KINDS.items()}}
    nccl = pl.col("shortName").is_in(_nccl_ids(adapter, "starts_with")) | pl.col(
        "demangledName"
    ).is_in(_nccl_ids(adapter, "contains"))
    # (trace_id: `Adapter.finish` adds it as a constant column)
    out = select_narrowed(ops, dict(
        kind=enum_mapped(kind, dict(enumerate(_OP_KINDS)), schemas.GPU_OP_KIND),
        start_ns="start",
        end_ns="end",
        global_pid="globalPid",
        pid=pid_of("globalPid"),
        name=categorical(by_kind(pl.col("shortName"), copy_key), labels),
        demangled_name=categorical(by_kind(pl.col("demangledName"), copy_key), labels),
        copy_kind=categorical(pl.when(kind == 1).then(copy_key),
                              labels.filter(pl.col("id") < memset_key),
                              dtype=schemas.COPY_KIND, column="copy_kind"),
        src_kind=categorical(pl.col("srcKind"), mem, mem_used, schemas.MEMORY_KIND, "src_kind"),
        dst_kind=categorical(pl.col("_dst"), mem, mem_used, schemas.MEMORY_KIND, "dst_kind"),
        bytes="bytes",
        graph_node_id="graphNodeId",
        **_COPIED,
        # kernels 0 (nccl) or 1 (compute), memset -1, copies their kind's class, and an
        # unknown (or missing) copy kind memcpy_d2d
        op_class=enum_mapped(
            by_kind(pl.when(nccl.fill_null(False)).then(0).otherwise(1), copy_key), classes,
            schemas.OP_CLASS,
        ).fill_null("memcpy_d2d"),
    ), schemas.GPU_OPS)
    return adapter.finish(out, schemas.GPU_OPS)

def _labels(adapter: Adapter, ops: pl.DataFrame) -> tuple[pl.DataFrame, int]:
    """The StringIds entries of the kernels' names plus the copy-kind labels (key
    ``-2 - copyKind``; kinds unknown to nsysan as ``Unknown(k)``) and "memset" (key -1), as
    (id, value); and the memset key. Only the names the ops use: the lookup is cast to
    Categorical, and a trace's StringIds hold every string of it."""
    kinds = ops.filter(pl.col("_kind") == 1)["copyKind"].drop_nulls().unique().sort().to_list()
    if kinds and kinds[0] < 0:  # (the keys below -1 are the copy kinds': they would collide)
        raise TraceFormatError(
            f"column copyKind of {MEMCPY} holds {kinds[0]}, where CUPTI writes a memory copy "
            "kind (0 or more): the export is damaged or was not written by nsys; export the "
            "report again (nsys export --type sqlite)")
    copies = pl.DataFrame(
        {"id": [-1, *(-2 - k for k in kinds)],
         "value": ["memset", *(COPY_KINDS[k][0] if k in COPY_KINDS else f"Unknown({k})"
                               for k in kinds)]},
        schema={"id": pl.Int64, "value": pl.String},
    )
    used = pl.concat([ops["shortName"], ops["demangledName"]]).drop_nulls().unique()
    names = adapter.strings.filter(pl.col("id").is_in(used.implode()))
    return pl.concat([names, copies]), -1

def _nccl_ids(adapter: Adapter, how: str) -> pl.Series:
    """StringIds ids of NCCL kernel names: short names starting with ``nccl``
    (``how="starts_with"``) or demangled names naming an NCCL kernel (``"contains"``)."""
    value = pl.col("value")
    match = value.str.starts_with("nccl") if how == "starts_with" else value.str.contains(
        "ncclKernel_|ncclDevKernel_"
    )
    return adapter.strings.filter(match)["id"].implode()

def _kernels(adapter: Adapter) -> pl.DataFrame | None:
    if not adapter.has(KERNEL):
        return None
    geometry = ["gridX", "gridY", "gridZ", "blockX", "blockY", "blockZ"]
    df = adapter.read(
        KERNEL,
        [*COMMON_COLUMNS, "shortName"],
        {c: pl.Int64() for c in [*geometry, "graphNodeId"]},
        {**DEFAULTED_COLUMNS, "demangledName": pl.Int64()},
        _NARROW,
    )
    # a minimal export without demangled names: the short name is the best one there is
    return df.with_columns(pl.coalesce("demangledName", "shortName").alias("demangledName"),
                           _kind=pl.lit(0, pl.Int8))

def _memcpys(adapter: Adapter) -> pl.DataFrame | None:
    if not adapter.has(MEMCPY):
        return None
    df = adapter.read(
        MEMCPY,
        [*COMMON_COLUMNS, "copyKind"],
        {"srcKind": pl.Int64(), "dstKind": pl.Int64(), "graphNodeId": pl.Int64()},
        {**DEFAULTED_COLUMNS, "bytes": pl.Int64()},
        _NARROW,
    )
    return df.rename({"dstKind": "_dst"}).with_columns(_kind=pl.lit(1, pl.Int8))

def _memsets(adapter: Adapter) -> pl.DataFrame | None:
    if not adapter.has(MEMSET):
        return None
    df = adapter.read(
        MEMSET, [*COMMON_COLUMNS], {"memKind": pl.Int64(), "graphNodeId": pl.Int64()},
        {**DEFAULTED_COLUMNS, "bytes": pl.Int64()},
        _NARROW,
    )
    return df.rename({"memKind": "_dst"}).with_columns(_kind=pl.lit(2, pl.Int8))
