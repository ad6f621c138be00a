"""The unit of batch work: `run_one(task) -> RunRecord`, identical under every executor.

`run_one` never raises: any failure becomes a ``failed`` record carrying the error type and a
one-line message, so one broken trace never stops the others. Both `RunTask` and `RunRecord`
are plain picklable dataclasses (they cross process and Dask boundaries).
"""

from __future__ import annotations

import dataclasses
import os
import socket
import time
import traceback
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from nsysan._version import __version__
from nsysan.batch import state
from nsysan.batch.summary import extra_metrics, finding_rows, json_safe, summary_metrics
from nsysan.errors import NsysanError


@dataclass(frozen=True)
class RunTask:
    """Everything a worker needs to analyze one trace (no open handles: it is pickled)."""

    trace_id: str
    path: str
    format: str
    group: str
    out_root: str
    batch_id: str
    sha256: str
    skip_key: str
    input_bytes: int
    params: dict[str, Any]  # analysis_params(): resolved passes, params, options
    passes: tuple[str, ...] | None = None  # as given by the user (None: defaults)
    settings: tuple[tuple[str, str], ...] = ()
    nsys: str | None = None
    nsysan_version: str = __version__  # the coordinator's: part of the skip key
    #: the capture's other forms (report / exports beside the analysed one), as paths
    aliases: tuple[str, ...] = ()

    @property
    def run_id(self) -> str:
        return f"{self.batch_id}:{self.trace_id}"

    @property
    def out_dir(self) -> Path:
        return Path(self.out_root) / self.trace_id


@dataclass
class RunRecord:
    """The outcome of one trace in one batch: one row of the catalog's ``runs`` table, plus
    what goes into ``traces``, ``metrics`` and ``findings``."""

    run_id: str
    batch_id: str
    trace_id: str
    status: str  # ok | failed | skipped
    input_path: str
    input_format: str
    group: str = ""
    sha256: str | None = None
    skip_key: str | None = None
    input_bytes: int | None = None
    output_dir: str | None = None
    output_bytes: int | None = None
    started_utc: datetime | None = None
    finished_utc: datetime | None = None
    duration_s: float | None = None
    error_type: str | None = None
    error_message: str | None = None
    error_detail: str | None = None  # traceback of unexpected (non-nsysan) errors
    nsysan_version: str = __version__
    params_json: str | None = None
    worker: str | None = None  # host:pid that ran it
    peak_rss_bytes: int | None = None
    trace_meta: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)  # summary.METRIC_COLUMNS
    extra_metrics: dict[str, Any] = field(default_factory=dict)  # the passes' own scalars
    findings: list[dict[str, Any]] = field(default_factory=list)
    timings_s: dict[str, float] = field(default_factory=dict)
    aliases: list[str] = field(default_factory=list)  # RunTask.aliases

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        for key in ("started_utc", "finished_utc"):
            value = data[key]
            data[key] = value.isoformat() if value is not None else None
        return json_safe(data)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunRecord:
        names = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in names}
        for key in ("started_utc", "finished_utc"):
            if isinstance(kwargs.get(key), str):
                kwargs[key] = datetime.fromisoformat(kwargs[key])
        return cls(**kwargs)


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def base_record(task: RunTask, status: str, **fields: Any) -> RunRecord:
    return RunRecord(
        run_id=task.run_id,
        batch_id=task.batch_id,
        trace_id=task.trace_id,
        status=status,
        input_path=task.path,
        input_format=task.format,
        group=task.group,
        sha256=task.sha256,
        skip_key=task.skip_key,
        input_bytes=task.input_bytes,
        params_json=state.canonical_json(task.params),
        aliases=list(task.aliases),
        **fields,
    )


def error_fields(exc: BaseException) -> dict[str, Any]:
    """error_type / one-line message / traceback for a record."""
    if isinstance(exc, NsysanError):
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return {"error_type": type(exc).__name__, "error_message": message}
    # Unexpected: keep the type in the message and the traceback for a bug report.
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return {
        "error_type": type(exc).__name__,
        "error_message": f"internal error: {type(exc).__name__}: {text}".rstrip(": "),
        "error_detail": "".join(traceback.format_exception(exc))[-8000:],
    }


def failed_record(task: RunTask, exc: BaseException | None = None, *, message: str | None = None,
                  error_type: str = "WorkerError") -> RunRecord:
    """A failed record for a task whose worker could not report (crash, lost worker, ...)."""
    fields = error_fields(exc) if exc is not None else {
        "error_type": error_type, "error_message": message}
    now = utcnow()
    return base_record(task, "failed", started_utc=now, finished_utc=now, duration_s=0.0,
                       **fields)


def _peak_rss_bytes() -> int | None:
    try:
        import resource
    except ImportError:  # not on POSIX
        return None
    # ru_maxrss is KiB on Linux: the peak of this worker process (one trace per process).
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def _trace_meta(trace: Any) -> dict[str, Any]:
    meta = trace.meta
    return json_safe(
        {
            "source_format": meta.source_format,
            "exporter_version": meta.exporter_version,
            "schema_version": meta.schema_version,
            "recorded_version": meta.recorded_version,
            "session_start_utc_ns": meta.session_start_utc_ns,
            "duration_ns": meta.duration_ns,
        }
    )


def run_one(task: RunTask) -> RunRecord:
    """Analyze one trace into ``OUT/<trace_id>/`` and mark it done; never raises."""
    started = utcnow()
    t0 = time.perf_counter()
    worker = f"{socket.gethostname()}:{os.getpid()}"
    try:
        if task.nsysan_version != __version__:
            # A Dask worker with another install would write outputs under a wrong skip key.
            raise NsysanError(
                f"worker {worker} runs nsysan {__version__}, the batch was started with "
                f"{task.nsysan_version}: install the same version on every worker"
            )
        from nsysan.api import analyze_to_dir
        from nsysan.load import open_trace

        trace = open_trace(task.path, nsys=task.nsys, trace_id=task.trace_id)
        options = task.params.get("options", {})
        # Exactly what `nsysan analyze TRACE -o OUT` does, under the batch's trace id.
        result, out_dir = analyze_to_dir(
            trace,
            task.out_root,
            passes=task.passes,
            settings=dict(task.settings),
            nsys=task.nsys,
            **{k: v for k, v in options.items() if k in ("samples_per_step", "tokens_per_step")},
        )
        # The frame cache is written in the background; a worker's next trace must not start
        # while this one's frames are still held for it (a Dask worker runs one after another).
        from nsysan.load import cache

        cache.flush()
        findings = result.findings
        record = base_record(
            task,
            "ok",
            output_dir=str(out_dir),
            started_utc=started,
            worker=worker,
            trace_meta=_trace_meta(result.trace),
            metrics=summary_metrics(result.tables, findings, result.diagnosis),
            extra_metrics=extra_metrics(result.metrics, result.diagnosis),
            findings=finding_rows(findings),
            timings_s={k: round(v, 6) for k, v in result.timings_s.items()},
        )
        # The marker must describe complete outputs: sizes first, then the marker, last.
        record.output_bytes = state.tree_bytes(out_dir)
        record.finished_utc = utcnow()
        record.duration_s = time.perf_counter() - t0
        record.peak_rss_bytes = _peak_rss_bytes()
        state.write_marker(out_dir, {"skip_key": task.skip_key, "record": record.to_json()})
        return record
    except Exception as exc:
        return base_record(
            task,
            "failed",
            started_utc=started,
            finished_utc=utcnow(),
            duration_s=time.perf_counter() - t0,
            worker=worker,
            peak_rss_bytes=_peak_rss_bytes(),
            **error_fields(exc),
        )
