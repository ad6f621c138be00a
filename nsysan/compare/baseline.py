"""Named baselines, and how the two sides of a diff or check are found.

A baseline is an analysis (its Parquet tables, findings.json and manifest.json) stored under a
name. Where it lives:

* **catalog** (when a catalog is configured: ``--catalog`` / ``$NSYSAN_CATALOG``): the
  ``baselines`` table of the batch catalog (`nsysan.batch.catalog`). Saving the id of a trace
  the catalog already analysed (``nsysan baseline save main <trace_id>``) just names that run
  (`Catalog.set_baseline`); saving a trace file or an output directory stores a copy of the
  analysis in the local directory below and records it in the catalog.
* **local directory** otherwise: ``--store DIR``, else ``$NSYSAN_BASELINES``, else
  ``$XDG_DATA_HOME/nsysan/baselines`` (``~/.local/share/nsysan/baselines``); one
  subdirectory per name with a ``baseline.json`` describing it.

`resolve` turns a command-line argument into a `MetricSet`: an existing file or directory
(a trace, or an ``analyze`` output directory), else a baseline name.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from nsysan.compare import metrics as M
from nsysan.compare.inputs import FINDINGS_JSON, MANIFEST_JSON, find_output_dir
from nsysan.errors import ConfigError
from nsysan.report.atomic import atomic_write

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
RECORD = "baseline.json"


@dataclass
class Baseline:
    name: str
    created_utc: str
    trace_id: str
    output_dir: str  # the analysis the baseline reads
    source: str  # what was saved: trace path, output directory, or catalog run
    where: str  # local | catalog
    run_id: str | None = None
    headline: dict[str, float | None] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def default_store() -> Path:
    env = os.environ.get("NSYSAN_BASELINES")
    if env:
        return Path(env).expanduser()
    data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data) / "nsysan" / "baselines"


def _stored(name: str) -> bool:
    """A file a baseline folder holds: the tables, findings.json, manifest.json, the record."""
    return name.endswith(".parquet") or name in (FINDINGS_JSON, MANIFEST_JSON, RECORD)


def check_name(name: str) -> str:
    if not NAME_RE.match(name):
        raise ConfigError(f"baseline name {name!r} is invalid: use letters, digits, '.', '_' "
                          "and '-' (at most 100, starting with a letter or digit)")
    return name


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _analyze(trace: Path, options: dict[str, Any]) -> Any:
    from nsysan.api import analyze

    return analyze(trace, **{k: v for k, v in options.items() if v is not None})


def write_analysis(result: Any, directory: Path) -> None:
    """The files a comparison reads (tables, findings.json, manifest.json), no pictures."""
    from nsysan.passes import registry
    from nsysan.report.jsonout import write_findings_json
    from nsysan.report.manifest import ManifestInfo, write_manifest
    from nsysan.report.parquet import write_tables

    schemas = {n: s for r in registry.resolve(result.results) for n, s in r.tables.items()}
    write_tables(result.tables, directory, schemas)
    if result.diagnosis is not None:
        write_findings_json(directory, result.diagnosis, result.trace)
    write_manifest(directory, result.trace, ManifestInfo(
        params=result.params, timings_s=result.timings_s, options=result.options,
        findings_params=getattr(result.diagnosis, "params", None)))


class LocalStore:
    """Baselines as directories under ``root``."""

    where = "local"

    def __init__(self, root: str | Path | None = None):
        self.root = Path(root).expanduser() if root is not None else default_store()

    def _dir(self, name: str) -> Path:
        return self.root / check_name(name)

    def save(self, name: str, target: str | Path, options: dict[str, Any] | None = None
             ) -> Baseline:
        """Store an analysis of ``target`` (a trace, or an ``analyze`` output directory)."""
        from nsysan.report.ownership import legacy_files, replacing

        final = self._dir(name)
        target = Path(target)
        if not target.exists():
            raise ConfigError(f"{target}: no such trace or output directory")
        # a baseline's folder is replaced by the next save of that name, whatever it holds,
        # but only when nsysan wrote it and nothing else is in it (see docs/outputs.md)
        with replacing(self.root, name, kind="baseline", inputs=[target], option="--store",
                       legacy=legacy_files(_stored, RECORD), same_input_only=False) as folder:
            tmp = folder.tmp
            found = find_output_dir(target)
            if found is not None:
                for f in sorted(found.iterdir()):
                    if f.is_file() and _stored(f.name) and f.name != RECORD:
                        shutil.copy2(f, tmp / f.name)
                source = str(found.resolve())
            else:
                write_analysis(_analyze(target, options or {}), tmp)
                source = str(target.resolve())
            ms = M.from_dir(tmp)
            rec = Baseline(name, _now(), ms.trace_id, str(final.resolve()), source, self.where,
                           headline=ms.headline())
            atomic_write(tmp / RECORD, json.dumps(rec.to_dict(), indent=2) + "\n")
            folder.commit()
        return rec

    def get(self, name: str) -> Baseline | None:
        path = self._dir(name) / RECORD
        if not path.is_file():
            return None
        try:
            return Baseline(**json.loads(path.read_text(encoding="utf-8")))
        except (json.JSONDecodeError, TypeError) as exc:
            raise ConfigError(f"{path}: corrupt baseline record ({exc}); save it again") from None

    def list(self) -> list[Baseline]:
        if not self.root.is_dir():
            return []
        found = [self.get(p.name) for p in sorted(self.root.iterdir())
                 if p.is_dir() and NAME_RE.match(p.name)]
        return [b for b in found if b is not None]


class CatalogStore:
    """Baselines in the batch catalog's ``baselines`` table (copies of analyses that the
    catalog does not hold live in a `LocalStore`)."""

    where = "catalog"

    def __init__(self, catalog: str, files: LocalStore):
        from nsysan.batch.catalog import Catalog, catalog_url

        self.catalog = Catalog(catalog_url(catalog))
        self.files = files

    def save(self, name: str, target: str | Path, options: dict[str, Any] | None = None
             ) -> Baseline:
        check_name(name)
        if not Path(target).exists():  # a trace id of the catalog: name its latest ok run
            row = self.catalog.set_baseline(name, str(target))
            return self._record(name, row, source=f"catalog run {row['run_id']}")
        rec = self.files.save(name, target, options)
        self._upsert(name, rec)
        rec.where = self.where
        return rec

    def _upsert(self, name: str, rec: Baseline) -> None:
        from nsysan.batch.catalog import BASELINES, utcnow

        values = {"name": name, "created_utc": utcnow(), "trace_id": rec.trace_id,
                  "run_id": None, "output_dir": rec.output_dir,
                  "metrics_json": json.dumps(rec.headline or {}, sort_keys=True)}

        def run(conn: Any) -> None:  # portable upsert: the name is the primary key
            conn.execute(BASELINES.delete().where(BASELINES.c.name == name))
            conn.execute(BASELINES.insert().values(**values))

        self.catalog.transaction(run)

    def _record(self, name: str, row: dict[str, Any], source: str | None = None) -> Baseline:
        created = row.get("created_utc")
        metrics = row.get("metrics")
        if metrics is None:
            metrics = json.loads(row.get("metrics_json") or "{}")
        if "step_time_ns" not in metrics:  # a catalog run's summary metrics: same meaning
            metrics = {"step_time_ns": metrics.get("step_mean_ns"),
                       "gpu_busy_frac": metrics.get("gpu_busy_frac")}
        return Baseline(name, created.isoformat() if hasattr(created, "isoformat")
                        else str(created), str(row.get("trace_id")), str(row.get("output_dir")),
                        source or (f"catalog run {row['run_id']}" if row.get("run_id")
                                   else str(row.get("output_dir"))),
                        self.where, row.get("run_id"), metrics)

    def get(self, name: str) -> Baseline | None:
        row = self.catalog.baseline(name)
        return None if row is None else self._record(name, row)

    def list(self) -> list[Baseline]:
        from nsysan.batch.catalog import BASELINES

        def run(conn: Any) -> list[dict[str, Any]]:
            q = BASELINES.select().order_by(BASELINES.c.name)
            return [dict(r._mapping) for r in conn.execute(q)]

        return [self._record(r["name"], r) for r in self.catalog.read(run)]


def open_store(catalog: str | None = None, store: str | Path | None = None
               ) -> LocalStore | CatalogStore:
    """The catalog when one is configured (argument, else $NSYSAN_CATALOG), else local."""
    local = LocalStore(store)
    catalog = catalog or os.environ.get("NSYSAN_CATALOG") or None
    return CatalogStore(catalog, local) if catalog else local


def load(rec: Baseline, devices: tuple[int, ...] | None = None) -> M.MetricSet:
    d = Path(rec.output_dir)
    if not d.is_dir():
        raise ConfigError(f"baseline {rec.name!r}: its analysis {d} is gone; save it again")
    ms = M.from_dir(d, devices)
    ms.source = f"baseline {rec.name} ({rec.source})"
    return ms


def resolve(arg: str, *, store: LocalStore | CatalogStore | None = None,
            options: dict[str, Any] | None = None, role: str = "input",
            devices: tuple[int, ...] | None = None) -> M.MetricSet:
    """A trace, an ``analyze`` output directory, or a baseline name -> its metric set
    (``devices``: only those devices, see `nsysan.compare.metrics.extract`)."""
    path = Path(arg)
    if path.exists():
        found = find_output_dir(path)
        if found is not None:
            return M.from_dir(found, devices)
        from nsysan.compare.inputs import RunData

        return M.extract(RunData.from_result(_analyze(path, options or {}), source=str(path)),
                         devices)
    store = store if store is not None else open_store()
    rec = store.get(arg) if NAME_RE.match(arg) else None
    if rec is None:
        known = ", ".join(b.name for b in store.list()[:10]) or "none"
        raise ConfigError(f"{role} {arg!r} is not a trace, an analyze output directory or a "
                          f"baseline (baselines: {known})")
    return load(rec, devices)
