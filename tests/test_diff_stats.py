"""The change test of `nsysan.compare.stats`: statistics, bootstrap intervals, verdicts."""

from __future__ import annotations

import numpy as np
import pytest

from nsysan.compare.stats import (
    StatsParams,
    compare_samples,
    delta_interval,
    judge,
    statistic,
)
from nsysan.errors import ConfigError

RNG = np.random.default_rng(7)
X = np.array([1.0, 2.0, 3.0, 4.0, 10.0])


@pytest.mark.parametrize(
    ("stat", "weights", "expected"),
    [
        ("mean", None, 4.0),
        ("mean", np.array([1.0, 1.0, 1.0, 1.0, 0.0]), 2.5),  # weight 0 drops the outlier
        ("p50", None, 3.0),
        ("p95", None, 8.8),  # linear interpolation between 4 and 10
        ("min", None, 1.0),
        ("max", None, 10.0),
    ],
)
def test_statistic(stat, weights, expected):
    assert statistic(X, weights, stat) == pytest.approx(expected)


def test_statistic_rejects_unknown():
    with pytest.raises(ConfigError, match="unknown statistic"):
        statistic(X, None, "p200x")


@pytest.mark.parametrize(
    ("delta", "threshold", "significant", "better", "verdict"),
    [
        (5.0, 1.0, True, "lower", "regressed"),
        (5.0, 1.0, True, "higher", "improved"),
        (-5.0, 1.0, True, "lower", "improved"),
        (-5.0, 1.0, True, "higher", "regressed"),
        (5.0, 1.0, False, "lower", "unchanged"),  # not significant
        (0.5, 1.0, True, "lower", "unchanged"),  # below the minimum effect
        (0.0, 0.0, True, "lower", "unchanged"),
    ],
)
def test_judge(delta, threshold, significant, better, verdict):
    assert judge(delta, threshold, significant, better) == verdict


def test_interval_covers_the_true_shift_and_is_deterministic():
    a = 100 + RNG.normal(0, 2, 60)
    b = 106 + RNG.normal(0, 2, 60)
    lo, hi = delta_interval(a, None, b, None, "mean", seed=3)
    assert lo < 6 < hi and hi - lo < 2.5
    assert (lo, hi) == delta_interval(a, None, b, None, "mean", seed=3)


@pytest.mark.parametrize(
    ("shift", "noise", "better", "verdict"),
    [
        (0.10, 0.01, "lower", "regressed"),  # +10 %, clearly above noise and min effect
        (0.10, 0.01, "higher", "improved"),
        (-0.10, 0.01, "lower", "improved"),
        (0.01, 0.001, "lower", "unchanged"),  # significant but below the 3 % minimum effect
        (0.05, 0.50, "lower", "unchanged"),  # above the minimum effect but lost in the noise
        (0.0, 0.02, "lower", "unchanged"),
    ],
)
def test_compare_samples_verdicts(shift, noise, better, verdict):
    rng = np.random.default_rng(11)
    a = 100 * (1 + rng.normal(0, noise, 40))
    b = 100 * (1 + shift) * (1 + rng.normal(0, noise, 40))
    c = compare_samples((None, a, None), (None, b, None), stat="mean", better=better,
                        floor=0.0, params=StatsParams())
    assert c.method == "bootstrap"
    assert c.verdict == verdict
    assert c.delta == pytest.approx(b.mean() - a.mean())


def test_floor_keeps_changes_of_near_zero_metrics_unchanged():
    a = np.zeros(30)
    b = np.full(30, 1e3)  # from 0 to 1 us: infinite relative change, below a 50 us floor
    c = compare_samples((None, a, None), (None, b, None), stat="mean", better="lower",
                        floor=50e3, params=StatsParams())
    assert c.verdict == "unchanged" and c.rel_delta is None
    c = compare_samples((None, a, None), (None, b * 100, None), stat="mean",
                        better="lower", floor=50e3, params=StatsParams())
    assert c.verdict == "regressed"


def test_without_samples_only_the_threshold_applies():
    c = compare_samples((100.0, None, None), (110.0, None, None), stat="mean",
                        better="lower", floor=0.0, params=StatsParams())
    assert (c.method, c.verdict, c.ci_low) == ("threshold", "regressed", None)
    assert "threshold only" in c.reason
    c = compare_samples((100.0, None, None), (102.0, None, None), stat="mean",
                        better="lower", floor=0.0, params=StatsParams())
    assert c.verdict == "unchanged"


def test_too_few_samples_fall_back_to_threshold():
    c = compare_samples((1.0, np.array([1.0, 1.0]), None), (2.0, np.array([2.0, 2.0]), None),
                        stat="mean", better="lower", floor=0.0, params=StatsParams())
    assert c.method == "threshold" and c.verdict == "regressed"


def test_missing_value_is_not_comparable():
    c = compare_samples((None, None, None), (2.0, None, None), stat="mean",
                        better="lower", floor=0.0, params=StatsParams())
    assert c.verdict == "not comparable"


@pytest.mark.parametrize(
    "kwargs",
    [{"min_effect": -0.1}, {"confidence": 1.0}, {"n_boot": 10}, {"min_samples": 1},
     {"frac_floor": -1}],
)
def test_params_validated(kwargs):
    with pytest.raises(ConfigError):
        StatsParams(**kwargs)


@pytest.mark.parametrize("weighted", [False, True])
def test_resampler_means_by_counts_equal_means_of_the_resampled_values(weighted):
    from nsysan.compare.stats import Resampler

    x = RNG.normal(10, 3, 17)
    w = RNG.uniform(0.5, 2, 17) if weighted else None
    r = Resampler(300, seed=5)
    idx = r.indices(17, 0)
    xs = x[idx]
    want = (xs * w[idx]).sum(1) / w[idx].sum(1) if weighted else xs.mean(1)
    assert np.allclose(r.replicates(x, w, "mean", 0), want)
    assert np.allclose(r.replicates(x, None, "p50", 0), np.quantile(xs, 0.5, axis=1))
    assert not np.array_equal(r.indices(17, 1), idx)  # BASE and NEW resample independently
