"""Write pass tables as Parquet, each with its declared schema (even when empty)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import polars as pl

from nsysan.frames.schemas import conform
from nsysan.report.atomic import temp_file


def write_table(df: pl.DataFrame, path: Path, schema: pl.Schema | None = None) -> Path:
    """Write one table atomically: a temp file in the same directory, then rename."""
    if schema is not None and df.schema != schema:  # (conforming a conforming frame: a copy)
        df = conform(df, schema)
    tmp = temp_file(path)
    try:
        # zstd level 1: a third faster to encode than the default level 3 on the largest
        # tables (attribution: 0.13 -> 0.10 s per 450k rows), files ~4% larger
        df.write_parquet(tmp, compression="zstd", compression_level=1, statistics=True)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def write_tables(
    tables: Mapping[str, pl.DataFrame], out_dir: Path, schemas: Mapping[str, pl.Schema]
) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    return [
        write_table(df, out_dir / f"{name}.parquet", schemas.get(name))
        for name, df in tables.items()
    ]
