"""`write_report`: every human and machine report of one trace, next to its Parquet tables.

Writes findings.md, findings.json, the pictures (timeline_device<N>.png per device,
layers.png, report.html) and, last, manifest.json (which lists and hashes everything else in
the directory, Parquet tables included). Each file is written atomically.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from nsysan.frames.trace import Trace
from nsysan.passes.base import PassResult
from nsysan.passes.schedule import analysis_context
from nsysan.report import html_data, plots
from nsysan.report.jsonout import write_findings_json
from nsysan.report.manifest import (
    ManifestInfo,
    digest_folders,
    inputs_of,
    prefetch_sha256,
    write_manifest,
)
from nsysan.report.markdown import write_markdown


def _unpack(trace: Trace, trace_or_result: Any, results: Mapping[str, PassResult] | None,
            diagnosis: Any, info: ManifestInfo | Mapping[str, Any] | None):
    """Accept either (trace, results, diagnosis, info) or one `nsysan.api.AnalysisResult`
    (``trace``: the context of the trace the reports are of)."""
    if not isinstance(trace_or_result, Trace):
        r = trace_or_result
        results = r.results
        diagnosis = diagnosis if diagnosis is not None else r.diagnosis
        if info is None:
            info = ManifestInfo(params=r.params, timings_s=r.timings_s, options=r.options)
    if results is None:
        raise TypeError("write_report needs the pass results")
    if diagnosis is None:  # the reports render findings; drawing them is the caller's part
        raise TypeError("write_report needs the diagnosis: nsysan.findings.diagnose(trace, "
                        "results), or an AnalysisResult of analyze(findings=True)")
    if isinstance(info, Mapping):
        info = ManifestInfo(**info)
    info = info or ManifestInfo()
    if info.findings_params is None:
        info.findings_params = diagnosis.params
    return trace, results, diagnosis, info


def write_report(out_dir: str | Path, trace_or_result: Any,
                 results: Mapping[str, PassResult] | None = None, diagnosis: Any = None,
                 manifest_info: ManifestInfo | Mapping[str, Any] | None = None,
                 before_manifest: Callable[[], object] | None = None,
                 perfetto: bool = False,
                 timeline: Callable[[], dict[str, Any]] | None = None) -> list[Path]:
    """Write the reports of one trace into ``out_dir``; returns the paths written.

    Call it after the Parquet tables are in ``out_dir`` so that the manifest hashes them too,
    or while they are being written, with ``before_manifest`` waiting for them: it is called
    just before the manifest lists the directory. With ``perfetto``, the annotated timeline
    ``trace.pftrace`` is written too (`nsysan.report.perfetto`; needs ``nsysan[perfetto]``).
    ``timeline``: returns the page's `html_data.timeline_payload` of these results, when the
    caller started building it earlier (the result of a future, say).
    """
    t_start = time.perf_counter()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    # the pictures share the unions of the GPU ops with the passes and the findings: through
    # the analysis' context, or one of their own
    base = trace_or_result if isinstance(trace_or_result, Trace) else trace_or_result.trace
    with analysis_context(base) as trace:
        return _write(out, t_start, *_unpack(trace, trace_or_result, results, diagnosis,
                                             manifest_info), before_manifest, perfetto,
                      timeline)


def _write(out: Path, t_start: float, trace: Trace, results: Mapping[str, PassResult],
           diagnosis: Any, info: ManifestInfo,
           before_manifest: Callable[[], object] | None, perfetto: bool,
           timeline: Callable[[], dict[str, Any]] | None) -> list[Path]:
    # The manifest hashes the inputs (a second per GB): started now, in a background thread,
    # the hash overlaps the pictures instead of following them (nothing new is started when
    # `analyze(hash_inputs=True)` prefetched them already; see `prefetch_sha256`).
    prefetch_sha256(inputs_of(trace, info), digest_folders(trace))
    tables = {n: df for r in results.values() for n, df in r.tables.items()}
    layers = tables.get("layers")
    written: list[Path] = []
    window = ((diagnosis.baseline.window_start_ns, diagnosis.baseline.window_end_ns)
              if diagnosis.baseline.window_start_ns is not None else None)
    # the pictures' bins and the page's, from the same unions of the ops
    timelines, states = plots.binned_timelines(trace, tables, window,
                                               (plots.PNG_BINS, html_data.N_BINS))
    pngs = [(tl.device_id, f"timeline_device{tl.device_id}.png") for tl in timelines]
    images: dict[str, str] = {}
    with_layers = (layers is not None and layers.height > 0
                   and diagnosis.attribution_note() is None)
    if with_layers:
        images["layers_png"] = "layers.png"
    images["html"] = "report.html"
    # The timelines are drawn in a thread while this one writes the HTML and the markdown, then
    # the layer bars (the longer half is the timelines): the pictures are mostly numpy and
    # Pillow work (zlib encoding releases the GIL), the documents are Python.
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="nsysan-png") as pool:
        drawn = [pool.submit(plots.timeline_png, tl, out / name)
                 for tl, (_, name) in zip(timelines, pngs, strict=True)]
        html = plots.report_html(out / "report.html", diagnosis, trace, timelines, layers,
                                 tables, states, timeline() if timeline is not None else None)
        md = write_markdown(out, diagnosis, trace, layers, images, pngs, tables.get("steps"),
                            tables.get("overlap"),
                            {k: tables[k] for k in ("host_threads", "host_layers") if k in tables})
        bars = ([plots.layers_png(layers, out / "layers.png")]
                if with_layers and layers is not None else [])
        written += [f.result() for f in drawn]
    written += [*bars, html, md]
    written.append(write_findings_json(out, diagnosis, trace, [p.name for p in written
                                                               if p.suffix != ".md"]))
    if perfetto:
        from nsysan.report import jsonout
        from nsysan.report import perfetto as pftrace

        written.append(pftrace.write_perfetto(
            out / pftrace.PERFETTO_TRACE, trace, tables,
            jsonout.findings_document(diagnosis, trace)["findings"]))
    if before_manifest is not None:
        before_manifest()
    timings = dict(info.timings_s)
    timings["write_report"] = time.perf_counter() - t_start
    info.timings_s = timings
    written.append(write_manifest(out, trace, info))
    return written
