"""report.html's timeline is built while the findings are drawn (`nsysan.api._write_outputs`,
`nsysan.passes.schedule.overlap_outputs`): the same bytes as when it is built after them."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from nsysan.api import analyze_to_dir
from nsysan.passes import schedule
from nsysan.report import html_data

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "example_ddp.sqlite"


def _run(tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch) -> tuple[bytes, list[str]]:
    threads: list[str] = []
    build = html_data.timeline_payload

    def recording(trace, tables):
        threads.append(threading.current_thread().name)
        return build(trace, tables)

    monkeypatch.setattr(html_data, "timeline_payload", recording)
    _, folder = analyze_to_dir(FIXTURE, tmp_path / name, frame_cache=False)
    return (folder / "report.html").read_bytes(), threads


def test_the_page_built_beside_the_findings_is_the_page_built_after_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(schedule.os, "cpu_count", lambda: 2)
    monkeypatch.delenv(schedule.WORKERS_ENV, raising=False)
    beside, threads = _run(tmp_path, "beside", monkeypatch)
    assert threads and all(t.startswith("nsysan-outputs") for t in threads)

    monkeypatch.setenv(schedule.WORKERS_ENV, "1")  # one thing at a time: no overlap
    after, threads = _run(tmp_path, "after", monkeypatch)
    assert threads == [threading.current_thread().name]
    assert beside == after


def test_no_overlap_on_one_core_or_above_the_size_bound(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(schedule.WORKERS_ENV, raising=False)
    from nsysan.load import open_trace

    trace = open_trace(FIXTURE, frame_cache=False)
    monkeypatch.setattr(schedule.os, "cpu_count", lambda: 1)
    assert not schedule.overlap_outputs(trace)
    monkeypatch.setattr(schedule.os, "cpu_count", lambda: 2)
    assert schedule.overlap_outputs(trace)
    monkeypatch.setattr(schedule, "CONCURRENT_MAX_OPS", 0)
    assert not schedule.overlap_outputs(trace)
