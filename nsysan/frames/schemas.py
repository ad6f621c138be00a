"""Schemas of every canonical frame and output table: the single source of truth.

Conventions (DESIGN.md "Explicit schemas and units"): time is Int64 nanoseconds in ``*_ns``
columns on the session timeline, intervals are half-open ``[start_ns, end_ns)``, fractions are
``*_frac`` in [0, 1], and every frame starts with ``trace_id``.

Text in the canonical event frames is dictionary-encoded, so that a frame costs what its data
costs (a 1M-kernel ``gpu_ops`` held ~600 MB of copied kernel names as String):

- an open vocabulary (names, domains) is ``pl.Categorical()`` (`CAT`): each row holds a
  32-bit code into polars' global categories, which are freed once no column uses them.
  Categoricals sort, compare and take min/max by their text, like String;
- an open vocabulary of a few labels (copy kinds, memory kinds, thread states) is a
  `small_vocabulary`: a Categorical of its own categories with 8-bit codes;
- a closed vocabulary is a ``pl.Enum`` of it (`GPU_OP_KIND`, `OP_CLASS`, `API_CLASS`,
  `API_LAYER`, `NVTX_STYLE`, `SYNC_TYPE`, `MEMORY_OP`); a value outside it cannot be stored.
  Its categories are in lexical order (``sorted`` of the vocabulary tuple, which keeps its
  meaningful order for reports), so that an Enum too sorts, compares and takes min/max by its
  text: every content order (`nsysan.frames.order`) is the one the String columns had.

Integers are as narrow as their values allow (`OS_ID`, ``I32``: OS ids, a kernel's grid x
size, API return values, Int32; `CUDA_ID`: CUDA device/context/stream ids and correlation
ids, UInt32 as CUPTI records them; `LAUNCH_DIM`: the grid's y and z sizes and the block's
sizes, which CUDA limits to 65535, UInt16; `CPU`: CPU numbers, Int16; a 1M-kernel
``gpu_ops`` 154 -> 100 B per op);
the output tables hold them as Int64, and a pass keying a table on a frame's id casts it.
CUPTI's not-applicable id marker (0xFFFFFFFF) is read as null
(`nsysan.load.adapters.null_invalid_ids`); any other value that does not fit its narrow type
is not one nsys writes: `conform` rejects it (`TraceFormatError`) instead of wrapping it.

What still needs text works on the distinct values (``df[col].unique().cast(pl.String)``) and
joins or maps back; two frames' keys join when both are Categorical (or both the same Enum),
never a Categorical with a String. ``trace_id`` stays String (one broadcast value), and so do
``nvtx.payload_json`` (mostly distinct), the small descriptive frames (gpus, streams,
processes, threads, meta) and every output table: passes conform what they return to their
declared String schemas, and the Parquet files are written from those.
"""

from __future__ import annotations

import polars as pl

from nsysan.frames.conform import COPY_KIND, MEMORY_KIND

# `conform` and the small vocabularies live in their own module; they are part of this one's
# namespace (``schemas.conform``, ``schemas.THREAD_STATE``, ...).
from nsysan.frames.conform import SMALL_LABELS_PER_TRACE as SMALL_LABELS_PER_TRACE
from nsysan.frames.conform import SMALL_VOCABULARIES as SMALL_VOCABULARIES
from nsysan.frames.conform import SMALL_VOCABULARY_MAX as SMALL_VOCABULARY_MAX
from nsysan.frames.conform import THREAD_STATE as THREAD_STATE
from nsysan.frames.conform import conform as conform
from nsysan.frames.conform import fit_small_vocabulary as fit_small_vocabulary
from nsysan.frames.conform import small_vocabulary as small_vocabulary
from nsysan.frames.host_taxonomy import HOST_LAYERS

# The communication tables live in their own module; they are part of this one's namespace.
from nsysan.frames.schemas_comm import COLLECTIVES, NCCL, NCCL_SUMMARY, RANKS
from nsysan.frames.schemas_comm import NCCL_OPS as NCCL_OPS

I64 = pl.Int64
I32 = pl.Int32
#: OS process and thread ids in the frames: 24 bits of nsys' global ids
#: (`nsysan.load.adapters.pid_of`); the output tables hold them as Int64
OS_ID = pl.Int32
#: CUDA device, context and stream ids and API correlation ids in the frames: CUPTI records
#: each as an unsigned 32-bit number (0xFFFFFFFF, "not applicable", reads as null); the
#: output tables hold them as Int64
CUDA_ID = pl.UInt32
#: a kernel's grid y/z and block x/y/z sizes: CUDA limits each to 65535 (blocks to 1024); the
#: frames hold them as UInt16, so multiply them after a cast (``pl.col("block_x").cast(pl.Int64)``)
LAUNCH_DIM = pl.UInt16
#: a CPU number (of a context switch or a CPU sample): Linux numbers at most a few thousand
CPU = pl.Int16
F64 = pl.Float64
STR = pl.String
BOOL = pl.Boolean
#: an open vocabulary of the canonical frames (module docstring)
CAT = pl.Categorical()
# ---------------------------------------------------------------------------------------------
# Vocabularies
# ---------------------------------------------------------------------------------------------
GPU_OP_KINDS = ("kernel", "memcpy", "memset")
OP_CLASSES = (
    "compute",
    "nccl",
    "memcpy_h2d",
    "memcpy_d2h",
    "memcpy_d2d",
    "memcpy_p2p",
    "memset",
)
#: short names used in overlap states, in their canonical (sorted) order
OVERLAP_CLASS_OF_OP_CLASS = {
    "compute": "compute",
    "nccl": "nccl",
    "memcpy_h2d": "h2d",
    "memcpy_d2h": "d2h",
    "memcpy_d2d": "d2d",
    "memcpy_p2p": "p2p",
    "memset": "memset",
}
API_CLASSES = ("launch", "memcpy", "memset", "sync", "malloc", "graph", "other")
NVTX_STYLES = ("push_pop", "start_end", "mark")
API_LAYERS = ("runtime", "driver")
SYNC_TYPE_LABELS = ("event_sync", "stream_wait_event", "stream_sync", "context_sync", "unknown")
MEMORY_OPS = ("alloc", "free")


def enum_of(vocabulary: tuple[str, ...]) -> pl.Enum:
    """The Enum of a closed vocabulary, its categories in lexical order: an Enum then sorts,
    compares and takes min/max by its text, as a String column does."""
    return pl.Enum(sorted(vocabulary))


GPU_OP_KIND = enum_of(GPU_OP_KINDS)
OP_CLASS = enum_of(OP_CLASSES)
API_CLASS = enum_of(API_CLASSES)
API_LAYER = enum_of(API_LAYERS)
NVTX_STYLE = enum_of(NVTX_STYLES)
SYNC_TYPE = enum_of(SYNC_TYPE_LABELS)
MEMORY_OP = enum_of(MEMORY_OPS)
STACK_LAYER = enum_of(HOST_LAYERS)

# ---------------------------------------------------------------------------------------------
# Canonical frames (the load contract)
# ---------------------------------------------------------------------------------------------
GPU_OPS = pl.Schema(
    {
        "trace_id": STR,
        "kind": GPU_OP_KIND,  # kernel | memcpy | memset
        "start_ns": I64,
        "end_ns": I64,
        "global_pid": I64,
        "pid": OS_ID,
        "device_id": CUDA_ID,
        "context_id": CUDA_ID,
        "stream_id": CUDA_ID,
        "correlation_id": CUDA_ID,
        "name": CAT,  # kernel short name, or the copy kind / "memset"
        "demangled_name": CAT,  # kernels: full demangled signature; else same as name
        "copy_kind": COPY_KIND,  # HtoD | DtoH | DtoD | HtoH | PtoP | ... (memcpy only)
        "src_kind": MEMORY_KIND,  # pageable | pinned | device | managed | ... (memcpy only)
        "dst_kind": MEMORY_KIND,  # memcpy: destination memory kind; memset: the kind set
        "bytes": I64,
        "graph_node_id": I64,
        "grid_x": I32,
        "grid_y": LAUNCH_DIM,
        "grid_z": LAUNCH_DIM,
        "block_x": LAUNCH_DIM,
        "block_y": LAUNCH_DIM,
        "block_z": LAUNCH_DIM,
        "op_class": OP_CLASS,  # one of OP_CLASSES
    }
)

CUDA_API = pl.Schema(
    {
        "trace_id": STR,
        "start_ns": I64,
        "end_ns": I64,
        "global_tid": I64,
        "global_pid": I64,
        "pid": OS_ID,
        "tid": OS_ID,
        "correlation_id": CUDA_ID,
        "name": CAT,  # version suffix (_v7000) stripped
        "api_class": API_CLASS,  # one of API_CLASSES
        "layer": API_LAYER,  # runtime | driver
        "return_value": I32,
    }
)

NVTX = pl.Schema(
    {
        "trace_id": STR,
        # unique in the trace; 1.. in content order (start, longer first, thread, ...), never
        # the export's row order: see nsysan.load.adapters_nvtx and docs/determinism.md
        "range_id": I64,
        "start_ns": I64,
        "end_ns": I64,  # marks: end_ns == start_ns
        "global_tid": I64,
        "global_pid": I64,
        "pid": OS_ID,
        "tid": OS_ID,
        "end_global_tid": I64,  # null unless a start/end range ended on another thread
        "domain": CAT,  # "" for the default domain
        "name": CAT,
        "category": I64,
        "style": NVTX_STYLE,  # push_pop | start_end | mark
        "depth": I32,  # 0 = outermost on its thread (same-thread ranges only)
        "parent_range_id": I64,
        "unterminated": BOOL,  # end_ns == session end: the range was probably never closed
        "payload_json": STR,  # JSON payload when the export has one (e.g. NCCL sizes)
    }
)

OSRT = pl.Schema(
    {
        "trace_id": STR,
        "start_ns": I64,
        "end_ns": I64,
        "global_tid": I64,
        "pid": OS_ID,
        "tid": OS_ID,
        "name": CAT,
    }
)

SYNC = pl.Schema(
    {
        "trace_id": STR,
        "start_ns": I64,
        "end_ns": I64,
        "global_pid": I64,
        "pid": OS_ID,
        "device_id": CUDA_ID,
        "context_id": CUDA_ID,
        "stream_id": CUDA_ID,
        "correlation_id": CUDA_ID,
        "sync_type": SYNC_TYPE,  # one of SYNC_TYPE_LABELS
    }
)

OVERHEAD = pl.Schema(
    {
        "trace_id": STR,
        "start_ns": I64,
        "end_ns": I64,
        "global_tid": I64,
        "pid": OS_ID,
        "name": CAT,
    }
)

GPUS = pl.Schema(
    {
        "trace_id": STR,
        "device_id": CUDA_ID,
        "name": STR,
        "uuid": STR,
        "bus_location": STR,
        "sm_count": I64,
        "compute_capability": STR,  # "8.0"
        "total_memory_bytes": I64,
        "memory_bandwidth_bps": I64,
        "clock_rate_hz": I64,
    }
)

STREAMS = pl.Schema(
    {
        "trace_id": STR,
        "pid": OS_ID,
        "context_id": CUDA_ID,
        "stream_id": CUDA_ID,
        "priority": I64,
        "stream_type": STR,  # default | non_blocking | null | unknown
    }
)

PROCESSES = pl.Schema(
    {
        "trace_id": STR,
        "global_pid": I64,
        "pid": OS_ID,
        "name": STR,
    }
)

THREADS = pl.Schema(
    {
        "trace_id": STR,
        "global_tid": I64,
        "pid": OS_ID,
        "tid": OS_ID,
        "name": STR,
    }
)

META = pl.Schema({"trace_id": STR, "key": STR, "value": STR})

# Host evidence (issue 18: sched, cpu_samples, cpu_stacks): optional frames, not canonical,
# so their schemas are in `schemas_host`.

#: CUDA memory-usage events (``--cuda-memory-usage=true``), one row per device allocation or
#: free: the columns the memory pass reads (it joins each event to its API call and NVTX
#: range itself, `nsysan.passes.memory.linked_events`)
MEMORY_EVENTS = pl.Schema(
    {
        "trace_id": STR,
        "start_ns": I64,
        "global_pid": I64,
        "pid": OS_ID,
        "device_id": CUDA_ID,
        "bytes": I64,
        "mem_kind": CAT,  # device | pinned | managed | array | device_static | ... (snake_case)
        "op": MEMORY_OP,  # alloc | free
        "correlation_id": CUDA_ID,  # of the CUDA API call that made it
        "pool_address": I64,  # local memory pool, null outside a pool (or not exported)
        "pool_size_bytes": I64,  # bytes the pool reserves after the event
        "pool_utilized_bytes": I64,  # bytes of the pool handed out after the event
    }
)

CANONICAL: dict[str, pl.Schema] = {
    "gpu_ops": GPU_OPS,
    "cuda_api": CUDA_API,
    "nvtx": NVTX,
    "osrt": OSRT,
    "sync": SYNC,
    "overhead": OVERHEAD,
    "gpus": GPUS,
    "streams": STREAMS,
    "processes": PROCESSES,
    "threads": THREADS,
    "meta": META,
    "memory_events": MEMORY_EVENTS,
}
#: frames outside the capture-status contract: never listed as "not captured" (an export
#: without memory-usage events keeps its manifest and findings exactly as before)
OPTIONAL_FRAMES = ("memory_events",)


def empty(schema: pl.Schema) -> pl.DataFrame:
    """An empty frame with exactly ``schema``."""
    return pl.DataFrame(schema=schema)


# ---------------------------------------------------------------------------------------------
# Output tables of the core passes
# ---------------------------------------------------------------------------------------------
GAP_CAUSES = (
    "sync_api",  # host blocked in a synchronisation API (cudaDeviceSynchronize, event sync, ...)
    "sync_copy",  # synchronous or pageable memcpy/memset on the host
    "launch_bound",  # launch calls in flight: the host could not feed the GPU fast enough
    "osrt_wait",  # OS-runtime waits (poll, futex, read, ...) on the launching threads
    "nvtx_range",  # an application NVTX range on the launching threads (e.g. data loading)
    "profiler_overhead",  # profiler flush / overhead records
    "no_cuda_activity",  # nothing CUDA-related on the host: host-side work, Python, I/O
)

GAPS = pl.Schema(
    {
        "trace_id": STR,
        "scope": STR,  # device | stream | process_device
        "pid": I64,  # null for scope=device
        "device_id": I64,
        "stream_id": I64,  # null unless scope=stream
        "start_ns": I64,
        "end_ns": I64,
        "duration_ns": I64,
        "cause": STR,  # one of GAP_CAUSES: the one explaining the largest share
        "cause_frac": F64,  # share of the gap the main cause explains
        "cause_detail": STR,  # evidence: names of the APIs / ranges, how much each covers
        "sync_api_ns": I64,
        "sync_copy_ns": I64,
        "launch_ns": I64,
        "osrt_ns": I64,
        "nvtx_ns": I64,
        "overhead_ns": I64,
        "step": I64,  # step containing the gap start, when steps are known
    }
)

GAP_SUMMARY = pl.Schema(
    {
        "trace_id": STR,
        "scope": STR,
        "device_id": I64,
        "span_ns": I64,
        "busy_ns": I64,
        "idle_ns": I64,
        "idle_frac": F64,
        "n_gaps": I64,
        "gaps_ns": I64,  # total duration of gaps >= threshold
        "n_gaps_1_10ms": I64,
        "n_gaps_10_100ms": I64,
        "n_gaps_ge_100ms": I64,
        "recurs_with_steps": BOOL,  # null when steps are unknown
        "steps_with_gap_frac": F64,
    }
)

OVERLAP = pl.Schema(
    {
        "trace_id": STR,
        "device_id": I64,
        "step": I64,  # null for the whole trace
        "state": STR,  # "+"-joined sorted class names, or "idle"
        "duration_ns": I64,
    }
)

OVERLAP_SUMMARY = pl.Schema(
    {
        "trace_id": STR,
        "device_id": I64,
        "span_ns": I64,
        "busy_ns": I64,
        "idle_ns": I64,
        "compute_ns": I64,  # union of compute
        "nccl_ns": I64,  # union of nccl
        "nccl_only_ns": I64,  # state exactly "nccl"
        "exposed_nccl_ns": I64,  # nccl active, compute not
        "hidden_nccl_frac": F64,
        "h2d_ns": I64,
        "h2d_unoverlapped_ns": I64,  # h2d active, compute not
        "max_stream_concurrency": I64,
        "mean_stream_concurrency": F64,  # time-weighted over busy time
    }
)

ATTRIBUTION = pl.Schema(
    {
        "trace_id": STR,
        "range_id": I64,
        "pid": I64,
        "tid": I64,
        "domain": STR,
        "name": STR,
        "depth": I32,
        "parent_range_id": I64,
        "cpu_start_ns": I64,
        "cpu_end_ns": I64,
        "proj_start_ns": I64,
        "proj_end_ns": I64,
        "n_gpu_ops": I64,
        "gpu_busy_ns": I64,
        "exclusive_gpu_ns": I64,
    }
)

LAYERS = pl.Schema(
    {
        "trace_id": STR,
        "domain": STR,
        "name": STR,
        "instances": I64,
        "n_gpu_ops": I64,
        "gpu_busy_ns": I64,
        "exclusive_gpu_ns": I64,
        "exclusive_frac": F64,  # share of all GPU busy time
    }
)

KERNELS = pl.Schema(
    {
        "trace_id": STR,
        "demangled_name": STR,
        "short_name": STR,
        "op_class": STR,
        "count": I64,
        "total_ns": I64,
        "mean_ns": F64,
        "median_ns": F64,
        "min_ns": I64,
        "max_ns": I64,
        "gpu_time_frac": F64,
        "tensor_core": BOOL,  # null when the name taxonomy does not know
        "tensor_core_rule": STR,  # which taxonomy rule matched
        "api_mean_ns": F64,  # mean duration of the launching API call
        "queue_mean_ns": F64,  # mean delay launch-call start -> kernel start
        "queue_max_ns": I64,
    }
)

STEPS = pl.Schema(
    {
        "trace_id": STR,
        "step": I64,
        "start_ns": I64,
        "end_ns": I64,
        "duration_ns": I64,
        "source": STR,  # nvtx:<range name pattern> | periodicity
        "warmup": BOOL,
        "gpu_busy_frac": F64,
        "idle_ns": I64,
        "exposed_nccl_ns": I64,
        "h2d_unoverlapped_ns": I64,
    }
)

OUTPUTS: dict[str, pl.Schema] = {
    "gaps": GAPS,
    "gap_summary": GAP_SUMMARY,
    "overlap": OVERLAP,
    "overlap_summary": OVERLAP_SUMMARY,
    "attribution": ATTRIBUTION,
    "layers": LAYERS,
    "kernels": KERNELS,
    "steps": STEPS,
}

# ---------------------------------------------------------------------------------------------
# Communication: the nccl pass and multi-rank jobs (`schemas_comm`, imported above)
# ---------------------------------------------------------------------------------------------
OUTPUTS.update({"nccl": NCCL, "nccl_summary": NCCL_SUMMARY})
#: tables written by multi-rank job analysis (not a pass: `nsysan.multirank.analyze_job`)
JOB_OUTPUTS: dict[str, pl.Schema] = {"ranks": RANKS, "collectives": COLLECTIVES}
