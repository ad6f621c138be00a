"""Memory scenarios: CUDA memory-usage events with planted in-use curves.

Every case is one process on one A100-80GB (``TARGET_INFO_GPU.totalMemory`` =
`DEVICE_TOTAL`) running ``steps`` NVTX steps of `STEP_NS` (a ``forward`` and a ``backward``
range, one kernel each), after a warm-up that allocates the weights with cudaMalloc:

- ``sawtooth``: each step cudaMalloc's `ACT_BYTES` of activations in ``forward`` and
  cudaFree's them in ``backward``: the level returns to the weights every step (allocation
  churn, no growth);
- ``leak``: each step cudaMallocAsync's ``leak_bytes`` that are never freed (the pool grows
  with its use: no slack);
- ``pool``: each step cudaMallocAsync's `ACT_BYTES` and cudaFreeAsync's them, but the pool
  reserves `ACT_BYTES` more every step while using at most `ACT_BYTES` of it (a
  fragmented pool that keeps growing with room to spare);
- ``near_oom``: the weights take 99% of the device memory less `ACT_BYTES`, and each step
  adds and frees `ACT_BYTES` with cudaMallocAsync (no pool reports): the peak lies 1% below
  the device memory.
"""

from __future__ import annotations

from pathlib import Path

from nsysan.errors import ConfigError
from nsysan.testing import kernels as K
from nsysan.testing._rows import _GPU_FACTS
from nsysan.testing.synth import TraceBuilder

MIB = 1 << 20
DEVICE_TOTAL: int = int(_GPU_FACTS["totalMemory"])  # type: ignore[arg-type]
STEP_NS = 10_000_000
ACT_BYTES = 512 * MIB
WEIGHTS_BYTES = 2048 * MIB
CASES = ("sawtooth", "leak", "pool", "near_oom")
PID = 4242
POOL_ADDRESS = 0x7F00_0000_0000


def memory_case(path: str | Path, case: str, layout: str = "2022.4", *, steps: int = 8,
                leak_bytes: int = 16 * MIB, pool_columns: bool = True,
                lazy: bool = True) -> Path:
    """Write the ``case`` trace (see the module docstring) at ``path``."""
    if case not in CASES:
        raise ConfigError(f"unknown memory case {case!r}; known: {', '.join(CASES)}")
    b = TraceBuilder(memory_pool_columns=pool_columns)
    gtid = b.add_process(PID, "python", main_thread="python")
    b.add_gpu(0)
    t = 1_000_000
    weights = (int(DEVICE_TOTAL * 0.99) - ACT_BYTES if case == "near_oom" else WEIGHTS_BYTES)
    b.add_nvtx_range(gtid, t, t + 400_000, "init")
    call = b.add_api(gtid, t + 100_000, t + 300_000, "cudaMalloc_v3020")
    b.add_memory_event(PID, t + 250_000, weights, "alloc", address=0x1_0000_0000, api=call)
    t += 2_000_000
    pool_size = pool_used = 0
    for i in range(steps):
        s = t + i * STEP_NS
        b.add_nvtx_range(gtid, s, s + STEP_NS - 100_000, f"step {i}")
        b.add_nvtx_range(gtid, s + 100_000, s + 4_000_000, "forward")
        b.add_kernel(gtid, s + 1_000_000, s + 3_500_000, K.SGEMM, api_start=s + 900_000)
        b.add_nvtx_range(gtid, s + 5_000_000, s + 9_000_000, "backward")
        b.add_kernel(gtid, s + 6_000_000, s + 8_500_000, K.SGEMM, api_start=s + 5_900_000)
        addr = 0x2_0000_0000 + i * 0x1000_0000
        if case == "sawtooth":
            a = b.add_api(gtid, s + 1_200_000, s + 1_260_000, "cudaMalloc_v3020")
            b.add_memory_event(PID, s + 1_240_000, ACT_BYTES, "alloc", address=addr, api=a,
                               name="activations")
            f = b.add_api(gtid, s + 6_200_000, s + 6_300_000, "cudaFree_v3020")
            b.add_memory_event(PID, s + 6_250_000, ACT_BYTES, "free", address=addr, api=f)
        elif case == "leak":
            a = b.add_api(gtid, s + 1_200_000, s + 1_220_000, "cudaMallocAsync_v11020")
            pool_size += leak_bytes
            pool_used += leak_bytes
            b.add_memory_event(PID, s + 1_210_000, leak_bytes, "alloc", address=addr, api=a,
                               pool=(POOL_ADDRESS, pool_size, pool_used))
        elif case == "pool":
            a = b.add_api(gtid, s + 1_200_000, s + 1_220_000, "cudaMallocAsync_v11020")
            pool_size += ACT_BYTES
            b.add_memory_event(PID, s + 1_210_000, ACT_BYTES, "alloc", address=addr, api=a,
                               pool=(POOL_ADDRESS, pool_size, ACT_BYTES))
            f = b.add_api(gtid, s + 6_200_000, s + 6_220_000, "cudaFreeAsync_v11020")
            b.add_memory_event(PID, s + 6_210_000, ACT_BYTES, "free", address=addr, api=f,
                               pool=(POOL_ADDRESS, pool_size, 0))
        else:  # near_oom
            a = b.add_api(gtid, s + 1_200_000, s + 1_220_000, "cudaMallocAsync_v11020")
            b.add_memory_event(PID, s + 1_210_000, ACT_BYTES, "alloc", address=addr, api=a)
            f = b.add_api(gtid, s + 6_200_000, s + 6_220_000, "cudaFreeAsync_v11020")
            b.add_memory_event(PID, s + 6_210_000, ACT_BYTES, "free", address=addr, api=f)
    return b.write(path, layout, lazy=lazy)
