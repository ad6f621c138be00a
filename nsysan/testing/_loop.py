"""`Loop`: place one host thread's CUDA calls and the GPU work they launch, causally.

A tiny launch model, enough for planted truth to be exact and realistic:
- a kernel on the loop's compute stream starts at ``max(stream ready, call end + latency)``;
- the host issues each call as soon as it is free (``host_gap`` after its previous event) but
  never more than ``lead`` ahead of the GPU (a bounded launch queue), so in steady state CPU
  ranges are the GPU timeline shifted by ``lead``, and after a host stall the GPU waits;
- NVTX ranges wrap the host events placed between `begin` and `end`, padded, and nest
  properly by construction (the loop checks that nothing on the thread overlaps).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from nsysan.testing._model import NULL_STREAM_ID, GpuOp, KernelName, NvtxEvent
from nsysan.testing.synth import TraceBuilder

API_NS = 5_000  # one cudaLaunchKernel call
LEAD_NS = 150_000  # how far the host may run ahead of the GPU
LATENCY_NS = 8_000  # launch call end -> kernel start on an idle stream
HOST_GAP_NS = 20_000  # host (Python) time between two calls


@dataclass(frozen=True)
class Mark:
    index: int  # first host item of the section
    floor: int  # the section may not start before this


class Loop:
    def __init__(
        self,
        b: TraceBuilder,
        gtid: int,
        rng: random.Random,
        *,
        device_id: int = 0,
        stream_id: int = NULL_STREAM_ID,
        t0: int = 1_000_000,
        lead_ns: int = LEAD_NS,
        latency_ns: int = LATENCY_NS,
        host_gap_ns: int = HOST_GAP_NS,
    ):
        self.b, self.gtid, self.rng = b, gtid, rng
        self.device_id, self.stream_id = device_id, stream_id
        self.gpu = t0  # compute stream is free from here
        self.host = t0  # the thread is free from here
        self.lead_ns, self.latency_ns, self.host_gap_ns = lead_ns, latency_ns, host_gap_ns
        self.items: list[tuple[int, int]] = []  # host events and ranges on this thread
        self.ops: list[GpuOp] = []

    # -- GPU work ---------------------------------------------------------------------------
    def jitter_gap(self, base: int = 17_000, spread: int = 5_000) -> int:
        return base + self.rng.randint(-spread, spread)

    def kernel(
        self,
        k: KernelName,
        dur: int,
        *,
        gap: int | None = None,
        api_ns: int = API_NS,
        api_name: str = "cudaLaunchKernel_v7000",
        driver: bool = False,
    ) -> GpuOp:
        """A kernel on the compute stream, ``gap`` after the previous one at the earliest."""
        ready = self.gpu + (self.jitter_gap() if gap is None else gap)
        api_start = max(self.host + self.host_gap_ns, ready - self.lead_ns - api_ns)
        start = max(ready, api_start + api_ns + self.latency_ns)
        self._host_event(api_start, api_start + api_ns)
        op = self.b.add_kernel(
            self.gtid,
            start,
            start + dur,
            k,
            device_id=self.device_id,
            stream_id=self.stream_id,
            api_start=api_start,
            api_ns=api_ns,
            api_name=api_name,
            driver=driver,
        )
        self.gpu = op.end_ns
        self.ops.append(op)
        return op

    def side_kernel(
        self,
        k: KernelName,
        start: int,
        dur: int,
        stream_id: int,
        *,
        api_name: str = "cudaLaunchKernel_v7000",
        driver: bool = False,
        api_ns: int = API_NS,
    ) -> GpuOp:
        """A kernel on another stream at a chosen time, launched right after the thread's
        previous event (it must fit before the kernel starts)."""
        api_start = self.host + 5_000
        self._host_event(api_start, api_start + api_ns)
        if api_start + api_ns + self.latency_ns > start:
            raise AssertionError(f"{k.short}: launch at {api_start} cannot start it at {start}")
        op = self.b.add_kernel(
            self.gtid,
            start,
            start + dur,
            k,
            device_id=self.device_id,
            stream_id=stream_id,
            api_start=api_start,
            api_ns=api_ns,
            api_name=api_name,
            driver=driver,
        )
        self.ops.append(op)
        return op

    def side_copy(self, start: int, dur: int, stream_id: int, **kw) -> GpuOp:
        """An async copy on another stream (pinned HtoD by default), launched like
        `side_kernel`."""
        api_start = self.host + 5_000
        self._host_event(api_start, api_start + 6_000)
        if api_start + 6_000 + self.latency_ns > start:
            raise AssertionError(f"copy launch at {api_start} cannot start it at {start}")
        op = self.b.add_memcpy(
            self.gtid,
            start,
            start + dur,
            device_id=self.device_id,
            stream_id=stream_id,
            api_start=api_start,
            api_ns=6_000,
            **kw,
        )
        self.ops.append(op)
        return op

    def memset(self, dur: int, nbytes: int, *, gap: int = 20_000) -> GpuOp:
        """A cudaMemsetAsync on the compute stream (placed like `kernel`)."""
        ready = self.gpu + gap
        api_start = max(self.host + self.host_gap_ns, ready - self.lead_ns - 4_000)
        start = max(ready, api_start + 4_000 + self.latency_ns)
        self._host_event(api_start, api_start + 4_000)
        op = self.b.add_memset(
            self.gtid,
            start,
            start + dur,
            nbytes=nbytes,
            device_id=self.device_id,
            stream_id=self.stream_id,
            api_start=api_start,
            api_ns=4_000,
        )
        self.gpu = op.end_ns
        self.ops.append(op)
        return op

    def graph(self, plan: list[tuple[KernelName, int]], *, gap: int = 20_000) -> list[GpuOp]:
        """One cudaGraphLaunch (12 us) whose kernels run back to back (3 us apart) on the
        compute stream, all carrying the launch's correlation id."""
        ready = self.gpu + gap
        api_start = max(self.host + self.host_gap_ns, ready - self.lead_ns - 12_000)
        t = max(ready, api_start + 12_000 + self.latency_ns)
        kernels = []
        for k, d in plan:
            kernels.append((t, t + d, k))
            t += d + 3_000
        self._host_event(api_start, api_start + 12_000)
        ops = self.b.add_graph_launch(
            self.gtid,
            api_start,
            api_start + 12_000,
            kernels,
            device_id=self.device_id,
            stream_id=self.stream_id,
        )
        self.gpu = ops[-1].end_ns
        self.ops.extend(ops)
        return ops

    def wait_for(self, op: GpuOp) -> None:
        """The compute stream waits for ``op`` (cudaEventRecord + cudaStreamWaitEvent)."""
        t = self.host + 5_000
        self.b.add_api(self.gtid, t, t + 3_000, "cudaEventRecord_v3020")
        self._host_event(t, t + 3_000)
        t += 8_000
        self.b.add_sync(
            self.gtid,
            t,
            t + 3_000,
            kind="stream_wait_event",
            device_id=self.device_id,
            stream_id=self.stream_id,
        )
        self._host_event(t, t + 3_000)
        self.gpu = max(self.gpu, op.end_ns)

    def drain(self) -> int:
        """When the last op launched so far on this loop's device ends."""
        return max((o.end_ns for o in self.ops), default=self.gpu)

    def sync(self, kind: str, wake_ns: int) -> int:
        """Host blocks in a sync API until the GPU drains, plus ``wake_ns``; returns the
        call's end."""
        start = self.host + self.host_gap_ns
        end = max(start + 2_000, self.drain() + wake_ns)
        self.b.add_sync(
            self.gtid, start, end, kind=kind, device_id=self.device_id, stream_id=self.stream_id
        )
        self._host_event(start, end)
        return end

    def sync_copy(self, nbytes: int, stage_ns: int, dma_ns: int, **kw) -> GpuOp:
        """A synchronous cudaMemcpy: the copy waits for the stream to drain and for the
        driver to stage ``stage_ns`` of pageable data; the call returns 15 us after it."""
        api_start = self.host + self.host_gap_ns
        start = max(self.drain(), api_start) + stage_ns
        end = start + dma_ns
        op = self.b.add_memcpy(
            self.gtid,
            start,
            end,
            nbytes=nbytes,
            device_id=self.device_id,
            stream_id=self.stream_id,
            sync=True,
            api_start=api_start,
            api_end=end + 15_000,
            **kw,
        )
        self._host_event(api_start, end + 15_000)
        self.gpu = end
        self.ops.append(op)
        return op

    # -- CPU side ---------------------------------------------------------------------------
    def osrt(self, name: str, dur: int, *, gap: int = 3_000, return_value: int = 0) -> None:
        start = self.host + gap
        self.b.add_osrt(self.gtid, start, start + dur, name, return_value=return_value)
        self._host_event(start, start + dur)

    def idle(self, ns: int) -> None:
        """Host time with no traced activity (Python work)."""
        self.host += ns

    def begin(self, pad: int = 0) -> Mark:
        """Open a section; ``pad`` ns of host time are reserved before its first event."""
        floor = self.host
        self.host += pad
        return Mark(len(self.items), floor)

    def end(
        self, mark: Mark, name: str, *, pad: int = 0, until: int | None = None, **nvtx
    ) -> NvtxEvent:
        """Close a section as an NVTX range over its host events (``pad`` either side), or
        up to ``until`` exactly."""
        inner = self.items[mark.index :]
        if inner:
            start = min(s for s, _ in inner) - pad
            end = max(e for _, e in inner) + pad
        else:
            start, end = mark.floor, self.host + pad
        if until is not None:
            if until < end - pad:
                raise AssertionError(f"{name}: cannot end at {until}, it holds events to {end}")
            end = until
        if start < mark.floor:
            raise AssertionError(f"{name} would start at {start}, before {mark.floor}")
        ev = self.b.add_nvtx_range(self.gtid, start, end, name, **nvtx)
        self.items.append((start, end))
        self.host = max(self.host, end)
        return ev

    def _host_event(self, start: int, end: int) -> None:
        if start < self.host:
            raise AssertionError(f"host event at {start} overlaps the thread (free at {self.host})")
        self.items.append((start, end))
        self.host = end
