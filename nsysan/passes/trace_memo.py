"""`TraceMemo`: one value per `Trace`, computed once and shared by passes, rules and reports.

Passes may run two at a time (`nsysan.passes.schedule`), so two threads can ask for the same
shared value at once; the second waits for the first's result instead of computing it again
(a lock per trace, so different traces never wait for each other). Entries are weak on the
trace (a dropped trace frees them) and remember the frame objects they were computed from: a
frame replaced after the fact is never served a stale value.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

import polars as pl

from nsysan.frames.trace import Trace

T = TypeVar("T")


class TraceMemo(Generic[T]):
    def __init__(self) -> None:
        self._values: weakref.WeakKeyDictionary[Trace, tuple[list[pl.DataFrame], T]] = (
            weakref.WeakKeyDictionary())
        self._locks: weakref.WeakKeyDictionary[Trace, threading.Lock] = (
            weakref.WeakKeyDictionary())
        self._guard = threading.Lock()

    def _hit(self, trace: Trace, frames: Sequence[pl.DataFrame]) -> tuple[bool, T | None]:
        entry = self._values.get(trace)
        if entry is not None and len(entry[0]) == len(frames) and all(
                a is b for a, b in zip(entry[0], frames, strict=True)):
            return True, entry[1]
        return False, None

    def get(self, trace: Trace, frames: Sequence[pl.DataFrame], build: Callable[[], T]) -> T:
        """The value for ``trace`` computed from ``frames`` (``build()`` on the first call)."""
        found, value = self._hit(trace, frames)
        if found:
            return value  # type: ignore[return-value]
        with self._guard:
            lock = self._locks.setdefault(trace, threading.Lock())
        with lock:
            found, value = self._hit(trace, frames)
            if found:
                return value  # type: ignore[return-value]
            built = build()
            self._values[trace] = (list(frames), built)
            return built

    def forget(self, trace: Trace) -> None:
        self._values.pop(trace, None)
