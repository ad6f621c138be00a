"""Batch progress: a rich bar on a terminal, periodic plain lines elsewhere (CI logs).

Both show done/total, ok/failed/skipped counts, throughput (analyzed traces per minute,
skips excluded: they cost nothing) and the ETA from that throughput.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Protocol, TextIO

from nsysan.batch.worker import RunRecord


class Progress(Protocol):
    def start(self, total: int) -> None: ...
    def update(self, record: RunRecord) -> None: ...
    def close(self) -> None: ...


class _Counts:
    def __init__(self) -> None:
        self.total = 0
        self.ok = self.failed = self.skipped = 0
        self.t0 = time.monotonic()

    @property
    def done(self) -> int:
        return self.ok + self.failed + self.skipped

    def add(self, record: RunRecord) -> None:
        if record.status == "ok":
            self.ok += 1
        elif record.status == "skipped":
            self.skipped += 1
        else:
            self.failed += 1

    def rate_per_min(self) -> float | None:
        analyzed = self.ok + self.failed
        elapsed = time.monotonic() - self.t0
        return analyzed / elapsed * 60 if analyzed and elapsed > 0 else None

    def eta_s(self) -> float | None:
        rate = self.rate_per_min()
        return (self.total - self.done) / rate * 60 if rate else None

    def line(self) -> str:
        rate = self.rate_per_min()
        eta = self.eta_s()
        parts = [
            f"{self.done}/{self.total} traces",
            f"ok {self.ok}, failed {self.failed}, skipped {self.skipped}",
            f"{rate:.1f}/min" if rate else "-/min",
            f"elapsed {_fmt_s(time.monotonic() - self.t0)}",
            f"eta {_fmt_s(eta)}" if eta is not None and self.done < self.total else "",
        ]
        return "batch: " + " | ".join(p for p in parts if p)


def _fmt_s(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = round(seconds)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class NullProgress:
    def start(self, total: int) -> None:
        pass

    def update(self, record: RunRecord) -> None:
        pass

    def close(self) -> None:
        pass


class PlainProgress:
    """A line at start, after each failure, every ``interval_s`` seconds, and at the end."""

    def __init__(self, stream: TextIO | None = None, interval_s: float = 30.0):
        self.stream = stream or sys.stderr
        self.interval_s = interval_s
        self.counts = _Counts()
        self._last = 0.0

    def _emit(self, text: str) -> None:
        print(text, file=self.stream, flush=True)

    def start(self, total: int) -> None:
        self.counts = _Counts()
        self.counts.total = total
        self._last = time.monotonic()
        self._emit(self.counts.line())

    def update(self, record: RunRecord) -> None:
        self.counts.add(record)
        if record.status == "failed":
            self._emit(f"batch: FAILED {record.trace_id}: {record.error_type}: "
                       f"{record.error_message}")
        now = time.monotonic()
        if now - self._last >= self.interval_s:
            self._last = now
            self._emit(self.counts.line())

    def close(self) -> None:
        self._emit(self.counts.line())


class RichProgress:
    """A live bar (rich) with counts, throughput and ETA, for terminals."""

    def __init__(self, stream: TextIO | None = None):
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )
        from rich.progress import Progress as RichBar

        self.counts = _Counts()
        self._bar = RichBar(
            TextColumn("[bold]batch"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("ok {task.fields[ok]} · failed {task.fields[failed]} · "
                       "skipped {task.fields[skipped]} · {task.fields[rate]}"),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=Console(file=stream or sys.stderr),
            transient=False,
        )
        self._task: Any = None

    def _fields(self) -> dict[str, Any]:
        rate = self.counts.rate_per_min()
        return {"ok": self.counts.ok, "failed": self.counts.failed,
                "skipped": self.counts.skipped, "rate": f"{rate:.1f}/min" if rate else "-/min"}

    def start(self, total: int) -> None:
        self.counts = _Counts()
        self.counts.total = total
        self._bar.start()
        self._task = self._bar.add_task("batch", total=total, **self._fields())

    def update(self, record: RunRecord) -> None:
        self.counts.add(record)
        if record.status == "failed":
            from rich.text import Text

            # Text, not markup: ids and messages may contain "[...]".
            self._bar.console.print(Text.assemble(
                ("FAILED ", "red"),
                f"{record.trace_id}: {record.error_type}: {record.error_message}",
            ))
        self._bar.update(self._task, completed=self.counts.done, **self._fields())

    def close(self) -> None:
        self._bar.stop()


def make_progress(mode: bool | str | None, stream: TextIO | None = None) -> Progress:
    """``None``/``"auto"``: a bar when the stream is a terminal, else plain lines;
    ``True``/``"bar"``, ``"plain"``; ``False``/``"none"``: silent."""
    stream = stream or sys.stderr
    if mode in (False, "none"):
        return NullProgress()
    if mode in (None, "auto"):
        mode = "bar" if getattr(stream, "isatty", lambda: False)() else "plain"
    if mode in (True, "bar"):
        return RichProgress(stream)
    if mode == "plain":
        return PlainProgress(stream)
    raise ValueError(f"unknown progress mode {mode!r}")
