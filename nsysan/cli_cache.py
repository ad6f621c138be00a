"""``nsysan cache list|prune``: what the frame cache holds, and removing some of it
(`nsysan.load.cache_space`)."""

from __future__ import annotations

import json
import math
import time
from dataclasses import replace
from pathlib import Path

import click

from nsysan.errors import ConfigError

_CACHE_DIR = click.option(
    "--cache-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
    help="The cache dir (default: $NSYSAN_CACHE_DIR or ~/.cache/nsysan).")


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t))


def _bound_text() -> str:
    from nsysan.load.cache_space import MAX_ENV, max_bytes

    limit = max_bytes()
    return f"bound {_size(limit) if limit is not None else 'none'} (${MAX_ENV})"


@click.group("cache")
def cache_group() -> None:
    """The frame cache: the traces it holds, and removing some of them.

    Analyses of big SQLite exports keep a mapped copy of their frames there (about 30% of the
    export's size); before one writes a trace's copy, the least recently used other traces
    are removed to keep the cache within $NSYSAN_CACHE_MAX (default 20G; none for no bound).
    """


@cache_group.command("list")
@_CACHE_DIR
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
def list_cmd(cache_dir: Path | None, as_json: bool) -> None:
    """The cached traces, least recently used first, and their total size."""
    from nsysan.load.cache import cache_root
    from nsysan.load.cache_space import entries

    root = cache_root(cache_dir)
    # (a cache folder without any of nsysan's files holds no trace: the user's files kept
    # by a prune, or an analysis that has not written yet)
    folders = entries(root)
    found = [e for e in folders if e.bytes]
    empty = [str(e.folder) for e in folders if not e.bytes]
    if as_json:
        click.echo(json.dumps({"root": str(root), "bytes": sum(e.bytes for e in found),
                               "traces": [{"folder": str(e.folder), "source": e.source_name,
                                           "bytes": e.bytes, "last_used": e.last_used}
                                          for e in found],
                               "folders_without_frames": empty}, indent=2))
        return
    for e in found:
        click.echo(f"{_size(e.bytes):>11}  {_when(e.last_used)}  {e.source_name}  "
                   f"({e.folder.name})")
    total = sum(e.bytes for e in found)
    others = f"; {len(empty)} other folder(s) hold no frames" if empty else ""
    click.echo(f"{len(found)} cached trace(s), {_size(total)} in {root}{others}; "
               f"{_bound_text()}")


@cache_group.command("prune")
@_CACHE_DIR
@click.option("--max-size", default=None, metavar="SIZE",
              help="Remove the least recently used traces until the cache takes at most SIZE "
              "(e.g. 5G). Default, without --older-than or --all: $NSYSAN_CACHE_MAX.")
@click.option("--older-than", "older_than", type=float, default=None, metavar="DAYS",
              help="Remove the traces not used for DAYS days.")
@click.option("--all", "everything", is_flag=True, help="Remove every cached trace.")
@click.option("--dry-run", is_flag=True, help="Say what would be removed; remove nothing.")
def prune_cmd(cache_dir: Path | None, max_size: str | None, older_than: float | None,
              everything: bool, dry_run: bool) -> None:
    """Remove cached traces (only the files nsysan wrote there)."""
    from nsysan.load.cache import cache_root
    from nsysan.load.cache_space import entries, max_bytes, parse_size, prune

    if older_than is not None and not 0 <= older_than < math.inf:
        raise ConfigError(f"--older-than is {older_than:g} days; give 0 or more")
    limit = parse_size(max_size, "--max-size") if max_size is not None else None
    if max_size is None and older_than is None and not everything:
        limit = max_bytes()
    root = cache_root(cache_dir)
    removed = prune(root, max_total=limit, older_than_s=None if older_than is None
                    else older_than * 86400, everything=everything, dry_run=dry_run)
    verb = "would remove" if dry_run else "removed"
    for r in removed:
        kept = "; its folder stays (not empty, or it could not be removed)" if r.folder_kept else ""
        click.echo(f"{verb} {_size(r.bytes):>11}  {_when(r.entry.last_used)}  "
                   f"{r.entry.source_name}  ({r.folder.name}){kept}")
    left = entries(root)
    if dry_run:  # (what the removal would leave)
        plan = {r.folder: r for r in removed}
        left = [replace(e, bytes=e.bytes - plan[e.folder].bytes) if e.folder in plan else e
                for e in left if e.folder not in plan or plan[e.folder].folder_kept]
    click.echo(f"{verb} {len(removed)} trace(s), {_size(sum(r.bytes for r in removed))}; "
               f"{len(left)} folder(s) left, {_size(sum(e.bytes for e in left))} in {root}")
