"""Synthetic traces with planted host evidence (context switches and CPU samples), one per
host finding. Each returns the path of the written export and what was planted.

- `cpu_bound_input`: the launching thread prepares every batch on the CPU (DALI, JPEG
  decoding, Python) for 20 ms while the GPU idles; then launches a 5 ms kernel
  (HOST_CPU_BOUND).
- `gpu_bound_driver_wait`: kernels run back to back; the launching thread waits for them in
  ``cudaStreamSynchronize``, spinning in ``libcuda`` and polling ``clock_gettime`` in
  ``[vdso]`` (HOST_WAITS_ON_GPU).
- `descheduled_launcher`: the launching thread is runnable but off-CPU for 8 ms before every
  launch (no blocking call), while four busy worker threads hold the CPUs (CPU_CONTENTION).
- `oversubscribed_loader`: the launching thread sleeps (switched out in the interruptible
  state) while six data-loading threads share two CPUs, preempted in turn (switched out
  still running), and the GPU waits for the batch (CPU_CONTENTION: more runnable threads
  than CPUs; the export records thread states at switches).
- `descheduled_comm_thread`: the launching thread waits in a futex for a host-side
  collective whose communication thread (samples in ``libnccl``) is runnable but off-CPU
  for 7 of every 10 ms, without blocking, while the GPU idles (CPU_CONTENTION).

A sample is planted every `PERIOD_NS` of on-CPU time of a thread.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nsysan.testing import kernels as K
from nsysan.testing.synth import TraceBuilder

MS = 1_000_000
US = 1_000
PERIOD_NS = 1 * MS
PID = 4242
LIBCUDA = "/usr/lib/x86_64-linux-gnu/libcuda.so.535.86.10"
LIBC = "/usr/lib/x86_64-linux-gnu/libc.so.6"
PYTHON = "/usr/bin/python3.10"
DALI = "/opt/conda/lib/python3.10/site-packages/nvidia/dali/libdali_operators.so"
JPEG = "/usr/lib/x86_64-linux-gnu/libjpeg.so.8"
TORCH = "/opt/conda/lib/python3.10/site-packages/torch/lib/libtorch_cpu.so"


def _start() -> tuple[TraceBuilder, int]:
    b = TraceBuilder()
    gtid = b.add_process(PID, "python", main_thread="python")
    b.add_gpu(0)
    return b, gtid


def _samples(b: TraceBuilder, gtid: int, start: int, end: int,
             stacks: list[list[tuple[str, str]]], cpu: int = 0) -> int:
    """One sample every PERIOD_NS in [start, end), cycling through ``stacks``."""
    n = 0
    t = start + PERIOD_NS // 2
    while t < end:
        b.add_sample(gtid, t, stacks[n % len(stacks)], cpu=cpu)
        t += PERIOD_NS
        n += 1
    return n


def cpu_bound_input(path: str | Path, iterations: int = 12) -> tuple[Path, dict[str, Any]]:
    b, gtid = _start()
    stacks = [
        [("dali::JpegDecode", DALI)], [("dali::Resize", DALI)],
        [("jpeg_idct_islow", JPEG)], [("_PyEval_EvalFrameDefault", PYTHON)],
        [("memcpy", LIBC), ("dali::Copy", DALI)],  # OS leaf under DALI: data pipeline
    ]
    t = 1 * MS
    idle = 0
    for i in range(iterations):
        prep_end = t + 20 * MS
        b.add_on_cpu(gtid, t, prep_end + 100 * US, cpu=i % 2)
        _samples(b, gtid, t, prep_end, stacks, cpu=i % 2)
        b.add_kernel(gtid, prep_end + 50 * US, prep_end + 5 * MS, K.SGEMM,
                     api_start=prep_end, api_ns=20 * US)
        if i:
            idle += 15 * MS + 200 * US  # next kernel start - this kernel end
        t = prep_end + 150 * US
    return b.write(Path(path)), {"finding": "HOST_CPU_BOUND", "gap_idle_ns": idle}


def gpu_bound_driver_wait(path: str | Path, iterations: int = 40
                          ) -> tuple[Path, dict[str, Any]]:
    b, gtid = _start()
    stacks = [[("cuEventSynchronize", LIBCUDA)]] * 4 + [
        [("clock_gettime", "[vdso]"), ("cuStreamSynchronize", LIBCUDA)]]
    t = 1 * MS
    gpu = 1 * MS + 100 * US
    for _ in range(iterations):
        launch = t
        for _ in range(3):
            b.add_kernel(gtid, gpu, gpu + 10 * MS, K.XMMA_GEMM, api_start=launch, api_ns=10 * US)
            launch += 20 * US
            gpu += 10 * MS + 5 * US
        sync_end = gpu - 5 * US + 10 * US
        b.add_sync(gtid, launch, sync_end)
        b.add_on_cpu(gtid, t, sync_end + 20 * US)
        # launches in Python, then the driver spin-waits in the synchronize call
        b.add_sample(gtid, t + 10 * US, [("_PyEval_EvalFrameDefault", PYTHON)])
        _samples(b, gtid, launch, sync_end, stacks)
        t = sync_end + 30 * US
        gpu = max(gpu, t + 60 * US)
    return b.write(Path(path)), {"finding": "HOST_WAITS_ON_GPU"}


def descheduled_launcher(path: str | Path, iterations: int = 12
                         ) -> tuple[Path, dict[str, Any]]:
    b, gtid = _start()
    workers = [b.add_thread(PID, PID + 10 + k, f"worker{k}") for k in range(4)]
    t = 1 * MS
    for _ in range(iterations):
        # launch a 4 ms kernel, briefly on-CPU; then descheduled for 8 ms while runnable
        b.add_on_cpu(gtid, t, t + 300 * US, cpu=0)
        b.add_sample(gtid, t + 100 * US, [("_PyEval_EvalFrameDefault", PYTHON)])
        b.add_kernel(gtid, t + 250 * US, t + 4 * MS, K.SGEMM, api_start=t + 200 * US,
                     api_ns=20 * US)
        off_end = t + 300 * US + 8 * MS
        for k, w in enumerate(workers):
            b.add_on_cpu(w, t + 300 * US, off_end, cpu=k % 2)
            _samples(b, w, t + 300 * US, off_end, [[("at::native::add_kernel", TORCH)]],
                     cpu=k % 2)
        t = off_end
    # OS-runtime tracing was on: one short traced call, so "not covered by a blocking call"
    # is evidence here
    b.add_osrt(workers[0], 100 * US, 200 * US, "poll")
    return b.write(Path(path)), {"finding": "CPU_CONTENTION"}


#: nsys' thread states at a switch-out (ENUM_SAMPLING_THREAD_STATE)
RUNNING, INTERRUPTIBLE = 1, 2
NCCL = "/usr/lib/x86_64-linux-gnu/libnccl.so.2.18.3"


def oversubscribed_loader(path: str | Path, iterations: int = 12, loaders: int = 6,
                          cpus: int = 2) -> tuple[Path, dict[str, Any]]:
    b, gtid = _start()
    workers = [b.add_thread(PID, PID + 20 + k, f"loader{k}") for k in range(loaders)]
    slot = 1 * MS
    t = 1 * MS
    for _ in range(iterations):
        # launch a 3 ms kernel, then sleep (waiting for the next batch) for 12 ms
        b.add_on_cpu(gtid, t, t + 200 * US, cpu=0, out_state=INTERRUPTIBLE)
        b.add_sample(gtid, t + 100 * US, [("_PyEval_EvalFrameDefault", PYTHON)], cpu=0)
        b.add_kernel(gtid, t + 150 * US, t + 3 * MS, K.SGEMM, api_start=t + 100 * US,
                     api_ns=20 * US)
        load = t + 200 * US
        # every slot, `cpus` of the loaders run and are preempted at its end: all of them
        # stay runnable, more than the CPUs
        for k in range(12):
            for cpu in range(cpus):
                w = workers[(cpus * k + cpu) % loaders]
                s0 = load + k * slot
                b.add_on_cpu(w, s0, s0 + slot, cpu=cpu, out_state=RUNNING)
                _samples(b, w, s0, s0 + slot, [[("dali::JpegDecode", DALI)],
                                               [("jpeg_idct_islow", JPEG)]], cpu=cpu)
        t = load + 12 * slot
    return b.write(Path(path)), {"finding": "CPU_CONTENTION", "cpus": cpus}


def descheduled_comm_thread(path: str | Path, iterations: int = 12
                            ) -> tuple[Path, dict[str, Any]]:
    b, gtid = _start()
    comm = b.add_thread(PID, PID + 30, "gloo-comm")
    t = 1 * MS
    for _ in range(iterations):
        # launch a 4 ms kernel; then wait 10 ms in a futex for the host-side collective
        b.add_on_cpu(gtid, t, t + 300 * US, cpu=0)
        b.add_sample(gtid, t + 100 * US, [("_PyEval_EvalFrameDefault", PYTHON)], cpu=0)
        b.add_kernel(gtid, t + 250 * US, t + 4 * MS, K.SGEMM, api_start=t + 200 * US,
                     api_ns=20 * US)
        wait0, wait1 = t + 300 * US, t + 300 * US + 10 * MS
        b.add_osrt(gtid, wait0, wait1, "pthread_cond_wait")
        # the communication thread runs 3 ms of the 10 and waits for a CPU the rest
        b.add_on_cpu(comm, wait1 - 3 * MS, wait1, cpu=1)
        _samples(b, comm, wait1 - 3 * MS, wait1, [[("ncclProxyProgress", NCCL)]], cpu=1)
        t = wait1
    return b.write(Path(path)), {"finding": "CPU_CONTENTION"}


SCENARIOS = {
    "cpu_bound_input": cpu_bound_input,
    "gpu_bound_driver_wait": gpu_bound_driver_wait,
    "descheduled_launcher": descheduled_launcher,
    "oversubscribed_loader": oversubscribed_loader,
    "descheduled_comm_thread": descheduled_comm_thread,
}
