"""The launch environment a profile recorded: rank and world size variables.

Read from the capture settings and the ``meta`` frame of one trace. The nccl pass (world
size) and the multi-rank analysis (ranks, `nsysan.multirank.ranks`) both need it, so it lives
in the loading layer, below both.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import polars as pl

from nsysan.frames.trace import Trace

__all__ = ["RANK_VARS", "WORLD_SIZE_VARS", "env_of_meta", "env_of_trace", "rank_from_env",
           "world_size_from_env"]

RANK_VARS = (
    "RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "MV2_COMM_WORLD_RANK",
    "SLURM_PROCID", "LOCAL_RANK",
)
WORLD_SIZE_VARS = (
    "WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE", "SLURM_NTASKS",
    "SLURM_STEP_NUM_TASKS",
)


def env_of_meta(meta: pl.DataFrame) -> dict[str, str]:
    """Environment variables recorded in a trace's ``meta`` frame (first value wins).

    Understands the forms an export can carry: ``PROCESS_n:ENVIRONMENT_VARIABLE`` rows
    (``NAME="value"``, nsys 2023.4+), a NUL-separated ``DeviceEnvironment`` block
    (``TARGET_INFO_SYSTEM_ENV``), and keys that name the variable (``env:NAME``).
    """
    env: dict[str, str] = {}
    if meta.is_empty():
        return env
    # Small frame (capture settings): a Python pass over its rows is fine.
    rows = meta.select("key", "value").filter(pl.col("value").is_not_null()).rows()
    ordered = sorted(rows, key=lambda kv: "DeviceEnvironment" in kv[0])  # process env first
    for key, value in ordered:
        if key.endswith("ENVIRONMENT_VARIABLE") or "DeviceEnvironment" in key:
            # NUL-separated in older exports, ";"-separated in newer ones.
            items = (value.split("\x00") if "\x00" in value
                     else re.split(r";(?=[A-Za-z_][A-Za-z0-9_]*=)", value))
            for item in items:
                name, sep, val = item.partition("=")
                if sep and name and name not in env:
                    env[name.strip()] = val.strip().strip('"')
            continue
        m = re.match(r"(?i)^(?:.*[:.])?env(?:ironment)?[:.]([A-Za-z_][A-Za-z0-9_]*)$", key)
        if m and m.group(1) not in env:
            env[m.group(1)] = value.strip().strip('"')
    return env


def env_of_trace(trace: Trace) -> dict[str, str]:
    """The launch environment of a profile: the capture's ``PROCESS_n:ENVIRONMENT_VARIABLE``
    entries (kept in ``TraceMeta.capture``), then whatever the ``meta`` frame holds."""
    capture = pl.DataFrame(
        [(k, v) for k, values in trace.meta.capture.items() if "ENVIRONMENT_VARIABLE" in k
         for v in values],
        schema={"key": pl.String, "value": pl.String}, orient="row",
    )
    env = env_of_meta(capture)
    for k, v in env_of_meta(trace.frame("meta")).items():
        env.setdefault(k, v)
    return env


def _int(value: str | None) -> int | None:
    if value is None:
        return None
    value = value.strip()
    return int(value) if value.isdigit() else None


def rank_from_env(env: Mapping[str, str]) -> tuple[int, str] | None:
    for var in RANK_VARS:
        r = _int(env.get(var))
        if r is not None:
            return r, f"env:{var}"
    return None


def world_size_from_env(env: Mapping[str, str]) -> int | None:
    for var in WORLD_SIZE_VARS:
        n = _int(env.get(var))
        if n:
            return n
    return None
