"""Where raw nsys tables come from: a SQLite export or a parquetdir export.

Adapters only talk to a `TableSource`, so no adapter (and no pass) knows which form a trace
came in. Raw table and column names are nsys's own (``CUPTI_ACTIVITY_KIND_KERNEL.start``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

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


@dataclass(frozen=True)
class Cond:
    """One condition on a raw column: ``op`` is ``==``, ``>``, ``in`` (``value``: a sequence
    of integers) or ``is_null``."""

    column: str
    op: str
    value: Any = None

    def __post_init__(self) -> None:
        if self.op not in ("==", ">", "in", "is_null"):
            raise ValueError(f"unknown condition {self.op!r}")


#: rows matching any of the alternatives, each alternative all of its conditions (an OR of
#: ANDs): what `FilteredSource.read_where` pushes down into the export
RowFilter = tuple[tuple[Cond, ...], ...]


class FilteredSource(Protocol):
    """A `TableSource` that can push a row filter down into the export, so that a big table
    is never read whole for a few of its rows (the CPU call stacks: 13M rows at 1M
    kernels, of which the host pass needs about one in ten)."""

    def read_where(self, table: str, columns: list[str], where: RowFilter, *,
                   expected_rows: int | None = None) -> pl.DataFrame:
        """The given integer columns (as Int64) of the rows of ``table`` that match
        ``where``, in no promised order (SQLite answers it through an index where one
        fits, e.g. an ``in`` list of keys). ``expected_rows``: about how many rows match,
        when the caller knows (a hint for sizing buffers, never a limit). A value of another
        type than INTEGER that the read meets is reported through `TableSource.issues`
        (``nulled``); the caller then reads the table whole with `TableSource.read`, whose
        data-quality rules handle it."""
        ...

    def not_null(self, table: str) -> set[str]:
        """The columns of ``table`` the export guarantees to hold no NULL."""
        ...


class NarrowingSource(Protocol):
    """A `TableSource` that can hand integer columns over in a narrower type than Int64, so
    that a frame build does not hold 64-bit copies of ids its frame stores in 16 or 32 bits
    (`nsysan.load.sqlite_bulk`: most of a big build's transient memory)."""

    def read_narrowed(self, table: str, columns: list[str],
                      narrow: Mapping[str, pl.DataType]) -> pl.DataFrame:
        """`TableSource.read`, where each integer column of ``narrow`` may come in the
        integer type given there instead of Int64 — only when every value fits it; the
        source chooses (a column it does not narrow comes as Int64)."""
        ...
