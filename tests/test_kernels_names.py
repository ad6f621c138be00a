"""kernels: the fallback from a missing demangled name to the short name (a path taken only
when some op lacks a demangled name), and the first of duplicate launch calls."""

from __future__ import annotations

import polars as pl

from nsysan.frames import schemas
from nsysan.frames.trace import Trace
from nsysan.passes import kernels as K

GPID = 100 << 24


def trace(demangled: list[str | None], api_rows: list[tuple[int, int, int]]) -> Trace:
    ops = pl.DataFrame(
        [dict(kind="kernel", correlation_id=i + 1, start_ns=100 * (i + 1),
              end_ns=100 * (i + 1) + 10 * (i + 1), name="k", demangled_name=d,
              op_class="compute", global_pid=GPID, pid=100, device_id=0)
         for i, d in enumerate(demangled)],
        schema={c: schemas.GPU_OPS[c] for c in (
            "kind", "correlation_id", "start_ns", "end_ns", "name", "demangled_name", "op_class",
            "global_pid", "pid", "device_id")},
    )
    api = pl.DataFrame(
        [dict(correlation_id=c, start_ns=s, end_ns=e, global_pid=GPID, pid=100, tid=1,
              global_tid=GPID | 1, name="cudaLaunchKernel") for c, s, e in api_rows],
        schema={c: schemas.CUDA_API[c] for c in (
            "correlation_id", "start_ns", "end_ns", "global_pid", "pid", "tid", "global_tid",
            "name")},
    )
    return Trace.from_frames("t", {"gpu_ops": ops, "cuda_api": api})


def summary(t: Trace) -> list[tuple]:
    table = K.run(t, K.KernelsParams(), {}).tables["kernels"]
    return table.select("demangled_name", "count", "total_ns", "api_mean_ns",
                        "queue_max_ns").rows()


def test_missing_demangled_name_groups_under_the_short_name():
    # Kernel 1 has no demangled name: it joins kernel 3, whose demangled name is "k".
    got = summary(trace(["k", "void k<int>()", None], [(1, 90, 95), (2, 150, 160)]))
    assert got == [("k", 2, 40, 5.0, 10), ("void k<int>()", 1, 20, 10.0, 50)]


def test_duplicate_calls_keep_the_first_and_other_kernels_keep_theirs():
    got = summary(trace(["k", "k"], [(1, 90, 95), (1, 80, 99), (2, 150, 160), (2, 150, 160)]))
    assert got == [("k", 2, 30, 7.5, 50)]
