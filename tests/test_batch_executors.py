"""Executors without real analysis: failure isolation of the local process executor, the
in-process path, and progress output."""

from __future__ import annotations

import io
import os
import signal

import pytest

from nsysan.batch.executors import LocalExecutor, make_executor
from nsysan.batch.progress import NullProgress, PlainProgress, make_progress
from nsysan.batch.worker import RunRecord, RunTask, base_record, failed_record
from nsysan.errors import ConfigError


def task(trace_id: str) -> RunTask:
    return RunTask(trace_id=trace_id, path=f"/x/{trace_id}", format="sqlite", group="",
                   out_root="/nonexistent", batch_id="b", sha256="0" * 64, skip_key="k",
                   input_bytes=1, params={"passes": [], "params": {}, "options": {}})


def fake_work(t: RunTask) -> RunRecord:
    """Module level so spawned workers can import it."""
    if t.trace_id == "segv":
        os.kill(os.getpid(), signal.SIGKILL)  # as the OOM killer would
    if t.trace_id == "exit":
        os._exit(3)
    if t.trace_id == "raise":
        raise RuntimeError("boom")
    return base_record(t, "ok", worker=str(os.getpid()))


@pytest.mark.parametrize("jobs", [1, 2])
def test_one_failing_worker_never_stops_the_others(jobs):
    names = ["a", "raise", "b", "c"] if jobs == 1 else ["a", "segv", "b", "exit", "raise", "c"]
    records = {r.trace_id: r for r in LocalExecutor(jobs).run([task(n) for n in names], fake_work)}
    assert set(records) == set(names)
    for name in ("a", "b", "c"):
        assert records[name].status == "ok"
    assert records["raise"].status == "failed"
    assert records["raise"].error_message == "internal error: RuntimeError: boom"
    assert "Traceback" in records["raise"].error_detail
    if jobs == 2:
        killed = "worker process was killed by SIGKILL (out of memory?)"
        assert records["segv"].error_message == killed
        assert "exited with code 3" in records["exit"].error_message
        # A fresh process per trace: no two traces share a worker.
        pids = [records[n].worker for n in ("a", "b", "c")]
        assert len(set(pids)) == 3 and str(os.getpid()) not in pids
    else:
        assert {records[n].worker for n in ("a", "b", "c")} == {str(os.getpid())}


def test_make_executor_validates():
    assert make_executor("local", 3).jobs == 3
    assert make_executor("dask", 2, "tcp://h:1").scheduler == "tcp://h:1"
    with pytest.raises(ConfigError, match="--scheduler needs"):
        make_executor("local", 1, "tcp://h:1")


def test_record_json_roundtrip():
    rec = failed_record(task("t"), message="gone", error_type="WorkerError")
    back = RunRecord.from_json(rec.to_json())
    assert back == rec


def test_plain_progress_lines():
    stream = io.StringIO()
    prog = PlainProgress(stream, interval_s=0)
    prog.start(3)
    prog.update(base_record(task("a"), "ok"))
    prog.update(failed_record(task("b"), message="bad input", error_type="TraceFormatError"))
    prog.update(base_record(task("c"), "skipped"))
    prog.close()
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("batch: 0/3 traces")
    assert "batch: FAILED b: TraceFormatError: bad input" in lines
    assert lines[-1].startswith("batch: 3/3 traces | ok 1, failed 1, skipped 1")
    assert "eta" not in lines[-1]


def test_progress_mode_follows_the_terminal():
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert isinstance(make_progress(None, io.StringIO()), PlainProgress)
    assert type(make_progress("auto", Tty())).__name__ == "RichProgress"
    assert isinstance(make_progress(False), NullProgress)
    bar = make_progress("bar", Tty())
    bar.start(1)
    bar.update(failed_record(task("[x]"), message="m [y]"))
    bar.close()


def test_a_worker_waits_for_the_frame_cache_before_its_next_trace(tmp_path, monkeypatch):
    """The frame cache is written in background threads that hold the trace's frames: a
    worker (a Dask worker runs its traces one after another) waits for them before it
    returns, so two traces' frames are never held at once."""
    from nsysan.batch.worker import run_one
    from nsysan.load import cache
    from nsysan.testing import host_scenarios as hs

    path, _ = hs.cpu_bound_input(tmp_path / "t.sqlite")
    calls: list[str] = []
    original = cache.flush
    monkeypatch.setattr(cache, "flush", lambda: (calls.append("flush"), original())[1])
    t = RunTask(trace_id="t", path=str(path), format="sqlite", group="",
                out_root=str(tmp_path / "out"), batch_id="b", sha256="0" * 64, skip_key="k",
                input_bytes=path.stat().st_size,
                params={"passes": [], "params": {}, "options": {}},
                passes=("gaps", "kernels"))
    record = run_one(t)
    assert record.status == "ok", record
    assert calls == ["flush"]
