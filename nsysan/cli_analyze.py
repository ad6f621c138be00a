"""``nsysan analyze`` and ``nsysan passes``: run the passes, write tables and findings."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from nsysan.cli_types import FINITE
from nsysan.errors import ConfigError, NsysanError
from nsysan.passes.base import SEVERITIES

if TYPE_CHECKING:
    from nsysan.frames.trace import Trace

#: Exit status when a finding at or above ``--fail-on`` exists (1 = error, 2 = usage).
EXIT_FINDINGS = 3


def parse_settings(values: tuple[str, ...]) -> dict[str, str]:
    settings: dict[str, str] = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(
                f"--set {item!r}: expected PASS.PARAM=VALUE, e.g. gaps.min_gap_ns=500000"
            )
        settings[key.strip()] = value.strip()
    return settings


def parse_passes(value: str | None) -> list[str] | None:
    if value is None:
        return None
    names = [p.strip() for p in value.split(",") if p.strip()]
    if not names:
        raise ConfigError("--passes is empty; give a comma-separated list, e.g. gaps,kernels")
    return names


def _fmt_ns(ns: float | None) -> str:
    if ns is None:
        return "n/a"
    if ns >= 1e9:
        return f"{ns / 1e9:.2f} s"
    if ns >= 1e6:
        return f"{ns / 1e6:.1f} ms"
    return f"{ns / 1e3:.1f} µs"


def summary_line(result: Any, out: Path | None) -> str:
    """One line per trace for logs: verdict, busy %, steps, findings by severity."""
    parts = [result.trace_id]
    diag = result.diagnosis
    if diag is not None:
        parts.append(f"verdict {diag.verdict.label}")
    metrics = result.metrics
    busy = metrics.get("overlap.gpu_busy_frac", metrics.get("gaps.gpu_busy_frac"))
    if busy is not None:
        parts.append(f"GPU busy {100 * busy:.1f}%")
    n_steps = metrics.get("steps.n_steps")
    if n_steps:
        parts.append(f"{n_steps} steps, mean {_fmt_ns(metrics.get('steps.step_mean_ns'))}")
    if diag is not None:
        counts = {s: sum(f.severity == s for f in diag.findings) for s in reversed(SEVERITIES)}
        found = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
        parts.append(f"findings: {found or 'none'}")
    text = "; ".join(parts)
    return f"{text} -> {out}" if out is not None else text


def _fails(result: Any, fail_on: str | None) -> bool:
    if fail_on is None or result.diagnosis is None:
        return False
    return bool(result.diagnosis.codes(fail_on))


@click.command("analyze")
@click.argument("traces", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("-o", "--out", "out", type=click.Path(file_okay=False, path_type=Path),
              required=True, help="Output directory; each trace writes OUT/<trace_id>/.")
@click.option("--passes", "passes", default=None,
              help="Comma-separated passes to run (default: the default passes; "
              "see `nsysan passes`).")
@click.option("--set", "settings", multiple=True, metavar="PASS.PARAM=VALUE",
              help="Override a pass parameter or finding threshold, e.g. --set "
              "gaps.min_gap_ns=500000, --set findings.launch_warn_frac=0.2 (repeatable; "
              "`nsysan findings` lists the thresholds).")
@click.option("--fail-on", type=click.Choice(list(SEVERITIES)), default=None,
              help=f"Exit {EXIT_FINDINGS} when a finding at or above this severity exists.")
@click.option("--samples-per-step", type=FINITE, default=None,
              help="Samples per step, for throughput in the baseline.")
@click.option("--tokens-per-step", type=FINITE, default=None,
              help="Tokens per step, for throughput in the baseline.")
@click.option("--job", is_flag=True, default=False,
              help="Treat the traces as the ranks of one job (multi-rank analysis).")
@click.option("--rank-map", default=None, metavar="FILE=RANK,...",
              help="With --job: explicit ranks, e.g. a.sqlite=0,b.sqlite=1.")
@click.option("--nsys", type=click.Path(path_type=Path), default=None,
              help="The nsys binary used to export .nsys-rep/.qdrep inputs.")
@click.option("-q", "--quiet", is_flag=True, default=False, help="No progress display.")
@click.option("--perfetto", is_flag=True, default=False,
              help="Also write trace.pftrace: the annotated timeline for ui.perfetto.dev "
              "(needs nsysan[perfetto]).")
@click.option("--no-cache", is_flag=True, default=False,
              help="Do not read or write the cache of canonical frames (kept for big "
              "SQLite exports; same as NSYSAN_NO_CACHE=1).")
def analyze_cmd(traces: tuple[Path, ...], out: Path, passes: str | None,
                settings: tuple[str, ...], fail_on: str | None, samples_per_step: float | None,
                tokens_per_step: float | None, job: bool, rank_map: str | None,
                nsys: Path | None, quiet: bool, no_cache: bool, perfetto: bool = False) -> None:
    """Analyze traces: write Parquet tables, findings.md/json, pictures and a manifest.

    Prints one summary line per trace. Exit status: 0 ok, 1 an input failed, 2 usage,
    3 a finding at or above --fail-on.
    """
    from nsysan.api import analyze_to_dir
    from nsysan.passes import registry

    frame_cache = False if no_cache else None  # passed to every opening, explicitly

    # The first trace opens and its frames load in background threads while this thread
    # imports the passes, the findings and the reports (~0.25 s, a quarter of a small
    # analysis); an error of the opening is raised where the trace is analysed, after the
    # usage checks below, as if it had been opened there.
    first = None if job or not traces else _Opening(traces[0], nsys, frame_cache)
    selected = parse_passes(passes)
    parsed = parse_settings(settings)
    # Validate passes and parameters once, before any trace is analysed.
    registry.build_params(registry.resolve(
        selected if selected is not None else registry.auto_passes(None, parsed)), parsed)
    if job:
        ignored = [opt for opt, given in (("--passes", passes is not None),
                                          ("--set", bool(settings)),
                                          ("--samples-per-step", samples_per_step is not None),
                                          ("--tokens-per-step", tokens_per_step is not None),
                                          ("--perfetto", perfetto))
                   if given]
        if ignored:  # the multi-rank analysis runs its own fixed passes
            raise click.UsageError(
                f"{', '.join(ignored)} cannot be used with --job: the multi-rank analysis has "
                "no pass selection or parameters; analyse the rank files without --job for that")
        _analyze_job(traces, out, rank_map, nsys, fail_on, frame_cache)
        return
    if rank_map:
        raise click.UsageError("--rank-map needs --job")
    if perfetto:  # a missing package is said once, before any trace is analysed
        from nsysan.report.perfetto import require

        require()
    check_distinct_ids(traces, out)
    from nsysan.report.ownership import InputPaths

    protect = InputPaths(traces)  # no output folder may be, hold or lie in any input
    _import_reports()
    failed = 0
    failing_findings = False
    show_progress = (not quiet and sys.stderr.isatty() and len(traces) > 1
                     and not os.environ.get("CI"))
    progress = _Progress(len(traces)) if show_progress else None
    for i, path in enumerate(traces):
        try:
            opened = first.result() if first is not None and i == 0 else None
            result, target = analyze_to_dir(
                path if opened is None else opened[0], out, passes=selected, settings=parsed,
                samples_per_step=samples_per_step, tokens_per_step=tokens_per_step,
                nsys=str(nsys) if nsys else None, protect=protect, frame_cache=frame_cache,
                timings_s=None if opened is None else {"open": opened[1]}, perfetto=perfetto)
        except ConfigError:
            raise  # a usage mistake applies to every trace: stop at once
        except NsysanError as exc:
            failed += 1
            message = " ".join(str(exc).split())
            where = "" if str(path) in message else f"{path}: "
            click.echo(f"Error: {where}{message}", err=True)
        except Exception as exc:  # a bug: reported for this trace, the others still run
            failed += 1
            click.echo(f"Error: {path}: {internal_error_line(exc)}", err=True)
            show_traceback(exc)
        else:
            click.echo(summary_line(result, target))
            failing_findings |= _fails(result, fail_on)
        if progress is not None:
            progress.advance()
    if progress is not None:
        progress.close()
    if failed:
        sys.exit(1)
    if failing_findings:
        sys.exit(EXIT_FINDINGS)


def check_distinct_ids(traces: tuple[Path, ...], out: Path) -> None:
    """Refuse, before any analysis, distinct inputs whose outputs would share a folder: each
    trace writes ``OUT/<trace_id>/``, and the id is the file name without export suffixes
    (``a b.sqlite`` and ``a_b.sqlite`` are both ``a_b``). The same file named twice is one
    input (analysed twice, its folder replaced)."""
    from nsysan.load import trace_id_for

    by_id: dict[str, dict[str, Path]] = {}
    for path in traces:
        by_id.setdefault(trace_id_for(path), {}).setdefault(os.path.realpath(path), path)
    for trace_id, inputs in by_id.items():
        if len(inputs) > 1:
            names = ", ".join(str(p) for p in list(inputs.values())[:4])
            raise ConfigError(
                f"{len(inputs)} inputs ({names}) would all write {out / trace_id}: analyze "
                "them into separate -o folders, rename them, or use `nsysan batch`, whose "
                "trace ids keep the relative path and the suffix")


def internal_error_line(exc: BaseException) -> str:
    """The one line of an unexpected exception (a bug in nsysan)."""
    text = " ".join(str(exc).split())
    return (f"internal error: {type(exc).__name__}{': ' + text if text else ''} (please "
            f"report it; NSYSAN_DEBUG=1 prints the traceback)")


def show_traceback(exc: BaseException) -> None:
    """The traceback of an internal error on stderr, when ``NSYSAN_DEBUG`` is set (not 0)."""
    if os.environ.get("NSYSAN_DEBUG", "").strip() not in ("", "0"):
        import traceback

        click.echo("".join(traceback.format_exception(exc)).rstrip(), err=True)


class _Opening:
    """`nsysan.api.start` of one trace in a background thread; `result` waits for it."""

    def __init__(self, path: Path, nsys: Path | None, frame_cache: bool | None):
        self._path, self._nsys, self._frame_cache = path, nsys, frame_cache
        self._trace: Trace | None = None
        self._error: BaseException | None = None
        self._seconds = 0.0
        # daemon: a usage error ends the command without waiting for the opening
        self._thread = threading.Thread(target=self._run, name="nsysan-open", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from nsysan.api import start

        t = time.perf_counter()
        try:
            self._trace = start(self._path, nsys=str(self._nsys) if self._nsys else None,
                                hash_inputs=True, frame_cache=self._frame_cache)
        except BaseException as exc:
            self._error = exc
        self._seconds = time.perf_counter() - t

    def result(self) -> tuple[Trace, float]:
        """The trace and the seconds its opening took (or the error it raised)."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._trace is not None
        return self._trace, self._seconds


def _import_reports() -> None:
    """Import what the findings and the reports need (while the first trace loads)."""
    with contextlib.suppress(ImportError):  # optional parts of a build: see nsysan.api
        import nsysan.findings
        import nsysan.report.raster
        import nsysan.report.write  # noqa: F401


def _analyze_job(traces: tuple[Path, ...], out: Path, rank_map: str | None,
                 nsys: Path | None, fail_on: str | None, frame_cache: bool | None) -> None:
    try:
        from nsysan.multirank import analyze_job, write_job_outputs
    except ImportError as exc:  # pragma: no cover - the package is part of nsysan
        raise ConfigError(f"multi-rank analysis is unavailable: {exc}") from None
    check_distinct_inputs(traces)
    mapping = parse_rank_map(rank_map) if rank_map else None
    job = analyze_job(list(traces), rank_map=mapping, nsys=str(nsys) if nsys else None,
                      frame_cache=frame_cache)
    target = write_job_outputs(job, out / f"job_{job.job_id}")
    counts = {s: sum(f.severity == s for f in job.findings) for s in reversed(SEVERITIES)}
    found = ", ".join(f"{n} {s}" for s, n in counts.items() if n) or "none"
    click.echo(f"job {job.job_id}: {job.ranks.height} ranks, {job.collectives.height} matched "
               f"collective rows; findings: {found} -> {target}")
    for note in job.notes:
        click.echo(f"note: {note}", err=True)
    if fail_on and any(SEVERITIES.index(f.severity) >= SEVERITIES.index(fail_on)
                       for f in job.findings):
        sys.exit(EXIT_FINDINGS)


def parse_rank_map(text: str) -> dict[str, int]:
    """``FILE=RANK,...`` -> {FILE: RANK}; a file named twice or a rank given twice is a
    ConfigError (one rank would silently win)."""
    mapping: dict[str, int] = {}
    for item in text.split(","):
        name, sep, rank = item.rpartition("=")
        name = name.strip()
        if not sep or not name or not rank.strip().isdigit():
            raise ConfigError(f"--rank-map {item!r}: expected FILE=RANK")
        if name in mapping:
            raise ConfigError(f"--rank-map names {name!r} twice; give each file one rank")
        mapping[name] = int(rank)
    seen: dict[int, str] = {}
    for name, rank in mapping.items():
        if rank in seen:
            raise ConfigError(f"--rank-map gives rank {rank} to both {seen[rank]!r} and "
                              f"{name!r}; every rank must be distinct")
        seen[rank] = name
    return mapping


def check_distinct_inputs(paths: tuple[Path, ...]) -> None:
    """The ranks of a job must be distinct profiles: the same file twice (by resolved path,
    or two copies with the same content) would count one rank twice."""
    from nsysan.batch.state import content_sha256

    by_path: dict[Path, Path] = {}
    for p in paths:
        try:
            resolved = p.expanduser().resolve()
        except (OSError, RuntimeError):  # a symlink loop: opening it says so
            resolved = p.expanduser().absolute()
        if resolved in by_path:
            raise ConfigError(f"--job: {by_path[resolved]} and {p} are the same file; name each "
                              "rank's profile once")
        by_path[resolved] = p
    by_size: dict[int, list[Path]] = {}
    for resolved, p in by_path.items():
        if resolved.is_file():
            by_size.setdefault(resolved.stat().st_size, []).append(p)
    for same_size in by_size.values():  # only files of equal size can be copies: hash those
        if len(same_size) < 2:
            continue
        digests: dict[str, Path] = {}
        for p in same_size:
            try:
                digest = content_sha256(p)
            except OSError:  # unreadable: opening it reports that, with the path
                continue
            if digest in digests:
                raise ConfigError(f"--job: {digests[digest]} and {p} have the same content (a "
                                  "copy of one profile); name each rank's profile once")
            digests[digest] = p


class _Progress:
    """A rich progress bar on a terminal (never in CI logs)."""

    def __init__(self, total: int):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

        self._progress = Progress("[progress.description]{task.description}", BarColumn(),
                                  MofNCompleteColumn(), TimeRemainingColumn(), transient=True)
        self._progress.start()
        self._task = self._progress.add_task("analyzing", total=total)

    def advance(self) -> None:
        self._progress.advance(self._task)

    def close(self) -> None:
        self._progress.stop()


@click.command("passes")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def passes_cmd(as_json: bool) -> None:
    """List the passes, their parameters with defaults, and their output tables."""
    from nsysan.passes.registry import describe

    info = describe()
    if as_json:
        click.echo(json.dumps(info, indent=2, default=str))
        return
    for p in info:
        default = "" if p["default"] else " (not run by default)"
        click.echo(f"{p['name']}{default}: {p['description']}")
        click.echo(f"  tables: {', '.join(p['tables'])}")
        if p["requires"]:
            click.echo(f"  requires: {', '.join(p['requires'])}")
        for k, v in p["params"].items():
            click.echo(f"  --set {p['name']}.{k}={_render(v)}")


def _render(value: Any) -> str:
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    return str(value)
