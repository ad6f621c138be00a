"""The host-side frames: ``cuda_api``, ``sync``, ``osrt`` and ``overhead`` (rules in `adapters`).

Each applies the row rules of the data-quality contract (`nsysan.load.quality`) to its integer
rows before anything else is computed from them; ``cuda_api`` also keeps one API row per
(process, correlation id)."""

from __future__ import annotations

import polars as pl

from nsysan.frames import schemas
from nsysan.frames.conform import select_narrowed
from nsysan.frames.order import sort_by_time, sort_by_time_in_place
from nsysan.load.adapters import (
    API_CLASS_RULES,
    COMMON_COLUMNS,
    DEFAULTED_COLUMNS,
    RUNTIME,
    SYNC_TYPE_BY_API,
    SYNC_TYPES,
    SYNCHRONIZATION,
    VERSION_SUFFIX,
    Adapter,
    enum_mapped,
    global_pid_of,
    null_invalid_ids,
    pid_of,
    tid_of,
)
from nsysan.load.quality import (
    FrameQuality,
    drop_duplicate_correlations,
    drop_duplicate_rows,
    drop_impossible,
)


def _clean(adapter: Adapter, quality: FrameQuality, df: pl.DataFrame) -> pl.DataFrame:
    """Rows without an impossible timestamp or an exact copy (row order kept: each frame
    sorts where it always did, so that ties are ordered by the same columns)."""
    df = drop_impossible(df, quality, adapter.session)
    return drop_duplicate_rows(df, quality, start="start")


def build_cuda_api(adapter: Adapter) -> pl.DataFrame | None:
    if not adapter.has(RUNTIME):
        return None
    quality = adapter.quality("cuda_api")
    df = adapter.read(
        RUNTIME,
        ["start", "end", "globalTid", "nameId"],
        {"eventClass": pl.Int64(), "returnValue": pl.Int64()},
        {"correlationId": pl.Int64()},
        # copied into the frame as they are, or only compared (eventClass)
        {"correlationId": schemas.CUDA_API["correlation_id"],
         "returnValue": schemas.CUDA_API["return_value"], "eventClass": pl.UInt8()},
    )
    # Sort the integer rows first (fewer columns to move); then classify each distinct
    # name once (regexes on hundreds of names, not on every call) and map the results
    # back through one lookup index: a join would copy the whole frame once more.
    # (in place: the frame just read is this function's own, ~1 GB on a 10M-kernel trace)
    df = null_invalid_ids(sort_by_time_in_place(_clean(adapter, quality, df), "start", "end"))
    names = adapter.resolve(df.select("nameId").unique(), "nameId", "raw_name")
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
    # the lookup is cast once: every call then holds codes, no copy of its name
    names = names.select(name.cast(schemas.CAT).alias("name"),
                         api_class.cast(schemas.API_CLASS).alias("api_class"),
                         by_name.cast(schemas.API_LAYER).alias("_layer"), "nameId")
    at = df["nameId"].replace_strict(
        names["nameId"], pl.int_range(names.height, eager=True), default=None,
        return_dtype=pl.UInt32,
    )
    # (the name ids go first: 140 MB on a 10M-kernel trace, beside the columns made below)
    df = df.drop("nameId").with_columns(
        names[c].gather(at) for c in ("name", "api_class", "_layer"))
    layer = (
        pl.when(pl.col("eventClass") == 0)
        .then(pl.lit("runtime", dtype=schemas.API_LAYER))
        .when(pl.col("eventClass") == 1)
        .then(pl.lit("driver", dtype=schemas.API_LAYER))
        .otherwise(pl.col("_layer").fill_null(pl.lit("runtime", dtype=schemas.API_LAYER)))
    )
    df = select_narrowed(df, dict(
        start_ns="start",
        end_ns="end",
        global_tid="globalTid",
        global_pid=global_pid_of("globalTid"),
        pid=pid_of("globalTid"),
        tid=tid_of("globalTid"),
        correlation_id="correlationId",
        name="name",
        api_class=pl.col("api_class").fill_null(pl.lit("other", dtype=schemas.API_CLASS)),
        layer=layer,
        return_value="returnValue",
    ), schemas.CUDA_API)
    df = drop_duplicate_correlations(
        df, quality, process="global_pid", correlation="correlation_id", start="start_ns",
        end="end_ns", name="name",
    )
    return adapter.finish(df, schemas.CUDA_API)


#: sync columns copied as they are: read in the frame's types (`Adapter.read`'s ``narrow``)
_SYNC_NARROW = {raw: schemas.SYNC[out] for raw, out in (
    ("deviceId", "device_id"), ("contextId", "context_id"), ("streamId", "stream_id"),
    ("correlationId", "correlation_id"))}


def build_sync(adapter: Adapter) -> pl.DataFrame | None:
    if not adapter.has(SYNCHRONIZATION):
        return None
    quality = adapter.quality("sync")
    df = adapter.read(SYNCHRONIZATION, [*COMMON_COLUMNS], {"syncType": pl.Int64()},
                      DEFAULTED_COLUMNS, _SYNC_NARROW)
    df = null_invalid_ids(_clean(adapter, quality, adapter.default_process(df)))
    df = df.select(
        start_ns="start",
        end_ns="end",
        global_pid="globalPid",
        pid=pid_of("globalPid"),
        device_id="deviceId",
        context_id="contextId",
        stream_id="streamId",
        correlation_id="correlationId",
        sync_type=enum_mapped(pl.col("syncType"), SYNC_TYPES, schemas.SYNC_TYPE).fill_null(
            pl.lit("unknown", dtype=schemas.SYNC_TYPE)),
    )
    df = _sync_type_from_api(adapter, df)
    return adapter.finish(sort_by_time(df), schemas.SYNC)


def _sync_type_from_api(adapter: Adapter, df: pl.DataFrame) -> pl.DataFrame:
    """Replace the enum-derived sync type by the one the synchronizing API names."""
    if df.is_empty() or adapter.frame is None or not adapter.has(RUNTIME):
        return df
    # The one-key filter first: it keeps the two-key join to the few calls that can match
    # (on 10M kernels, 17M API calls vs 1M synchronisations).
    api = (
        adapter.frame("cuda_api")
        .select("global_pid", "correlation_id", "name")
        .filter(pl.col("correlation_id").is_in(df["correlation_id"].unique().implode()))
    )
    # the regexes run on the distinct names (as text), the labels join back by the name
    name = pl.col("name").cast(pl.String)
    by_api = pl.lit(None, dtype=schemas.SYNC_TYPE)
    for label, pattern in reversed(SYNC_TYPE_BY_API):
        by_api = pl.when(name.str.contains(pattern)).then(
            pl.lit(label, dtype=schemas.SYNC_TYPE)).otherwise(by_api)
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


def build_osrt(adapter: Adapter) -> pl.DataFrame | None:
    if not adapter.has("OSRT_API"):
        return None
    quality = adapter.quality("osrt")
    df = adapter.read(
        "OSRT_API", ["start", "end", "globalTid", "nameId"], {"eventClass": pl.Int64()}
    )
    # eventClass 31/32 rows are zero-length "profiling started/finished" markers, not calls
    df = df.filter(pl.col("eventClass").is_null() | (pl.col("eventClass") == 27))
    df = _clean(adapter, quality, df)
    df = adapter.resolve_categorical(df, "nameId", "name").select(
        start_ns="start",
        end_ns="end",
        global_tid="globalTid",
        pid=pid_of("globalTid"),
        tid=tid_of("globalTid"),
        name="name",
    )
    return adapter.finish(sort_by_time(df), schemas.OSRT)


def build_overhead(adapter: Adapter) -> pl.DataFrame | None:
    if not adapter.has("PROFILER_OVERHEAD"):
        return None
    quality = adapter.quality("overhead")
    df = adapter.read("PROFILER_OVERHEAD", ["start", "end", "globalTid", "nameId"])
    df = _clean(adapter, quality, df)
    df = adapter.resolve_categorical(df, "nameId", "name").select(
        start_ns="start",
        end_ns="end",
        global_tid="globalTid",
        pid=pid_of("globalTid"),
        name="name",
    )
    return adapter.finish(sort_by_time(df), schemas.OVERHEAD)
