"""The ``layers`` scenario: NVTX nesting with known inclusive / exclusive GPU time per range."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nsysan.testing import kernels as K
from nsysan.testing._common import US, finish, flush, start
from nsysan.testing._loop import Loop, Mark
from nsysan.testing._model import GpuOp, KernelName
from nsysan.testing.truth import LayerTruth, PlantedTruth, RangeTruth, total, union

PID = 4242


@dataclass
class _Open:
    name: str
    pad: int
    mark: Mark
    depth: int
    parent: str | None
    nvtx: dict[str, Any]
    ops: list[GpuOp] = field(default_factory=list)  # launched anywhere inside (inclusive)
    own: list[GpuOp] = field(default_factory=list)  # innermost range is this one (exclusive)


class _Recorder:
    """Opens and closes ranges on a `Loop` and records, by construction, which GPU ops each
    range launched: every open range gets the op, the innermost one exclusively."""

    def __init__(self, loop: Loop):
        self.loop = loop
        self.stack: list[_Open] = []
        self.ranges: list[RangeTruth] = []
        self.unattributed: list[GpuOp] = []

    def open(self, name: str, pad: int, **nvtx: Any) -> None:
        parent = self.stack[-1].name if self.stack else None
        mark = self.loop.begin(pad)
        self.stack.append(_Open(name, pad, mark, len(self.stack), parent, nvtx))

    def record(self, ops: list[GpuOp]) -> None:
        for r in self.stack:
            r.ops.extend(ops)
        (self.stack[-1].own if self.stack else self.unattributed).extend(ops)

    def kernel(self, k: KernelName, dur: int) -> None:
        self.record([self.loop.kernel(k, dur, gap=20 * US)])

    def close(self) -> None:
        r = self.stack.pop()
        ev = self.loop.end(r.mark, r.name, pad=r.pad, **r.nvtx)
        assert ev.end_ns is not None
        spans = [(o.start_ns, o.end_ns) for o in r.ops]
        self.ranges.append(
            RangeTruth(
                name=r.name,
                domain=r.nvtx.get("domain") or "",
                style=r.nvtx.get("style", "push_pop"),
                pid=PID,
                tid=PID,
                start_ns=ev.start_ns,
                end_ns=ev.end_ns,
                depth=r.depth,
                parent=r.parent,
                n_gpu_ops=len({id(o.api) for o in r.ops}),
                n_gpu_records=len(r.ops),
                proj_start_ns=min((s for s, _ in spans), default=None),
                proj_end_ns=max((e for _, e in spans), default=None),
                gpu_busy_ns=total(spans),
                # ops run one at a time on one stream, so a sum is also a union
                exclusive_gpu_ns=sum(o.duration_ns for o in r.own),
            )
        )


def layers(
    path: str | Path,
    layout: str = "2022.4",
    *,
    seed: int = 0,
    lazy: bool = True,
    iterations: int = 2,
) -> tuple[Path, PlantedTruth]:
    """Ranges nested three deep on the main thread (``iteration`` > ``forward`` /
    ``backward`` / ``optimizer`` > layer ranges) with kernels launched at every level; layer
    ranges mix the default domain and ``nsysan.model``, text and registered strings, push/pop
    and start/end; ``optimizer`` holds one cudaGraphLaunch of three kernels; one range
    launches nothing. Outside: a kernel in no range, a start/end range ended on another
    thread (excluded from attribution) and a range on a thread that launches nothing."""
    rng = random.Random(seed)
    b, gtid = start()
    loop = Loop(b, gtid, rng)
    rec = _Recorder(loop)
    model = {"domain": "nsysan.model", "registered": True}
    d = lambda base: base + rng.randint(-10, 10) * US  # noqa: E731
    for it in range(iterations):
        rec.open("iteration", 30 * US)
        rec.record([loop.memset(d(60 * US), 32 << 20)])  # zero_grad, launched at depth 0
        rec.open("forward", 15 * US)
        rec.kernel(K.ADD, d(250 * US))  # launched directly in forward
        rec.open("Linear", 5 * US, **model)
        rec.kernel(K.XMMA_GEMM, d(900 * US))
        rec.kernel(K.ADD, d(120 * US))
        rec.close()
        rec.open("ReLU", 5 * US, registered=True)
        rec.kernel(K.ADD, d(150 * US))
        rec.close()
        rec.open("Linear", 5 * US, **model)
        rec.kernel(K.CUTLASS_GEMM, d(700 * US))
        rec.kernel(K.ADD, d(120 * US))
        rec.close()
        rec.open("Dropout", 5 * US)  # CPU only
        loop.idle(40 * US)
        rec.close()
        rec.close()  # forward
        rec.open("backward", 15 * US)
        rec.open("LinearBackward", 5 * US, style="start_end", domain="nsysan.model")
        rec.kernel(K.SGEMM, d(800 * US))
        rec.kernel(K.SGEMM, d(800 * US))
        rec.close()
        rec.open("ReLUBackward", 5 * US)
        rec.kernel(K.ADD, d(150 * US))
        rec.close()
        rec.kernel(K.REDUCE, d(300 * US))  # launched directly in backward
        rec.close()
        rec.open("optimizer", 15 * US)
        rec.record(loop.graph([(K.ADAM, d(400 * US)), (K.ADAM, d(400 * US)), (K.FILL, 50 * US)]))
        rec.close()
        loop.idle(2 * US)
        b.add_nvtx_mark(gtid, loop.host, f"iteration {it} done")
        rec.close()  # iteration
    rec.kernel(K.REDUCE, d(300 * US))  # in no range at all
    # a start/end range begun here and ended on another thread: not same-thread, so the
    # kernel launched inside it stays unattributed
    prefetcher = b.add_thread(PID, PID + 8, "pt_prefetch")
    t0 = loop.host + 10 * US
    loop.idle(20 * US)
    rec.kernel(K.ADD, d(200 * US))
    prefetch = b.add_nvtx_range(
        gtid, t0, loop.host + 400 * US, "prefetch", style="start_end", end_gtid=prefetcher
    )
    logger = b.add_thread(PID, PID + 9, "logger")
    log = b.add_nvtx_range(logger, t0, t0 + 300 * US, "log")
    for ev, tid, depth in ((prefetch, PID, -1), (log, PID + 9, 0)):
        assert ev.end_ns is not None
        style = "start_end" if ev.end_global_tid is not None else "push_pop"
        rec.ranges.append(
            RangeTruth(ev.name, "", style, PID, tid, ev.start_ns, ev.end_ns, depth, None,
                       0, 0, None, None, 0, 0)
        )  # fmt: skip
    flush(b, gtid, loop.host + 500 * US)

    ranges = sorted(rec.ranges, key=lambda r: r.start_ns)
    by_name: dict[tuple[str, str], LayerTruth] = {}
    for r in ranges:
        if r.depth < 0:  # not a same-thread range: takes no part in attribution
            continue
        lt = by_name.setdefault((r.domain, r.name), LayerTruth(r.domain, r.name, 0, 0, 0, 0, 0))
        lt.instances += 1
        lt.n_gpu_ops += r.n_gpu_ops
        lt.n_gpu_records += r.n_gpu_records
        lt.gpu_busy_ns += r.gpu_busy_ns
        lt.exclusive_gpu_ns += r.exclusive_gpu_ns
    all_spans = [(o.start_ns, o.end_ns) for o in b.ops]
    attributed = [(o.start_ns, o.end_ns) for o in b.ops if o not in rec.unattributed]
    return finish(
        "layers",
        b,
        Path(path),
        layout,
        lazy,
        seed,
        ranges=ranges,
        layers=by_name,
        attribution_coverage_frac=total(attributed) / total(union(all_spans)),
        extra={
            "iterations": [(r.start_ns, r.end_ns) for r in ranges if r.name == "iteration"],
            "unattributed_ns": sum(o.duration_ns for o in rec.unattributed),
            "graph_kernels": sum(1 for o in b.ops if o.graph_node_id is not None),
        },
    )
