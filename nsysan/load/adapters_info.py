"""Descriptive frames (GPUs, streams, processes, threads, meta) and the export's metadata.

Choices:
- ``gpus.device_id`` is ``TARGET_INFO_GPU.cuDevice`` (the CUDA ordinal, which is what CUPTI's
  ``deviceId`` in the activity tables counts) when the export has it, else ``id``: in the sc22
  capture ``id`` 3 is ``cuDevice`` 0. Processes that remap devices with ``CUDA_VISIBLE_DEVICES``
  can still disagree; nsys's own reports join ``id`` directly.
- ``threads``: one row per ``global_tid``; a thread named twice keeps the name with the highest
  ``priority``, the greatest name on a tie.
- row order is content order, never the export's (which Nsight Systems 2025.6+ does not
  promise): gpus by ``device_id``, streams, processes and threads by their ids, then by every
  other column; capture settings by name, each setting's values sorted; an export-metadata
  name given twice keeps its greatest value.
- the ``meta`` frame holds the versions, the session, every export-metadata row
  (``export:<NAME>``), the host facts of TARGET_INFO_SYSTEM_ENV (``system:<name>``), capture
  settings (``capture:<NAME>``) **except environment variables**, which can hold secrets and would
  travel into reports (they stay in ``TraceMeta.capture``), and what was not captured
  (``missing:<frame>``).
"""

from __future__ import annotations

from typing import Any

import polars as pl

from nsysan.frames import schemas
from nsysan.frames.order import content_sort
from nsysan.load.adapters import Adapter, null_invalid_ids, pid_of, tid_of

EXPORT_META_TABLES = ("META_DATA_EXPORT", "EXPORT_META_DATA")  # 2023.4+ name first
STREAM_TYPES = {1: "default", 2: "non_blocking", 3: "null"}


def _name_value(adapter: Adapter, table: str) -> list[tuple[str, str]]:
    if not adapter.has(table):
        return []
    df = adapter.read(table, ["name", "value"])
    df = df.select(pl.col("name", "value").cast(pl.String)).sort("name", "value")
    return list(zip(df["name"], df["value"], strict=True))


def _first(adapter: Adapter, table: str, column: str, agg: str = "min") -> int | None:
    if column not in adapter.source.columns(table):
        return None
    values = adapter.read(table, [column])[column].drop_nulls().cast(pl.Int64)
    if values.is_empty():
        return None
    value = values.max() if agg == "max" else values.min()
    return int(value)  # type: ignore[arg-type]  # an Int64 series yields ints


def read_metadata(adapter: Adapter) -> dict[str, Any]:
    """Fields of `TraceMeta` that the export itself records (small tables only)."""
    export_rows: list[tuple[str, str]] = []
    for table in EXPORT_META_TABLES:
        export_rows = _name_value(adapter, table)
        if export_rows:
            break
    export = dict(export_rows)
    capture: dict[str, list[str]] = {}
    for name, value in _name_value(adapter, "META_DATA_CAPTURE"):  # sorted by name, value
        capture.setdefault(name, []).append(value)
    notes: list[str] = []
    normalized = export.get("EXPORT_PARAM_TIME_NORMALIZE", "").lower() == "true"
    shift = export.get("EXPORT_CONFIG_TIME_SHIFT") or export.get("EXPORT_PARAM_TIME_SHIFT")
    shifted = normalized or (shift not in (None, "", "0"))
    if shifted:
        notes.append(
            "timestamps were shifted at export (--ts-normalize/--ts-shift): they are not "
            "relative to the session start"
        )
    if not export:
        notes.append("the export records no exporter metadata (nsys 2020.x or a trimmed file)")
    return {
        "exporter_version": export.get("EXPORT_PRODUCT_VERSION"),
        "schema_version": export.get("EXPORT_SCHEMA_VERSION"),
        "export": export,
        "capture": capture,
        "duration_ns": _first(adapter, "ANALYSIS_DETAILS", "duration", agg="max"),
        "session_start_utc_ns": _first(adapter, "TARGET_INFO_SESSION_START_TIME", "utcEpochNs"),
        "time_shifted": shifted,
        "notes": notes,
    }


def build_gpus(adapter: Adapter) -> pl.DataFrame | None:
    table = "TARGET_INFO_GPU"
    if not adapter.has(table):
        return None
    cols = adapter.source.columns(table)
    id_col = "id" if "id" in cols else "deviceId"  # 2020.x exports name it deviceId
    df = adapter.read(
        table,
        [id_col],
        {
            "cuDevice": pl.Int64(),
            "name": pl.String(),
            "uuid": pl.String(),
            "busLocation": pl.String(),
            "smCount": pl.Int64(),
            "computeMajor": pl.Int64(),
            "computeMinor": pl.Int64(),
            "totalMemory": pl.Int64(),
            "memoryBandwidth": pl.Int64(),
            "clockRate": pl.Int64(),
        },
    )
    df = df.select(
        device_id=pl.coalesce("cuDevice", id_col),
        name="name",
        uuid="uuid",
        bus_location="busLocation",
        sm_count="smCount",
        compute_capability=pl.when(pl.col("computeMajor").is_not_null()).then(
            pl.format("{}.{}", "computeMajor", pl.col("computeMinor").fill_null(0))
        ),
        total_memory_bytes="totalMemory",
        memory_bandwidth_bps="memoryBandwidth",
        clock_rate_hz="clockRate",
    )
    if "TARGET_INFO_CUDA_GPU" in adapter.source.tables():
        # 2020.x: the SM count and compute capability live in TARGET_INFO_CUDA_GPU (its other
        # columns have undocumented units, so they are left out)
        cuda = adapter.read(
            "TARGET_INFO_CUDA_GPU",
            ["deviceId"],
            {
                "numMultiprocessors": pl.Int64(),
                "computeCapabilityMajor": pl.Int64(),
                "computeCapabilityMinor": pl.Int64(),
            },
        ).sort(pl.all(), nulls_last=True).unique("deviceId", keep="first", maintain_order=True)
        df = df.join(
            cuda.rename({"deviceId": "device_id"}),
            on="device_id",
            how="left",
            maintain_order="left",
        ).with_columns(
            sm_count=pl.coalesce("sm_count", "numMultiprocessors"),
            compute_capability=pl.coalesce(
                "compute_capability",
                pl.format("{}.{}", "computeCapabilityMajor", "computeCapabilityMinor"),
            ),
        )
    return adapter.finish(content_sort(df, ["device_id"]), schemas.GPUS)


def build_streams(adapter: Adapter) -> pl.DataFrame | None:
    table = "TARGET_INFO_CUDA_STREAM"
    if not adapter.has(table):
        return None
    df = null_invalid_ids(adapter.read(
        table, ["streamId", "processId", "contextId"], {"priority": pl.Int64(), "flag": pl.Int64()}
    ))
    types = pl.DataFrame(
        {"flag": list(STREAM_TYPES), "stream_type": list(STREAM_TYPES.values())},
        schema={"flag": pl.Int64, "stream_type": pl.String},
    )
    df = df.join(types, on="flag", how="left", maintain_order="left").select(
        pid="processId",  # a plain PID here, not a globalPid
        context_id="contextId",
        stream_id="streamId",
        priority="priority",
        stream_type=pl.col("stream_type").fill_null(pl.lit("unknown")),
    )
    return adapter.finish(content_sort(df, ["pid", "context_id", "stream_id"]), schemas.STREAMS)


def build_processes(adapter: Adapter) -> pl.DataFrame | None:
    if not adapter.has("PROCESSES"):
        return None
    df = adapter.read("PROCESSES", ["globalPid"], {"pid": pl.Int64(), "name": pl.String()})
    df = df.select(
        global_pid="globalPid",
        pid=pl.coalesce("pid", pid_of("globalPid")),
        name="name",
    )
    return adapter.finish(content_sort(df, ["global_pid"]), schemas.PROCESSES)


def build_threads(adapter: Adapter) -> pl.DataFrame | None:
    if not adapter.has("ThreadNames"):
        return None
    df = adapter.read("ThreadNames", ["globalTid", "nameId"], {"priority": pl.Int64()})
    df = (
        adapter.resolve(df, "nameId", "name")
        .sort("globalTid", pl.col("priority").fill_null(0), "name", nulls_last=False)
        .unique("globalTid", keep="last", maintain_order=True)
    )
    df = df.select(
        global_tid="globalTid",
        pid=pid_of("globalTid"),
        tid=tid_of("globalTid"),
        name="name",
    )
    return adapter.finish(df, schemas.THREADS)


def build_meta(adapter: Adapter) -> pl.DataFrame:
    meta = adapter.meta
    rows: list[tuple[str, str | None]] = []
    if meta is not None:
        for key in (
            "source_format",
            "exporter_version",
            "schema_version",
            "recorded_version",
            "session_start_utc_ns",
            "duration_ns",
        ):
            value = getattr(meta, key)
            rows.append((key, None if value is None else str(value)))
    info = read_metadata(adapter)
    rows += [(f"export:{k}", v) for k, v in info["export"].items()]
    if adapter.has("TARGET_INFO_SYSTEM_ENV"):
        env = adapter.read("TARGET_INFO_SYSTEM_ENV", ["name", "value"])
        env = env.select(pl.col("name", "value").cast(pl.String)).sort("name", "value")
        rows += [(f"system:{k}", v) for k, v in env.iter_rows()]
    for key, values in info["capture"].items():
        if "ENVIRONMENT_VARIABLE" not in key:
            rows += [(f"capture:{key}", v) for v in values]
    if meta is not None:
        rows += [(f"missing:{frame}", why) for frame, why in meta.missing.items()]
    df = pl.DataFrame(rows, schema={"key": pl.String, "value": pl.String}, orient="row")
    return adapter.finish(df, schemas.META)
