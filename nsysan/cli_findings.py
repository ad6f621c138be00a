"""``nsysan findings``: the finding codes and every threshold with its default."""

from __future__ import annotations

import json

import click


@click.command("findings")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def findings_cmd(as_json: bool) -> None:
    """List the finding codes and the thresholds of the rules (settable with
    --set findings.PARAM=VALUE), with their defaults."""
    from nsysan.findings.catalogue import CATALOGUE
    from nsysan.findings.params import describe

    thresholds = describe()
    if as_json:
        click.echo(json.dumps({
            "codes": [{"code": s.code, "layer": s.layer, "title": s.title,
                       "severity_rule": s.severity_rule} for s in CATALOGUE.values()],
            "thresholds": thresholds}, indent=2))
        return
    click.echo("codes (docs/findings.md):")
    for s in CATALOGUE.values():
        click.echo(f"  {s.code} [{s.layer}]: {s.title}")
    click.echo("thresholds:")
    for t in thresholds:
        click.echo(f"  --set findings.{t['name']}={t['default']}")
