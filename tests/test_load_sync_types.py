"""Sync records get their type from the synchronizing API, not from nsys's shifted enum."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

import nsysan
from nsysan.testing.scenarios import build


@pytest.mark.parametrize("layout", ["2022.4", "2023.4"])
def test_device_synchronize_is_a_context_sync(tmp_path: Path, layout: str) -> None:
    # The builder stores syncType with the numbering real 2022–2023 exports use
    # (cudaDeviceSynchronize = 1, which their enum table labels "event sync").
    path, _ = build("sync_in_loop", tmp_path, layout)
    trace = nsysan.open_trace(path)
    joined = trace.sync.join(
        trace.cuda_api.select("global_pid", "correlation_id", "name"),
        on=["global_pid", "correlation_id"],
    )
    assert joined.height == trace.sync.height > 0
    expected = {
        "cudaDeviceSynchronize": "context_sync",
        "cudaStreamSynchronize": "stream_sync",
        "cudaEventSynchronize": "event_sync",
        "cudaStreamWaitEvent": "stream_wait_event",
    }
    for name, sync_type in joined.select("name", "sync_type").unique().rows():
        assert sync_type == expected[name], name


def test_shared_trace_sync_types_follow_api_names(shared_traces: Path) -> None:
    path = shared_traces / "sc22-ddp-4gpu-nccl" / "4gpu_baseline.nsys-rep.nsys2022.4.2.sqlite"
    trace = nsysan.open_trace(path)
    counts = dict(trace.sync.group_by("sync_type").len().rows())
    # raw syncType 3 holds both cudaStreamSynchronize (118) and cudaStreamWaitEvent (2124)
    assert counts["stream_wait_event"] == 2124
    assert counts["stream_sync"] == 118
    waits = trace.sync.filter(pl.col("sync_type") == "stream_wait_event")
    assert waits.height == 2124
