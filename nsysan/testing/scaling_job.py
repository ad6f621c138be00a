"""Synthetic data-parallel jobs at two scales, with planted truth: the issue-22 case.

A job of ``n_gpus`` ranks, ``gpus_per_node`` per node, one profile per node (``node<k>.sqlite``,
one process per GPU, as ``nsys profile`` of a per-node launcher records it). Every rank runs
the same step (weak scaling: constant work per GPU), all times in ns on one job clock:

- a ``train_step`` NVTX range around the step; ``forward`` (one kernel of ``forward_ns``) and
  ``backward`` (two kernels of ``backward_ns / 2``) ranges launch the compute kernels on
  stream 7, back to back;
- the contended rank (``contended_rank``; its NCCL and compute threads fight for cores) has a
  ``contention_ns`` hole between its two backward kernels, so it arrives late;
- an ``ncclAllReduce`` range (domain ``NCCL``) launches the AllReduce on stream 20; the kernel
  starts when the rank's compute ends (its arrival) and ends ``comm_ns`` after the last
  arrival: the end-of-step exposed AllReduce;
- the next step's first kernel starts ``host_gap_ns`` after the AllReduce ended.

Each rank's communicator-init range (``ncclCommInitRank``) carries NCCL's payload (communicator
id, ``No. of ranks``, ``Rank``, ``CUDA device``) and every ``ncclAllReduce`` its message size
``message_bytes``, written in the ``json`` (mid-2024 ``jsonText``) or ``binary`` (2025+
``binaryData`` + payload schemas) layout (`nsysan.testing.payloads`), or not at all
(``payload_layout=None``: sizes unknown, as 2022.4 exports are). ``layout`` is the builder's
table layout (2022.4 or 2023.4).

`truth` holds what was planted: per rank and step the step duration, the end-of-step gap (from
the last compute kernel's end to the step's end), the per-state times, and the planted bus
bandwidth of the AllReduce transfer (``message_bytes`` over ``comm_ns``, nccl-tests factor).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from nsysan.testing._model import KernelName
from nsysan.testing.payloads import Payload, add_payloads
from nsysan.testing.synth import TraceBuilder

FORWARD = KernelName("void fwd_gemm<float>(float const*, float*)", "fwd_gemm")
BACKWARD = KernelName("void bwd_gemm<float>(float const*, float*)", "bwd_gemm")
ALLREDUCE = KernelName(
    "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
    "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
)
COMM_ID = 0x5EED_0000_0000_0022


@dataclass(frozen=True)
class ScalingJob:
    """What to plant (ns, bytes)."""

    n_gpus: int = 8
    gpus_per_node: int = 8
    n_steps: int = 8
    forward_ns: int = 60_000_000
    backward_ns: int = 100_000_000
    comm_ns: int = 20_000_000  # AllReduce transfer, after the last arrival
    contended_rank: int | None = None
    contention_ns: int = 0
    host_gap_ns: int = 100_000
    message_bytes: int = 1 << 29  # AllReduce message size (gradient bucket)
    gpu_name: str = "NVIDIA A100-SXM4-80GB"
    layout: str = "2022.4"
    payload_layout: str | None = "json"
    prefix: str = "node"
    step_name: str | None = "train_step"  # None: no step ranges (nor periodicity: 1 step)
    compute_kernel: KernelName = BACKWARD  # the backward kernels (a workload's signature)


@dataclass
class ScalingTruth:
    job: ScalingJob
    paths: list[Path] = field(default_factory=list)
    #: (rank, step) -> {duration_ns, end_gap_ns, compute, communication, idle}
    steps: dict[tuple[int, int], dict[str, int]] = field(default_factory=dict)

    @property
    def busbw_factor(self) -> float:
        n = self.job.n_gpus
        return 2 * (n - 1) / n

    @property
    def busbw_gbps(self) -> float:
        """The planted bus bandwidth: message size over the transfer time, nccl-tests."""
        return self.job.message_bytes / self.job.comm_ns * self.busbw_factor

    def mean(self, key: str, rank: int | None = None) -> float:
        vals = [v[key] for (r, _), v in self.steps.items() if rank is None or r == rank]
        return sum(vals) / len(vals)


def write_scaling_job(directory: str | Path, job: ScalingJob) -> ScalingTruth:
    """Write ``job``'s profiles into ``directory``; returns the planted truth."""
    out = Path(directory)
    truth = ScalingTruth(job)
    n_nodes = -(-job.n_gpus // job.gpus_per_node)
    nodes: list[tuple[TraceBuilder, list[int]]] = []
    for k in range(n_nodes):
        b = TraceBuilder(hostname=f"node{k:02d}", command=("python", "train.py"))
        gtids = []
        for local in range(min(job.gpus_per_node, job.n_gpus - k * job.gpus_per_node)):
            gtids.append(b.add_process(10_000 + 100 * local, "python"))
            b.add_gpu(local, job.gpu_name)
        nodes.append((b, gtids))
    payloads: list[list[Payload]] = [[] for _ in nodes]

    def where(rank: int) -> tuple[TraceBuilder, int, int, list[Payload]]:
        k, local = divmod(rank, job.gpus_per_node)
        return nodes[k][0], nodes[k][1][local], local, payloads[k]

    for rank in range(job.n_gpus):
        b, g, local, pay = where(rank)
        start = 1_000_000 + 1_000 * local
        b.add_nvtx_range(g, start, start + 500_000, "ncclCommInitRank", domain="NCCL")
        pay.append(Payload(start, g, "ncclCommInitRank", "comm_init", {
            "NCCL communicator ID": COMM_ID, "No. of ranks": job.n_gpus, "Rank": rank,
            "CUDA device": local}))

    t = 10_000_000  # the first step's first kernel
    half = job.backward_ns // 2
    # The loop is over steps and ranks of a small synthetic job: test-data generation.
    for i in range(job.n_steps):
        arrivals = []
        for rank in range(job.n_gpus):
            hole = job.contention_ns if rank == job.contended_rank else 0
            arrivals.append(t + job.forward_ns + 2 * half + hole)
        comm_end = max(arrivals) + job.comm_ns
        next_t = comm_end + job.host_gap_ns
        last = i == job.n_steps - 1
        for rank in range(job.n_gpus):
            b, g, local, pay = where(rank)
            hole = job.contention_ns if rank == job.contended_rank else 0
            host = t - 400_000  # the CPU runs ahead of the GPU by 0.4 ms
            if job.step_name is not None:
                b.add_nvtx_range(g, host, host + 300_000, job.step_name)
            b.add_nvtx_range(g, host + 10_000, host + 60_000, "forward")
            b.add_kernel(g, t, t + job.forward_ns, FORWARD, device_id=local, stream_id=7,
                         api_start=host + 20_000)
            b.add_nvtx_range(g, host + 70_000, host + 150_000, "backward")
            b1 = t + job.forward_ns
            b.add_kernel(g, b1, b1 + half, job.compute_kernel, device_id=local, stream_id=7,
                         api_start=host + 80_000)
            b.add_kernel(g, b1 + half + hole, b1 + 2 * half + hole, job.compute_kernel,
                         device_id=local, stream_id=7, api_start=host + 100_000)
            b.add_nvtx_range(g, host + 200_000, host + 260_000, "ncclAllReduce",
                             domain="NCCL")
            pay.append(Payload(host + 200_000, g, "ncclAllReduce", "all_reduce", {
                "NCCL communicator ID": COMM_ID, "Message size [bytes]": job.message_bytes}))
            b.add_kernel(g, arrivals[rank], comm_end, ALLREDUCE, device_id=local,
                         stream_id=20, api_start=host + 210_000)
            end = comm_end if last else next_t
            truth.steps[(rank, i)] = {
                "duration_ns": end - t,
                "end_gap_ns": end - arrivals[rank],
                "compute": job.forward_ns + 2 * half,
                "communication": comm_end - arrivals[rank],
                "idle": hole + (end - comm_end),
            }
        t = next_t
    for k, (b, _) in enumerate(nodes):
        path = b.write(out / f"{job.prefix}{k:02d}.sqlite", job.layout)
        if job.payload_layout is not None:
            add_payloads(path, payloads[k], job.payload_layout)
        truth.paths.append(path)
    return truth


def eval_node_trace(path: str | Path, *, n_gpus: int = 4, n_steps: int = 6,
                    comm_ns: int = 20_000_000, message_bytes: int = 1 << 29,
                    payload_layout: str = "json") -> Path:
    """One node of a job (every rank a process of one profile) written at ``path``: the
    eval-corpus builder (``builder = "nsysan.testing.scaling_job:eval_node_trace"``). With no
    waiting, every AllReduce's bus bandwidth is ``message_bytes / comm_ns x 2(n-1)/n``."""
    path = Path(path)
    job = ScalingJob(n_gpus=n_gpus, gpus_per_node=n_gpus, n_steps=n_steps, comm_ns=comm_ns,
                     message_bytes=message_bytes, payload_layout=payload_layout,
                     layout="2023.4" if payload_layout == "binary" else "2022.4",
                     prefix=path.stem + "_node")
    written = write_scaling_job(path.parent, job).paths[0]
    return written.replace(path)
