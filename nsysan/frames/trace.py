"""`Trace`: the canonical frames of one profile, loaded on first use, plus `TraceMeta`."""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from nsysan.frames import schemas, schemas_host
from nsysan.frames.heap import trim


class TableCounts(Mapping[str, int]):
    """Every raw table of an export with its row count.

    Which tables exist, and whether a table has any row, is known at once (`has_rows`); the
    exact counts may still be being computed (``pending``: a SQLite ``count(*)`` walks every
    page of a table, 0.5 s at 1M kernels and 26 s on a cold 10M-kernel file), and reading a
    count waits for them. So opening a trace does not wait for counts that only the manifest
    and ``nsysan schema`` print."""

    def __init__(self, counts: Mapping[str, int] | None = None, *,
                 names: Iterable[str] = (), nonempty: Mapping[str, bool] | None = None,
                 pending: Future[dict[str, int]] | None = None,
                 bounds: Mapping[str, int] | None = None):
        self._counts: dict[str, int] | None = dict(counts) if counts is not None else None
        self._names = list(self._counts) if self._counts is not None else list(names)
        self._nonempty = dict(nonempty or {})
        self._pending = pending
        self._bounds = dict(bounds or {})

    def _resolved(self) -> dict[str, int]:
        if self._counts is None:
            self._counts = dict(self._pending.result()) if self._pending is not None else {}
        return self._counts

    def __getitem__(self, table: str) -> int:
        return self._resolved()[table]

    def __contains__(self, table: object) -> bool:
        return table in self._names

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def __repr__(self) -> str:
        return f"TableCounts({self._counts!r})" if self._counts is not None else \
            f"TableCounts(<counting {len(self._names)} tables>)"

    def __reduce__(self):  # pickled (batch workers, caches) as the plain counts
        return (TableCounts, (self._resolved(),))

    def at_most(self, table: str) -> int:
        """At least as many as ``table``'s rows (0 if absent), without waiting for the counts
        when the source gave a bound at once (SQLite: the span of the rowids); else the count."""
        if self._counts is None and table in self._bounds:
            return self._bounds[table]
        return self.get(table, 0)

    def when_counted(self, callback: Callable[[dict[str, int]], None]) -> None:
        """Call ``callback`` with the exact counts once they are known: at once when they
        are, else in the counting thread when it ends, before any reader gets them (so a
        process that ends once it has read them has run it); never when counting failed
        (reading the counts raises that error). An error of ``callback`` is its own: it
        reaches neither the readers nor the log."""
        if self._counts is not None or self._pending is None:
            with contextlib.suppress(Exception):
                callback(dict(self._resolved()))
            return
        handed: Future[dict[str, int]] = Future()

        def counted(done: Future[dict[str, int]]) -> None:
            error = done.exception()
            if error is not None:
                handed.set_exception(error)
                return
            with contextlib.suppress(Exception):
                callback(dict(done.result()))
            handed.set_result(done.result())

        self._pending.add_done_callback(counted)
        self._pending = handed

    def has_rows(self, table: str) -> bool:
        """True when ``table`` exists and holds at least one row (no waiting for counts)."""
        if self._counts is not None or table not in self._nonempty:
            return self.get(table, 0) > 0
        return self._nonempty[table]


@dataclass
class TraceMeta:
    """What is known about a profile before any frame is read."""

    trace_id: str
    path: Path  # what the user passed (report, .sqlite or parquetdir)
    source_path: Path  # what frames are read from (.sqlite or parquetdir)
    source_format: str  # sqlite | parquetdir
    exporter_version: str | None = None  # nsys that wrote the export, e.g. 2022.4.2.1
    schema_version: str | None = None  # export schema, e.g. 3.0.0
    recorded_version: str | None = None  # nsys that recorded the report, when known
    session_start_utc_ns: int | None = None
    duration_ns: int | None = None
    tables: Mapping[str, int] = field(default_factory=TableCounts)  # raw table -> rows
    capture: dict[str, list[str]] = field(default_factory=dict)  # capture settings (multimap)
    missing: dict[str, str] = field(default_factory=dict)  # canonical frame -> why it is empty
    notes: list[str] = field(default_factory=list)  # other caveats found while loading
    #: timestamps were shifted at export (--ts-normalize / --ts-shift)
    time_shifted: bool = False
    #: the data-quality counts of every frame built so far (`nsysan.load.quality`): frame (or
    #: ``strings``, the StringIds lookup) -> {rows, rules: {rule: {action, rows, columns?}},
    #: notes}; see docs/data-quality.md
    quality: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: the folder of this trace's frame cache (`nsysan.load.cache`); None without one
    frame_cache: Path | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.tables, TableCounts):  # e.g. read back from a manifest
            self.tables = TableCounts(self.tables)

    def quality_summary(self) -> dict[str, dict[str, Any]]:
        """`quality` in a fixed order (canonical frames, then ``strings``), whatever order
        the frames were built in: what manifest.json and ``nsysan schema`` show."""
        order = [*schemas.CANONICAL, "strings"]
        known = [k for k in order if k in self.quality]
        return {k: self.quality[k] for k in [*known, *sorted(set(self.quality) - set(known))]}


FrameLoader = Callable[[str], pl.DataFrame]


@dataclass
class _PrefetchQueue:
    """The frames waiting for a prefetch thread, and how many threads take from them: one
    queue per trace, whatever number of `Trace.prefetch` calls filled it."""
    todo: deque[str] = field(default_factory=deque)
    threads: int = 0
    started: list[threading.Thread] = field(default_factory=list)  # (for `wait_for_prefetch`)


#: the column every frame carries first: the trace's id (the same in every row)
TRACE_ID = "trace_id"
#: integer columns the passes read row by row (group and join keys, times): kept as they are
#: even when every row holds one value, since each reader would materialise a constant
#: column again in its own copy (measured with ``device_id`` and ``pid`` constant on the
#: 10M-kernel copy: +9% wall)
_READ_PER_ROW = frozenset({
    "device_id", "pid", "tid", "global_tid", "stream_id", "correlation_id", "start_ns",
    "end_ns", "time_ns", "sample_id", "range_id", "parent_range_id", "cpu",
})


def _at_rest(frame: pl.DataFrame, trace_id: str) -> pl.DataFrame:
    """``frame`` as a `Trace` keeps it: without its leading ``trace_id`` column when that
    column holds ``trace_id`` in every row (`_handed_out` adds it back), every column that
    holds only nulls as polars' constant null column, and every integer column outside
    `_READ_PER_ROW` that holds one value in every row (``global_pid`` and ``context_id``
    of a profile of one process, API return codes) as a constant column.

    Why: a String column of one short value still costs a 16-byte view per row once polars
    materialises it (a join, a Parquet write, or a ``select`` with a literal does):
    about 50M rows, 0.8 GB, across the frames of a 10M-kernel trace, for one value. The test
    reads a constant column without materialising it. A column read from the export with no
    value (``graph_node_id`` where graphs were not traced, NVTX ``category`` and
    ``payload_json`` on most traces) held zeros and a validity mask, 8-16 bytes a row; a
    null column polars makes allocates zeroed pages that are never touched. One rank's
    profile holds one process: its ``global_pid`` alone was 8 bytes a row of gpu_ops,
    cuda_api, nvtx and sync.

    For readers: polars (1.44) expands every constant column of a frame to one value per
    row when the whole frame is filtered, joined or sorted, even when no row is kept (28
    bytes a call of cuda_api: 0.5 GB at 10M kernels, for a filter that kept nothing).
    Select the columns a step reads first, then filter; ``select(pl.all().filter(...))``
    expands only the rows it keeps."""
    if frame.columns and frame.columns[0] == TRACE_ID and frame.schema[TRACE_ID] == pl.String \
            and frame.select(pl.col(TRACE_ID).eq_missing(trace_id).all()).item():
        frame = frame.drop(TRACE_ID)  # (not when a notebook's frame mixes several traces')
    constants = _constant_columns(frame)
    return frame.with_columns(pl.lit(v, dtype=frame.schema[c]).alias(c)
                              for c, v in constants.items()) if constants else frame


def _constant_columns(frame: pl.DataFrame) -> dict[str, Any]:
    """The columns `_at_rest` keeps as constants, with their value: those holding only
    nulls (None), and the integer columns outside `_READ_PER_ROW` holding one value in
    every row. None of a frame without rows (nothing to save)."""
    if frame.is_empty():
        return {}
    counts = frame.select(pl.all().null_count()).row(0)
    constants: dict[str, Any] = {c: None for c, n in zip(frame.columns, counts, strict=True)
                                 if n == frame.height}
    full = [c for c, n in zip(frame.columns, counts, strict=True)
            if n == 0 and c not in _READ_PER_ROW and frame.schema[c].is_integer()]
    if full:  # (one pass over these columns for their least and greatest values)
        bounds = frame.select(*(pl.col(c).min().alias(f"lo{i}") for i, c in enumerate(full)),
                              *(pl.col(c).max().alias(f"hi{i}") for i, c in enumerate(full)))
        low, high = bounds.row(0)[:len(full)], bounds.row(0)[len(full):]
        constants |= {c: lo for c, lo, hi in zip(full, low, high, strict=True) if lo == hi}
    return constants


def _handed_out(frame: pl.DataFrame, trace_id: str) -> pl.DataFrame:
    """A frame kept by `_at_rest` with its ``trace_id`` column back, as polars' constant
    column: nothing is allocated per row until a reader materialises it, and then only in
    this copy of the frame, freed with it (the kept frame's columns are shared, not copied).
    A frame that kept its column (ids of several traces, or a rank view's parent id) is
    handed out as a copy too: every reader has a frame object of its own."""
    view = frame.clone()
    if TRACE_ID not in frame.columns:
        view.insert_column(0, pl.lit(trace_id, dtype=pl.String).alias(TRACE_ID))
    return view


class Trace:
    """Canonical frames of one profile.

    Frames are read from the source on first access and cached, so an analysis that needs only
    ``gpu_ops`` never pays for NVTX. Every frame has exactly its schema from `schemas.CANONICAL`.
    Each `frame` call returns a frame object of its own over the same kept columns (see
    `_at_rest`); `stored` is the kept object, for callers that compare frames by identity.
    """

    def __init__(self, meta: TraceMeta, loader: FrameLoader):
        self.meta = meta
        self._loader = loader
        self._frames: dict[str, pl.DataFrame] = {}
        # One lock per frame: a frame is built once even when a prefetch thread and the caller
        # (or a frame that depends on it, e.g. sync on cuda_api) ask for it at the same time.
        self._locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()
        self._queued: set[str] = set()  # frames `prefetch` was asked for (once each)
        self._prefetching = _PrefetchQueue()

    def __repr__(self) -> str:
        return f"Trace({self.meta.trace_id!r}, source={str(self.meta.source_path)!r})"

    def _share_frames(self, view: Trace) -> None:
        """Make ``view`` read (and build) the very frames of this trace: an
        `nsysan.frames.context.AnalysisContext` is such a view."""
        view.meta = self.meta
        view._loader = self._loader
        view._frames = self._frames
        view._locks = self._locks
        view._locks_guard = self._locks_guard
        view._queued = self._queued
        view._prefetching = self._prefetching

    @property
    def trace_id(self) -> str:
        return self.meta.trace_id

    def frame(self, name: str) -> pl.DataFrame:
        return _handed_out(self.stored(name), self.meta.trace_id)

    def stored(self, name: str) -> pl.DataFrame:
        """The frame ``name`` as this trace keeps it (built on first use): the same object
        until it is released, without the ``trace_id`` column `frame` adds (`_at_rest`)."""
        if name not in schemas.CANONICAL and name not in schemas_host.HOST_EVIDENCE:
            known = [*schemas.CANONICAL, *schemas_host.HOST_EVIDENCE]
            raise KeyError(f"unknown frame {name!r}; known: {', '.join(known)}")
        frame = self._frames.get(name)
        if frame is not None:
            return frame
        with self._locks_guard:
            lock = self._locks.setdefault(name, threading.Lock())
        with lock:
            frame = self._frames.get(name)
            if frame is None:
                frame = _at_rest(self._loader(name), self.meta.trace_id)
                self._frames[name] = frame
                trim()  # what building it freed (`nsysan.frames.heap`)
        return frame  # (not read back: a `release` in another thread may have dropped it)

    def prefetch(self, names: Iterable[str], workers: int = 2, *, first: bool = False) -> None:
        """Start building ``names`` in background threads, in the given order.

        Why: reading SQLite (`SqliteSource` bulk reads) and the polars work of building a frame
        release the GIL, so on a multi-core machine the frames of a big trace load in parallel,
        and while the first passes already run. A frame asked for before a thread got to it is
        built by the caller; a failed build is simply built again (and raises) when asked for.
        The threads are daemons: an interrupted analysis exits without waiting for them.

        All calls share one queue and its threads: a call starts threads until ``workers``
        run, so frames are built at most that many at a time (plus one a pass may be building
        in the caller's thread), and the transient copies of a build (the SQLite read, its
        sort) are held for no more frames at once: on a 10M-kernel trace they are gigabytes.
        With ``first``, ``names`` go ahead of the frames still waiting (the analysis queues
        the host frames so: otherwise, on a trace whose builds are bounded, they were built
        last, while the heaviest passes ran).
        """
        queue = self._prefetching
        with self._locks_guard:  # a frame is queued once, however often prefetch is called
            new = [n for n in dict.fromkeys(names)
                   if (n in schemas.CANONICAL or n in schemas_host.HOST_EVIDENCE)
                   and n not in self._frames
                   and n not in self._queued]
            self._queued.update(new)
            if first:
                queue.todo.extendleft(reversed(new))
            else:
                queue.todo.extend(new)
            start = max(0, min(workers - queue.threads, len(queue.todo)))
            queue.threads += start

        def work() -> None:
            while True:
                with self._locks_guard:  # (an empty queue and the thread's end: one step)
                    if not queue.todo:
                        queue.threads -= 1
                        return
                    name = queue.todo.popleft()
                with contextlib.suppress(Exception):  # the caller's own frame() reports it
                    self.stored(name)

        for _ in range(start):
            thread = threading.Thread(target=work, name="nsysan-frames", daemon=True)
            with self._locks_guard:  # (listed before it starts: a waiter cannot miss it)
                queue.started = [t for t in queue.started
                                 if t.is_alive() or t.ident is None] + [thread]
            try:
                thread.start()
            except RuntimeError:  # no thread to be had: the callers build what is left
                with self._locks_guard:
                    queue.threads -= 1
                    queue.started.remove(thread)

    def wait_for_prefetch(self) -> None:
        """Return once the prefetch threads have built every frame queued so far (a frame
        whose build failed is built again, and raises, when asked for). Nothing is built in
        the calling thread: the frames are built as many at a time as `prefetch` allowed.
        (Frames left queued because no thread could be started are the callers' to build;
        called from a prefetch thread, it does not wait for that thread.)"""
        me = threading.current_thread()
        while True:
            with self._locks_guard:
                waiting = [t for t in self._prefetching.started
                           if t is not me and (t.is_alive() or t.ident is None)]
            if not waiting:
                return
            for thread in waiting:
                if thread.ident is None:  # listed, not started yet: look again shortly
                    threading.Event().wait(0.001)
                    break
                thread.join()

    def release(self, names: Iterable[str] | None = None) -> None:
        """Forget the frames ``names`` (all by default): built ones are dropped and those
        still waiting for a prefetch thread are taken off its queue (a build already under
        way ends, and is kept); a later `frame` builds them again. For callers that go
        through many traces one after another (a job of many ranks) and must not hold every
        trace's frames at once."""
        with self._locks_guard:
            todo = self._prefetching.todo
            drop = set(self._frames) | self._queued if names is None else set(names)
            for name in drop:
                self._frames.pop(name, None)
                self._queued.discard(name)
            waiting = [n for n in todo if n not in drop]
            todo.clear()
            todo.extend(waiting)

    def lazy(self, name: str) -> pl.LazyFrame:
        return self.frame(name).lazy()

    def load_all(self) -> Trace:
        for name in schemas.CANONICAL:
            self.stored(name)
        return self

    def has(self, name: str) -> bool:
        """True when the frame was captured (it may still be empty if nothing happened)."""
        return name not in self.meta.missing

    # Convenience accessors for notebooks.
    @property
    def gpu_ops(self) -> pl.DataFrame:
        return self.frame("gpu_ops")

    @property
    def cuda_api(self) -> pl.DataFrame:
        return self.frame("cuda_api")

    @property
    def nvtx(self) -> pl.DataFrame:
        return self.frame("nvtx")

    @property
    def osrt(self) -> pl.DataFrame:
        return self.frame("osrt")

    @property
    def sync(self) -> pl.DataFrame:
        return self.frame("sync")

    @property
    def overhead(self) -> pl.DataFrame:
        return self.frame("overhead")

    @property
    def gpus(self) -> pl.DataFrame:
        return self.frame("gpus")

    @property
    def streams(self) -> pl.DataFrame:
        return self.frame("streams")

    @property
    def processes(self) -> pl.DataFrame:
        return self.frame("processes")

    @property
    def threads(self) -> pl.DataFrame:
        return self.frame("threads")

    @property
    def memory_events(self) -> pl.DataFrame:
        return self.frame("memory_events")

    @property
    def meta_frame(self) -> pl.DataFrame:
        return self.frame("meta")

    @classmethod
    def from_frames(
        cls, trace_id: str, frames: dict[str, pl.DataFrame], **meta_fields
    ) -> Trace:
        """Build a trace from in-memory frames (tests, notebooks). Absent frames are empty and
        recorded as not captured; present frames are conformed to their schema."""
        conformed: dict[str, pl.DataFrame] = {}
        missing: dict[str, str] = {}
        for name, schema in schemas.CANONICAL.items():
            if name in frames:
                df = frames[name]
                if "trace_id" not in df.columns:
                    df = df.with_columns(pl.lit(trace_id).alias("trace_id"))
                conformed[name] = schemas.conform(df, schema)
            else:
                conformed[name] = schemas.empty(schema)
                if name != "meta" and name not in schemas.OPTIONAL_FRAMES:
                    missing[name] = "not provided"
        for name, schema in schemas_host.HOST_EVIDENCE.items():  # optional: never "missing"
            df = frames.get(name)
            if df is None:
                conformed[name] = schemas.empty(schema)
                continue
            if "trace_id" not in df.columns:
                df = df.with_columns(pl.lit(trace_id).alias("trace_id"))
            conformed[name] = schemas.conform(df, schema)
        path = meta_fields.pop("path", Path(trace_id))
        meta = TraceMeta(
            trace_id=trace_id,
            path=path,
            source_path=meta_fields.pop("source_path", path),
            source_format=meta_fields.pop("source_format", "memory"),
            missing=missing,
            **meta_fields,
        )
        return cls(meta, conformed.__getitem__)
