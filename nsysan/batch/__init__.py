"""Batch analysis of many traces (``nsysan batch``) and the run catalog (``nsysan catalog``).

Modules: `discover` (inputs → traces and ids), `state` (skip keys, done markers), `worker`
(`run_one`, the unit of work), `executors` (local processes, Dask), `catalog` + `migrations`
(SQLAlchemy schema, writes), `queries` (canned questions), `summary` (catalog metrics),
`progress`, `run` (`run_batch`). See docs/catalog.md.
"""

from __future__ import annotations

from typing import Any

__all__ = ["BatchSummary", "Catalog", "run_batch"]


def __getattr__(name: str) -> Any:
    # Lazy: importing nsysan.batch (e.g. for RunTask in a worker) stays cheap.
    if name in ("run_batch", "BatchSummary"):
        from nsysan.batch import run

        return getattr(run, name)
    if name == "Catalog":
        from nsysan.batch.catalog import Catalog

        return Catalog
    raise AttributeError(f"module 'nsysan.batch' has no attribute {name!r}")
