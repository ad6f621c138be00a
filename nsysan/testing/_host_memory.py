"""The host-evidence and device-memory rows of `nsysan.testing.synth.TraceBuilder`: on-CPU
intervals (SCHED_EVENTS), CPU samples (COMPOSITE_EVENTS + SAMPLING_CALLCHAINS) and CUDA
memory-usage events, as a mixin so that the builder's module stays readable."""

from __future__ import annotations

from nsysan.errors import ConfigError
from nsysan.testing._model import MEM_KINDS, ApiCall, MemoryEvent, Process


def check_interval(what: str, start: int, end: int) -> None:
    """Refuse a negative or reversed interval (every timed row the builder writes)."""
    if start < 0 or end < start:
        raise ConfigError(f"{what}: interval [{start}, {end}) is negative or reversed")


class HostAndMemoryEvents:
    """Methods of `TraceBuilder` (which holds ``sched``, ``samples``, ``memory``,
    ``memory_usage_captured`` and the helpers ``_process``, ``_pid_of``, ``_intern``)."""

    sched: list[tuple[int, int, int, int, int | None]]
    samples: list[tuple[int, int, int, tuple[tuple[str, str], ...], int]]
    memory: list[MemoryEvent]
    memory_usage_captured: bool

    def _process(self, pid: int) -> Process:  # pragma: no cover - TraceBuilder's
        raise NotImplementedError

    def _pid_of(self, gtid: int) -> int:  # pragma: no cover - TraceBuilder's
        raise NotImplementedError

    def _intern(self, s: str) -> int:  # pragma: no cover - TraceBuilder's
        raise NotImplementedError

    def add_on_cpu(self, gtid: int, start_ns: int, end_ns: int, cpu: int = 0, *,
                   out_state: int | None = None) -> None:
        """Thread ``gtid`` ran on ``cpu`` during [start, end): a switch-in and a switch-out
        row of SCHED_EVENTS (what ``--cpuctxsw`` records). ``out_state``: nsys' thread state
        at the switch-out (1 = running: preempted, 2 = interruptible: went to sleep), which
        exports from schema 3.28 record; given once, SCHED_EVENTS gets that schema's
        ``threadState`` and ``threadBlock`` columns."""
        check_interval("on-CPU interval", start_ns, end_ns)
        self._process(self._pid_of(gtid))
        self.sched.append((gtid, cpu, start_ns, end_ns, out_state))

    def add_sample(
        self, gtid: int, time_ns: int, stack: list[tuple[str, str]], *, cpu: int = 0,
        state: int = 1,
    ) -> None:
        """A CPU IP/backtrace sample of thread ``gtid``: ``stack`` is (symbol, module) pairs,
        leaf first (COMPOSITE_EVENTS + SAMPLING_CALLCHAINS rows); ``state`` is nsys' thread
        state number (1 = running)."""
        if time_ns < 0:
            raise ConfigError(f"sample at {time_ns} ns lies before the session")
        self._process(self._pid_of(gtid))
        for symbol, module in stack:
            self._intern(symbol)
            self._intern(module)
        self.samples.append((gtid, time_ns, cpu, tuple(stack), state))

    def add_memory_event(
        self, pid: int, start_ns: int, nbytes: int, op: str, *, address: int,
        device_id: int = 0, mem_kind: str = "device", api: ApiCall | None = None,
        pool: tuple[int, int, int] | None = None, release_threshold: int | None = None,
        name: str | None = None,
    ) -> MemoryEvent:
        """A CUDA memory-usage event of process ``pid``: ``op`` is alloc | free, ``api`` the
        call that made it, ``pool`` = (pool address, pool size, utilized size) after it."""
        if op not in ("alloc", "free") or mem_kind not in MEM_KINDS or nbytes < 0 \
                or start_ns < 0:
            raise ConfigError(f"memory event: op {op!r}, kind {mem_kind!r}, {nbytes} bytes "
                              f"at {start_ns}")
        proc = self._process(pid)
        ev = MemoryEvent(start_ns, proc.global_pid, device_id, address, nbytes, mem_kind, op,
                         api, name=name)
        if pool is not None:
            ev.pool_address, ev.pool_size, ev.pool_utilized = pool
            ev.pool_release_threshold = release_threshold
        self.memory.append(ev)
        self.memory_usage_captured = True
        return ev
