"""``nsysan batch`` and ``nsysan catalog``: click commands attached to the main group in
nsysan/cli.py (``main.add_command(batch)``, ``main.add_command(catalog)``). Thin: parse, one
library call, render."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from datetime import datetime
from typing import Any

import click

from nsysan.cli_analyze import parse_passes, parse_settings
from nsysan.cli_types import FINITE
from nsysan.errors import NsysanError


def _errors_to_exit(fn: Callable[..., Any]) -> Callable[..., Any]:
    """NsysanError → ``Error: <message>`` on stderr and exit 1, as the main group does, so
    the commands behave the same when invoked on their own."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except NsysanError as exc:
            raise click.ClickException(" ".join(str(exc).split()) or type(exc).__name__) from None

    return wrapper


def _fmt_duration(seconds: float) -> str:
    m, s = divmod(seconds, 60)
    return f"{int(m)}m{s:04.1f}s" if m else f"{s:.1f}s"


@click.command("batch")
@click.argument("inputs", nargs=-1, required=True)
@click.option("-o", "--out", "out", required=True, type=click.Path(file_okay=False),
              help="Output root: one OUT/<trace_id>/ per trace, and OUT/catalog.db.")
@click.option("--jobs", "-j", type=click.IntRange(min=1), default=None,
              help="Traces analyzed at once (default: CPU count); 1 runs in-process.")
@click.option("--executor", type=click.Choice(["local", "dask"]), default="local",
              show_default=True, help="local processes, or a dask.distributed cluster.")
@click.option("--scheduler", default=None, metavar="ADDRESS",
              help="Dask scheduler address (tcp://host:8786); default: start a local cluster.")
@click.option("--catalog", "catalog", default=None, metavar="URL",
              help="SQLAlchemy URL or SQLite path of the run catalog (default OUT/catalog.db).")
@click.option("--on-error", type=click.Choice(["record", "raise"]), default="record",
              show_default=True,
              help="record: a failed trace is a failed row and the batch goes on; raise: stop.")
@click.option("--passes", default=None, metavar="P1,P2",
              help="Passes to run (default: the default passes of `nsysan analyze`).")
@click.option("--set", "set_", multiple=True, metavar="PASS.PARAM=VALUE",
              help="Override a pass parameter (repeatable).")
@click.option("--samples-per-step", type=FINITE, default=None)
@click.option("--tokens-per-step", type=FINITE, default=None)
@click.option("--nsys", default=None, metavar="PATH", help="nsys binary for .nsys-rep/.qdrep.")
@click.option("--progress", type=click.Choice(["auto", "bar", "plain", "none"]), default="auto",
              show_default=True, help="auto: a bar on a terminal, plain lines otherwise.")
@_errors_to_exit
def batch(
    inputs: tuple[str, ...],
    out: str,
    jobs: int | None,
    executor: str,
    scheduler: str | None,
    catalog: str | None,
    on_error: str,
    passes: str | None,
    set_: tuple[str, ...],
    samples_per_step: float | None,
    tokens_per_step: float | None,
    nsys: str | None,
    progress: str,
) -> None:
    """Analyze many traces (files, directories searched for .nsys-rep/.qdrep/.sqlite and
    parquetdirs, or globs) into OUT/<trace_id>/, resumably; exit 1 if any trace failed."""
    from nsysan.batch.run import run_batch

    summary = run_batch(
        inputs,
        out,
        jobs=jobs,
        executor=executor,
        scheduler=scheduler,
        catalog=catalog,
        on_error=on_error,
        passes=parse_passes(passes),
        settings=parse_settings(set_),
        samples_per_step=samples_per_step,
        tokens_per_step=tokens_per_step,
        nsys=nsys,
        progress=progress,
    )
    click.echo(
        f"batch {summary.batch_id}: {len(summary.records)} traces: {summary.n_ok} ok, "
        f"{summary.n_failed} failed, {summary.n_skipped} skipped in "
        f"{_fmt_duration(summary.wall_s)}"
    )
    click.echo(f"outputs: {summary.out_dir}")
    click.echo(f"catalog: {summary.catalog}")
    for rec in summary.failed:
        click.echo(f"FAILED {rec.trace_id}: {rec.error_type}: {rec.error_message}")
    sys.exit(summary.exit_code)


@click.group("catalog")
def catalog() -> None:
    """Query the run catalog written by `nsysan batch`."""


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, datetime):
        return value.isoformat(timespec="seconds")
    return str(value)


def _render(result: Any, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(result.records(), indent=1, default=str))
        return
    from rich.console import Console
    from rich.table import Table

    cells = [[_cell(v) for v in row] for row in result.rows]
    table = Table(show_edge=False, header_style="bold")
    for col in result.columns:
        table.add_column(col, overflow="fold")
    for row in cells:
        table.add_row(*row)
    console = Console()
    if not console.is_terminal:
        # Piped or captured: never wrap cells, however wide the table gets.
        widths = [max([len(c), *(len(r[i]) for r in cells)]) for i, c in enumerate(result.columns)]
        console = Console(width=sum(widths) + 3 * len(widths) + 2)
    console.print(table)
    click.echo(f"({len(result.rows)} rows)")


_CATALOG_OPT = click.option(
    "--catalog", "catalog_", envvar="NSYSAN_CATALOG", required=True, metavar="URL|PATH",
    help="SQLAlchemy URL, SQLite file, or a batch OUT directory (its catalog.db); "
    "env NSYSAN_CATALOG.",
)


@catalog.command("query")
@_CATALOG_OPT
@click.option("--findings", "code", default=None, metavar="CODE",
              help="Findings of CODE (wildcards * allowed) in each trace's latest run.")
@click.option("--all-runs", is_flag=True, help="With --findings: every run, not only the latest.")
@click.option("--regressed", "metric", default=None, metavar="METRIC",
              help="Traces whose latest run got worse on METRIC (e.g. exposed_nccl_ns).")
@click.option("--by-ratio", type=FINITE, default=1.05, show_default=True,
              help="With --regressed: worse by more than this factor.")
@click.option("--against", type=click.Choice(["previous", "group"]), default="previous",
              show_default=True,
              help="With --regressed: the trace's previous run, or the median of its group.")
@click.option("--min-delta", type=FINITE, default=0.0, show_default=True,
              help="With --regressed: ignore absolute changes at or below this.")
@click.option("--sql", default=None, metavar="SELECT...", help="One read-only SQL statement.")
@click.option("--json", "as_json", is_flag=True, help="JSON (a list of objects), not a table.")
@_errors_to_exit
def query(
    catalog_: str,
    code: str | None,
    all_runs: bool,
    metric: str | None,
    by_ratio: float,
    against: str,
    min_delta: float,
    sql: str | None,
    as_json: bool,
) -> None:
    """Canned questions (--findings, --regressed) or --sql; without them, each trace's latest
    run with its key metrics."""
    from nsysan.batch import queries
    from nsysan.batch.catalog import Catalog, catalog_url

    chosen = [x for x in (code, metric, sql) if x is not None]
    if len(chosen) > 1:
        raise click.UsageError("choose one of --findings, --regressed, --sql")
    with Catalog(catalog_url(catalog_)) as cat:
        if code is not None:
            result = queries.findings_of(cat, code, all_runs=all_runs)
        elif metric is not None:
            result = queries.regressed(cat, metric, by_ratio=by_ratio, against=against,
                                       min_delta=min_delta)
        elif sql is not None:
            result = queries.run_sql(cat, sql)
        else:
            result = queries.latest_runs(cat)
    _render(result, as_json)


@catalog.command("info")
@_CATALOG_OPT
@_errors_to_exit
def info(catalog_: str) -> None:
    """Schema version and row counts of the catalog (creating/migrating it if needed)."""
    from nsysan.batch import queries
    from nsysan.batch.catalog import Catalog, catalog_url

    with Catalog(catalog_url(catalog_)) as cat:
        click.echo(f"catalog: {cat.display_url}")
        click.echo(f"schema version: {cat.schema_version()}")
        counts = queries.run_sql(
            cat,
            "SELECT (SELECT COUNT(*) FROM traces) AS traces, (SELECT COUNT(*) FROM runs) AS runs, "
            "(SELECT COUNT(*) FROM runs WHERE status = 'failed') AS failed_runs, "
            "(SELECT COUNT(*) FROM findings) AS findings",
        ).records()[0]
        for key, value in counts.items():
            click.echo(f"{key}: {value}")
