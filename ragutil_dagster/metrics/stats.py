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
class RankCorrelation:
    """One cell pair of eRAG Table 1: Kendall's τ-b and Spearman's ρ of a predictor with the
    downstream performance over queries, each with a bootstrap interval.

    When the correlation is undefined (a constant vector, fewer than 3 queries) every statistic
    is None and ``undefined`` says why; ``resamples`` counts the bootstrap resamples whose
    correlation was defined (a resample can repeat one query until a vector is constant)."""

    tau: float | None
    tau_low: float | None
    tau_high: float | None
    rho: float | None
    rho_low: float | None
    rho_high: float | None
    n: int
    resamples: int
    undefined: str | None


# Resamples are scored through the n × n matrices of pairwise signs: up to this many queries;
# more go through scipy's O(n log n) one resample at a time.
_MATRIX_LIMIT = 2_000


def bootstrap_rank_correlations(
    x: np.ndarray, y: np.ndarray, index: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Kendall's τ-b and Spearman's ρ of ``x``, ``y`` resampled at each row of ``index``
    (resamples × n positions), NaN where a resample is constant — the values scipy's
    ``kendalltau(variant="b")`` and ``spearmanr`` give on ``x[row]``, ``y[row]``, computed for
    all rows together from each row's multiplicities c (how often it drew each query).

    τ-b = Σ_{a<b} sign(Δx)·sign(Δy) / √(Σ|sign(Δx)| · Σ|sign(Δy)|) over the resample's pairs:
    each sum is ½ cᵀ M c for M the queries' pairwise sign products (a query drawn twice is a
    tied pair, 0 in both). ρ is Pearson's r of the resample's average ranks, weighted by c."""
    n = x.size
    if n > _MATRIX_LIMIT:
        taus = np.array(
            [
                stats.kendalltau(a, b, variant="b").statistic if np.ptp(a) and np.ptp(b) else np.nan
                for a, b in zip(x[index], y[index])
            ]
        )
        rhos = np.array([stats.spearmanr(a, b).statistic for a, b in zip(x[index], y[index])])
        return taus, np.where(np.isnan(taus), np.nan, rhos)
    rows = np.arange(index.shape[0])[:, None]
    counts = np.zeros((index.shape[0], n))
    np.add.at(counts, (rows, index), 1.0)
    sign_x = np.sign(x[:, None] - x[None, :])
    sign_y = np.sign(y[:, None] - y[None, :])

    def half_quadratic(matrix: np.ndarray) -> np.ndarray:
        return 0.5 * ((counts @ matrix) * counts).sum(axis=1)

    with np.errstate(invalid="ignore", divide="ignore"):
        taus = half_quadratic(sign_x * sign_y) / np.sqrt(
            half_quadratic(np.abs(sign_x)) * half_quadratic(np.abs(sign_y))
        )
        centred_x, centred_y = (_resampled_ranks(v, counts) - (n + 1) / 2 for v in (x, y))
        rhos = (counts * centred_x * centred_y).sum(axis=1) / np.sqrt(
            (counts * centred_x**2).sum(axis=1) * (counts * centred_y**2).sum(axis=1)
        )
    undefined = ~np.isfinite(taus) | ~np.isfinite(rhos)
    return np.where(undefined, np.nan, taus), np.where(undefined, np.nan, rhos)


def _resampled_ranks(values: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Per resample (row of ``counts``), the average rank each query's value takes among the
    resample's n draws: the draws below it plus the mean position among its ties."""
    distinct, position = np.unique(values, return_inverse=True)
    per_value = np.zeros((counts.shape[0], distinct.size))
    np.add.at(per_value, (slice(None), position), counts)
    below = np.cumsum(per_value, axis=1) - per_value
    return (below + (per_value + 1) / 2)[:, position]


def _undefined_reason(a: np.ndarray, b: np.ndarray) -> str | None:
    if a.size < 3:
        return f"{a.size} queries: a rank correlation needs at least 3"
    if np.ptp(a) == 0:
        return "constant predictor: every query has the same value"
    if np.ptp(b) == 0:
        return "constant target: every query has the same downstream performance"
    return None


def rank_correlation(
    x: Sequence[float],
    y: Sequence[float],
    confidence: float = 0.95,
    n_resamples: int = 1000,
    seed: int = 0,
) -> RankCorrelation:
    """Kendall's τ-b and Spearman's ρ of paired per-query values, as eRAG Table 1 reports them,
    with percentile bootstrap intervals: resample queries with replacement (fixed ``seed``),
    recompute both correlations, take the (1 ± confidence) / 2 quantiles over the resamples
    where they are defined.

    τ-b (scipy's default, which eRAG's code calls) is what Table 1 shows: for binary predictors
    (R, Hit Ratio) against binary EM its τ equals its ρ, as τ-b = ρ = φ on a 2 × 2 table, while
    τ-a would be smaller.
    """
    a, b = _paired(x, y, 0)
    reason = _undefined_reason(a, b)
    if reason is not None:
        return RankCorrelation(None, None, None, None, None, None, a.size, 0, reason)
    # The estimate by the same arithmetic as its resamples, so an interval is comparable with it.
    tau, rho = (float(v[0]) for v in bootstrap_rank_correlations(a, b, np.arange(a.size)[None]))
    index = np.random.default_rng(seed).integers(0, a.size, size=(n_resamples, a.size))
    taus, rhos = bootstrap_rank_correlations(a, b, index)
    defined = ~np.isnan(taus)  # a resample repeating one query until a vector is constant
    taus, rhos = taus[defined], rhos[defined]
    if not taus.size:
        return RankCorrelation(tau, None, None, rho, None, None, a.size, 0, None)
    tail = (1 - confidence) / 2
    tau_low, tau_high = (float(q) for q in np.quantile(taus, [tail, 1 - tail]))
    rho_low, rho_high = (float(q) for q in np.quantile(rhos, [tail, 1 - tail]))
    return RankCorrelation(tau, tau_low, tau_high, rho, rho_low, rho_high, a.size, len(taus), None)


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
        (a,),
        np.mean,
        confidence_level=confidence,
        n_resamples=n_resamples,
        method=method,
        rng=np.random.default_rng(seed),
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
        (a, b),
        mean_difference,
        permutation_type="samples",
        vectorized=True,
        n_resamples=n_resamples,
        alternative="two-sided",
        rng=np.random.default_rng(seed),
    )
    return PermutationTest(mean_difference=float(np.mean(a - b)), pvalue=float(result.pvalue))


def roc_auc(
    positives: Sequence[float], negatives: Sequence[float], axis: int = -1
) -> np.ndarray | float:
    """ROC AUC of a score separating ``positives`` from ``negatives``: the share of (positive,
    negative) pairs the score orders correctly, ties counting half — the Mann–Whitney U of the
    positives over n₊·n₋ (scipy.stats.mannwhitneyu; vectorised along ``axis``)."""
    a, b = np.asarray(positives, dtype=np.float64), np.asarray(negatives, dtype=np.float64)
    u = stats.mannwhitneyu(a, b, axis=axis, method="asymptotic").statistic
    return u / (a.shape[axis] * b.shape[axis])


@dataclass(frozen=True)
class BinaryValidity:
    """How well a per-passage measure separates passages labelled 1 from passages labelled 0
    (ConSens §3 reports the ROC AUC, SePer Table 2 the Pearson r with a 1 / 0 utility — against a
    0/1 label, the point-biserial r).

    ``auc_low`` / ``auc_high``: stratified percentile bootstrap interval (positives and negatives
    resampled separately, so every resample holds both), None with fewer than two of either; a
    constant measure has AUC ½ in every resample, so [½, ½]. ``r`` and ``pvalue``
    (scipy.stats.pointbiserialr: the t-test SePer §4.1.2 uses) are None when the measure is
    constant; every statistic is None without a positive or a negative, and ``undefined`` says
    why."""

    auc: float | None
    auc_low: float | None
    auc_high: float | None
    resamples: int
    r: float | None
    pvalue: float | None
    n_positive: int
    n_negative: int
    undefined: str | None

    @property
    def n(self) -> int:
        return self.n_positive + self.n_negative


def binary_validity(
    values: Sequence[float],
    labels: Sequence[int],
    confidence: float = 0.95,
    n_resamples: int = 1000,
    seed: int = 0,
) -> BinaryValidity:
    """ROC AUC (with its bootstrap interval) and point-biserial r (with its p-value) of
    ``values`` against 0/1 ``labels``."""
    a, b = _paired(values, labels, 0)
    if not np.isin(b, (0, 1)).all():
        raise ValueError(f"labels must be 0 or 1, got {sorted(set(b.tolist()) - {0.0, 1.0})[:5]}")
    positives, negatives = a[b == 1], a[b == 0]
    counts = {"n_positive": positives.size, "n_negative": negatives.size}
    if not positives.size or not negatives.size:
        missing = "" if not a.size else "positive " if not positives.size else "negative "
        return BinaryValidity(
            None, None, None, 0, None, None, **counts, undefined=f"no {missing}passage"
        )
    auc = float(roc_auc(positives, negatives))
    if np.ptp(a) == 0:  # every pair is a tie: AUC 1/2 in every resample, r undefined
        return BinaryValidity(
            auc,
            auc,
            auc,
            0,
            None,
            None,
            **counts,
            undefined="constant measure: every passage has the same value",
        )
    correlation = stats.pointbiserialr(b, a)
    low = high = None
    resamples = 0
    if positives.size >= 2 and negatives.size >= 2:
        interval = stats.bootstrap(
            (positives, negatives),
            roc_auc,
            vectorized=True,
            paired=False,
            confidence_level=confidence,
            n_resamples=n_resamples,
            method="percentile",
            rng=np.random.default_rng(seed),
        ).confidence_interval
        low, high, resamples = float(interval.low), float(interval.high), n_resamples
    return BinaryValidity(
        auc,
        low,
        high,
        resamples,
        float(correlation.statistic),
        float(correlation.pvalue),
        **counts,
        undefined=None,
    )
