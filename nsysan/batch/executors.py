"""Where `run_one` runs: local processes or a Dask cluster, behind one interface.

Both executors take the same `RunTask` list and yield the same `RunRecord`s as traces finish
(in completion order); the coordinating process does everything else (skip decisions, the
catalog, progress). Memory stays bounded: one trace at a time per worker.

* `LocalExecutor` — ``jobs`` worker processes, **a fresh process per trace** (``spawn``), so
  a trace's memory is returned to the OS when it finishes and a crash (segfault, OOM kill) is
  attributed to exactly that trace. Workers die with the coordinator (Linux
  ``PR_SET_PDEATHSIG``), so a killed batch leaves no orphan still writing outputs.
  ``jobs == 1`` runs in-process (no isolation; handy under a debugger).
* `DaskExecutor` — a ``dask.distributed`` client: ``scheduler`` is the address of an existing
  cluster (start its workers with ``--nthreads 1`` to keep one trace per worker), or a
  ``LocalCluster(n_workers=jobs, threads_per_worker=1, processes=True)`` when none is given.

Each worker process gets ``POLARS_MAX_THREADS = cpu_count // jobs`` (unless already set), so
``jobs`` concurrent traces do not each start a thread per core.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import multiprocessing.connection
import os
import signal
import sys
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

from nsysan.batch.worker import RunRecord, RunTask, failed_record, run_one
from nsysan.errors import ConfigError

WorkFn = Callable[[RunTask], RunRecord]
EXECUTORS = ("local", "dask")


class Executor(Protocol):
    name: str
    jobs: int

    def run(self, tasks: Iterable[RunTask], fn: WorkFn = run_one) -> Iterator[RunRecord]:
        """Run ``fn`` on every task; yield one record per task as each finishes."""
        ...


def default_jobs() -> int:
    return max(1, os.cpu_count() or 1)


def _worker_env(jobs: int) -> dict[str, str]:
    if "POLARS_MAX_THREADS" in os.environ:
        return {}
    return {"POLARS_MAX_THREADS": str(max(1, default_jobs() // max(1, jobs)))}


@contextlib.contextmanager
def _environ(extra: dict[str, str]) -> Iterator[None]:
    """Set env vars around a spawn: a spawned child copies the environment at start time."""
    old = {k: os.environ.get(k) for k in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _die_with_parent(parent_pid: int) -> None:
    """Ask Linux to SIGKILL this process when its parent dies (no orphans after a kill)."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def _child_main(fn: WorkFn, task: RunTask, conn: Any, parent_pid: int) -> None:
    _die_with_parent(parent_pid)
    try:
        record = fn(task)
    except BaseException as exc:  # run_one never raises; a custom fn might
        record = failed_record(task, exc)
    conn.send(record)
    conn.close()


def _describe_exit(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        hint = " (out of memory?)" if -code == signal.SIGKILL else ""
        return f"worker process was killed by {name}{hint}"
    return f"worker process exited with code {code} before reporting a result"


class LocalExecutor:
    """A fresh spawned process per trace, at most ``jobs`` at once (in-process when 1)."""

    name = "local"

    def __init__(self, jobs: int | None = None):
        self.jobs = jobs or default_jobs()

    def run(self, tasks: Iterable[RunTask], fn: WorkFn = run_one) -> Iterator[RunRecord]:
        if self.jobs == 1:
            for task in tasks:
                try:
                    record = fn(task)
                except Exception as exc:  # run_one never raises; a custom fn might
                    record = failed_record(task, exc)
                yield record
            return
        ctx = mp.get_context("spawn")
        queue = deque(tasks)
        running: dict[Any, tuple[Any, RunTask]] = {}  # read end -> (process, task)
        env = _worker_env(self.jobs)
        try:
            while queue or running:
                while queue and len(running) < self.jobs:
                    task = queue.popleft()
                    reader, writer = ctx.Pipe(duplex=False)
                    proc = ctx.Process(
                        target=_child_main,
                        args=(fn, task, writer, os.getpid()),
                        name=f"nsysan-batch:{task.trace_id}",
                        daemon=False,  # joined or terminated below; may run nsys itself
                    )
                    with _environ(env):
                        proc.start()
                    # Close our copy of the write end so the reader sees EOF if the child dies.
                    writer.close()
                    running[reader] = (proc, task)
                for reader in multiprocessing.connection.wait(list(running)):
                    proc, task = running.pop(reader)
                    try:
                        record = reader.recv()
                    except (EOFError, OSError):
                        proc.join()
                        record = failed_record(
                            task, message=_describe_exit(proc.exitcode), error_type="WorkerError"
                        )
                    finally:
                        reader.close()
                    proc.join()
                    yield record
        finally:
            # Interrupted (Ctrl-C, --on-error raise, consumer stopped): stop what still runs.
            for proc, _ in running.values():
                if proc.is_alive():
                    proc.terminate()
            for reader, (proc, _) in running.items():
                proc.join()
                reader.close()


class DaskExecutor:
    """`run_one` on a ``dask.distributed`` cluster (existing, or a local one we start)."""

    name = "dask"

    def __init__(self, jobs: int | None = None, scheduler: str | None = None):
        # Checked here, before the batch writes anything: Dask is an extra.
        try:
            import distributed  # noqa: F401
        except ImportError:
            raise ConfigError(
                "--executor dask needs dask.distributed: pip install 'nsysan[dask]'"
            ) from None
        self.jobs = jobs or default_jobs()
        self.scheduler = scheduler

    def _client(self) -> tuple[Any, Any]:
        from distributed import Client, LocalCluster
        if self.scheduler:
            try:
                return Client(self.scheduler, timeout="15s"), None
            except (OSError, TimeoutError) as exc:
                raise ConfigError(
                    f"cannot connect to the Dask scheduler at {self.scheduler}: {exc}; start one "
                    "(`dask scheduler` + `dask worker ADDRESS --nthreads 1`) or omit --scheduler "
                    "for a local cluster"
                ) from None
        cluster = LocalCluster(
            n_workers=self.jobs,
            threads_per_worker=1,  # one trace at a time per worker: bounded memory
            processes=True,
            dashboard_address=None,
            silence_logs=logging.ERROR,
            env=_worker_env(self.jobs),
        )
        return Client(cluster), cluster

    def run(self, tasks: Iterable[RunTask], fn: WorkFn = run_one) -> Iterator[RunRecord]:
        from distributed import as_completed

        tasks = list(tasks)
        if not tasks:
            return
        client, cluster = self._client()
        futures: list[Any] = []
        try:
            by_key: dict[str, RunTask] = {}
            for task in tasks:
                key = f"nsysan-run-{task.trace_id}-{uuid.uuid4().hex[:8]}"
                fut = client.submit(fn, task, key=key, pure=False, retries=0)
                by_key[fut.key] = task
                futures.append(fut)
            for fut in as_completed(futures):
                task = by_key[fut.key]
                try:
                    record = fut.result()
                except Exception as exc:  # KilledWorker, lost connection, ...
                    record = failed_record(
                        task,
                        message=f"dask worker failed ({type(exc).__name__}): {exc}".strip(),
                        error_type="WorkerError",
                    )
                yield record
        finally:
            pending = [f for f in futures if not f.done()]
            if pending:
                client.cancel(pending)
            client.close()
            if cluster is not None:
                cluster.close()


def make_executor(kind: str, jobs: int | None = None, scheduler: str | None = None) -> Executor:
    if jobs is not None and jobs < 1:
        raise ConfigError(f"--jobs must be at least 1, got {jobs}")
    if kind == "local":
        if scheduler:
            raise ConfigError("--scheduler needs --executor dask")
        return LocalExecutor(jobs)
    if kind == "dask":
        return DaskExecutor(jobs, scheduler)
    raise ConfigError(f"unknown executor {kind!r}; choose one of: {', '.join(EXECUTORS)}")
