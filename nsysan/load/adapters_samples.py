"""The CPU sampling frames: ``cpu_samples`` (one row per sample) and ``cpu_stacks`` (its
call stack, one row per frame).

nsys' CPU IP/backtrace sampling (``--sample=cpu``) writes ``COMPOSITE_EVENTS(id, start, cpu,
threadState, globalTid, cpuCycles)`` and ``SAMPLING_CALLCHAINS(id, symbol, module,
kernelMode, ..., stackDepth)`` with depth 0 the leaf; ``symbol`` and ``module`` are StringIds
keys. Every schema from 2.9 to 3.25 has these columns; ``threadState`` and ``kernelMode`` are
read where present (null otherwise). ``cpu_samples`` takes its leaf frame from
``cpu_stacks`` (the call-chain table is read once); a sample without a call chain has null
leaf columns and ``n_frames`` 0. Rows without an id, time or thread are dropped (counted as
``missing_timestamp``).
"""

from __future__ import annotations

import numpy as np
import polars as pl

from nsysan.frames import schemas
from nsysan.frames.order import content_sort
from nsysan.load.adapters import Adapter, pid_of, tid_of
from nsysan.load.adapters_sched import state_labels

SAMPLES_TABLE = "COMPOSITE_EVENTS"
CALLCHAINS_TABLE = "SAMPLING_CALLCHAINS"


def _resolve_categorical(adapter: Adapter, df: pl.DataFrame, cols: dict[str, str]
                         ) -> pl.DataFrame:
    """Replace each StringIds key column by its value as a Categorical: each distinct id is
    looked up once and every row holds a 32-bit code. Why: a call-chain table has ~10 frames
    per sample (13M rows at 1M kernels) but a few thousand distinct symbols and a few hundred
    modules; a String column would copy the (long, C++-mangled) text into every row."""
    strings = adapter.strings
    for col, out in cols.items():
        at = _dense_codes(df[col])
        if at is None:  # ids too sparse or negative for a dense table: hash them
            ids = df.select(pl.col(col).unique().drop_nulls().sort())
            at = df[col].replace_strict(ids[col], pl.int_range(ids.height, eager=True),
                                        default=None, return_dtype=pl.UInt32)
        else:
            at, ids = at
        lookup = ids.join(strings.rename({"id": col, "value": out}), on=col, how="left",
                          maintain_order="left")
        values = lookup[out].cast(pl.Categorical)
        df = df.with_columns(values.gather(at).alias(out)).drop(col)
    return df


def _dense_codes(ids: pl.Series) -> tuple[pl.Series, pl.DataFrame] | None:
    """(each row's index into the sorted distinct ids, those ids as a one-column frame) through
    a table indexed by id (StringIds keys are small non-negative integers): no hashing of
    the 13M frames of a big call-chain table. None when the ids do not suit a dense table."""
    if ids.is_empty():
        return None
    low, high = ids.min(), ids.max()
    if low is None or low < 0 or high >= max(1 << 20, 4 * ids.len()):
        return None
    values = ids.fill_null(0).to_numpy()
    present = np.zeros(high + 1, dtype=bool)
    present[values] = True
    if ids.null_count():  # a null id is no value (the lookup gives null)
        present[0] = bool((values[ids.is_not_null().to_numpy()] == 0).any())
    distinct = np.flatnonzero(present)
    index = np.zeros(high + 1, dtype=np.uint32)
    index[distinct] = np.arange(distinct.size, dtype=np.uint32)
    at = pl.Series(index[values]).scatter(ids.is_null().arg_true(), None) if ids.null_count() \
        else pl.Series(index[values])
    return at, pl.DataFrame({ids.name: pl.Series(distinct, dtype=pl.Int64)})


def _in_order(df: pl.DataFrame) -> bool:
    """True when the rows are strictly increasing in (id, stackDepth), as nsys writes them:
    then sorting is a no-op and no rows tie."""
    if df.height < 2:
        return True
    step = df.select(
        d_id=pl.col("id").diff(), d_depth=pl.col("stackDepth").diff()
    ).slice(1)
    return bool(step.select(((pl.col("d_id") > 0) | ((pl.col("d_id") == 0)
                                                      & (pl.col("d_depth") > 0))).all()).item())


def build_cpu_stacks(adapter: Adapter) -> pl.DataFrame | None:
    if not adapter.has(CALLCHAINS_TABLE):
        return None
    quality = adapter.quality("cpu_stacks")
    df = adapter.read(CALLCHAINS_TABLE, ["id", "symbol", "module", "stackDepth"],
                      {"kernelMode": pl.Int64()})
    valid = pl.col("id").is_not_null() & pl.col("stackDepth").is_not_null()
    dropped = df.height - int(df.select(valid.sum()).item()) if df.height else 0
    if dropped:
        quality.add("missing_timestamp", dropped)
        df = df.filter(valid)
    ordered = _in_order(df)
    df = _resolve_categorical(adapter, df, {"symbol": "symbol_name", "module": "module_name"})
    df = df.select(
        sample_id="id",
        depth="stackDepth",
        symbol="symbol_name",
        module="module_name",
        kernel_mode=pl.col("kernelMode").cast(pl.Boolean),
    )
    if not ordered:  # ties (duplicate frames) sort by the text: Categoricals sort lexically
        df = content_sort(df, ["sample_id", "depth"])
    return adapter.finish(df, schemas.CPU_STACKS)


def _leaves_and_sizes(stacks: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(``id, leaf_symbol, leaf_module``: the first depth-0 frame of each sample,
    ``id, n_frames``) of ``stacks``. The cpu_stacks frame is sorted by (sample_id, depth):
    then both come from comparisons with the previous row and run lengths, without hashing
    millions of frames; any other order takes the group-by."""
    leaf = stacks.filter(pl.col("depth") == 0).select(
        pl.col("sample_id").alias("id"), leaf_symbol="symbol", leaf_module="module")
    if stacks["sample_id"].is_sorted():
        leaf = leaf.filter(pl.col("id").ne_missing(pl.col("id").shift(1)))
        runs = stacks["sample_id"].rle().struct.unnest()
        frames = runs.select(id="value", n_frames="len")
    else:
        leaf = leaf.unique("id", keep="first", maintain_order=True)
        frames = stacks.group_by("sample_id").len("n_frames").rename({"sample_id": "id"})
    return leaf, frames


def build_cpu_samples(adapter: Adapter) -> pl.DataFrame | None:
    if not adapter.has(SAMPLES_TABLE):
        return None
    quality = adapter.quality("cpu_samples")
    df = adapter.read(SAMPLES_TABLE, ["id", "start", "globalTid"],
                      {"cpu": pl.Int64(), "threadState": pl.Int64()})
    valid = (pl.col("id").is_not_null() & pl.col("start").is_not_null()
             & pl.col("globalTid").is_not_null())
    dropped = df.height - int(df.select(valid.sum()).item()) if df.height else 0
    if dropped:
        quality.add("missing_timestamp", dropped)
        df = df.filter(valid)
    stacks = (adapter.frame("cpu_stacks") if adapter.frame is not None
              else build_cpu_stacks(adapter))
    if stacks is None:
        stacks = schemas.empty(schemas.CPU_STACKS)
    leaf, frames = _leaves_and_sizes(stacks)
    df = (
        state_labels(adapter, df, "threadState", "thread_state")
        .join(leaf, on="id", how="left", maintain_order="left")
        .join(frames, on="id", how="left", maintain_order="left")
    )
    df = df.select(
        sample_id="id",
        time_ns="start",
        global_tid="globalTid",
        pid=pid_of("globalTid"),
        tid=tid_of("globalTid"),
        cpu="cpu",
        thread_state=pl.when(pl.col("threadState").is_not_null()).then(pl.col("thread_state")),
        leaf_symbol="leaf_symbol",
        leaf_module="leaf_module",
        n_frames=pl.col("n_frames").cast(pl.Int64).fill_null(0),
    )
    return adapter.finish(content_sort(df, ["time_ns", "global_tid", "sample_id"]),
                          schemas.CPU_SAMPLES)
