"""Where raw nsys tables come from: a SQLite export or a parquetdir export.

Adapters only talk to a `TableSource`, so no adapter (and no pass) knows which form a trace
came in. Raw table and column names are nsys's own (``CUPTI_ACTIVITY_KIND_KERNEL.start``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import polars as pl


class TableSource(Protocol):
    """Read access to the raw tables of one nsys export."""

    path: Path
    format: str  # "sqlite" | "parquetdir"

    def tables(self) -> dict[str, int]:
        """Every raw table present, with its row count."""
        ...

    def columns(self, table: str) -> list[str]:
        """Column names of ``table`` (empty list when the table is absent)."""
        ...

    def read(self, table: str, columns: list[str]) -> pl.DataFrame:
        """The given columns of ``table`` as a polars frame, in the export's row order,
        with nsys's column names. Integer columns are Int64, text columns String."""
        ...

    def issues(self, table: str) -> dict[str, dict[str, int]]:
        """What the reads of ``table`` could not return as stored, per column and kind
        (``nulled``: a value of another type than its column's, read as NULL; ``truncated``:
        text cut to `nsysan.load.quality.text_limit` bytes). See docs/data-quality.md."""
        ...

    def close(self) -> None: ...
