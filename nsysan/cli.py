"""The ``nsysan`` command line. Thin by design: parse, one library call, render.

Every `NsysanError` becomes ``Error: <message>`` on stderr with exit status 1 and no traceback
(`NsysanGroup`); so does a failure of the file system that no command turned into one (an
OSError), and any other exception, a bug, as ``Error: internal error: ...`` (the traceback
follows when ``NSYSAN_DEBUG=1``). Usage errors exit 2 (click's default). `cli` is the click
group, `main` the console entry point. To add a command, write a function under
``@cli.command()`` (or build it in its own module and ``cli.add_command(cmd)`` at the end of
this file) that calls the library and renders; reuse `nsys_options` where the command accepts
reports.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click

from nsysan._version import __version__
from nsysan.errors import NsysanError
from nsysan.frames.heap import share_one_arena

F = TypeVar("F", bound=Callable[..., Any])


class NsysanGroup(click.Group):
    """A click group that reports library errors as one line, not a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except NsysanError as exc:
            raise click.ClickException(_one_line(exc)) from None
        except OSError as exc:
            where = f"{exc.filename}: " if exc.filename else ""
            raise click.ClickException(f"{where}{exc.strerror or _one_line(exc)}") from None
        except Exception as exc:
            from nsysan.cli_analyze import internal_error_line, show_traceback

            show_traceback(exc)
            raise click.ClickException(internal_error_line(exc)) from None


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


def nsys_options(fn: F) -> F:
    """``--nsys`` and ``--cache-dir``: how reports (.nsys-rep/.qdrep) are exported."""
    fn = click.option(
        "--cache-dir",
        type=click.Path(file_okay=False, path_type=Path),
        default=None,
        help="Where exports are cached (default: next to the report when writable, else "
        "$NSYSAN_CACHE_DIR or ~/.cache/nsysan).",
    )(fn)
    fn = click.option(
        "--nsys",
        "nsys",
        type=click.Path(dir_okay=True, path_type=Path),
        default=None,
        help="The nsys binary (default: $NSYSAN_NSYS, PATH, then the usual install places).",
    )(fn)
    return fn


@click.group(cls=NsysanGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="nsysan")
def cli() -> None:
    """What is the GPU waiting for? Analysis of NVIDIA Nsight Systems profiles."""


@cli.command("export")
@click.argument("reports", nargs=-1, required=True, type=click.Path(path_type=Path))
@nsys_options
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["sqlite", "parquetdir"]),
    default="sqlite",
    show_default=True,
    help="Export format (parquetdir needs nsys 2023.4 or newer).",
)
def export_cmd(
    reports: tuple[Path, ...], nsys: Path | None, cache_dir: Path | None, fmt: str
) -> None:
    """Export reports with `nsys export` (cached); print one export path per line.

    A report that fails is reported on stderr and the others are still exported; the exit
    status is then 1.
    """
    from nsysan.load.export import export_report

    failed = 0
    for report in reports:
        try:
            out = export_report(report, nsys=nsys, fmt=fmt, cache_dir=cache_dir)  # type: ignore[arg-type]
            click.echo(str(out))
        except NsysanError as exc:
            failed += 1
            click.echo(f"Error: {_one_line(exc)}", err=True)
    if failed:
        raise click.exceptions.Exit(1)


@cli.command("schema")
@click.argument("trace", type=click.Path(path_type=Path))
@nsys_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
def schema_cmd(trace: Path, nsys: Path | None, cache_dir: Path | None, as_json: bool) -> None:
    """Show what TRACE holds: versions, canonical frames (captured or not, and why), notes,
    and every raw table with its row count."""
    from nsysan.load.describe import describe_path

    info = describe_path(trace, nsys=nsys, cache_dir=cache_dir)
    if as_json:
        click.echo(json.dumps(info, indent=2))
    else:
        click.echo(_render_schema(info))


def _render_schema(info: dict[str, Any]) -> str:
    def unknown(v: Any) -> str:
        return "unknown" if v is None else str(v)

    lines = [
        f"trace:     {info['trace_id']}",
        f"path:      {info['path']}",
        f"source:    {info['source_format']} {info['source_path']}",
        f"exporter:  nsys {unknown(info['exporter_version'])}, schema "
        f"{unknown(info['schema_version'])}",
        f"recorded:  nsys {unknown(info['recorded_version'])}",
        f"session:   start {unknown(info['session_start_utc'])}, duration "
        + ("unknown" if info["duration_ns"] is None else f"{info['duration_ns'] / 1e9:.3f} s"),
        "frames:",
    ]
    for name, frame in info["frames"].items():
        if frame["captured"]:
            feeds = ", ".join(f"{t} {n}" for t, n in frame["tables"].items())
            lines.append(f"  {name:<10} yes  {feeds}")
        else:
            lines.append(f"  {name:<10} no   {frame['missing']}")
        if frame.get("error"):
            lines.append(f"  {'':<10}      cannot be built: {frame['error']}")
    quality = [(name, rule, entry) for name, q in info.get("quality", {}).items()
               for rule, entry in q["rules"].items()]
    lines.append("quality:" + ("" if quality else "   no row repaired or dropped"))
    lines += [f"  {name:<10} {rule}: {entry['rows']} {entry['action']}"
              + (f" ({', '.join(entry['columns'])})" if entry.get("columns") else "")
              for name, rule, entry in quality]
    lines += [f"  {name:<10} {note}" for name, q in info.get("quality", {}).items()
              for note in q["notes"]]
    if info["notes"]:
        lines.append("notes:")
        lines += [f"  - {note}" for note in info["notes"]]
    lines.append(f"tables ({len(info['tables'])}):")
    width = max((len(t) for t in info["tables"]), default=0)
    lines += [f"  {t:<{width}}  {n}" for t, n in info["tables"].items()]
    return "\n".join(lines)


def main() -> None:
    """Console entry point (``nsysan``).

    The process ends with `os._exit` once the command is done: tearing the interpreter down
    (freeing every module of polars, numpy, Pillow, ...) takes 0.1-0.15 s, a tenth of the
    analysis of a small trace. What must finish first does: queued frame-cache files are
    written, `atexit` functions run and the output streams flushed; while any other
    non-daemon thread is alive, the exit is the normal one (which waits for it).
    Its threads share one C heap (`nsysan.frames.heap.share_one_arena`).
    """
    share_one_arena()
    try:
        cli(prog_name="nsysan")
        status: object = 0
    except SystemExit as exc:
        status = exc.code
    _exit(status)


#: the frame-cache writer's thread (`nsysan.load.cache`): idle once flushed
_DISPENSABLE_THREADS = ("nsysan-cache",)


def _exit(status: object) -> NoReturn:
    cache = sys.modules.get("nsysan.load.cache")
    if cache is not None:
        cache.flush()
    others = [t for t in threading.enumerate() if t is not threading.main_thread()
              and not t.daemon and not t.name.startswith(_DISPENSABLE_THREADS)]
    if others:
        sys.exit(status)
    if status is not None and not isinstance(status, int):
        print(status, file=sys.stderr)  # what sys.exit does with a message
        status = 1
    atexit._run_exitfuncs()  # what the interpreter's own exit would run
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed pipe: nothing left to do about it
            stream.flush()
    os._exit(status or 0)


# Commands defined in their own modules (kept out of this file so it stays small).
from nsysan.cli_analyze import analyze_cmd, passes_cmd  # noqa: E402

cli.add_command(analyze_cmd)
cli.add_command(passes_cmd)


from nsysan.cli_batch import batch, catalog  # noqa: E402  (commands defined in their own module)

cli.add_command(batch)
cli.add_command(catalog)


from nsysan.cli_compare import baseline_group, check_cmd, diff_cmd  # noqa: E402  (own module)

cli.add_command(diff_cmd)
cli.add_command(check_cmd)
cli.add_command(baseline_group)

from nsysan.cli_findings import findings_cmd  # noqa: E402  (own module)

cli.add_command(findings_cmd)

from nsysan.cli_compare import scaling_cmd  # noqa: E402  (own module)

cli.add_command(scaling_cmd)


from nsysan.cli_perfetto import perfetto_cmd  # noqa: E402  (command defined in its own module)

cli.add_command(perfetto_cmd)

from nsysan.cli_cache import cache_group  # noqa: E402  (own module)

cli.add_command(cache_group)
