"""Output tables of the memory pass (`nsysan.passes.memory`): declared beside the pass, as
every pass declares its own (docs/architecture.md), in their own module to keep the pass's
module readable."""

from __future__ import annotations

import polars as pl

I64, F64, STR = pl.Int64, pl.Float64, pl.String

MEMORY = pl.Schema(
    {
        "trace_id": STR,
        "device_id": I64,
        "pid": I64,
        "mem_kind": STR,
        "bin": I64,
        "start_ns": I64,
        "end_ns": I64,
        "in_use_bytes_max": I64,  # exact: the highest level reached inside the bin
        "in_use_bytes_end": I64,  # level at the end of the bin
        "alloc_bytes": I64,
        "free_bytes": I64,
        "n_allocs": I64,
        "n_frees": I64,
        "pool_size_bytes_max": I64,  # local pools of this key, reserved (null without pools)
        "pool_utilized_bytes_max": I64,
    }
)

MEMORY_SUMMARY = pl.Schema(
    {
        "trace_id": STR,
        "device_id": I64,
        "pid": I64,
        "peak_bytes": I64,  # device-resident kinds of this process
        "peak_ns": I64,  # first time the peak is reached
        "device_peak_bytes": I64,  # all processes on the device together
        "device_peak_ns": I64,
        "device_total_bytes": I64,  # TARGET_INFO_GPU totalMemory
        "margin_bytes": I64,  # device_total_bytes - device_peak_bytes
        "margin_frac": F64,
        "n_events": I64,
        "n_steps": I64,  # steady steps the per-step columns are over
        "growth_bytes_per_step": F64,  # (level at last step end - at first step start) / n
        "steps_grown_frac": F64,  # share of steady steps that end above where they started
        "steps_allocating_frac": F64,  # share of steady steps that allocate
        "allocs_per_step": F64,
        "frees_per_step": F64,
        "alloc_bytes_per_step": F64,
        "free_bytes_per_step": F64,
        "api_ns_per_step": F64,  # host time in the API calls that made the steps' events
        "pool_reserved_peak_bytes": I64,
        "pool_utilized_at_peak_bytes": I64,
        "pool_utilized_frac": F64,  # utilized / reserved at the reserved peak
        "pool_growths": I64,  # steady-window events that grew a pool
        "pool_growths_with_slack": I64,  # ... although the pool's free bytes could hold them
    }
)

MEMORY_SITES = pl.Schema(
    {
        "trace_id": STR,
        "device_id": I64,
        "pid": I64,
        "nvtx_name": STR,  # innermost NVTX range around the calls; null: outside every range
        "n_allocs": I64,
        "alloc_bytes": I64,
        "alloc_bytes_frac": F64,  # of the process's allocated bytes on the device
        "steady_n_allocs": I64,  # in the steady steps (all of them without steps)
        "steady_alloc_bytes": I64,
    }
)

#: the pass's tables (its SPEC's ``tables``)
TABLES = {"memory": MEMORY, "memory_summary": MEMORY_SUMMARY,
          "memory_sites": MEMORY_SITES}
