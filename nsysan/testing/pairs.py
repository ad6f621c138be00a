"""Synthetic *pairs* of runs for `nsysan diff` / `nsysan check`: a baseline and the same run
with one planted change, with the planted amount computed from the builder's records.

Both runs of a pair come from the same structure seed, so every kernel duration and every
launch gap is identical; only the planted change (and, for jitter pairs, an independent per-step
scale factor per run) differs. The planted amount is measured on the planted records with the
naive oracle of `nsysan.testing.truth` (GPU span and state times), never with nsysan's code.

    base, new, truth = exposed_allreduce_pair(tmp_path)   # +3 ms exposed AllReduce per step
    base, new, truth = data_loader_pair(tmp_path)         # slower loader every 4th step
    base, new, truth = jitter_pair(tmp_path)              # +-2 % random jitter per step only
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

from nsysan.testing import kernels as K
from nsysan.testing._common import MS, US, dur, finish, flush, start
from nsysan.testing._loop import Loop
from nsysan.testing._model import GpuOp, KernelName
from nsysan.testing._step import (
    BUCKETS,
    BWD,
    COPY_STREAM,
    FWD,
    OPT,
    SECTION_PAD,
    Step,
    last_compute,
)
from nsysan.testing.truth import PlantedTruth

PID = 4242


@dataclass(frozen=True)
class RunSpec:
    """One synthetic DDP training run (forward, backward with bucketed AllReduce hidden
    under it, a last AllReduce bucket before the optimizer, pinned H2D prefetch)."""

    steps: int = 24
    seed: int = 0  # structure: kernel durations and launch gaps
    stall_every: int = 0  # 0: never; else the data loader stalls on steps k*every (k >= 1)
    stall_ns: int = 0  # GPU idle planted before the first kernel of a stalled step
    exposed_ns: int = 0  # the last AllReduce bucket runs this long past backward's end
    jitter: float = 0.0  # every GPU op of a step scaled by 1 + U(-jitter, +jitter)
    jitter_seed: int = 0
    layout: str = "2022.4"


@dataclass
class PairTruth:
    """What a correct diff of ``base`` -> ``new`` must report."""

    kind: str
    base: PlantedTruth
    new: PlantedTruth
    n_steps: int
    #: mean change of step time (ns per step) caused by the planted change
    delta_ns_per_step: float
    #: engine state that takes the delta: compute | communication | copies | idle (or None)
    state: str | None
    #: text that names the layer the delta belongs to (a layer label or a GPU-idle cause)
    layer: str | None
    #: planted change of each engine state, ns per step, from the naive state sweep
    state_delta_ns_per_step: dict[str, float] = field(default_factory=dict)


class _ScaledStep(Step):
    """A `Step` whose GPU work (kernels, side copies, AllReduce) is scaled by ``factor``."""

    factor: float = 1.0

    def scaled(self, plan: list[tuple[KernelName, int]]) -> list[tuple[KernelName, int]]:
        return [(k, round(base * self.factor)) for k, base in plan]

    def _after_kernel(self, section: str, i: int, op: GpuOp) -> GpuOp | None:
        loop = self.loop
        if section == "forward" and i == 0 and self.h2d_prefetch:
            return loop.side_copy(op.start_ns + 100 * US, round(400 * US * self.factor),
                                  COPY_STREAM, nbytes=8 << 20)
        if section == "backward" and i in BUCKETS and self.overlapped_allreduce is not None:
            return self.allreduce(self.overlapped_allreduce, op.start_ns + 100 * US,
                                  round(700 * US * self.factor))
        return None


def training_run(path: str | Path, spec: RunSpec = RunSpec()) -> tuple[Path, PlantedTruth]:
    """Write one run of ``spec`` at ``path``; returns it with its `PlantedTruth`."""
    rng = random.Random(spec.seed)
    jrng = random.Random(1_000_003 * spec.jitter_seed + 7)
    b, gtid = start(PID)
    loop = Loop(b, gtid, rng)
    # OS-runtime tracing is on in every run (an export omits OSRT_API when no call was
    # traced, which would read as a different capture): the script reads its config first
    loop.osrt("read", 50 * US, return_value=4096)
    step_ranges = []
    for i in range(spec.steps):
        s = _ScaledStep(loop, i, rng)
        s.factor = 1 + jrng.uniform(-spec.jitter, spec.jitter) if spec.jitter else 1.0
        s.h2d_prefetch = True
        s.overlapped_allreduce = K.NCCL_ALLREDUCE_OLD
        stalled = bool(spec.stall_every) and i > 0 and i % spec.stall_every == 0
        drained = loop.drain()
        s.data(stall_until=drained + spec.stall_ns if stalled and spec.stall_ns else None)
        s.kernels(s.scaled(FWD), "forward")
        last = last_compute(s.kernels(s.scaled(BWD), "backward"))
        # the last bucket starts under the last backward kernel and ends `exposed_ns` after it
        _optimizer(s, last, last.end_ns + spec.exposed_ns)
        step_ranges.append(s.close())
    flush(b, gtid, loop.host)
    return finish("pair_run", b, Path(path), spec.layout, True, spec.seed, steps=step_ranges,
                  extra={"spec": spec})


def _optimizer(s: _ScaledStep, last: GpuOp, end: int) -> None:
    """The last gradient bucket's AllReduce starts under the last backward kernel ``last`` and
    runs to ``end``; the optimizer waits for it (cudaStreamWaitEvent), so it is exposed from
    ``last.end_ns`` to ``end``."""
    loop = s.loop
    m = loop.begin(SECTION_PAD)
    tail = s.allreduce(K.NCCL_ALLREDUCE_OLD, last.start_ns + 100 * US,
                       end - last.start_ns - 100 * US)
    loop.wait_for(tail)
    for kern, base in s.scaled(OPT):
        loop.kernel(kern, dur(loop.rng, base))
    loop.end(m, "optimizer", pad=SECTION_PAD)


CATEGORIES = ("compute", "communication", "copies", "idle")


def _categories(states: dict[str, int]) -> dict[str, int]:
    """Overlap states (``compute+nccl``, ``h2d``, ...) summed into the diff's engine-state
    categories: any compute; else NCCL; else copies / memsets; idle."""
    out = dict.fromkeys(CATEGORIES, 0)
    for state, ns in states.items():
        parts = state.split("+")
        cat = ("idle" if state == "idle" else "compute" if "compute" in parts
               else "communication" if "nccl" in parts else "copies")
        out[cat] += ns
    return out


def _pair(kind: str, directory: str | Path, base: RunSpec, new: RunSpec, *,
          state: str | None, layer: str | None) -> tuple[Path, Path, PairTruth]:
    directory = Path(directory)
    pb, tb = training_run(directory / f"{kind}-base.sqlite", base)
    pn, tn = training_run(directory / f"{kind}-new.sqlite", new)
    # Same structure, so the steps tile the same GPU span on both sides: the planted change
    # of mean step time is the change of the GPU span over the number of steps.
    n = base.steps
    delta = (tn.device(0).span_ns - tb.device(0).span_ns) / n
    cat_b, cat_n = _categories(tb.device(0).states), _categories(tn.device(0).states)
    truth = PairTruth(kind, tb, tn, n, delta, state, layer,
                      {c: (cat_n[c] - cat_b[c]) / n for c in CATEGORIES})
    return pb, pn, truth


def exposed_allreduce_pair(directory: str | Path, *, steps: int = 24, extra_ns: int = 3 * MS,
                           seed: int = 0, layout: str = "2022.4") -> tuple[Path, Path, PairTruth]:
    """Baseline: the last AllReduce bucket hidden under backward. New: it runs ``extra_ns``
    longer, exposed (compute waits for it), on every step."""
    base = RunSpec(steps=steps, seed=seed, layout=layout)
    new = RunSpec(steps=steps, seed=seed, exposed_ns=extra_ns, layout=layout)
    return _pair("exposed_allreduce", directory, base, new, state="communication",
                 layer="NCCL:ncclAllReduce")


def data_loader_pair(directory: str | Path, *, steps: int = 24, every: int = 4,
                     stall_ns: int = 20 * MS, seed: int = 0,
                     layout: str = "2022.4") -> tuple[Path, Path, PairTruth]:
    """Baseline: the next batch is always ready. New: on every ``every``-th step the data
    loader makes the GPU wait ``stall_ns`` (host in ``DataLoader.__next__``)."""
    base = RunSpec(steps=steps, seed=seed, layout=layout)
    new = RunSpec(steps=steps, seed=seed, stall_every=every, stall_ns=stall_ns, layout=layout)
    return _pair("data_loader", directory, base, new, state="idle",
                 layer="DataLoader.__next__")


def jitter_pair(directory: str | Path, *, steps: int = 24, jitter: float = 0.02,
                seed: int = 0, layout: str = "2022.4") -> tuple[Path, Path, PairTruth]:
    """Two runs that differ only by independent +-``jitter`` random scaling of each step's GPU
    work: every metric must come out unchanged."""
    base = RunSpec(steps=steps, seed=seed, jitter=jitter, jitter_seed=1, layout=layout)
    new = RunSpec(steps=steps, seed=seed, jitter=jitter, jitter_seed=2, layout=layout)
    return _pair("jitter", directory, base, new, state=None, layer=None)


__all__ = [
    "PairTruth",
    "RunSpec",
    "data_loader_pair",
    "exposed_allreduce_pair",
    "jitter_pair",
    "training_run",
]
