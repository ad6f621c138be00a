"""The CPU sampling frames: ``cpu_samples`` (one row per sample) and ``cpu_stacks`` (its
call stack, one row per frame).

nsys' CPU IP/backtrace sampling (``--sample=cpu``) writes ``COMPOSITE_EVENTS(id, start, cpu,
threadState, globalTid, cpuCycles)`` and ``SAMPLING_CALLCHAINS(id, symbol, module,
kernelMode, ..., stackDepth)`` with depth 0 the leaf; ``symbol`` and ``module`` are StringIds
keys. Every schema from 2.9 to 3.25 has these columns; ``threadState`` and ``kernelMode`` are
read where present (null otherwise). ``cpu_samples`` takes its leaf frame and its stack
layer from `nsysan.load.adapters_stacks.stack_summary`, which reads only the call-chain rows
that decide them (the ``cpu_stacks`` frame is built only when asked for: a notebook's
question, no pass needs it); a sample without a call chain has null leaf columns and stack
layer. Rows without an id, time or thread are dropped (counted as ``missing_timestamp``).
"""

from __future__ import annotations

import numpy as np
import polars as pl

from nsysan.frames import schemas_host
from nsysan.frames.conform import select_narrowed
from nsysan.frames.order import content_sort, content_sort_in_place, strictly_increasing
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
    return adapter.finish(df, schemas_host.CPU_STACKS)


def _with_summary(samples: pl.DataFrame, summary: pl.DataFrame) -> pl.DataFrame:
    """``samples`` with the `stack_summary` columns of each sample's ``id`` (null where it
    has no call chain): what a left join on ``id`` gives, in ``samples``' order.

    When the summary's ids are strictly increasing (as it is built from an nsys export),
    each sample's row of it is found by a binary search and the summary's columns are
    gathered beside the samples' own, which stay where they are; a join copied every column
    of the samples into its result (0.5 GB at 10M kernels, while the build's other frames
    were alive). Otherwise the join."""
    if not strictly_increasing(summary, ["id"]) or samples["id"].null_count():
        return samples.join(summary, on="id", how="left", maintain_order="left")
    k, q = summary["id"].to_numpy(), samples["id"].to_numpy()
    at = np.searchsorted(k, q)
    hit = at < k.size
    hit[hit] = k[at[hit]] == q[hit]
    rows = pl.Series("_at", at, dtype=pl.Int64).to_frame().select(
        pl.when(pl.Series(hit)).then(pl.col("_at"))).to_series()
    return samples.with_columns(summary.drop("id").select(pl.all().gather(rows)))


def build_cpu_samples(adapter: Adapter) -> pl.DataFrame | None:
    if not adapter.has(SAMPLES_TABLE):
        return None
    quality = adapter.quality("cpu_samples")
    df = adapter.read(SAMPLES_TABLE, ["id", "start", "globalTid"],
                      {"cpu": pl.Int64(), "threadState": pl.Int64()},
                      narrow={"cpu": schemas_host.CPU_SAMPLES["cpu"]})  # (copied as it is)
    valid = (pl.col("id").is_not_null() & pl.col("start").is_not_null()
             & pl.col("globalTid").is_not_null())
    dropped = df.height - int(df.select(valid.sum()).item()) if df.height else 0
    if dropped:
        quality.add("missing_timestamp", dropped)
        df = df.filter(valid)
    from nsysan.load.adapters_stacks import stack_summary

    df = _with_summary(state_labels(adapter, df, "threadState", "thread_state"),
                       stack_summary(adapter))
    df = select_narrowed(df, dict(
        sample_id="id",
        time_ns="start",
        global_tid="globalTid",
        pid=pid_of("globalTid"),
        tid=tid_of("globalTid"),
        cpu="cpu",
        thread_state=pl.when(pl.col("threadState").is_not_null()).then(pl.col("thread_state")),
        leaf_symbol="leaf_symbol",
        leaf_module="leaf_module",
        stack_layer="stack_layer",
    ), schemas_host.CPU_SAMPLES)
    # (in place: ``df`` is this function's own frame)
    return adapter.finish(content_sort_in_place(df, ["time_ns", "global_tid", "sample_id"]),
                          schemas_host.CPU_SAMPLES)
