"""Schemas of the host-evidence frames (issue 18): thread scheduling, CPU samples and their
call stacks (`nsysan.load.adapters_sched`, `nsysan.load.adapters_samples`), read by the host
pass. Same conventions as `nsysan.frames.schemas`. Separate because these are optional frames,
read only when a pass asks for them (they are large): not in `schemas.CANONICAL`, so nothing
that loads "every frame" pays for them.
"""

from __future__ import annotations

import polars as pl

from nsysan.frames.schemas import BOOL, CPU, I64, OS_ID, STACK_LAYER, STR, THREAD_STATE

SCHED = pl.Schema(
    {
        "trace_id": STR,
        "global_tid": I64,
        "pid": OS_ID,
        "tid": OS_ID,
        "cpu": CPU,  # the CPU of the switch-in
        "start_ns": I64,  # switch-in (or the session start when the thread ran already)
        "end_ns": I64,  # switch-out (or the session end when it never switched out)
        "open_start": BOOL,  # no switch-in before the first switch-out: opened at session start
        "open_end": BOOL,  # no switch-out after the last switch-in: closed at session end
        # thread state at the switch-out, where the export has it (a few labels)
        "out_state": THREAD_STATE,
    }
)
CPU_SAMPLES = pl.Schema(
    {
        "trace_id": STR,
        "sample_id": I64,  # COMPOSITE_EVENTS.id: joins cpu_stacks
        "time_ns": I64,
        "global_tid": I64,
        "pid": OS_ID,
        "tid": OS_ID,
        "cpu": CPU,
        # ENUM_SAMPLING_THREAD_STATE label, snake_case (running, ...): a few labels
        "thread_state": THREAD_STATE,
        # stack depth 0; Categorical like cpu_stacks' (a few thousand distinct values)
        "leaf_symbol": pl.Categorical(),
        "leaf_module": pl.Categorical(),
        # the host layer of the call stack (`host_taxonomy`: the leaf module's, an OS leaf
        # its nearest known caller's); null without a call chain
        "stack_layer": STACK_LAYER,
    }
)
CPU_STACKS = pl.Schema(
    {
        "trace_id": STR,
        "sample_id": I64,
        "depth": I64,  # 0 = leaf
        # Categorical: ~10 frames per sample share a few thousand symbols, a few hundred modules
        "symbol": pl.Categorical(),
        "module": pl.Categorical(),
        "kernel_mode": BOOL,
    }
)
#: optional frames (`Trace.frame` builds them on demand like the canonical ones)
HOST_EVIDENCE: dict[str, pl.Schema] = {
    "sched": SCHED,
    "cpu_samples": CPU_SAMPLES,
    "cpu_stacks": CPU_STACKS,
}
