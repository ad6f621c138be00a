"""The records a `TraceBuilder` collects, and nsys's identity and enum conventions."""

from __future__ import annotations

from dataclasses import dataclass, field

from nsysan.errors import ConfigError

VM_ID = 1  # local captures: VM id 1, HW id 0 (e.g. 0x0001_0024DB_0024DB)
NULL_STREAM_ID = 7  # the legacy default stream id CUPTI gives the first context
CUPTI_INVALID = 0xFFFFFFFF  # CUPTI's "does not apply" marker (stream of a context sync, ...)

COPY_KINDS = {"HtoD": 1, "DtoH": 2, "DtoD": 8, "HtoH": 9, "PtoP": 10}
MEM_KINDS = {"pageable": 0, "pinned": 1, "device": 2, "array": 3, "managed": 4,
             "device_static": 5, "managed_static": 6}
COPY_OP_CLASS = {
    "HtoD": "memcpy_h2d",
    "DtoH": "memcpy_d2h",
    "DtoD": "memcpy_d2d",
    "PtoP": "memcpy_p2p",
    "HtoH": "memcpy_d2d",
}

# Sync kinds: (API name, syncType as captures of the nsys 2020-2023 era store it, stream valid,
# event valid). The stored numbers do NOT follow ENUM_CUPTI_SYNC_TYPE's labels: every such
# capture in ../shared/traces has cudaDeviceSynchronize -> 1, cudaEventSynchronize /
# cudaEventQuery -> 2, cudaStreamSynchronize and cudaStreamWaitEvent -> 3. Readers should
# classify sync rows by the API joined on correlationId, not by the number.
SYNC_KINDS = {
    "context": ("cudaDeviceSynchronize_v3020", 1, False, False),
    "event": ("cudaEventSynchronize_v3020", 2, False, True),
    "stream": ("cudaStreamSynchronize_v3020", 3, True, False),
    "stream_wait_event": ("cudaStreamWaitEvent_v3020", 3, True, True),
}

NVTX_MARK, NVTX_PUSH_POP, NVTX_START_END = 34, 59, 60
NVTX_DOMAIN_CREATE, NVTX_DOMAIN_DESTROY = 75, 76
OSRT_CLASS, OSRT_STARTED, OSRT_FINISHED = 27, 31, 32

_RAW_CLOCK_BASE = 357_844_493_043  # ANALYSIS_DETAILS.startTime lives on another clock


def null_stream_for(context_id: int) -> int:
    """The legacy NULL stream id of a context: 7 for the first one, as CUPTI numbers them."""
    return NULL_STREAM_ID + 6 * (context_id - 1)


def global_tid(pid: int, tid: int, *, hw: int = 0, vm: int = VM_ID) -> int:
    """nsys's serialized thread id: ``HW:8 | VM:8 | PID:24 | TID:24`` bits."""
    if not (0 <= pid < 1 << 24 and 0 <= tid < 1 << 24):
        raise ConfigError(f"pid {pid} / tid {tid} must fit in 24 bits")
    return (hw << 56) | (vm << 48) | (pid << 24) | tid


def global_pid(pid: int, *, hw: int = 0, vm: int = VM_ID) -> int:
    """nsys's serialized process id: a globalTid with TID 0."""
    return global_tid(pid, 0, hw=hw, vm=vm)


@dataclass(frozen=True)
class KernelName:
    """A kernel as CUPTI names it, with the launch geometry it always uses."""

    demangled: str
    short: str
    mangled: str | None = None  # NULL in the export when None (as for older captures)
    grid: tuple[int, int, int] = (1, 1, 1)
    block: tuple[int, int, int] = (128, 1, 1)
    registers: int = 32
    static_smem: int = 0
    dynamic_smem: int = 0

    @property
    def op_class(self) -> str:
        return "nccl" if self.short.startswith("nccl") else "compute"


@dataclass
class ApiCall:
    """One CUPTI_ACTIVITY_KIND_RUNTIME row (runtime or driver call)."""

    global_tid: int
    start_ns: int
    end_ns: int
    name: str  # with version suffix, as nsys stores it
    event_class: int = 0  # 0 CUDA runtime, 1 CUDA driver
    return_value: int = 0
    seq: int = 0
    correlation_id: int | None = None  # assigned per process in call order by the builder

    @property
    def pid(self) -> int:
        return (self.global_tid >> 24) & 0xFFFFFF


@dataclass
class GpuOp:
    """One kernel, memcpy or memset row, with what nsysan should derive from it."""

    kind: str  # kernel | memcpy | memset
    start_ns: int
    end_ns: int
    pid: int
    device_id: int
    context_id: int
    stream_id: int
    api: ApiCall | None
    op_class: str  # compute | nccl | memcpy_h2d | ... | memset
    kernel: KernelName | None = None
    copy_kind: str | None = None
    src_kind: str | None = None
    dst_kind: str | None = None
    bytes: int = 0
    value: int = 0
    graph_node_id: int | None = None
    correlation_id: int | None = None  # assigned by the builder

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


@dataclass
class NvtxEvent:
    event_type: int  # 34 mark, 59 push/pop, 60 start/end
    start_ns: int
    end_ns: int | None
    global_tid: int
    name: str
    domain: str | None = None  # None: the default domain
    registered: bool = False  # name given as a registered string (textId) instead of text
    end_global_tid: int | None = None  # start/end ranges that end on another thread
    category: int | None = None
    color: int | None = None
    payload: int | None = None  # int64 payload

    @property
    def pid(self) -> int:
        return (self.global_tid >> 24) & 0xFFFFFF


@dataclass
class HostEvent:
    """An OSRT_API or PROFILER_OVERHEAD row."""

    start_ns: int
    end_ns: int
    global_tid: int
    name: str
    return_value: int = 0


@dataclass
class MemoryEvent:
    """A CUDA_GPU_MEMORY_USAGE_EVENTS row: one device allocation or free."""

    start_ns: int
    global_pid: int
    device_id: int
    address: int
    bytes: int
    mem_kind: str  # key of MEM_KINDS
    op: str  # alloc | free
    api: ApiCall | None = None  # the call that made it (its correlation id is the event's)
    context_id: int = 1
    pool_address: int | None = None
    pool_release_threshold: int | None = None
    pool_size: int | None = None
    pool_utilized: int | None = None
    name: str | None = None


@dataclass
class SyncEvent:
    api: ApiCall
    kind: str  # key of SYNC_KINDS
    device_id: int
    context_id: int
    stream_id: int | None
    event_id: int | None


@dataclass
class Process:
    pid: int
    name: str
    hw: int = 0
    vm: int = VM_ID
    threads: dict[int, str] = field(default_factory=dict)

    @property
    def global_pid(self) -> int:
        return global_pid(self.pid, hw=self.hw, vm=self.vm)
