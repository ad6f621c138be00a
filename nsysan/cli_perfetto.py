"""``nsysan perfetto SOURCE -o FILE``: the annotated Perfetto trace of a trace analysed earlier.

SOURCE is either a folder that ``nsysan analyze`` wrote (its manifest names the input, whose
GPU ops and NVTX ranges are read again; the gaps, steps and findings come from the folder, so
the trace shows what that analysis found) or a trace, which is analysed first (default passes).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from nsysan.errors import ConfigError


def _from_folder(folder: Path) -> tuple[Any, dict, list]:
    import polars as pl

    from nsysan.load import open_trace
    from nsysan.report.manifest import MANIFEST_JSON

    try:
        manifest = json.loads((folder / MANIFEST_JSON).read_text(encoding="utf-8"))
        findings = json.loads((folder / "findings.json").read_text(encoding="utf-8"))["findings"]
        inputs = [(i["path"], i.get("bytes")) for i in manifest["inputs"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{folder}: not a complete nsysan analyze output ({exc}); pass the "
                          "trace itself, or the folder `nsysan analyze -o OUT` wrote "
                          "(OUT/<trace_id>)") from None
    if len(inputs) != 1:
        raise ConfigError(f"{folder}: its manifest names {len(inputs)} inputs, not one trace; "
                          "pass the trace itself")
    src, size = Path(inputs[0][0]), inputs[0][1]
    if not src.exists():
        raise ConfigError(f"{folder}: the trace it was analysed from, {src}, is gone; pass "
                          "the trace itself (it is analysed again)")
    if src.is_file() and size is not None and src.stat().st_size != size:
        raise ConfigError(f"{folder}: {src} changed since it was analysed ({src.stat().st_size}"
                          f" bytes, {size} then); analyse it again, or pass the trace itself")
    tables = {name: pl.read_parquet(folder / f"{name}.parquet")
              for name in ("gaps", "steps") if (folder / f"{name}.parquet").is_file()}
    return open_trace(src), tables, findings


def _from_trace(path: Path, nsys: Path | None) -> tuple[Any, dict, list]:
    from nsysan.api import analyze
    from nsysan.report.jsonout import findings_document

    result = analyze(path, nsys=str(nsys) if nsys else None)
    tables = {n: df for r in result.results.values() for n, df in r.tables.items()}
    findings = ([] if result.diagnosis is None
                else findings_document(result.diagnosis, result.trace)["findings"])
    return result.trace, tables, findings


@click.command("perfetto")
@click.argument("source", type=click.Path(exists=True, path_type=Path))
@click.option("-o", "--out", "out", type=click.Path(dir_okay=False, path_type=Path),
              required=True, help="The trace file to write, e.g. run.pftrace.")
@click.option("--nsys", type=click.Path(path_type=Path), default=None,
              help="The nsys binary used to export a .nsys-rep/.qdrep SOURCE.")
def perfetto_cmd(source: Path, out: Path, nsys: Path | None) -> None:
    """Write the annotated timeline of SOURCE for ui.perfetto.dev (Open trace file).

    SOURCE: a folder written by `nsysan analyze` (OUT/<trace_id>), or a trace.
    """
    from nsysan.report.atomic import write_errors
    from nsysan.report.perfetto import require, write_perfetto

    require()
    is_output = source.is_dir() and (source / "manifest.json").is_file() \
        and (source / "findings.json").is_file()
    trace, tables, findings = (_from_folder(source) if is_output
                               else _from_trace(source, nsys))
    with write_errors(out):
        path = write_perfetto(out, trace, tables, findings)
    click.echo(f"{path}: open it at ui.perfetto.dev (Open trace file)")
