"""Small traces of the evaluation corpus (tests/eval/labels): the cases of issue 19 that used to
draw false alarms, and healthy negatives. Each builder is ``fn(path, **kw) -> path``, writes
an nsys-schema SQLite export in well under a second, and is deterministic.

What each trace holds is planted by construction (named in its docstring), so its labels
follow from the construction, not from nsysan's output.
"""

from __future__ import annotations

import random
from pathlib import Path

from nsysan.testing import kernels as K
from nsysan.testing._common import MS, US, flush, start
from nsysan.testing._model import KernelName

#: Names of a transformer-like layer block and of what runs once per iteration.
_LAYER = [K.XMMA_GEMM, K.ADD, K.SGEMM, K.FILL]
_ONCE = [KernelName(n, n, n) for n in ("embedding_fwd_kernel", "cross_entropy_loss_kernel",
                                       "multi_tensor_apply_kernel_adam")]


def tiny_first_launch(path: str | Path, *, layout: str = "2022.4") -> Path:
    """One 4 MiB upload, then two kernels; the first ``cudaLaunchKernel`` takes 17 ms (module
    loading under CUDA lazy loading), and one ``cudaHostAlloc`` of 3.57 ms comes before it:
    a smoke test with nothing to judge, no steps, no repetition."""
    b, g = start()
    b.add_memcpy(g, 5 * MS, 5 * MS + 400 * US, nbytes=4 << 20, api_start=5 * MS - 20 * US)
    t = 11 * MS
    b.add_api(g, t, t + 3_570 * US, "cudaHostAlloc_v3020")
    t += 4 * MS
    b.add_kernel(g, t + 17 * MS + 10 * US, t + 17 * MS + 60 * US, K.ADD, api_start=t,
                 api_ns=17 * MS)
    t += 17 * MS + 100 * US
    b.add_kernel(g, t + 20 * US, t + 70 * US, K.FILL, api_start=t, api_ns=6 * US)
    flush(b, g, t + 100 * US)
    return b.write(Path(path), layout)


def microbench(path: str | Path, *, layout: str = "2022.4", kernels: int = 3) -> Path:
    """A microbenchmark: ``kernels`` kernels of 200 us, each launched after a host sync
    (benchmark timing loop), the first after a 12 ms lazy-loading launch."""
    b, g = start()
    t = 5 * MS
    names = [K.SGEMM, K.XMMA_GEMM, K.ADD]
    for i in range(kernels):
        api_ns = 12 * MS if i == 0 else 5 * US
        k0 = t + api_ns + 5 * US
        b.add_kernel(g, k0, k0 + 200 * US, names[i % len(names)], api_start=t, api_ns=api_ns)
        b.add_sync(g, t + api_ns + 1 * US, k0 + 205 * US, kind="context")
        t = k0 + 300 * US
    flush(b, g, t)
    return b.write(Path(path), layout)


def identical_kernels(path: str | Path, *, layout: str = "2022.4", n: int = 400) -> Path:
    """``n`` identical 1 ms kernels back to back, queued ahead (no idle, no structure): a
    steady compute-bound stream that has no step structure."""
    b, g = start()
    t0 = 5 * MS
    for i in range(n):
        s = t0 + i * (1 * MS + 2 * US)
        b.add_kernel(g, s, s + 1 * MS, K.ADD, api_start=t0 - 1 * MS + i * 8 * US, api_ns=5 * US)
    flush(b, g, t0 + n * (1 * MS + 2 * US))
    return b.write(Path(path), layout)


def nested_layers(path: str | Path, *, layout: str = "2022.4", iterations: int = 2,
                  layers: int = 12) -> Path:
    """A window of a transformer run: ``iterations`` iterations, each the embedding kernel,
    ``layers`` identical layer blocks of 4 kernels (forward), the loss, the same blocks
    again (backward), then the optimizer; kernels queued ahead (compute-bound). The
    iteration is the period; the layer block repeats inside it."""
    b, g = start()
    t = 5 * MS
    launch = t - 2 * MS
    rng = random.Random(0)

    def k(name: KernelName, d: int) -> None:
        nonlocal t, launch
        d = int(d * (1 + rng.uniform(-0.02, 0.02)))
        b.add_kernel(g, t, t + d, name, api_start=launch, api_ns=5 * US)
        launch += 7 * US
        t += d + 3 * US

    for _ in range(iterations):
        k(_ONCE[0], 200 * US)
        for _ in range(layers):
            for kn in _LAYER:
                k(kn, 300 * US)
        k(_ONCE[1], 150 * US)
        for _ in range(layers):
            for kn in reversed(_LAYER):
                k(kn, 400 * US)
        k(_ONCE[2], 900 * US)
    flush(b, g, t)
    return b.write(Path(path), layout)


def compute_steady(path: str | Path, *, layout: str = "2022.4", steps: int = 30) -> Path:
    """A steady compute-bound loop without NVTX: per step 20 kernels of ~0.5 ms queued ahead,
    then one 100 us dispatch gap before the next step (host Python; ~1% of device time)."""
    b, g = start()
    rng = random.Random(1)
    # one iteration: a fixed, non-repeating order of 20 kernels
    order = [K.XMMA_GEMM, K.ADD, K.XMMA_GEMM, K.FILL, K.ADD, K.ADD, K.XMMA_GEMM, K.FILL,
             K.FILL, K.XMMA_GEMM, K.ADD, K.FILL, K.XMMA_GEMM, K.XMMA_GEMM, K.ADD, K.FILL,
             K.ADD, K.XMMA_GEMM, K.FILL, _ONCE[2]]
    t = 5 * MS
    for _ in range(steps):
        launch = t - 1 * MS
        for kn in order:
            d = int(500 * US * (1 + rng.uniform(-0.03, 0.03)))
            b.add_kernel(g, t, t + d, kn, api_start=launch, api_ns=5 * US)
            launch += 10 * US
            t += d + 2 * US
        t += 100 * US  # the host's per-step dispatch: the next step's first launch is late
    flush(b, g, t)
    return b.write(Path(path), layout)


def starved_below_verdict(path: str | Path, *, layout: str = "2022.4", steps: int = 20,
                          share: float = 0.196) -> Path:
    """Steps of 10 ms of queued compute, each preceded by a data-loading stall (NVTX
    ``DataLoader.__next__`` with a ``poll`` on the main thread) sized so that the stalls
    are ``share`` of device time: a starvation warning just under the old 20% verdict bar."""
    b, g = start()
    stall = int(10 * MS * share / (1 - share))
    t = 5 * MS
    for i in range(steps):
        if i:  # the first step starts the GPU span: no stall before it
            b.add_nvtx_range(g, t, t + stall, "DataLoader.__next__")
            b.add_osrt(g, t + 10 * US, t + stall - 10 * US, "poll")
            t += stall
        st = t
        launch = t - 500 * US if i == 0 else t - 40 * US
        for j in range(10):
            b.add_kernel(g, t, t + 1 * MS - 2 * US, _LAYER[j % 4], api_start=launch,
                         api_ns=3 * US)
            launch += 4 * US
            t += 1 * MS
        b.add_nvtx_range(g, st - 50 * US, t - 9 * MS, f"train_step {i}")
    flush(b, g, t)
    return b.write(Path(path), layout)
