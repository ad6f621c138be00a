"""Schemas of communication: the nccl pass and multi-rank jobs (`nsysan.passes.nccl`,
`nsysan.multirank`). Same conventions as `nsysan.frames.schemas`, which re-exports them."""

from __future__ import annotations

import polars as pl

I64 = pl.Int64
F64 = pl.Float64
STR = pl.String

NCCL_OPS = (
    "AllReduce",
    "AllGather",
    "ReduceScatter",
    "Broadcast",
    "Reduce",
    "SendRecv",
    "Send",
    "Recv",
    "AllToAll",
    "Gather",
    "Scatter",
    "Generic",  # ncclDevKernel_Generic_*: the kernel name does not say, and no NVTX range did
)

NCCL = pl.Schema(
    {
        "trace_id": STR,
        "pid": I64,
        "global_pid": I64,
        "device_id": I64,
        "stream_id": I64,
        "correlation_id": I64,
        "seq": I64,  # 0-based occurrence of this op on its (pid, device, stream)
        "op": STR,  # one of NCCL_OPS
        "op_source": STR,  # nvtx (NCCL's API ranges named it) | kernel (the kernel name did)
        "kernel_name": STR,
        "algorithm": STR,  # RING | TREE | COLLNET_DIRECT | NVLS | ... (when the name says)
        "protocol": STR,  # LL | LL128 | SIMPLE
        "redop": STR,  # Sum | Prod | Min | Max | ...
        "dtype": STR,  # as the kernel name spells it (float, f32, bf16, ...)
        "start_ns": I64,
        "end_ns": I64,
        "duration_ns": I64,
        "bytes": I64,  # NCCL's "Message size [bytes]" (summed over a group); null when unknown
        "n_ranks": I64,  # ranks of the communicator, when known
        "algbw_gbps": F64,  # nccl-tests algorithm bandwidth, GB/s (= bytes per ns)
        "busbw_gbps": F64,  # nccl-tests bus bandwidth, GB/s
        "exposed_ns": I64,  # part of [start, end) not covered by compute on the device
        "nvtx_range": STR,  # NCCL API range(s) that issued it, "+"-joined (ncclSend+ncclRecv)
        "api_name": STR,  # CUDA API call that launched the kernel
        "api_start_ns": I64,
        "comm_id": STR,  # NCCL communicator id from the payload, when exported
        "step": I64,  # step containing the op start, when steps are known
    }
)

NCCL_SUMMARY = pl.Schema(
    {
        "trace_id": STR,
        "op": STR,
        "size_bucket": STR,  # e.g. "64KiB-1MiB", or "unknown" when bytes are not exported
        "bucket_min_bytes": I64,
        "n_ops": I64,
        "total_ns": I64,
        "mean_ns": F64,
        "median_ns": F64,
        "max_ns": I64,
        "exposed_ns": I64,
        "exposed_frac": F64,  # exposed_ns / total_ns
        "total_bytes": I64,
        "algbw_gbps": F64,  # median over the bucket's ops
        "busbw_gbps": F64,  # median over the bucket's ops
    }
)

RANKS = pl.Schema(
    {
        "trace_id": STR,  # the job id
        "rank": I64,
        "source_trace_id": STR,  # the profile this rank was read from
        "pid": I64,
        "device_id": I64,  # the device it used most
        "rank_source": STR,  # explicit | env:<VAR> | thread_name | nccl_payload | file_name | ...
        "hostname": STR,
        "clock_offset_ns": I64,  # added to the profile's times to put them on the job timeline
        "clock_refine_ns": I64,  # the part of it estimated from collective end times
        "first_activity_ns": I64,  # job timeline: 0 = earliest session start of the job
        "first_kernel_ns": I64,  # time to first kernel
        "first_collective_ns": I64,  # time to first collective (NCCL kernel or MPI range)
        "n_steps": I64,
        "step_time_ns": F64,  # median step duration
        "span_ns": I64,  # first GPU op start -> last GPU op end
        "busy_ns": I64,
        "busy_frac": F64,
        "comm_ns": I64,  # union of NCCL kernels
        "exposed_comm_ns": I64,  # NCCL active, compute not
        "exposed_comm_frac": F64,  # exposed_comm_ns / span_ns
        "exposed_comm_per_step_ns": F64,
        "host_comm_ns": I64,  # union of MPI / NCCL API NVTX ranges on the host
        "n_collectives": I64,  # matched collective instances this rank took part in
        "n_last": I64,  # ... in which it arrived last (skew above the threshold)
        "wait_ns": I64,  # total time it waited for later ranks
        "wait_imposed_ns": I64,  # total time others waited for it when it arrived last
    }
)

COLLECTIVES = pl.Schema(
    {
        "trace_id": STR,  # the job id
        "instance": I64,  # matched instance, 0-based in time order
        "kind": STR,  # nccl (GPU kernel) | mpi (NVTX range)
        "key": STR,  # what was matched: op and stream ordinal, or the range name
        "name": STR,  # op (AllReduce, ...) or range name (MPI_Allreduce)
        "seq": I64,  # occurrence index of the key on the reference rank
        "rank": I64,
        "arrival_ns": I64,  # job timeline, after clock alignment
        "end_ns": I64,
        "duration_ns": I64,
        "lag_ns": I64,  # arrival - first arrival of the instance
        "wait_ns": I64,  # last arrival - arrival: how long this rank waited for the last
        "skew_ns": I64,  # last arrival - first arrival (same on every row of the instance)
        "end_spread_ns": I64,  # last end - first end: the alignment residual of the instance
        "last_rank": I64,
        "wait_imposed_ns": I64,  # sum of wait_ns over the instance's ranks
    }
)
