"""Is a change real? Bootstrap intervals on per-step samples plus a minimum effect size.

The test (documented in docs/diff.md):

* the **statistic** of a run is the (weighted) mean of its per-step samples, or one of their
  quantiles (linear interpolation between order statistics), e.g. ``p95`` of step time;
* its **noise** comes from a percentile bootstrap: the steps of each run are resampled
  independently with replacement (``n_boot`` times, fixed seed, so the same inputs always give
  the same verdict; see `Resampler`) and the ``confidence`` interval of
  ``stat(new) - stat(base)`` is read off the bootstrap distribution;
* a change is **significant** when that interval excludes 0, and **relevant** when the point
  estimate is at least ``max(min_effect * |base|, floor)``, where the floor is an absolute noise
  floor for the metric's unit (`floor_for`). Only a significant *and* relevant change is
  improved / regressed (by the metric's direction); anything else is unchanged.

Metrics without per-step samples on both sides (whole-trace kernel statistics, ...) have no
noise estimate: only the effect-size threshold applies and the method says so.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from nsysan.errors import ConfigError

VERDICTS = ("improved", "regressed", "unchanged", "not comparable")
#: statistics a sampled metric can be summarised by (``p50`` ... are quantiles)
STATS = ("mean", "p50", "p90", "p95", "p99", "min", "max")


@dataclass(frozen=True)
class StatsParams:
    """Thresholds of the change test (``nsysan diff --min-effect`` ...)."""

    #: smallest relative change reported as improved / regressed (0.03 = 3 %)
    min_effect: float = 0.03
    #: floor for time-per-step metrics, as a share of the baseline's mean step time
    min_step_frac: float = 0.005
    #: floor for ``*_frac`` metrics (absolute: 0.005 = half a percentage point)
    frac_floor: float = 0.005
    #: floor for counts per step
    count_floor: float = 0.5
    confidence: float = 0.95
    n_boot: int = 2000
    #: fewer per-step samples than this on a side: no bootstrap, threshold only
    min_samples: int = 5
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.min_effect < 10:
            raise ConfigError(f"min_effect must be in [0, 10), got {self.min_effect}")
        if not 0.5 <= self.confidence < 1:
            raise ConfigError(f"confidence must be in [0.5, 1), got {self.confidence}")
        if self.n_boot < 100:
            raise ConfigError(f"n_boot must be >= 100, got {self.n_boot}")
        if self.min_samples < 2:
            raise ConfigError(f"min_samples must be >= 2, got {self.min_samples}")
        for name in ("min_step_frac", "frac_floor", "count_floor"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}")


@dataclass(frozen=True)
class Comparison:
    """The outcome of comparing one statistic of one metric between two runs."""

    base: float | None
    new: float | None
    delta: float | None
    rel_delta: float | None  # delta / |base|; None when base is 0
    ci_low: float | None  # confidence interval of delta (None: no noise estimate)
    ci_high: float | None
    threshold: float | None  # smallest |delta| reported as a change
    method: str  # bootstrap | threshold
    verdict: str  # one of VERDICTS
    reason: str | None = None


def _quantile_level(stat: str) -> float | None:
    if stat.startswith("p") and stat[1:].isdigit():
        return int(stat[1:]) / 100
    return None


def statistic(x: np.ndarray, w: np.ndarray | None, stat: str) -> float:
    """``stat`` of samples ``x`` (weights ``w`` apply to the mean only)."""
    if stat not in STATS:
        raise ConfigError(f"unknown statistic {stat!r}; use one of {', '.join(STATS)}")
    if x.size == 0:
        return float("nan")
    if stat == "mean":
        if w is None:
            return float(x.mean())
        total = float(w.sum())
        return float((x * w).sum() / total) if total else float(x.mean())
    if stat == "min":
        return float(x.min())
    if stat == "max":
        return float(x.max())
    q = _quantile_level(stat)
    return float(np.quantile(x, q))


class Resampler:
    """Bootstrap resamples of the steps of the two runs, shared by every metric of a diff.

    Every sampled metric of a run has one sample per steady-state step, so one set of
    resampled step indices per run serves them all (each metric's bootstrap distribution is
    still the plain bootstrap; sharing the indices only makes a diff of a few thousand metrics
    fast and its result independent of the order of metrics). Means are computed as
    ``counts @ x`` with the resample counts matrix, one BLAS call per metric; quantiles gather
    the resampled values."""

    def __init__(self, n_boot: int = 2000, seed: int = 0):
        self.n_boot, self.seed = n_boot, seed
        self._idx: dict[tuple[int, int], np.ndarray] = {}
        self._counts: dict[tuple[int, int], np.ndarray] = {}

    def indices(self, n: int, side: int) -> np.ndarray:
        """``n_boot`` x ``n`` resampled indices for a run (side 0: BASE, 1: NEW) of n steps."""
        key = (n, side)
        if key not in self._idx:
            rng = np.random.default_rng([self.seed, side, n])
            self._idx[key] = rng.integers(0, n, size=(self.n_boot, n))
        return self._idx[key]

    def counts(self, n: int, side: int) -> np.ndarray:
        """How often each step occurs in each resample (``n_boot`` x ``n``)."""
        key = (n, side)
        if key not in self._counts:
            idx = self.indices(n, side)
            flat = (idx + np.arange(self.n_boot)[:, None] * n).ravel()
            self._counts[key] = np.bincount(flat, minlength=self.n_boot * n).reshape(
                self.n_boot, n).astype(np.float64)
        return self._counts[key]

    def replicates(self, x: np.ndarray, w: np.ndarray | None, stat: str, side: int
                   ) -> np.ndarray:
        """``n_boot`` bootstrap replicates of ``stat`` of samples ``x``."""
        n = x.size
        if stat == "mean":
            c = self.counts(n, side)
            plain = c @ x / n
            if w is None:
                return plain
            den = c @ w
            return np.where(den > 0, (c @ (x * w)) / np.where(den > 0, den, 1.0), plain)
        xs = x[self.indices(n, side)]
        if stat == "min":
            return xs.min(axis=1)
        if stat == "max":
            return xs.max(axis=1)
        return np.quantile(xs, _quantile_level(stat), axis=1)


def delta_interval(
    a: np.ndarray, wa: np.ndarray | None, b: np.ndarray, wb: np.ndarray | None, stat: str,
    *, n_boot: int = 2000, confidence: float = 0.95, seed: int = 0,
    resampler: Resampler | None = None,
) -> tuple[float, float]:
    """Percentile-bootstrap ``confidence`` interval of ``stat(b) - stat(a)``."""
    r = resampler or Resampler(n_boot, seed)
    diff = r.replicates(b, wb, stat, 1) - r.replicates(a, wa, stat, 0)
    alpha = (1 - confidence) / 2
    lo, hi = np.quantile(diff, [alpha, 1 - alpha])
    return float(lo), float(hi)


def judge(delta: float, threshold: float, significant: bool, better: str) -> str:
    """improved / regressed / unchanged for a change of ``delta`` (``better``: lower|higher)."""
    if not significant or delta == 0 or abs(delta) < threshold:
        return "unchanged"
    worse = delta > 0 if better == "lower" else delta < 0
    return "regressed" if worse else "improved"


def compare_samples(
    base: tuple[float | None, np.ndarray | None, np.ndarray | None],
    new: tuple[float | None, np.ndarray | None, np.ndarray | None],
    *,
    stat: str,
    better: str,
    floor: float,
    params: StatsParams,
    resampler: Resampler | None = None,
) -> Comparison:
    """Compare ``(value, samples, weights)`` of two runs for one statistic.

    With enough samples on both sides the statistic is recomputed from the samples (so it
    matches the bootstrap); otherwise the given values are compared against the threshold."""
    (va, xa, wa), (vb, xb, wb) = base, new
    sampled = (xa is not None and xb is not None
               and xa.size >= params.min_samples and xb.size >= params.min_samples)
    if sampled:
        assert xa is not None and xb is not None
        va, vb = statistic(xa, wa, stat), statistic(xb, wb, stat)
    if va is None or vb is None or not np.isfinite(va) or not np.isfinite(vb):
        return Comparison(va, vb, None, None, None, None, None, "threshold", "not comparable",
                          "no value on one side")
    delta = vb - va
    rel = delta / abs(va) if va else None
    threshold = max(params.min_effect * abs(va), floor)
    if sampled:
        assert xa is not None and xb is not None
        lo, hi = delta_interval(xa, wa, xb, wb, stat, confidence=params.confidence,
                                resampler=resampler or Resampler(params.n_boot, params.seed))
        significant = lo > 0 or hi < 0
        verdict = judge(delta, threshold, significant, better)
        return Comparison(va, vb, delta, rel, lo, hi, threshold, "bootstrap", verdict)
    verdict = judge(delta, threshold, True, better)
    return Comparison(va, vb, delta, rel, None, None, threshold, "threshold", verdict,
                      "no per-step samples: effect-size threshold only")
