"""`run_batch`: analyze many traces into ``OUT/<trace_id>/``, resumably, with a catalog.

The coordinating process discovers inputs, hashes them, skips the ones already done (see
`nsysan.batch.state`), hands the rest to an executor (`nsysan.batch.executors`) and writes
every outcome to the catalog as it arrives — the catalog has a single writer per batch, so
workers never contend for it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import time
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from nsysan import errors
from nsysan.batch import state
from nsysan.batch.catalog import Catalog, catalog_url
from nsysan.batch.discover import TraceInput, discover
from nsysan.batch.executors import make_executor
from nsysan.batch.progress import Progress, make_progress
from nsysan.batch.worker import RunRecord, RunTask, base_record, error_fields, utcnow
from nsysan.errors import ConfigError, NsysanError, OutputError
from nsysan.load.parquetdir import is_parquetdir
from nsysan.report.atomic import write_errors
from nsysan.report.ownership import InputPaths

ON_ERROR = ("record", "raise")


@dataclass
class BatchSummary:
    """What a batch did; ``exit_code`` is 0 when every trace is ok or skipped, else 1."""

    batch_id: str
    out_dir: Path
    catalog: str  # URL with any password hidden
    records: list[RunRecord]
    wall_s: float

    def count(self, status: str) -> int:
        return sum(r.status == status for r in self.records)

    @property
    def n_ok(self) -> int:
        return self.count("ok")

    @property
    def n_failed(self) -> int:
        return self.count("failed")

    @property
    def n_skipped(self) -> int:
        return self.count("skipped")

    @property
    def failed(self) -> list[RunRecord]:
        return [r for r in self.records if r.status == "failed"]

    @property
    def exit_code(self) -> int:
        return 1 if self.n_failed else 0


def new_batch_id() -> str:
    """Sortable and unique: UTC time to the second plus 6 random hex digits."""
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(3)


def _hash(trace: TraceInput) -> tuple[str, int]:
    return state.content_sha256(trace.path), state.input_bytes(trace.path)


def _as_error(record: RunRecord) -> NsysanError:
    """The failure of ``--on-error raise``: the trace's own error type where it is ours."""
    cls = getattr(errors, record.error_type or "", None)
    message = f"{record.trace_id}: {record.error_message}"
    if isinstance(cls, type) and issubclass(cls, NsysanError):
        return cls(message)
    return NsysanError(f"{record.trace_id}: {record.error_type}: {record.error_message}")


def _skipped(task: RunTask, marker: Mapping[str, Any], catalog: Catalog) -> RunRecord:
    """The skipped row; first restores the run that produced the outputs if the catalog lacks
    it (batch killed between the marker and the catalog write, or a new catalog URL)."""
    done = marker.get("record")
    prev = RunRecord.from_json(done) if isinstance(done, dict) else None
    if prev is not None and not catalog.has_ok_run(task.trace_id, task.skip_key):
        catalog.record(prev)
    now = utcnow()
    return base_record(
        task,
        "skipped",
        output_dir=str(task.out_dir),
        output_bytes=prev.output_bytes if prev is not None else None,
        started_utc=now,
        finished_utc=now,
        duration_s=0.0,
    )


def run_batch(
    inputs: Iterable[str | os.PathLike[str]],
    out: str | os.PathLike[str],
    *,
    jobs: int | None = None,
    executor: str = "local",
    scheduler: str | None = None,
    catalog: str | None = None,
    on_error: str = "record",
    passes: Iterable[str] | None = None,
    settings: Mapping[str, str] | None = None,
    samples_per_step: float | None = None,
    tokens_per_step: float | None = None,
    nsys: str | None = None,
    progress: bool | str | Progress | None = None,
    batch_id: str | None = None,
) -> BatchSummary:
    """Analyze every trace of ``inputs`` into ``out/<trace_id>/`` (see docs/catalog.md).

    ``catalog``: a SQLAlchemy URL or a path (default ``out/catalog.db``). ``on_error``:
    ``record`` (a failed trace is a failed row; the others go on) or ``raise`` (stop at the
    first failure and raise its error). ``progress``: None/"auto", "bar", "plain", False or a
    `Progress` object.
    """
    t0 = time.monotonic()
    if on_error not in ON_ERROR:
        raise ConfigError(f"--on-error must be one of {', '.join(ON_ERROR)}, got {on_error!r}")
    runner = make_executor(executor, jobs, scheduler)
    pass_list = tuple(passes) if passes is not None else None
    from nsysan.api import check_per_step

    check_per_step(samples_per_step=samples_per_step, tokens_per_step=tokens_per_step)
    options = {"samples_per_step": samples_per_step, "tokens_per_step": tokens_per_step}
    params = state.analysis_params(pass_list, settings, options)
    out_dir = Path(out).expanduser().resolve()
    inputs = list(inputs)
    traces = discover(inputs, exclude=[out_dir])
    # no OUT/<trace_id> may be, hold or lie inside any input of the batch (checked here for
    # all of them; each worker checks its own trace again); OUT itself, where the catalog and
    # the lock go, may hold traces but not be or lie in one (a parquetdir, a file)
    protect = InputPaths(t.path for t in traces)
    named = InputPaths(p for p in map(Path, inputs) if p.is_file() or is_parquetdir(p))
    for given in (protect, named):
        given.check(out_dir, holding=False)
    with write_errors(out_dir):
        out_dir.mkdir(parents=True, exist_ok=True)
    batch_id = batch_id or new_batch_id()
    prog = progress if hasattr(progress, "update") else make_progress(progress)  # type: ignore[arg-type]
    records: list[RunRecord] = []

    url = catalog_url(catalog, out_dir)
    with state.BatchLock(out_dir), _catalog_errors(url), Catalog(url) as cat:
        state.clean_stale(out_dir)

        def finish(record: RunRecord) -> None:
            cat.record(record)
            records.append(record)
            prog.update(record)
            if record.status == "failed" and on_error == "raise":
                raise _as_error(record)

        prog.start(len(traces))
        try:
            # Hashing reads every input: threads overlap the I/O (hashlib releases the GIL).
            with ThreadPoolExecutor(max_workers=max(1, min(runner.jobs, 8))) as pool:
                hashed = list(pool.map(lambda t: _safe_hash(t), traces))
            pending: list[RunTask] = []
            for trace, (digest, size, exc) in zip(traces, hashed, strict=True):
                key = state.skip_key(digest, params) if digest else ""
                task = RunTask(
                    trace_id=trace.trace_id,
                    path=str(trace.path),
                    format=trace.format,
                    group=trace.group,
                    out_root=str(out_dir),
                    batch_id=batch_id,
                    sha256=digest,
                    skip_key=key,
                    input_bytes=size,
                    params=params,
                    passes=pass_list,
                    settings=tuple(sorted((settings or {}).items())),
                    nsys=nsys,
                    aliases=tuple(str(p) for p in trace.aliases),
                )
                why = protect.conflict(task.out_dir)
                if exc is None and why is not None:
                    exc = OutputError(f"{task.out_dir}: refusing to write there: {why}; "
                                      "choose another -o")
                if exc is not None:
                    now = utcnow()
                    finish(base_record(task, "failed", started_utc=now, finished_utc=now,
                                       duration_s=0.0, **error_fields(exc)))
                elif (marker := state.is_done(task.out_dir, key)) is not None:
                    finish(_skipped(task, marker, cat))
                else:
                    pending.append(task)
            with contextlib.closing(runner.run(pending)) as results:
                for record in results:
                    finish(record)
        finally:
            prog.close()
    return BatchSummary(
        batch_id=batch_id,
        out_dir=out_dir,
        catalog=cat.display_url,
        records=records,
        wall_s=time.monotonic() - t0,
    )


@contextlib.contextmanager
def _catalog_errors(url: str) -> Iterator[None]:
    """A database error of the catalog (its disk full, the server gone) as one line."""
    import sqlalchemy as sa

    try:
        yield
    except sa.exc.DBAPIError as exc:
        shown = sa.make_url(url).render_as_string(hide_password=True)
        first = (str(getattr(exc, "orig", exc)).strip().splitlines() or [""])[0]
        raise NsysanError(f"catalog {shown}: {first}: check its file system (free space, "
                          "permissions) or database, or choose another --catalog") from None


def _safe_hash(trace: TraceInput) -> tuple[str, int, BaseException | None]:
    """(sha256, bytes, None), or ("", 0, error) when the input cannot be read (a named pipe
    or a device is refused before it is opened: reading it would block or never end)."""
    from nsysan.load import check_openable

    try:
        check_openable(trace.path)
    except errors.TraceFormatError as exc:
        return "", 0, exc
    try:
        digest, size = _hash(trace)
        return digest, size, None
    except OSError as exc:
        return "", 0, errors.TraceFormatError(
            f"{trace.path}: cannot read input ({exc.strerror or exc})"
        )
