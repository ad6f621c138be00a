"""The library entry points behind ``nsysan analyze``: run passes on a trace, write outputs."""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from nsysan.errors import ConfigError
from nsysan.frames.context import AnalysisContext
from nsysan.frames.trace import Trace
from nsysan.passes import registry
from nsysan.passes.base import Finding, PassResult
from nsysan.passes.schedule import (
    analysis_context,
    build_workers,
    pass_workers,
    passes_wait_for_frames,
    run_passes,
)

if TYPE_CHECKING:
    from nsysan.findings.rules import Diagnosis
    from nsysan.report.ownership import InputPaths, OwnedFolder

#: the event frames an analysis reads, in the order the passes first need them
EVENT_FRAMES = ("gpu_ops", "nvtx", "cuda_api", "sync", "osrt", "overhead")
#: small frames read by the nccl pass (meta: the ranks) and the findings (gpus: memory), a few
#: ms each: loaded in the background too, after the event frames
SMALL_FRAMES = ("meta", "gpus")


@dataclass
class AnalysisResult:
    """Everything one analysis produced: tables (polars), findings, metrics, provenance."""

    trace: Trace
    results: dict[str, PassResult]
    params: dict[str, Any]
    timings_s: dict[str, float] = field(default_factory=dict)
    diagnosis: Diagnosis | None = None  # when findings ran
    options: dict[str, Any] = field(default_factory=dict)
    #: nsysan.findings.FindingParams from ``findings.*`` settings (None: the defaults)
    finding_params: Any = None

    def __repr__(self) -> str:
        # compact for notebooks: the default dataclass repr prints every table
        tables = ", ".join(f"{n} ({df.height})" for n, df in self.tables.items())
        found = (f"{len(self.diagnosis.findings)} findings, verdict "
                 f"{self.diagnosis.verdict.label}" if self.diagnosis is not None
                 else "findings not drawn")
        return f"AnalysisResult({self.trace_id!r}; tables: {tables or 'none'}; {found})"

    @property
    def trace_id(self) -> str:
        return self.trace.trace_id

    @property
    def tables(self) -> dict[str, pl.DataFrame]:
        return {name: df for r in self.results.values() for name, df in r.tables.items()}

    def table(self, name: str) -> pl.DataFrame:
        tables = self.tables
        if name not in tables:
            raise KeyError(f"no table {name!r}; have: {', '.join(tables)}")
        return tables[name]

    @property
    def metrics(self) -> dict[str, Any]:
        return {f"{p}.{k}": v for p, r in self.results.items() for k, v in r.metrics.items()}

    @property
    def findings(self) -> list[Finding]:
        if self.diagnosis is not None:
            return list(self.diagnosis.findings)
        return [f for r in self.results.values() for f in r.findings]


def _open(path_or_trace: str | os.PathLike[str] | Trace, nsys: str | None,
          frame_cache: bool | None = None) -> Trace:
    if isinstance(path_or_trace, Trace):
        return path_or_trace
    from nsysan.load import open_trace

    return open_trace(path_or_trace, nsys=nsys, frame_cache=frame_cache)


def start(
    path_or_trace: str | os.PathLike[str] | Trace,
    *,
    nsys: str | None = None,
    findings: bool = True,
    hash_inputs: bool = False,
    frame_cache: bool | None = None,
) -> Trace:
    """Open a trace for `analyze` and start reading what the analysis will need.

    The frames are built in background threads (SQLite reads and polars release the GIL), so
    the big tables of a trace are read on both cores, while the caller imports or validates
    and while the first passes run; with ``hash_inputs`` the input files are hashed for the
    manifest in a background thread too. `analyze` calls it; a caller may call it earlier
    (``nsysan analyze`` does, while it imports the passes) and pass the trace to `analyze`.
    ``frame_cache`` is `nsysan.load.open_trace`'s (False: no cache of the frames).
    """
    trace = _open(path_or_trace, nsys, frame_cache)
    # Starting a trace again starts nothing new: the hashes are keyed by file version and a
    # frame is prefetched once (`Trace.prefetch`).
    if hash_inputs:
        from nsysan.report.manifest import default_inputs, digest_folders, prefetch_sha256

        prefetch_sha256(default_inputs(trace), digest_folders(trace))
    if not trace.has("gpu_ops") and not trace.has("cuda_api"):
        from nsysan.errors import SchemaError

        raise SchemaError(
            f"{trace.meta.path}: no CUDA activity tables (CUPTI_ACTIVITY_KIND_KERNEL/MEMCPY/"
            "MEMSET/RUNTIME) — record the profile with `nsys profile --trace=cuda,...`"
        )
    trace.prefetch((*EVENT_FRAMES, *SMALL_FRAMES) if findings else EVENT_FRAMES[:3])
    return trace


def analyze(
    path_or_trace: str | os.PathLike[str] | Trace,
    *,
    passes: Iterable[str] | None = None,
    settings: Mapping[str, Any] | None = None,
    samples_per_step: float | None = None,
    tokens_per_step: float | None = None,
    nsys: str | None = None,
    findings: bool = True,
    hash_inputs: bool = False,
    frame_cache: bool | None = None,
) -> AnalysisResult:
    """Run the selected passes (default: all default passes) on one trace.

    ``settings`` are ``{"PASS.PARAM": "VALUE"}`` overrides as given to ``--set``. With
    ``hash_inputs`` (for callers that then `write_outputs`), the input files are hashed for the
    manifest in a background thread while the passes run. ``frame_cache``: see `start`.
    """
    t0 = time.perf_counter()
    trace = _open(path_or_trace, nsys, frame_cache)
    opened_s = time.perf_counter() - t0
    # the passes and the findings share one context: its products are freed on return
    with analysis_context(trace) as ctx:
        result = _run_passes(ctx, passes=passes, settings=settings,
                             samples_per_step=samples_per_step, tokens_per_step=tokens_per_step,
                             nsys=nsys, findings=findings, hash_inputs=hash_inputs)
        result.timings_s["open"] += opened_s
        if findings:
            _diagnose_timed(result, ctx)
    return result


def _run_passes(
    path_or_trace: str | os.PathLike[str] | Trace,
    *,
    passes: Iterable[str] | None = None,
    settings: Mapping[str, Any] | None = None,
    samples_per_step: float | None = None,
    tokens_per_step: float | None = None,
    nsys: str | None = None,
    findings: bool = True,
    hash_inputs: bool = False,
    release_frames: bool = False,
) -> AnalysisResult:
    """`analyze` up to the findings (prepared for, when ``findings``, but not drawn).
    ``release_frames``: `run_passes`'."""
    # (settings are checked before the trace is opened; passes that run by default only on
    # traces holding their input are added once it is)
    chosen = passes if passes is not None else registry.auto_passes(None, settings)
    specs = registry.resolve(chosen)
    params = registry.build_params(specs, settings)
    finding_params = _finding_params(settings) if findings else None
    check_per_step(samples_per_step=samples_per_step, tokens_per_step=tokens_per_step)
    t0 = time.perf_counter()
    trace = start(path_or_trace, nsys=nsys, findings=findings, hash_inputs=hash_inputs)
    if any(s.name == "host" for s in specs):  # its frames load while the first passes run
        # (on a big trace, before them: `passes_wait_for_frames`)
        from nsysan.passes.host import frames_to_read

        trace.prefetch(frames_to_read(trace), workers=build_workers(trace), first=True)
    timings = {"open": time.perf_counter() - t0}
    if passes is None and registry.auto_passes(trace, settings) != chosen:
        specs = registry.resolve(registry.auto_passes(trace, settings))
        params = registry.build_params(specs, settings)
    if findings:
        # Imported while the frames load (the first pass waits for them anyway), not after
        # the passes: the import is ~0.05 s, a tenth of a small analysis.
        _findings_module()
    if passes_wait_for_frames(trace):  # (a big trace: builds bounded, see there)
        t = time.perf_counter()
        trace.wait_for_prefetch()
        timings["frames"] = time.perf_counter() - t
    results, pass_timings = run_passes(specs, trace, params, pass_workers(trace),
                                       release_frames=release_frames)
    timings.update(pass_timings)
    return AnalysisResult(
        trace=trace.base if isinstance(trace, AnalysisContext) else trace,
        results=results,
        params=params,
        timings_s=timings,
        options={"samples_per_step": samples_per_step, "tokens_per_step": tokens_per_step},
        finding_params=finding_params,
    )


def _finding_params(settings: Mapping[str, str] | None) -> Any:
    """FindingParams from the ``findings.*`` settings (checked before any trace is read)."""
    if not any(k.startswith("findings.") for k in settings or {}):
        return None
    from nsysan.findings.params import from_settings

    return from_settings(settings)


def check_per_step(**values: float | None) -> None:
    """``samples_per_step`` / ``tokens_per_step``: None or a positive finite number (NaN
    passed ``value <= 0`` and came out as "nan/s")."""
    for name, value in values.items():
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(value) or value <= 0:
            raise ConfigError(f"--{name.replace('_', '-')} must be positive and finite, "
                              f"got {value!r}")


def _diagnose_timed(result: AnalysisResult, trace: Trace) -> None:
    t = time.perf_counter()
    result.diagnosis = _diagnose(result, trace)
    result.timings_s["findings"] = time.perf_counter() - t


def _findings_module() -> Any:
    try:
        import nsysan.findings
    except ImportError:  # findings package not installed in this build
        return None
    return nsysan.findings


def _diagnose(result: AnalysisResult, trace: Trace) -> Any:
    findings = _findings_module()
    if findings is None:
        return None
    return findings.diagnose(trace, result.results, params=result.finding_params, **{
        k: v for k, v in result.options.items() if v is not None
    })


def write_outputs(result: AnalysisResult, out_dir: str | os.PathLike[str], *,
                  protect: Iterable[str | os.PathLike[str]] | InputPaths | None = None,
                  perfetto: bool = False) -> Path:
    """Write every table and report of ``result`` into ``out_dir/<trace_id>/``, atomically.

    Files are written into a temporary sibling folder that is swapped into place at the end,
    so a crash never leaves a folder that looks complete. An existing ``<trace_id>`` folder is
    replaced only when nsysan wrote it, for the same input, and nothing else is in it; an
    output folder that is, contains or lies inside an input (the trace's, or any of
    ``protect``: every input of a multi-trace run) is refused (`nsysan.errors.OutputError`,
    nothing touched; see docs/outputs.md). With ``perfetto``, the folder also gets
    ``trace.pftrace`` (`nsysan.report.perfetto`).
    """
    folder = _prepare_folder(result.trace, out_dir, protect)
    return _write_outputs(result, folder, diagnose=False, perfetto=perfetto)


def _prepare_folder(trace: Trace, out_dir: str | os.PathLike[str],
                    protect: Iterable[str | os.PathLike[str]] | InputPaths | None
                    ) -> OwnedFolder:
    from nsysan.report import ownership
    from nsysan.report.manifest import default_inputs

    if protect is not None and not isinstance(protect, ownership.InputPaths):
        protect = ownership.InputPaths(protect)
    return ownership.prepare(out_dir, trace.trace_id, kind="analysis",
                             inputs=default_inputs(trace), protect=protect,
                             legacy=ownership.legacy_analysis)


def _write_outputs(result: AnalysisResult, folder: OwnedFolder, *, diagnose: bool,
                   trace: Trace | None = None, perfetto: bool = False) -> Path:
    """`write_outputs` into the prepared ``folder``; with ``diagnose``, the findings are drawn
    (`_diagnose_timed`) while the Parquet tables are written: they need only the pass
    results. ``trace``: the context of the analysis, when it is still open (its products
    serve the findings and pictures)."""
    trace = trace or result.trace
    from nsysan.report.atomic import output_error
    from nsysan.report.manifest import MANIFEST_JSON
    from nsysan.report.parquet import write_tables

    tmp = folder.tmp
    try:
        schemas = {n: s for r in registry.resolve(result.results) for n, s in r.tables.items()}

        def parquet() -> float:
            t = time.perf_counter()
            write_tables(result.tables, tmp, schemas)
            return time.perf_counter() - t

        # Parquet encoding runs in polars without the GIL: it overlaps the findings and the
        # pictures and documents (mostly Python), and the manifest waits for it (it hashes
        # the tables). Its time is recorded then, after the findings' (manifest key order).
        # The page's timeline (numpy, polars and zlib work) is built beside the findings too
        # where `overlap_outputs` allows: only its engine-state strips wait for them.
        with ThreadPoolExecutor(max_workers=2, thread_name_prefix="nsysan-outputs") as pool:
            tables_written = pool.submit(parquet)
            timeline = _start_timeline(pool, result, trace) if diagnose else None

            def tables_done() -> None:
                result.timings_s["write_parquet"] = tables_written.result()

            if diagnose:
                _diagnose_timed(result, trace)
            _write_reports(result, trace, tmp, tables_done, perfetto,
                           timeline.result if timeline is not None else None)
            tables_done()  # also when no report was written: raise its error
        manifest = tmp / MANIFEST_JSON  # its inputs' sizes and hashes go into the marker
        described = (json.loads(manifest.read_text(encoding="utf-8"))["inputs"]
                     if manifest.is_file() else [])
        return folder.commit(described)
    except Exception as exc:  # a failure of the file system: one line that says what to do
        error = output_error(exc, folder.final)
        if error is None:
            raise
        raise error from None
    finally:
        folder.abort()  # (nothing once committed)


def _start_timeline(pool: ThreadPoolExecutor, result: AnalysisResult, trace: Trace
                    ) -> Future[dict[str, Any]] | None:
    """The page's timeline payload started in ``pool`` (`overlap_outputs`), or None. Only
    inside the analysis' context, whose products (the op links) the reports share."""
    from nsysan.passes.schedule import overlap_outputs

    if not isinstance(trace, AnalysisContext) or not overlap_outputs(trace):
        return None
    try:
        from nsysan.report.html_data import timeline_payload
    except ImportError:  # no reports: `_write_reports` writes none
        return None
    tables = {n: df for r in result.results.values() for n, df in r.tables.items()}
    return pool.submit(timeline_payload, trace, tables)


def _write_reports(result: AnalysisResult, trace: Trace, out_dir: Path,
                   before_manifest: Callable[[], object], perfetto: bool = False,
                   timeline: Callable[[], dict[str, Any]] | None = None) -> None:
    try:
        from nsysan.report.manifest import ManifestInfo
        from nsysan.report.write import write_report
    except ImportError:
        return
    info = ManifestInfo(params=result.params, timings_s=result.timings_s,
                        options=result.options)
    # the reports render the findings: drawn here when the analysis did not draw them
    diagnosis = result.diagnosis if result.diagnosis is not None else _diagnose(result, trace)
    write_report(out_dir, trace, result.results, diagnosis, info,
                 before_manifest=before_manifest, perfetto=perfetto, timeline=timeline)


def analyze_to_dir(
    path_or_trace: str | os.PathLike[str] | Trace,
    out_dir: str | os.PathLike[str],
    *,
    timings_s: Mapping[str, float] | None = None,
    protect: Iterable[str | os.PathLike[str]] | InputPaths | None = None,
    **kwargs: Any,
) -> tuple[AnalysisResult, Path]:
    """`analyze` then `write_outputs`: what ``nsysan analyze TRACE -o OUT`` does per trace.

    The output folder is checked (and its temporary folder made) right after the trace is
    opened, before the passes run: a folder that may not be written costs no analysis. The
    findings are drawn while the Parquet tables are written. ``timings_s`` are times the
    caller measured before (e.g. ``open`` when the trace was opened in the background); they
    replace those of the analysis in the manifest. ``protect`` and ``perfetto`` are
    `write_outputs`'; other keywords are `analyze`'s.
    """
    kwargs.setdefault("hash_inputs", True)
    perfetto = kwargs.pop("perfetto", False)
    if perfetto:  # a missing package is said before any work
        from nsysan.report.perfetto import require

        require()
    findings = kwargs.pop("findings", True)
    t0 = time.perf_counter()
    trace = _open(path_or_trace, kwargs.get("nsys"), kwargs.pop("frame_cache", None))
    opened_s = time.perf_counter() - t0
    folder = _prepare_folder(trace, out_dir, protect)
    # one context for the passes, the findings and the reports: freed once they are written
    with analysis_context(trace) as ctx:
        try:
            # the frames only the passes read are freed as soon as they are done (a caller
            # that passed its own trace gets them built again if it asks)
            result = _run_passes(ctx, findings=findings, release_frames=True, **kwargs)
        except BaseException:
            folder.abort()
            raise
        result.timings_s["open"] += opened_s
        result.timings_s.update(timings_s or {})
        return result, _write_outputs(result, folder, diagnose=findings, trace=ctx,
                                      perfetto=perfetto)
