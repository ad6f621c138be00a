"""The issue's acceptance run: `nsysan batch` over all of ../shared/traces with --jobs 2.

Slow (about 2.5 minutes on 2 cores, nsys exports included) but run in CI: the shared traces
and nsys are required there. Reports that the installed nsys (2022.4) cannot read must fail
alone with an ExportError; everything else must succeed; a second run must skip every
finished trace.
"""

from __future__ import annotations

import time

import pytest

from nsysan.batch import queries, state
from nsysan.batch.catalog import Catalog, catalog_url
from nsysan.batch.discover import discover
from nsysan.batch.run import run_batch

pytestmark = [pytest.mark.slow, pytest.mark.shared, pytest.mark.nsys]


def test_batch_over_all_shared_traces(shared_traces, nsys_bin, tmp_path, monkeypatch):
    monkeypatch.setenv("NSYSAN_CACHE_DIR", str(tmp_path / "export-cache"))  # cold exports
    out = tmp_path / "out"
    traces = discover([shared_traces])
    t0 = time.monotonic()
    first = run_batch([shared_traces], out, jobs=2, nsys=str(nsys_bin), progress="plain")
    first_s = time.monotonic() - t0

    assert sorted(r.trace_id for r in first.records) == sorted(t.trace_id for t in traces)
    for rec in first.records:
        if rec.input_format in ("sqlite", "parquetdir"):
            assert rec.status == "ok", (rec.trace_id, rec.error_message)
        if rec.status == "failed":
            # Only reports too new for the installed nsys may fail, each with a clear reason.
            assert rec.input_format in ("nsys-rep", "qdrep"), rec.trace_id
            assert rec.error_type == "ExportError", (rec.trace_id, rec.error_message)
            assert "newer" in rec.error_message, rec.error_message
        else:
            marker = state.read_marker(out / rec.trace_id)
            assert marker is not None and marker["skip_key"] == rec.skip_key
            assert list((out / rec.trace_id).glob("*.parquet"))
    assert first.n_ok >= len(traces) - 5  # 4 reports are too new for nsys 2022.4 today
    with Catalog(catalog_url(None, out)) as cat:
        per_trace = queries.run_sql(
            cat, "SELECT trace_id, COUNT(*) FROM runs GROUP BY trace_id").rows
        assert sorted(per_trace) == sorted((t.trace_id, 1) for t in traces)
        n_metrics = queries.run_sql(cat, "SELECT COUNT(*) FROM metrics").rows[0][0]
        assert n_metrics == first.n_ok
        assert queries.findings_of(cat, "*").rows  # real traces do have findings

    mtimes = {p: p.stat().st_mtime_ns for p in out.glob("*/*.parquet")}
    t0 = time.monotonic()
    second = run_batch([shared_traces], out, jobs=2, nsys=str(nsys_bin), progress=False)
    second_s = time.monotonic() - t0
    by_id = {r.trace_id: r for r in second.records}
    for rec in first.records:
        again = by_id[rec.trace_id]
        assert again.status == ("skipped" if rec.ok else "failed"), rec.trace_id
        if not rec.ok:
            assert again.error_message == rec.error_message
    assert {p: p.stat().st_mtime_ns for p in out.glob("*/*.parquet")} == mtimes
    print(f"\nbatch over {len(traces)} shared traces: first {first_s:.1f} s "
          f"({first.n_ok} ok, {first.n_failed} failed), second {second_s:.1f} s "
          f"({second.n_skipped} skipped)")
