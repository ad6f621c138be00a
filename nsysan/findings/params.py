"""Thresholds of every finding rule, with their defaults and why."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from nsysan.errors import ConfigError

#: The ``--set`` prefix of finding thresholds (``--set findings.launch_warn_frac=0.2``).
PREFIX = "findings."


@dataclass(frozen=True)
class FindingParams:
    """Thresholds of the finding rules. Shares are of steady-state device time (the sum over
    devices of the analysed window), unless said otherwise."""

    # --- analysis window -----------------------------------------------------------------
    #: Without step markers, count-based steady-state rules (allocations, copies, syncs) skip
    #: this leading share of the GPU span: warm-up allocates and uploads on purpose.
    warmup_frac_without_steps: float = 0.2

    # --- GPU_STARVATION_PERIODIC -----------------------------------------------------------
    starvation_warn_frac: float = 0.05
    starvation_crit_frac: float = 0.20
    #: A gap pattern "recurs" when it hits at least this share of steps, or when at least
    #: ``starvation_min_gaps`` stalls are spaced regularly (in steps, or in time without
    #: steps): coefficient of variation of the spacing <= ``starvation_max_period_cv``.
    starvation_min_step_frac: float = 0.5
    starvation_min_gaps: int = 3
    starvation_max_period_cv: float = 0.5

    # --- H2D_NOT_OVERLAPPED ----------------------------------------------------------------
    h2d_warn_frac: float = 0.05
    h2d_crit_frac: float = 0.20

    # --- PAGEABLE_OR_SYNC_COPIES -----------------------------------------------------------
    copy_warn_frac: float = 0.02  # GPU time they cost / steady-state device time
    copy_crit_frac: float = 0.10
    #: nsys's cuda-sync-memcpy rule ignores synchronous H2D copies up to this size.
    copy_small_h2d_bytes: int = 64_000

    # --- HOST_SYNC_IN_STEP -----------------------------------------------------------------
    sync_warn_frac: float = 0.02  # device idle drained by syncs / device time
    sync_crit_frac: float = 0.10
    sync_min_count_without_steps: int = 10

    # --- LAUNCH_BOUND ----------------------------------------------------------------------
    #: Gaps shorter than this are "between kernels": launch latency and host overhead.
    #: Longer gaps are classified by the gaps pass's cause.
    short_gap_max_ns: int = 1_000_000
    launch_warn_frac: float = 0.10
    launch_crit_frac: float = 0.30

    # --- EXPOSED_COMMUNICATION -------------------------------------------------------------
    comm_warn_frac: float = 0.10
    comm_crit_frac: float = 0.25

    # --- NCCL_LOW_BANDWIDTH ----------------------------------------------------------------
    nccl_min_bytes: int = 1 << 20  # small messages are latency-bound: bandwidth meaningless
    nccl_warn_busbw_Bps: float = 10e9
    nccl_crit_busbw_Bps: float = 2e9

    # --- NO_TENSOR_CORES -------------------------------------------------------------------
    tc_warn_frac: float = 0.30
    tc_crit_frac: float = 0.60

    # --- DOMINANT_LAYER / NVTX_LOW_COVERAGE ------------------------------------------------
    dominant_layer_frac: float = 0.50
    nvtx_min_coverage: float = 0.50

    # --- MEMORY_CHURN ----------------------------------------------------------------------
    churn_warn_frac: float = 0.02
    churn_crit_frac: float = 0.10

    # --- SLOW_START ------------------------------------------------------------------------
    start_info_ns: int = 5_000_000_000
    start_warn_ns: int = 30_000_000_000

    # --- STARTUP_COST ----------------------------------------------------------------------
    #: A start-up call (first launch of a kernel, module / library loading, context creation,
    #: NCCL communicator init) counts when it lasts at least this long.
    startup_min_call_ns: int = 1_000_000
    #: STARTUP_COST is info below this much device idle in start-up calls, warning above.
    startup_warn_ns: int = 1_000_000_000

    # --- judgement: how much activity a severity needs (docs/findings.md) ------------------
    #: A symptom finding is at most info unless the analysed window holds at least this many
    #: GPU ops and this much device time, and repeats: judge_warn_min_steps steps, or
    #: (without steps) judge_warn_min_ops_without_steps ops. Critical also needs
    #: judge_crit_min_ns of device time and a steady state: judge_crit_min_steps steps, or
    #: (without steps) judge_crit_min_ops ops.
    judge_warn_min_ops: int = 20
    judge_warn_min_ns: int = 5_000_000
    judge_warn_min_steps: int = 2
    judge_warn_min_ops_without_steps: int = 100
    judge_crit_min_ns: int = 20_000_000
    judge_crit_min_steps: int = 3
    judge_crit_min_ops: int = 200
    #: MEMORY_CHURN without steps needs this many allocation calls to be called churn.
    churn_min_calls_without_steps: int = 10
    #: With steps, churn needs allocation calls in at least this share of the steady steps.
    churn_min_step_frac: float = 0.5

    # --- CAPTURE_TRUNCATED -----------------------------------------------------------------
    lost_warn_frac: float = 0.01

    # --- CAPTURE_DATA_QUALITY --------------------------------------------------------------
    #: Share of a frame's rows that the data-quality rules dropped or nulled for being
    #: impossible (exact copies and cut names do not count: they change no timing).
    quality_warn_frac: float = 0.01
    quality_crit_frac: float = 0.10

    # --- verdict ---------------------------------------------------------------------------
    #: A non-compute bottleneck becomes the verdict when it takes at least this share of
    #: device time (removing it would speed the step up by >= 25%) and more than any other.
    verdict_min_share: float = 0.20
    #: A stall that a warning- or critical-level finding reports becomes the verdict from this
    #: share on (when it is the largest stall), so that verdict and findings agree.
    verdict_finding_min_share: float = 0.10

    # --- evidence --------------------------------------------------------------------------
    top_n: int = 5

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name.endswith("_frac") and not 0 <= v <= 1:
                raise ConfigError(f"findings.{f.name} must be in [0, 1], got {v}")
            if isinstance(v, int | float) and v < 0:
                raise ConfigError(f"findings.{f.name} must be >= 0, got {v}")
        if self.top_n < 1:
            raise ConfigError(f"findings.top_n must be >= 1, got {self.top_n}")


def from_settings(settings: Mapping[str, str] | None) -> FindingParams:
    """`FindingParams` with the ``findings.PARAM`` overrides of ``--set`` settings (other keys
    belong to the passes and are ignored here)."""
    from nsysan.passes.registry import _coerce  # the same value parsing as pass parameters

    known = {f.name: f for f in fields(FindingParams)}
    overrides: dict[str, Any] = {}
    for key, raw in (settings or {}).items():
        if not key.startswith(PREFIX):
            continue
        name = key[len(PREFIX):]
        if name not in known:
            raise ConfigError(f"--set {key}: no finding threshold {name!r}; see "
                              "`nsysan findings` for the list")
        overrides[name] = _coerce(str(raw), known[name].type, f"--set {key}")
    return FindingParams(**overrides)


def describe() -> list[dict[str, Any]]:
    """Every threshold with its default (for ``nsysan findings``)."""
    defaults = FindingParams()
    return [{"name": f.name, "default": getattr(defaults, f.name)} for f in fields(FindingParams)]
