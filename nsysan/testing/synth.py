"""`TraceBuilder`: write synthetic traces as real nsys SQLite exports, with known content.

The files follow the nsys 2022.4 layout (schema 3.0.0) or the 2023.4 layout (schema 3.7.2)
table for table and column for column (see `_schema`), with nsys's conventions: globalTid /
globalPid encoding, StringIds interning, `_vNNNN` API name suffixes, correlation ids numbered
per process in call order, NVTX domains created per process, ENUM tables, export metadata and
(lazy export) no empty tables. Any correct nsys-schema reader, nsys's own `stats` and
`analyze` included, can read them.

Times are integer nanoseconds on the session timeline. The builder checks what a real export
guarantees (intervals not reversed, launch calls start before their GPU work, known layouts)
and raises `ConfigError` otherwise.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from nsysan.errors import ConfigError
from nsysan.testing import _rows, _schema
from nsysan.testing._host_memory import HostAndMemoryEvents
from nsysan.testing._host_memory import check_interval as _check_interval
from nsysan.testing._model import (
    COPY_KINDS,
    COPY_OP_CLASS,
    MEM_KINDS,
    NULL_STREAM_ID,
    NVTX_MARK,
    NVTX_PUSH_POP,
    NVTX_START_END,
    SYNC_KINDS,
    ApiCall,
    GpuOp,
    HostEvent,
    KernelName,
    MemoryEvent,
    NvtxEvent,
    Process,
    SyncEvent,
    global_pid,
    global_tid,
)

__all__ = [
    "ApiCall",
    "GpuOp",
    "HostEvent",
    "KernelName",
    "MemoryEvent",
    "NvtxEvent",
    "Process",
    "SyncEvent",
    "TraceBuilder",
    "global_pid",
    "global_tid",
]


class TraceBuilder(HostAndMemoryEvents):
    """Collects processes, threads, CUDA work, NVTX and OS-runtime events, then writes them as
    an nsys SQLite export (`write`). Everything added stays inspectable (``ops``, ``apis``,
    ``nvtx``, ...), which is what scenarios compute their planted truth from."""

    def __init__(
        self,
        *,
        session_start_utc_ns: int = 1_700_000_000_000_000_000,
        hostname: str = "synthetic-node",
        command: tuple[str, ...] = ("python", "train.py"),
        tail_ns: int = 2_000_000,
        memory_pool_columns: bool = True,
    ):
        self.session_start_utc_ns = session_start_utc_ns
        self.hostname = hostname
        self.command = command
        self.tail_ns = tail_ns  # session time after the last event
        self.processes: dict[int, Process] = {}
        self.gpus: dict[int, str] = {}
        self.apis: list[ApiCall] = []
        self.ops: list[GpuOp] = []
        self.nvtx: list[NvtxEvent] = []
        self.osrt: list[HostEvent] = []
        self.overhead: list[HostEvent] = []
        self.syncs: list[SyncEvent] = []
        #: host evidence: on-CPU intervals (gtid, cpu, start, end) and CPU samples
        #: (gtid, time, cpu, stack as (symbol, module) leaf first, thread state)
        self.sched: list[tuple[int, int, int, int, int | None]] = []
        self.samples: list[tuple[int, int, int, tuple[tuple[str, str], ...], int]] = []
        self.memory: list[MemoryEvent] = []
        #: write CUDA_GPU_MEMORY_USAGE_EVENTS with its memory-pool columns (nsys does)
        self.memory_pool_columns = memory_pool_columns
        #: the capture ran with --cuda-memory-usage=true (set by `add_memory_event`; 2023.4
        #: layouts then say so in META_DATA_CAPTURE)
        self.memory_usage_captured = False
        self._strings: dict[str, int] = {}
        self._next_graph_node = 1
        for s in ("[Unknown]", "[kernel.kallsyms]", "[Max depth]"):  # ids 0-2 as in nsys
            self._intern(s)

    # -- identity ---------------------------------------------------------------------------
    def add_process(
        self, pid: int, name: str = "python", *, main_thread: str | None = None, hw: int = 0
    ) -> int:
        """Register a process; returns the globalTid of its main thread (TID == PID)."""
        if pid in self.processes:
            raise ConfigError(f"process {pid} added twice")
        self.processes[pid] = Process(pid, name, hw=hw)
        # nsys's own injection threads live in every profiled process
        self.add_thread(pid, pid + 1, "[NSys]")
        self.add_thread(pid, pid + 2, "[NSys Comms]")
        return self.add_thread(pid, pid, main_thread or name)

    def add_thread(self, pid: int, tid: int, name: str | None = None) -> int:
        """Register a thread of a known process; returns its globalTid."""
        proc = self._process(pid)
        proc.threads[tid] = name or ""
        if name:
            self._intern(name)
        return global_tid(pid, tid, hw=proc.hw, vm=proc.vm)

    def add_gpu(self, device_id: int, name: str = "NVIDIA A100-SXM4-80GB") -> None:
        self.gpus[device_id] = name

    # -- CUDA -------------------------------------------------------------------------------
    def add_api(
        self, gtid: int, start_ns: int, end_ns: int, name: str, *, driver: bool = False
    ) -> ApiCall:
        """A runtime (or driver) API call with no GPU work of its own."""
        _check_interval(name, start_ns, end_ns)
        self._process(self._pid_of(gtid))
        api = ApiCall(gtid, start_ns, end_ns, name, 1 if driver else 0, seq=len(self.apis))
        self.apis.append(api)
        self._intern(name)
        return api

    def _launch(
        self,
        gtid: int,
        op_start: int,
        api_start: int | None,
        api_ns: int,
        name: str,
        via: ApiCall | None,
        driver: bool = False,
    ) -> ApiCall:
        if via is not None:
            api = via
        else:
            start = op_start - api_ns - 2_000 if api_start is None else api_start
            api = self.add_api(gtid, start, start + api_ns, name, driver=driver)
        if api.start_ns >= op_start:
            raise ConfigError(f"{api.name} at {api.start_ns} must start before its GPU work")
        return api

    def add_kernel(
        self,
        gtid: int,
        start_ns: int,
        end_ns: int,
        kernel: KernelName,
        *,
        device_id: int = 0,
        stream_id: int = NULL_STREAM_ID,
        context_id: int = 1,
        api_start: int | None = None,
        api_ns: int = 5_000,
        api_name: str = "cudaLaunchKernel_v7000",
        driver: bool = False,
        via: ApiCall | None = None,
        graph_node_id: int | None = None,
    ) -> GpuOp:
        """A kernel and (unless ``via`` shares one, as a graph launch does) its launch call
        on thread ``gtid``: ``[api_start, api_start + api_ns)``, by default ending 2 us before
        the kernel starts."""
        _check_interval(kernel.short, start_ns, end_ns)
        api = self._launch(gtid, start_ns, api_start, api_ns, api_name, via, driver)
        for s in (kernel.demangled, kernel.short, kernel.mangled):
            if s is not None:
                self._intern(s)
        op = GpuOp(
            "kernel",
            start_ns,
            end_ns,
            api.pid,
            device_id,
            context_id,
            stream_id,
            api,
            kernel.op_class,
            kernel=kernel,
            graph_node_id=graph_node_id,
        )
        self.ops.append(op)
        return op

    def add_graph_launch(
        self,
        gtid: int,
        api_start: int,
        api_end: int,
        kernels: list[tuple[int, int, KernelName]],
        *,
        device_id: int = 0,
        stream_id: int = NULL_STREAM_ID,
        context_id: int = 1,
    ) -> list[GpuOp]:
        """One ``cudaGraphLaunch`` whose kernels (traced at node level) all carry its
        correlation id and a graphNodeId."""
        api = self.add_api(gtid, api_start, api_end, "cudaGraphLaunch_v10000")
        out = []
        for start, end, k in kernels:
            node = self._next_graph_node
            self._next_graph_node += 1
            out.append(
                self.add_kernel(
                    gtid,
                    start,
                    end,
                    k,
                    device_id=device_id,
                    stream_id=stream_id,
                    context_id=context_id,
                    via=api,
                    graph_node_id=node,
                )
            )
        return out

    def add_memcpy(
        self,
        gtid: int,
        start_ns: int,
        end_ns: int,
        *,
        kind: str = "HtoD",
        src: str = "pinned",
        dst: str = "device",
        nbytes: int = 1 << 20,
        device_id: int = 0,
        stream_id: int = NULL_STREAM_ID,
        context_id: int = 1,
        sync: bool = False,
        api_start: int | None = None,
        api_end: int | None = None,
        api_ns: int = 6_000,
    ) -> GpuOp:
        """A copy and its API call: ``cudaMemcpyAsync`` by default; with ``sync=True`` a
        ``cudaMemcpy`` whose call spans the copy (``[api_start, api_end)``, by default 10 us
        either side)."""
        _check_interval("memcpy", start_ns, end_ns)
        if kind not in COPY_KINDS or src not in MEM_KINDS or dst not in MEM_KINDS:
            raise ConfigError(f"unknown copy kind {kind!r} or memory kind {src!r}/{dst!r}")
        if sync:
            a0 = start_ns - 10_000 if api_start is None else api_start
            a1 = end_ns + 10_000 if api_end is None else api_end
            if a1 < end_ns:
                raise ConfigError("a synchronous cudaMemcpy returns after its copy ends")
            api = self._launch(gtid, start_ns, a0, a1 - a0, "cudaMemcpy_v3020", None)
        else:
            api = self._launch(gtid, start_ns, api_start, api_ns, "cudaMemcpyAsync_v3020", None)
        op = GpuOp(
            "memcpy",
            start_ns,
            end_ns,
            api.pid,
            device_id,
            context_id,
            stream_id,
            api,
            COPY_OP_CLASS[kind],
            copy_kind=kind,
            src_kind=src,
            dst_kind=dst,
            bytes=nbytes,
        )
        self.ops.append(op)
        return op

    def add_memset(
        self,
        gtid: int,
        start_ns: int,
        end_ns: int,
        *,
        nbytes: int = 1 << 20,
        value: int = 0,
        device_id: int = 0,
        stream_id: int = NULL_STREAM_ID,
        context_id: int = 1,
        api_start: int | None = None,
        api_ns: int = 4_000,
    ) -> GpuOp:
        _check_interval("memset", start_ns, end_ns)
        api = self._launch(gtid, start_ns, api_start, api_ns, "cudaMemsetAsync_v3020", None)
        op = GpuOp(
            "memset",
            start_ns,
            end_ns,
            api.pid,
            device_id,
            context_id,
            stream_id,
            api,
            "memset",
            dst_kind="device",
            bytes=nbytes,
            value=value,
        )
        self.ops.append(op)
        return op

    def add_sync(
        self,
        gtid: int,
        start_ns: int,
        end_ns: int,
        *,
        kind: str = "stream",
        device_id: int = 0,
        stream_id: int = NULL_STREAM_ID,
        context_id: int = 1,
        event_id: int = 1,
    ) -> SyncEvent:
        """A synchronizing API call (host blocked over ``[start_ns, end_ns)``) and its
        CUPTI_ACTIVITY_KIND_SYNCHRONIZATION row."""
        if kind not in SYNC_KINDS:
            raise ConfigError(f"unknown sync kind {kind!r}; known: {', '.join(SYNC_KINDS)}")
        name, _, has_stream, has_event = SYNC_KINDS[kind]
        api = self.add_api(gtid, start_ns, end_ns, name)
        sync = SyncEvent(
            api,
            kind,
            device_id,
            context_id,
            stream_id if has_stream else None,
            event_id if has_event else None,
        )
        self.syncs.append(sync)
        return sync

    # -- CPU side ---------------------------------------------------------------------------
    def add_nvtx_range(
        self,
        gtid: int,
        start_ns: int,
        end_ns: int,
        name: str,
        *,
        style: str = "push_pop",
        domain: str | None = None,
        registered: bool = False,
        end_gtid: int | None = None,
        category: int | None = None,
        color: int | None = None,
        payload: int | None = None,
    ) -> NvtxEvent:
        """An NVTX push/pop or start/end range (``end_gtid``: a start/end range ended on
        another thread)."""
        _check_interval(name, start_ns, end_ns)
        if style not in ("push_pop", "start_end"):
            raise ConfigError(f"NVTX style must be push_pop or start_end, not {style!r}")
        if end_gtid is not None and (style != "start_end" or end_gtid == gtid):
            raise ConfigError("only start/end ranges can end on another thread")
        etype = NVTX_PUSH_POP if style == "push_pop" else NVTX_START_END
        ev = NvtxEvent(
            etype,
            start_ns,
            end_ns,
            gtid,
            name,
            domain,
            registered,
            end_gtid,
            category,
            color,
            payload,
        )
        return self._add_nvtx(ev)

    def add_nvtx_mark(
        self, gtid: int, ts_ns: int, name: str, *, domain: str | None = None
    ) -> NvtxEvent:
        return self._add_nvtx(NvtxEvent(NVTX_MARK, ts_ns, None, gtid, name, domain))

    def _add_nvtx(self, ev: NvtxEvent) -> NvtxEvent:
        self._process(ev.pid)
        if ev.registered:
            self._intern(ev.name)
        self.nvtx.append(ev)
        return ev

    def add_osrt(
        self, gtid: int, start_ns: int, end_ns: int, name: str, *, return_value: int = 0
    ) -> HostEvent:
        """An OS-runtime call (poll, futex, read, ...) that nsys traced on thread ``gtid``."""
        _check_interval(name, start_ns, end_ns)
        self._process(self._pid_of(gtid))
        ev = HostEvent(start_ns, end_ns, gtid, name, return_value)
        self.osrt.append(ev)
        self._intern(name)
        return ev

    def add_overhead(
        self, gtid: int, start_ns: int, end_ns: int, name: str = "CUDA profiling data flush"
    ) -> HostEvent:
        """A PROFILER_OVERHEAD row (2022.x captures name the flush "CUDA profiling data
        flush"; nsys's GPU-starvation rule only counts names ending in "overhead")."""
        _check_interval(name, start_ns, end_ns)
        ev = HostEvent(start_ns, end_ns, gtid, name)
        self.overhead.append(ev)
        self._intern(name)
        return ev

    # -- derived ----------------------------------------------------------------------------
    @property
    def duration_ns(self) -> int:
        """Session length: the last event's end plus ``tail_ns`` (ANALYSIS_DETAILS.duration)."""
        ends = [0]
        ends += [a.end_ns for a in self.apis] + [o.end_ns for o in self.ops]
        ends += [e.end_ns if e.end_ns is not None else e.start_ns for e in self.nvtx]
        ends += [e.end_ns for e in self.osrt] + [e.end_ns for e in self.overhead]
        ends += [s[3] for s in self.sched] + [t for _, t, *_ in self.samples]
        ends += [e.start_ns for e in self.memory]
        return max(ends) + self.tail_ns

    def assign_correlation_ids(self) -> None:
        """Number API calls per process from 1 in call order, as CUPTI does (so ids collide
        across processes), and give GPU ops their launch call's id. Idempotent."""
        by_pid: dict[int, list[ApiCall]] = {}
        for api in sorted(self.apis, key=lambda a: (a.start_ns, a.seq)):
            by_pid.setdefault(api.pid, []).append(api)
        for apis in by_pid.values():
            for i, api in enumerate(apis, start=1):
                api.correlation_id = i
        orphan = {pid: len(apis) for pid, apis in by_pid.items()}
        for op in self.ops:
            if op.api is not None:
                op.correlation_id = op.api.correlation_id
            else:  # GPU work whose call was not captured: an id no API row has
                orphan[op.pid] = orphan.get(op.pid, 0) + 1
                op.correlation_id = orphan[op.pid]

    # -- writing ----------------------------------------------------------------------------
    def write(self, path: str | Path, layout: str = "2022.4", *, lazy: bool = True) -> Path:
        """Write the trace as an nsys ``layout`` SQLite export at ``path`` (replaced if it
        exists). ``lazy=True`` omits empty tables, as ``nsys export`` does by default;
        ``lazy=False`` creates every table the builder knows, empty or not."""
        if layout not in _schema.LAYOUTS:
            raise ConfigError(f"unknown layout {layout!r}; known: {', '.join(_schema.LAYOUTS)}")
        self.assign_correlation_ids()
        rows = _rows.materialize(self, layout, Path(path).name, lazy)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
        con = sqlite3.connect(path)
        try:
            con.execute("PRAGMA journal_mode = OFF")
            con.execute("PRAGMA synchronous = OFF")
            for table, spec in _schema.table_columns(layout).items():
                data = rows.get(table, [])
                if lazy and not data:
                    continue
                if table == "CUDA_GPU_MEMORY_USAGE_EVENTS" and not self.memory_pool_columns:
                    spec = _schema.without_columns(spec, _schema.MEMORY_POOL_COLUMNS)
                if table == "SCHED_EVENTS" and any(s[4] is not None for s in self.sched):
                    spec += ", " + _schema.SCHED_STATE_COLUMNS
                con.execute(f"CREATE TABLE {table} ({spec})")
                cols = _schema.column_names(spec)
                if table == "CUDA_GPU_MEMORY_USAGE_EVENTS":
                    data = [{k: v for k, v in r.items() if k in cols} for r in data]
                unknown = {k for r in data for k in r} - set(cols)
                if unknown:  # a builder bug, not a user error
                    raise AssertionError(f"{table} has no columns {sorted(unknown)}")
                marks = ", ".join("?" * len(cols))
                con.executemany(
                    f"INSERT INTO {table} VALUES ({marks})",
                    [tuple(r.get(c) for c in cols) for r in data],
                )
            con.commit()
        finally:
            con.close()
        return path

    # -- helpers ----------------------------------------------------------------------------
    def _intern(self, s: str) -> int:
        if s not in self._strings:
            self._strings[s] = len(self._strings)
        return self._strings[s]

    def string_id(self, s: str) -> int:
        return self._strings[s]

    @property
    def strings(self) -> dict[str, int]:
        return dict(self._strings)

    def _process(self, pid: int) -> Process:
        if pid not in self.processes:
            raise ConfigError(f"process {pid} is unknown: call add_process({pid}) first")
        return self.processes[pid]

    @staticmethod
    def _pid_of(gtid: int) -> int:
        return (gtid >> 24) & 0xFFFFFF
