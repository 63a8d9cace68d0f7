"""Statistics for comparing metrics and systems: correlations, bootstrap intervals, paired tests.

Correlations wrap scipy.stats; :func:`pearson` reports the p-value the SePer paper uses (§4.1.2):
t = r·sqrt((n − 2) / (1 − r²)) against Student's t with n − 2 degrees of freedom, two-sided.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy import stats


@dataclass(frozen=True)
class Correlation:
    statistic: float
    pvalue: float
    n: int


def _paired(x: Sequence[float], y: Sequence[float], minimum: int) -> tuple[np.ndarray, np.ndarray]:
    a = np.asarray(x, dtype=np.float64)
    b = np.asarray(y, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"expected two 1-d sequences of equal length, got {a.shape} and {b.shape}")
    if a.size < minimum:
        raise ValueError(f"need at least {minimum} paired values, got {a.size}")
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        raise ValueError("values must be finite (no NaN or infinity)")
    return a, b


def pearson(x: Sequence[float], y: Sequence[float]) -> Correlation:
    """Pearson's r with the SePer paper's t-test p-value (two-sided, n − 2 degrees of freedom)."""
    a, b = _paired(x, y, 3)
    if np.ptp(a) == 0 or np.ptp(b) == 0:
        raise ValueError("Pearson correlation is undefined when one variable is constant")
    r = float(np.clip(np.corrcoef(a, b)[0, 1], -1.0, 1.0))
    n = a.size
    if abs(r) == 1.0:
        return Correlation(statistic=r, pvalue=0.0, n=n)
    t = r * np.sqrt((n - 2) / (1 - r * r))
    return Correlation(statistic=r, pvalue=float(2 * stats.t.sf(abs(t), n - 2)), n=n)


def spearman(x: Sequence[float], y: Sequence[float]) -> Correlation:
    """Spearman's ρ (scipy.stats.spearmanr)."""
    a, b = _paired(x, y, 3)
    result = stats.spearmanr(a, b)
    return Correlation(statistic=float(result.statistic), pvalue=float(result.pvalue), n=a.size)


def kendall_tau_b(x: Sequence[float], y: Sequence[float]) -> Correlation:
    """Kendall's τ-b, which corrects for ties (scipy.stats.kendalltau, variant "b")."""
    a, b = _paired(x, y, 3)
    result = stats.kendalltau(a, b, variant="b")
    return Correlation(statistic=float(result.statistic), pvalue=float(result.pvalue), n=a.size)


@dataclass(frozen=True)
class Interval:
    estimate: float
    low: float
    high: float
    confidence: float


BootstrapMethod = Literal["percentile", "basic", "BCa"]


def bootstrap_mean_ci(
    values: Sequence[float],
    confidence: float = 0.95,
    n_resamples: int = 10_000,
    seed: int = 0,
    method: BootstrapMethod = "percentile",
) -> Interval:
    """Bootstrap confidence interval of a mean (scipy.stats.bootstrap)."""
    a = np.asarray(values, dtype=np.float64)
    if a.ndim != 1 or a.size < 2:
        raise ValueError(f"need at least 2 values for a bootstrap interval, got {a.size}")
    if np.ptp(a) == 0:  # every resample has the same mean
        return Interval(float(a[0]), float(a[0]), float(a[0]), confidence)
    result = stats.bootstrap(
        (a,), np.mean, confidence_level=confidence, n_resamples=n_resamples,
        method=method, rng=np.random.default_rng(seed),
    )
    ci = result.confidence_interval
    return Interval(float(a.mean()), float(ci.low), float(ci.high), confidence)


def bootstrap_paired_diff_ci(
    x: Sequence[float],
    y: Sequence[float],
    confidence: float = 0.95,
    n_resamples: int = 10_000,
    seed: int = 0,
    method: BootstrapMethod = "percentile",
) -> Interval:
    """Bootstrap interval of mean(x − y) for paired observations (same questions, two systems),
    resampling questions jointly."""
    a, b = _paired(x, y, 2)
    return bootstrap_mean_ci(a - b, confidence, n_resamples, seed, method)


@dataclass(frozen=True)
class PermutationTest:
    mean_difference: float
    pvalue: float


def paired_permutation_test(
    x: Sequence[float], y: Sequence[float], n_resamples: int = 10_000, seed: int = 0
) -> PermutationTest:
    """Two-sided paired permutation (sign-flip) test of mean(x − y) = 0
    (scipy.stats.permutation_test, ``permutation_type="samples"``)."""
    a, b = _paired(x, y, 2)

    def mean_difference(u: np.ndarray, v: np.ndarray, axis: int) -> np.ndarray:
        return np.mean(u - v, axis=axis)

    result = stats.permutation_test(
        (a, b), mean_difference, permutation_type="samples", vectorized=True,
        n_resamples=n_resamples, alternative="two-sided", rng=np.random.default_rng(seed),
    )
    return PermutationTest(mean_difference=float(np.mean(a - b)), pvalue=float(result.pvalue))
