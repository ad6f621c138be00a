"""Turn what a `TraceBuilder` collected into the rows of each nsys export table."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any

from nsysan.testing import _enums, _schema
from nsysan.testing._model import (
    COPY_KINDS,
    CUPTI_INVALID,
    MEM_KINDS,
    NVTX_DOMAIN_CREATE,
    NVTX_START_END,
    OSRT_CLASS,
    OSRT_FINISHED,
    OSRT_STARTED,
    SYNC_KINDS,
    VM_ID,
    null_stream_for,
)

if TYPE_CHECKING:
    from nsysan.testing.synth import TraceBuilder

Row = dict[str, Any]

GLOBAL_VID = VM_ID << 48  # ANALYSIS_DETAILS / TARGET_INFO_* use the VM id in serialized form
_EXPORT_DIR = "/tmp/nsysan-synthetic"  # fixed, so that files do not depend on where they go


def utc_text(epoch_ns: int) -> str:
    """``YYYY-MM-DDTHH:MM:SS`` as nsys writes utcTime."""
    return datetime.fromtimestamp(epoch_ns // 10**9, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")


def materialize(b: TraceBuilder, layout: str, filename: str, lazy: bool) -> dict[str, list[Row]]:
    """Every table's rows, as dicts keyed by nsys column name (absent keys are NULL)."""
    green = layout != "2022.4"  # 3.7.2 added greenContextId to the CUDA activity tables
    duration = b.duration_ns
    # Strings that only appear at write time are interned first, so that StringIds is final.
    for s in ("OS runtime libraries profiling started", "OS runtime libraries profiling finished"):
        if b.osrt:
            b._intern(s)
    rows: dict[str, list[Row]] = {}
    rows["TARGET_INFO_SYSTEM_ENV"] = _system_env(b)
    rows["TARGET_INFO_SESSION_START_TIME"] = [
        {
            "utcEpochNs": b.session_start_utc_ns,
            "utcTime": utc_text(b.session_start_utc_ns),
            "localTime": utc_text(b.session_start_utc_ns),
        }
    ]
    rows["ANALYSIS_DETAILS"] = [
        {
            "globalVid": GLOBAL_VID,
            "duration": duration,
            "startTime": 357_844_493_043,  # another clock: only `duration` is meaningful
            "stopTime": 357_844_493_043 + duration,
        }
    ]
    rows["PROCESSES"] = _processes(b)
    rows["NVTX_EVENTS"] = _nvtx(b)
    rows["CUPTI_ACTIVITY_KIND_RUNTIME"] = [
        {
            "start": a.start_ns,
            "end": a.end_ns,
            "eventClass": a.event_class,
            "globalTid": a.global_tid,
            "correlationId": a.correlation_id,
            "nameId": b.string_id(a.name),
            "returnValue": a.return_value,
        }
        for a in sorted(b.apis, key=lambda a: (a.start_ns, a.seq))
    ]
    kernels, memsets, memcpys = _gpu_ops(b, green)
    rows["CUPTI_ACTIVITY_KIND_KERNEL"] = kernels
    rows["CUPTI_ACTIVITY_KIND_MEMSET"] = memsets
    rows["CUPTI_ACTIVITY_KIND_MEMCPY"] = memcpys
    rows["CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"] = _syncs(b, green)
    rows["PROFILER_OVERHEAD"] = [
        {
            "start": e.start_ns,
            "end": e.end_ns,
            "globalTid": e.global_tid,
            "nameId": b.string_id(e.name),
            "returnValue": 0,
        }
        for e in sorted(b.overhead, key=lambda e: e.start_ns)
    ]
    rows["OSRT_API"] = _osrt(b, duration)
    rows.update(_host_evidence(b))
    rows["CUDA_GPU_MEMORY_USAGE_EVENTS"] = _memory(b)
    rows["ThreadNames"] = [
        {
            "nameId": b.string_id(name),
            "priority": 10 if name.startswith("[NSys") else 0,
            "globalTid": proc.global_pid | tid,
        }
        for proc in b.processes.values()
        for tid, name in sorted(proc.threads.items())
        if name
    ]
    rows["TARGET_INFO_GPU"] = _gpus(b)
    rows.update(_streams(b, layout))
    for table in _schema.table_columns(layout):
        if table.startswith("ENUM_"):
            rows[table] = _enum_rows(table, layout)
    rows.update(_export_meta(b, layout, filename, lazy, duration))
    # last: every string is interned by now
    rows["StringIds"] = [{"id": i, "value": s} for s, i in b.strings.items()]
    return rows


def _system_env(b: TraceBuilder) -> list[Row]:
    facts = [  # (name, nameEnum as nsys numbers it, value)
        ("CpuCores", 1, "64"),
        ("CpuArchitecture", 3, "x86_64"),
        ("CpuDescription", 13, "AMD EPYC 7763 64-Core Processor"),
        ("NvDriverVersion", 205, "5353001"),
        ("OsDescription", 605, "Ubuntu 22.04.3 LTS"),
        ("CudaDriverVersion", 611, "12020"),
        ("Hostname", 619, b.hostname),
    ]
    base = {"globalVid": GLOBAL_VID, "devStateName": "Local (CLI)"}
    return [base | {"name": n, "nameEnum": e, "value": v} for n, e, v in facts]


def _processes(b: TraceBuilder) -> list[Row]:
    out = [{"globalPid": p.global_pid, "pid": p.pid, "name": p.name} for p in b.processes.values()]
    # PROCESSES also lists nsys's own processes: readers must not take it as the profiled set
    for pid, name in ((97, "nsys"), (98, "nsys-launcher")):
        if pid not in b.processes:
            out.append({"globalPid": (VM_ID << 48) | (pid << 24), "pid": pid, "name": name})
    return out


def _nvtx(b: TraceBuilder) -> list[Row]:
    # Domains are created per process, ids from 1 in order of first use, just before it.
    domain_ids: dict[tuple[int, str], int] = {}
    creates: list[tuple[int, int, Row]] = []
    events = sorted(enumerate(b.nvtx), key=lambda t: (t[1].start_ns, t[0]))
    for _, ev in events:
        if ev.domain is None or (ev.pid, ev.domain) in domain_ids:
            continue
        n = 1 + sum(1 for pid, _ in domain_ids if pid == ev.pid)
        domain_ids[(ev.pid, ev.domain)] = n
        t = max(0, ev.start_ns - 1_000)
        create: Row = {"start": t, "eventType": NVTX_DOMAIN_CREATE, "text": ev.domain}
        create |= {"globalTid": ev.global_tid, "domainId": n}
        creates.append((t, -1, create))
    range_ids: dict[int, int] = {}
    out = list(creates)
    for order, ev in events:
        row: Row = {
            "start": ev.start_ns,
            "end": ev.end_ns,
            "eventType": ev.event_type,
            "category": ev.category,
            "color": ev.color,
            "globalTid": ev.global_tid,
            "endGlobalTid": ev.end_global_tid,
            "domainId": 0 if ev.domain is None else domain_ids[(ev.pid, ev.domain)],
            "int64Value": ev.payload,
        }
        if ev.registered:
            row["textId"] = b.string_id(ev.name)
        else:
            row["text"] = ev.name
        if ev.event_type == NVTX_START_END:  # nvtxRangeStart's id, numbered per process
            range_ids[ev.pid] = range_ids.get(ev.pid, 0) + 1
            row["rangeId"] = range_ids[ev.pid]
        out.append((ev.start_ns, order, row))
    return [r for _, _, r in sorted(out, key=lambda t: (t[0], t[1]))]


def _gpu_ops(b: TraceBuilder, green: bool) -> tuple[list[Row], list[Row], list[Row]]:
    kernels: list[Row] = []
    memsets: list[Row] = []
    memcpys: list[Row] = []
    grid_id = 0
    for op in sorted(b.ops, key=lambda o: (o.start_ns, o.device_id, o.stream_id)):
        proc = b.processes[op.pid]
        row: Row = {
            "start": op.start_ns,
            "end": op.end_ns,
            "deviceId": op.device_id,
            "contextId": op.context_id,
            "streamId": op.stream_id,
            "correlationId": op.correlation_id,
            "globalPid": proc.global_pid,
            "graphNodeId": op.graph_node_id,
        }
        if green:
            row["greenContextId"] = None
        if op.kind == "kernel":
            k = op.kernel
            assert k is not None
            grid_id += 1
            smem = k.static_smem + k.dynamic_smem
            row |= {
                "demangledName": b.string_id(k.demangled),
                "shortName": b.string_id(k.short),
                "mangledName": None if k.mangled is None else b.string_id(k.mangled),
                "launchType": 1,  # regular
                "cacheConfig": 1,
                "registersPerThread": k.registers,
                "gridX": k.grid[0],
                "gridY": k.grid[1],
                "gridZ": k.grid[2],
                "blockX": k.block[0],
                "blockY": k.block[1],
                "blockZ": k.block[2],
                "staticSharedMemory": k.static_smem,
                "dynamicSharedMemory": k.dynamic_smem,
                "localMemoryPerThread": 0,
                "localMemoryTotal": 208_797_696,
                "gridId": grid_id,
                "sharedMemoryExecuted": 32_768 if smem <= 32_768 else 167_936,
                "sharedMemoryLimitConfig": 0,
            }
            kernels.append(row)
        elif op.kind == "memcpy":
            assert op.copy_kind and op.src_kind and op.dst_kind
            row |= {
                "bytes": op.bytes,
                "copyKind": COPY_KINDS[op.copy_kind],
                "srcKind": MEM_KINDS[op.src_kind],
                "dstKind": MEM_KINDS[op.dst_kind],
            }
            if op.copy_kind == "PtoP":
                row |= {"srcDeviceId": op.device_id, "srcContextId": op.context_id}
            memcpys.append(row)
        else:
            row |= {"value": op.value, "bytes": op.bytes, "memKind": MEM_KINDS["device"]}
            memsets.append(row)
    return kernels, memsets, memcpys


def _syncs(b: TraceBuilder, green: bool) -> list[Row]:
    out = []
    for s in sorted(b.syncs, key=lambda s: s.api.start_ns):
        row: Row = {
            "start": s.api.start_ns,
            "end": s.api.end_ns,
            "deviceId": s.device_id,
            "contextId": s.context_id,
            "streamId": CUPTI_INVALID if s.stream_id is None else s.stream_id,
            "correlationId": s.api.correlation_id,
            "globalPid": b.processes[s.api.pid].global_pid,
            "syncType": SYNC_KINDS[s.kind][1],
            "eventId": CUPTI_INVALID if s.event_id is None else s.event_id,
        }
        if green:
            row["greenContextId"] = None
        out.append(row)
    return out


def _osrt(b: TraceBuilder, duration: int) -> list[Row]:
    out: list[tuple[int, Row]] = []
    first: dict[int, int] = {}
    for e in b.osrt:
        pid = (e.global_tid >> 24) & 0xFFFFFF
        first[pid] = min(first.get(pid, e.start_ns), e.start_ns)
        row = {"start": e.start_ns, "end": e.end_ns, "eventClass": OSRT_CLASS}
        row |= {"globalTid": e.global_tid, "nameId": b.string_id(e.name)}
        row |= {"returnValue": e.return_value, "nestingLevel": 0, "callchainId": 0}
        out.append((e.start_ns, row))
    for pid, t0 in first.items():  # zero-length marker rows on the process (TID 0)
        gpid = b.processes[pid].global_pid
        for ts, cls, name in (
            (max(0, t0 - 500_000), OSRT_STARTED, "OS runtime libraries profiling started"),
            (duration - b.tail_ns // 2, OSRT_FINISHED, "OS runtime libraries profiling finished"),
        ):
            row = {"start": ts, "end": ts, "eventClass": cls, "globalTid": gpid}
            row |= {"nameId": b.string_id(name), "returnValue": 0, "callchainId": 0}
            out.append((ts, row))
    return [r for _, r in sorted(out, key=lambda t: t[0])]


_GPU_FACTS: Row = {  # an A100-SXM4-80GB as nsys describes it
    "isDiscrete": 1,
    "l2CacheSize": 41_943_040,
    "totalMemory": 85_198_045_184,
    "memoryBandwidth": 2_039_000_000_000,
    "clockRate": 1_410_000_000,
    "smCount": 108,
    "luid": 0,
    "chipName": "GA100",
    "ctxswDevPath": "",
    "ctrlDevPath": "",
    "revision": 161,
    "nodeMask": 0,
    "constantMemory": 65_536,
    "maxIPC": 4,
    "maxRegistersPerBlock": 65_536,
    "maxShmemPerBlock": 49_152,
    "maxShmemPerBlockOptin": 166_912,
    "maxShmemPerSm": 167_936,
    "maxRegistersPerSm": 65_536,
    "threadsPerWarp": 32,
    "asyncEngines": 5,
    "maxWarpsPerSm": 64,
    "maxBlocksPerSm": 32,
    "maxThreadsPerBlock": 1024,
    "maxBlockDimX": 1024,
    "maxBlockDimY": 1024,
    "maxBlockDimZ": 64,
    "maxGridDimX": 2_147_483_647,
    "maxGridDimY": 65_535,
    "maxGridDimZ": 65_535,
    "computeMajor": 8,
    "computeMinor": 0,
    "smMajor": 8,
    "smMinor": 0,
}


def _memory(b: TraceBuilder) -> list[Row]:
    """CUDA_GPU_MEMORY_USAGE_EVENTS in time order (nsys writes them as CUPTI delivers them)."""
    out = []
    for e in sorted(b.memory, key=lambda e: e.start_ns):
        out.append({
            "start": e.start_ns, "globalPid": e.global_pid, "deviceId": e.device_id,
            "contextId": e.context_id, "address": e.address, "pc": 0, "bytes": e.bytes,
            "memKind": MEM_KINDS[e.mem_kind],
            "memoryOperationType": 0 if e.op == "alloc" else 1, "name": e.name,
            "correlationId": e.api.correlation_id if e.api is not None else None,
            "localMemoryPoolAddress": e.pool_address,
            "localMemoryPoolReleaseThreshold": e.pool_release_threshold,
            "localMemoryPoolSize": e.pool_size,
            "localMemoryPoolUtilizedSize": e.pool_utilized,
        })
    return out


def _gpus(b: TraceBuilder) -> list[Row]:
    devices = dict.fromkeys(sorted({op.device_id for op in b.ops} | set(b.gpus)))
    out = []
    for dev in devices:
        row = {"vmId": GLOBAL_VID, "id": dev, "name": b.gpus.get(dev, "NVIDIA A100-SXM4-80GB")}
        row |= {"busLocation": f"0000:{0x07 + 0x10 * dev:02x}:00.0", "pwGpuId": dev}
        row |= {"uuid": f"5e7e1c{dev:02x}-0000-4000-8000-00000000{dev:04x}", "cuDevice": dev}
        out.append(row | _GPU_FACTS)
    return out


def _streams(b: TraceBuilder, layout: str) -> dict[str, list[Row]]:
    contexts: dict[tuple[int, int, int], None] = {}  # (pid, device, context)
    streams: dict[tuple[int, int, int], None] = {}  # (pid, context, stream)
    for op in sorted(b.ops, key=lambda o: o.start_ns):
        contexts[(op.pid, op.device_id, op.context_id)] = None
        streams[(op.pid, op.context_id, op.stream_id)] = None
    for s in b.syncs:
        contexts[(s.api.pid, s.device_id, s.context_id)] = None
        if s.stream_id is not None:
            streams[(s.api.pid, s.context_id, s.stream_id)] = None
    null_rows = []
    for pid, dev, ctx in contexts:
        ident = {"hwId": b.processes[pid].hw, "vmId": VM_ID, "processId": pid}
        ident |= {"deviceId": dev, "contextId": ctx}
        if layout == "2022.4":
            null_rows.append({"streamId": null_stream_for(ctx)} | ident)
        else:
            null_rows.append({"nullStreamId": null_stream_for(ctx)} | ident)
    stream_rows = [
        {
            "streamId": sid,
            "hwId": b.processes[pid].hw,
            "vmId": VM_ID,
            "processId": pid,
            "contextId": ctx,
            "priority": 0,
            "flag": 3 if sid == null_stream_for(ctx) else 2,  # 3 NULL stream, 2 non-blocking
        }
        for pid, ctx, sid in streams
    ]
    null_table = (
        "TARGET_INFO_CUDA_NULL_STREAM" if layout == "2022.4" else "TARGET_INFO_CUDA_CONTEXT_INFO"
    )
    return {null_table: null_rows, "TARGET_INFO_CUDA_STREAM": stream_rows}


def _enum_rows(table: str, layout: str) -> list[Row]:
    key = "ENUM_CUDA_KERNEL_LAUNCH_TYPE" if table == "ENUM_CUDA_KRENEL_LAUNCH_TYPE" else table
    rows = _enums.ENUMS[key]
    if table == "ENUM_NSYS_EVENT_TYPE":
        rows = [r for r in rows if r[0] <= _schema.MAX_EVENT_TYPE[layout]]
    return [{"id": i, "name": n, "label": lab} for i, n, lab in rows]


def _export_meta(
    b: TraceBuilder, layout: str, filename: str, lazy: bool, duration: int
) -> dict[str, list[Row]]:
    stem = filename.rsplit(".", 1)[0]
    report = f"{stem}.nsys-rep"
    when = utc_text(b.session_start_utc_ns + duration + 3_600 * 10**9)
    version = _schema.SCHEMA_VERSION[layout]
    common = [
        ("EXPORT_PRODUCT_NAME", "NVIDIA Nsight Systems"),
        ("EXPORT_PRODUCT_VERSION", _schema.PRODUCT_VERSION[layout]),
        ("EXPORT_PRODUCT_DATE", layout),
        ("EXPORT_SCHEMA_VERSION", version),
        ("EXPORT_SCHEMA_VERSION_MAJOR", version.split(".")[0]),
        ("EXPORT_SCHEMA_VERSION_MINOR", version.split(".")[1]),
        ("EXPORT_SCHEMA_VERSION_MICRO", version.split(".")[2]),
        ("EXPORT_SCHEMA_VERSION_CKSUM", _schema.SCHEMA_CKSUM[layout]),
        ("EXPORT_PLATFORM", "linux-desktop"),
        ("EXPORT_ARCH", "x64"),
    ]
    abs_in = str(PurePosixPath(_EXPORT_DIR) / report)
    abs_out = str(PurePosixPath(_EXPORT_DIR) / filename)
    lazy_text = "true" if lazy else "false"
    if layout == "2022.4":  # "OUTUPT" is nsys's own spelling
        pairs = [
            *common,
            ("EXPORT_TIME", "0.01"),
            ("EXPORT_TIME_UTC", when),
            ("EXPORT_TIME_LOCAL", when),
            ("EXPORT_HOST", b.hostname),
            ("EXPORT_USER", ""),
            ("EXPORT_INPUT_FILE", report),
            ("EXPORT_OUTUPT_FILE", filename),
            ("EXPORT_INPUT_PATH", report),
            ("EXPORT_OUTUPT_PATH", filename),
            ("EXPORT_INPUT_PATH_ABS", abs_in),
            ("EXPORT_OUTUPT_PATH_ABS", abs_out),
            ("EXPORT_OVERWRITE", "true"),
            ("EXPORT_LAZY", lazy_text),
        ]
        return {"EXPORT_META_DATA": [{"name": n, "value": v} for n, v in pairs]}
    pairs = [
        *common,
        ("EXPORT_TIME_UTC", when),
        ("EXPORT_TIME_LOCAL", f"{when} +0000 UTC"),
        ("EXPORT_HOST", b.hostname),
        ("EXPORT_USER", ""),
        ("EXPORT_PARAM_INPUT_FILE", report),
        ("EXPORT_PARAM_OUTUPT_FILE", filename),
        ("EXPORT_PARAM_INPUT_PATH", report),
        ("EXPORT_PARAM_OUTUPT_PATH", filename),
        ("EXPORT_PARAM_INPUT_PATH_ABS", abs_in),
        ("EXPORT_PARAM_OUTUPT_PATH_ABS", abs_out),
        ("EXPORT_PARAM_OVERWRITE", "true"),
        ("EXPORT_PARAM_APPEND", "false"),
        ("EXPORT_PARAM_LAZY", lazy_text),
        ("EXPORT_PARAM_TIME_NORMALIZE", "false"),
        ("EXPORT_PARAM_TIME_SHIFT", "0"),
        ("EXPORT_PARAM_TABLES_TO_EXPORT", ""),
        ("EXPORT_PARAM_TIMES_TO_EXPORT", ""),
        ("EXPORT_CONFIG_TIME_SHIFT", "0"),
        ("EXPORT_TIME", "0.02 sec"),
    ]
    capture = [
        ("DEVICE_ID", "Local (CLI)"),
        ("CAPTURE_EVENT_TYPE", "NvtxEvents"),
        ("CAPTURE_EVENT_TYPE", "Cuda"),
    ]
    if b.osrt:
        capture.append(("CAPTURE_EVENT_TYPE", "OSRuntime"))
    capture += [
        ("DEVICE_TYPE", "Unix"),
        ("DEVICE_DISPLAY_NAME", b.hostname),
        ("PROCESS_0:HOW_TO_ATTACH", "LaunchAnother"),
        ("PROCESS_0:COMMAND", b.command[0]),
    ]
    capture += [(f"PROCESS_0:ARGUMENT_{i}", a) for i, a in enumerate(b.command[1:])]
    capture += [
        ("PROCESS_0:WORKING_DIR", "/workspace"),
        ("PROCESS_0:ENVIRONMENT_VARIABLE", 'CUDA_VISIBLE_DEVICES="0,1,2,3"'),
        ("PROCESS_0:COLLECT_NVTX_TRACE", "true"),
        ("PROCESS_0:COLLECT_CUDA_TRACE", "true"),
        ("PROCESS_0:CUDA_GRAPH_TRACE_OPTIONS:MODE", "Node"),
        ("RUN_DURATION_MS", str(duration // 1_000_000)),
        ("OS_RUNTIME_OPTIONS:DURATION_THRESHOLD_NS", "1000"),
        ("NVTX_OPTIONS:NVTX_DOMAIN_FILTER_STRING", ""),
    ]
    if b.memory_usage_captured:  # the key real 2023.4 captures write ("false" when off)
        capture.append(("PROCESS_0:COLLECT_GPU_MEMORY_USAGE", "true"))
    return {
        "META_DATA_CAPTURE": [{"name": n, "value": v} for n, v in capture],
        "META_DATA_EXPORT": [{"name": n, "value": v} for n, v in pairs],
    }


def _host_evidence(b: TraceBuilder) -> dict[str, list[Row]]:
    """SCHED_EVENTS, COMPOSITE_EVENTS and SAMPLING_CALLCHAINS rows (time order; sample ids
    numbered in that order from 1, as nsys does)."""
    sched = []
    states = any(s[4] is not None for s in b.sched)
    for gtid, cpu, start, end, out_state in b.sched:
        switch_in = {"start": start, "cpu": cpu, "isSchedIn": 1, "globalTid": gtid}
        switch_out = {"start": end, "cpu": cpu, "isSchedIn": 0, "globalTid": gtid}
        if states:  # schema 3.28: the state at each switch (running when switched in)
            switch_in["threadState"], switch_out["threadState"] = 1, out_state
        sched += [switch_in, switch_out]
    sched.sort(key=lambda r: (r["start"], r["isSchedIn"], r["globalTid"]))
    events, chains = [], []
    for i, (gtid, t, cpu, stack, state) in enumerate(
        sorted(b.samples, key=lambda s: (s[1], s[0])), start=1
    ):
        events.append({"id": i, "start": t, "cpu": cpu, "threadState": state,
                       "globalTid": gtid, "cpuCycles": 1})
        for depth, (symbol, module) in enumerate(stack):
            chains.append({"id": i, "symbol": b.string_id(symbol), "module": b.string_id(module),
                           "kernelMode": int(module == "[kernel.kallsyms]"), "stackDepth": depth})
    return {"SCHED_EVENTS": sched, "COMPOSITE_EVENTS": events, "SAMPLING_CALLCHAINS": chains}
