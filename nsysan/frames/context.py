"""`AnalysisContext`: one analysis of one trace, with the derived products it shares.

Several passes, the findings and the pictures need the same derived data of a trace: the GPU
ops sorted by (device, start) and their unions per device (`nsysan.passes.device_blocks`),
the API call of every GPU op (`nsysan.passes.op_link`), the overlap states of every device
and their sums per step (`nsysan.passes.steps`). Each is declared once, next to the code that
builds it, as a `Product`: a name, the canonical frames it is computed from and its build
function. Whoever needs it asks `product(trace, PRODUCT, *args)`.

Lifecycle: the pass scheduler (`nsysan.passes.schedule.analysis_context`) opens a context
for an analysis and closes it when the analysis ends (after the passes, or after the findings
and reports when the entry point draws them too: `nsysan.api`); closing frees every product.
The context is a view of the trace: it *is* a `Trace` whose frames are the trace's own (built
once, shared with the trace and every other view), so passes keep their ``run(trace, params,
results)`` signature and read frames as before. Outside a context (a test calling a service
on a plain `Trace`, or a closed context) a product is built and not kept: the same answer,
nothing outlives the call.

Thread-safety: passes may run two at a time (`nsysan.passes.schedule`); two threads asking
for the same product wait for one build (a lock per product name; different products never
wait for each other). A value is served only for the frame objects (and ``args``) it was built
from: a frame replaced after the fact is never served a stale product.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import polars as pl

from nsysan.frames.trace import Trace

T = TypeVar("T")


@dataclass(frozen=True)
class Product(Generic[T]):
    """A derived value of one trace, shared within an analysis.

    ``build(trace, *args)`` computes it from the canonical ``frames`` of ``trace`` (and from
    ``args``: frames or other products it is built on, compared by identity, data frames also
    by value)."""

    name: str
    frames: tuple[str, ...]
    build: Callable[..., T]
    description: str = ""


def _same(a: Any, b: Any) -> bool:
    if a is b:
        return True
    return isinstance(a, pl.DataFrame) and isinstance(b, pl.DataFrame) and a.equals(b)


class AnalysisContext(Trace):
    """The trace as one analysis sees it: its frames, plus the products built so far."""

    def __init__(self, trace: Trace):
        base = trace.base if isinstance(trace, AnalysisContext) else trace
        trace._share_frames(self)
        self.base = base
        self._values: dict[str, tuple[tuple[Any, ...], Any]] = {}
        self._product_locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()
        self._open = True

    def __repr__(self) -> str:
        return f"AnalysisContext({self.base!r}, products={sorted(self._values)})"

    def _inputs(self, product: Product[Any], args: tuple[Any, ...]) -> tuple[Any, ...]:
        return (*(self.stored(f) for f in product.frames), *args)

    def _hit(self, name: str, inputs: tuple[Any, ...]) -> tuple[bool, Any]:
        entry = self._values.get(name)
        if entry is not None and len(entry[0]) == len(inputs) and all(
                _same(a, b) for a, b in zip(entry[0], inputs, strict=True)):
            return True, entry[1]
        return False, None

    def get(self, product: Product[T], *args: Any, keep: bool = True) -> T:
        """``product`` of this trace (built on the first call). With ``keep`` false the
        caller is its last user: a kept value is handed over and dropped, or the value is
        built and not kept."""
        inputs = self._inputs(product, args)
        with self._guard:
            lock = self._product_locks.setdefault(product.name, threading.Lock())
        with lock:
            found, value = self._hit(product.name, inputs)
            if not keep:
                self._values.pop(product.name, None)
            if found:
                return value  # type: ignore[no-any-return]
            built = product.build(self, *args)
            if keep and self._open:
                self._values[product.name] = (inputs, built)
            return built

    def put(self, product: Product[T], value: T, *args: Any) -> None:
        """Keep ``value`` as ``product`` (of ``args``): a build of another product found it on
        the way."""
        if self._open:
            with self._guard:
                self._values[product.name] = (self._inputs(product, args), value)

    def products(self) -> tuple[str, ...]:
        """The names of the products kept now (sorted)."""
        return tuple(sorted(self._values))

    def close(self) -> None:
        """Free every product; later requests build and do not keep."""
        with self._guard:
            self._open = False
            self._values.clear()


def product(trace: Trace, p: Product[T], *args: Any, keep: bool = True) -> T:
    """``p`` of ``trace``: shared through its `AnalysisContext`, or built for this call only
    when ``trace`` is a plain `Trace`."""
    if isinstance(trace, AnalysisContext):
        return trace.get(p, *args, keep=keep)
    return p.build(trace, *args)


def share(trace: Trace, p: Product[T], value: T, *args: Any) -> None:
    """`AnalysisContext.put` when ``trace`` is a context (a plain trace keeps nothing)."""
    if isinstance(trace, AnalysisContext):
        trace.put(p, value, *args)
