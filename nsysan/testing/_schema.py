"""Column lists of the nsys export tables the synthetic builder writes, per layout.

Names, order, types, NOT NULL markers and keys are those of real exports: nsys 2022.4.2
(schema 3.0.0) and nsys 2023.4.4 (schema 3.7.2), read from ``sqlite_master`` of real files
(see ``../shared/research/ddl``). Only the tables the builder can fill are listed; a real
``--lazy=false`` export has many more (graphics APIs, OpenMP, sampling, ...).
"""

from __future__ import annotations

_COLUMNS_2022_4: dict[str, str] = {
    "StringIds": ("id INTEGER NOT NULL PRIMARY KEY, value TEXT NOT NULL"),
    "ProcessStreams": (
        "globalPid INTEGER NOT NULL, filenameId INTEGER NOT NULL, contentId INTEGER NOT NULL"
    ),
    "TARGET_INFO_SYSTEM_ENV": (
        "globalVid INTEGER NOT NULL, devStateName TEXT NOT NULL, name TEXT NOT NULL, nameEnum "
        "INTEGER NOT NULL, value TEXT NOT NULL"
    ),
    "TARGET_INFO_SESSION_START_TIME": ("utcEpochNs INTEGER, utcTime TEXT, localTime TEXT"),
    "ANALYSIS_DETAILS": (
        "globalVid INTEGER NOT NULL, duration INTEGER NOT NULL, startTime INTEGER NOT NULL, "
        "stopTime INTEGER NOT NULL"
    ),
    "PROCESSES": ("globalPid INTEGER, pid INTEGER, name TEXT"),
    "NVTX_EVENTS": (
        "start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL, rangeId INTEGER, "
        "category INTEGER, color INTEGER, text TEXT, globalTid INTEGER, endGlobalTid INTEGER, "
        "textId INTEGER, domainId INTEGER, uint64Value INTEGER, int64Value INTEGER, "
        "doubleValue REAL, uint32Value INTEGER, int32Value INTEGER, floatValue REAL, "
        "jsonTextId INTEGER, jsonText TEXT"
    ),
    "CUPTI_ACTIVITY_KIND_RUNTIME": (
        "start INTEGER NOT NULL, end INTEGER NOT NULL, eventClass INTEGER NOT NULL, globalTid "
        "INTEGER, correlationId INTEGER, nameId INTEGER NOT NULL, returnValue INTEGER NOT "
        "NULL, callchainId INTEGER"
    ),
    "CUPTI_ACTIVITY_KIND_KERNEL": (
        "start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL, contextId "
        "INTEGER NOT NULL, streamId INTEGER NOT NULL, correlationId INTEGER, globalPid "
        "INTEGER, demangledName INTEGER NOT NULL, shortName INTEGER NOT NULL, mangledName "
        "INTEGER, launchType INTEGER, cacheConfig INTEGER, registersPerThread INTEGER NOT "
        "NULL, gridX INTEGER NOT NULL, gridY INTEGER NOT NULL, gridZ INTEGER NOT NULL, blockX "
        "INTEGER NOT NULL, blockY INTEGER NOT NULL, blockZ INTEGER NOT NULL, "
        "staticSharedMemory INTEGER NOT NULL, dynamicSharedMemory INTEGER NOT NULL, "
        "localMemoryPerThread INTEGER NOT NULL, localMemoryTotal INTEGER NOT NULL, gridId "
        "INTEGER NOT NULL, sharedMemoryExecuted INTEGER, graphNodeId INTEGER, "
        "sharedMemoryLimitConfig INTEGER"
    ),
    "CUPTI_ACTIVITY_KIND_MEMSET": (
        "start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL, contextId "
        "INTEGER NOT NULL, streamId INTEGER NOT NULL, correlationId INTEGER, globalPid "
        "INTEGER, value INTEGER NOT NULL, bytes INTEGER NOT NULL, graphNodeId INTEGER, "
        "memKind INTEGER"
    ),
    "CUPTI_ACTIVITY_KIND_MEMCPY": (
        "start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL, contextId "
        "INTEGER NOT NULL, streamId INTEGER NOT NULL, correlationId INTEGER, globalPid "
        "INTEGER, bytes INTEGER NOT NULL, copyKind INTEGER NOT NULL, deprecatedSrcId INTEGER, "
        "srcKind INTEGER, dstKind INTEGER, srcDeviceId INTEGER, srcContextId INTEGER, "
        "dstDeviceId INTEGER, dstContextId INTEGER, migrationCause INTEGER, graphNodeId "
        "INTEGER, virtualAddress INTEGER"
    ),
    "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION": (
        "start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL, contextId "
        "INTEGER NOT NULL, streamId INTEGER NOT NULL, correlationId INTEGER, globalPid "
        "INTEGER, syncType INTEGER NOT NULL, eventId INTEGER NOT NULL"
    ),
    "PROFILER_OVERHEAD": (
        "start INTEGER NOT NULL, end INTEGER NOT NULL, globalTid INTEGER, nameId INTEGER NOT "
        "NULL, returnValue INTEGER NOT NULL"
    ),
    "CUDA_GPU_MEMORY_USAGE_EVENTS": (
        "start INTEGER NOT NULL, globalPid INTEGER NOT NULL, deviceId INTEGER NOT NULL, "
        "contextId INTEGER NOT NULL, address INTEGER NOT NULL, pc INTEGER NOT NULL, bytes "
        "INTEGER NOT NULL, memKind INTEGER NOT NULL, memoryOperationType INTEGER NOT NULL, "
        "name TEXT, correlationId INTEGER, localMemoryPoolAddress INTEGER, "
        "localMemoryPoolReleaseThreshold INTEGER, localMemoryPoolSize INTEGER, "
        "localMemoryPoolUtilizedSize INTEGER, importedMemoryPoolAddress INTEGER, "
        "importedMemoryPoolProcessId INTEGER"
    ),
    "OSRT_API": (
        "start INTEGER NOT NULL, end INTEGER NOT NULL, eventClass INTEGER NOT NULL, globalTid "
        "INTEGER, nameId INTEGER NOT NULL, returnValue INTEGER NOT NULL, nestingLevel "
        "INTEGER, callchainId INTEGER NOT NULL"
    ),
    "SCHED_EVENTS": (
        "start INTEGER NOT NULL, cpu INTEGER NOT NULL, isSchedIn INTEGER NOT NULL, globalTid "
        "INTEGER"
    ),
    "COMPOSITE_EVENTS": (
        "id INTEGER NOT NULL PRIMARY KEY, start INTEGER NOT NULL, cpu INTEGER, threadState "
        "INTEGER, globalTid INTEGER, cpuCycles INTEGER NOT NULL"
    ),
    "SAMPLING_CALLCHAINS": (
        "id INTEGER NOT NULL, symbol INTEGER NOT NULL, module INTEGER NOT NULL, kernelMode "
        "INTEGER, thumbCode INTEGER, unresolved INTEGER, specialEntry INTEGER, originalIP "
        "INTEGER, unwindMethod INTEGER, stackDepth INTEGER NOT NULL, PRIMARY KEY "
        "(id,stackDepth)"
    ),
    "ThreadNames": ("nameId INTEGER NOT NULL, priority INTEGER, globalTid INTEGER"),
    "TARGET_INFO_GPU": (
        "vmId INTEGER NOT NULL, id INTEGER NOT NULL, name TEXT, busLocation TEXT, isDiscrete "
        "INTEGER, l2CacheSize INTEGER, totalMemory INTEGER, memoryBandwidth INTEGER, "
        "clockRate INTEGER, smCount INTEGER, pwGpuId INTEGER, uuid TEXT, luid INTEGER, "
        "chipName TEXT, cuDevice INTEGER, ctxswDevPath TEXT, ctrlDevPath TEXT, revision "
        "INTEGER, nodeMask INTEGER, constantMemory INTEGER, maxIPC INTEGER, "
        "maxRegistersPerBlock INTEGER, maxShmemPerBlock INTEGER, maxShmemPerBlockOptin "
        "INTEGER, maxShmemPerSm INTEGER, maxRegistersPerSm INTEGER, threadsPerWarp INTEGER, "
        "asyncEngines INTEGER, maxWarpsPerSm INTEGER, maxBlocksPerSm INTEGER, "
        "maxThreadsPerBlock INTEGER, maxBlockDimX INTEGER, maxBlockDimY INTEGER, maxBlockDimZ "
        "INTEGER, maxGridDimX INTEGER, maxGridDimY INTEGER, maxGridDimZ INTEGER, computeMajor "
        "INTEGER, computeMinor INTEGER, smMajor INTEGER, smMinor INTEGER"
    ),
    "TARGET_INFO_CUDA_NULL_STREAM": (
        "streamId INTEGER NOT NULL, hwId INTEGER NOT NULL, vmId INTEGER NOT NULL, processId "
        "INTEGER NOT NULL, deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL"
    ),
    "TARGET_INFO_CUDA_STREAM": (
        "streamId INTEGER NOT NULL, hwId INTEGER NOT NULL, vmId INTEGER NOT NULL, processId "
        "INTEGER NOT NULL, contextId INTEGER NOT NULL, priority INTEGER NOT NULL, flag "
        "INTEGER NOT NULL"
    ),
    "EXPORT_META_DATA": ("name TEXT NOT NULL, value TEXT"),
}
_COLUMNS_2023_4: dict[str, str] = {
    # tables whose columns did not change since 2022.4 refer to that layout
    "StringIds": _COLUMNS_2022_4["StringIds"],
    "ProcessStreams": _COLUMNS_2022_4["ProcessStreams"],
    "TARGET_INFO_SYSTEM_ENV": (
        "globalVid INTEGER, devStateName TEXT NOT NULL, name TEXT NOT NULL, nameEnum INTEGER "
        "NOT NULL, value TEXT NOT NULL"
    ),
    "TARGET_INFO_SESSION_START_TIME": _COLUMNS_2022_4["TARGET_INFO_SESSION_START_TIME"],
    "ANALYSIS_DETAILS": _COLUMNS_2022_4["ANALYSIS_DETAILS"],
    "PROCESSES": _COLUMNS_2022_4["PROCESSES"],
    "NVTX_EVENTS": _COLUMNS_2022_4["NVTX_EVENTS"],
    "CUPTI_ACTIVITY_KIND_RUNTIME": _COLUMNS_2022_4["CUPTI_ACTIVITY_KIND_RUNTIME"],
    "CUPTI_ACTIVITY_KIND_KERNEL": (
        "start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL, contextId "
        "INTEGER NOT NULL, greenContextId INTEGER, streamId INTEGER NOT NULL, correlationId "
        "INTEGER, globalPid INTEGER, demangledName INTEGER NOT NULL, shortName INTEGER NOT "
        "NULL, mangledName INTEGER, launchType INTEGER, cacheConfig INTEGER, "
        "registersPerThread INTEGER NOT NULL, gridX INTEGER NOT NULL, gridY INTEGER NOT NULL, "
        "gridZ INTEGER NOT NULL, blockX INTEGER NOT NULL, blockY INTEGER NOT NULL, blockZ "
        "INTEGER NOT NULL, staticSharedMemory INTEGER NOT NULL, dynamicSharedMemory INTEGER "
        "NOT NULL, localMemoryPerThread INTEGER NOT NULL, localMemoryTotal INTEGER NOT NULL, "
        "gridId INTEGER NOT NULL, sharedMemoryExecuted INTEGER, graphNodeId INTEGER, "
        "sharedMemoryLimitConfig INTEGER"
    ),
    "CUPTI_ACTIVITY_KIND_MEMSET": (
        "start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL, contextId "
        "INTEGER NOT NULL, greenContextId INTEGER, streamId INTEGER NOT NULL, correlationId "
        "INTEGER, globalPid INTEGER, value INTEGER NOT NULL, bytes INTEGER NOT NULL, "
        "graphNodeId INTEGER, memKind INTEGER"
    ),
    "CUPTI_ACTIVITY_KIND_MEMCPY": (
        "start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL, contextId "
        "INTEGER NOT NULL, greenContextId INTEGER, streamId INTEGER NOT NULL, correlationId "
        "INTEGER, globalPid INTEGER, bytes INTEGER NOT NULL, copyKind INTEGER NOT NULL, "
        "deprecatedSrcId INTEGER, srcKind INTEGER, dstKind INTEGER, srcDeviceId INTEGER, "
        "srcContextId INTEGER, dstDeviceId INTEGER, dstContextId INTEGER, migrationCause "
        "INTEGER, graphNodeId INTEGER, virtualAddress INTEGER"
    ),
    "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION": (
        "start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL, contextId "
        "INTEGER NOT NULL, greenContextId INTEGER, streamId INTEGER NOT NULL, correlationId "
        "INTEGER, globalPid INTEGER, syncType INTEGER NOT NULL, eventId INTEGER NOT NULL"
    ),
    "PROFILER_OVERHEAD": _COLUMNS_2022_4["PROFILER_OVERHEAD"],
    "CUDA_GPU_MEMORY_USAGE_EVENTS": _COLUMNS_2022_4["CUDA_GPU_MEMORY_USAGE_EVENTS"],
    "OSRT_API": _COLUMNS_2022_4["OSRT_API"],
    **{t: _COLUMNS_2022_4[t] for t in ("SCHED_EVENTS", "COMPOSITE_EVENTS", "SAMPLING_CALLCHAINS")},
    "ThreadNames": _COLUMNS_2022_4["ThreadNames"],
    "TARGET_INFO_GPU": _COLUMNS_2022_4["TARGET_INFO_GPU"],
    "TARGET_INFO_CUDA_CONTEXT_INFO": (
        "nullStreamId INTEGER NOT NULL, hwId INTEGER NOT NULL, vmId INTEGER NOT NULL, "
        "processId INTEGER NOT NULL, deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, "
        "parentContextId INTEGER, isGreenContext INTEGER"
    ),
    "TARGET_INFO_CUDA_STREAM": _COLUMNS_2022_4["TARGET_INFO_CUDA_STREAM"],
    "META_DATA_CAPTURE": ("name TEXT NOT NULL, value TEXT"),
    "META_DATA_EXPORT": ("name TEXT NOT NULL, value TEXT"),
}


ENUM_COLUMNS = "id INTEGER NOT NULL PRIMARY KEY, name TEXT, label TEXT"

#: ENUM tables each layout writes (all with the same three columns), in nsys's order.
_ENUMS_2022_4 = (
    "ENUM_NSYS_EVENT_TYPE",
    "ENUM_NSYS_EVENT_CLASS",
    "ENUM_GPU_CTX_SWITCH",
    "ENUM_CUDA_MEMCPY_OPER",
    "ENUM_CUDA_MEM_KIND",
    "ENUM_CUDA_MEMPOOL_TYPE",
    "ENUM_CUDA_MEMPOOL_OPER",
    "ENUM_CUDA_DEV_MEM_EVENT_OPER",
    "ENUM_CUDA_KRENEL_LAUNCH_TYPE",  # sic: nsys 2022.x spells it so
    "ENUM_CUDA_SHARED_MEM_LIMIT_CONFIG",
    "ENUM_CUDA_UNIF_MEM_MIGRATION",
    "ENUM_CUDA_UNIF_MEM_ACCESS_TYPE",
    "ENUM_CUDA_FUNC_CACHE_CONFIG",
    "ENUM_CUPTI_SYNC_TYPE",
    "ENUM_STACK_UNWIND_METHOD",
    "ENUM_SAMPLING_THREAD_STATE",
)
_ENUMS_2023_4 = tuple(
    "ENUM_CUDA_KERNEL_LAUNCH_TYPE" if t == "ENUM_CUDA_KRENEL_LAUNCH_TYPE" else t
    for t in _ENUMS_2022_4
)
_ENUMS_2023_4 = (
    *_ENUMS_2023_4[: _ENUMS_2023_4.index("ENUM_CUPTI_SYNC_TYPE")],
    "ENUM_CUPTI_STREAM_TYPE",
    *_ENUMS_2023_4[_ENUMS_2023_4.index("ENUM_CUPTI_SYNC_TYPE") :],
)

#: highest ENUM_NSYS_EVENT_TYPE id each layout knows
MAX_EVENT_TYPE = {"2022.4": 133, "2023.4": 143}

EXPORT_META_TABLE = {"2022.4": "EXPORT_META_DATA", "2023.4": "META_DATA_EXPORT"}
PRODUCT_VERSION = {"2022.4": "2022.4.2.1", "2023.4": "2023.4.4.54"}
SCHEMA_VERSION = {"2022.4": "3.0.0", "2023.4": "3.7.2"}
SCHEMA_CKSUM = {"2022.4": "4042420554 115894", "2023.4": "2307844469 139029"}

LAYOUTS = ("2022.4", "2023.4")
#: what schema 3.28 adds to SCHED_EVENTS (the thread state at each switch); the builder adds
#: them to any layout when a switch-out state is given (`TraceBuilder.add_on_cpu`)
SCHED_STATE_COLUMNS = "threadState INTEGER, threadBlock INTEGER"


def table_columns(layout: str) -> dict[str, str]:
    """Table -> column spec (as in ``CREATE TABLE t (<spec>)``), in the order nsys creates
    them: event tables first, then target info, enums and export metadata last."""
    base = _COLUMNS_2022_4 if layout == "2022.4" else _COLUMNS_2023_4
    enums = _ENUMS_2022_4 if layout == "2022.4" else _ENUMS_2023_4
    out = dict(base)
    meta = [t for t in ("META_DATA_CAPTURE", "META_DATA_EXPORT", "EXPORT_META_DATA") if t in out]
    for t in meta:
        del out[t]
    out.update({t: ENUM_COLUMNS for t in enums})
    out.update({t: base[t] for t in meta})
    return out


def column_names(spec: str) -> list[str]:
    """Column names of a column spec, skipping table constraints."""
    names = []
    for part in spec.split(", "):
        word = part.split(" ", 1)[0]
        if word != "PRIMARY":
            names.append(word)
    return names


#: the memory-pool columns of CUDA_GPU_MEMORY_USAGE_EVENTS (a reduced or third-party export
#: may lack them: `TraceBuilder(memory_pool_columns=False)` writes the table without them)
MEMORY_POOL_COLUMNS = (
    "localMemoryPoolAddress", "localMemoryPoolReleaseThreshold", "localMemoryPoolSize",
    "localMemoryPoolUtilizedSize", "importedMemoryPoolAddress", "importedMemoryPoolProcessId",
)


def without_columns(spec: str, drop: tuple[str, ...]) -> str:
    """``spec`` without the columns named in ``drop``."""
    return ", ".join(p for p in spec.split(", ") if p.split(" ", 1)[0] not in drop)
