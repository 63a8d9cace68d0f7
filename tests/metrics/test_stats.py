"""Statistics: Pearson with the SePer paper's t-test, rank correlations, bootstrap, permutation."""

import numpy as np
import pytest
from scipy import stats as sps

from ragutil_dagster.metrics.stats import (
    bootstrap_mean_ci,
    bootstrap_paired_diff_ci,
    kendall_tau_b,
    paired_permutation_test,
    pearson,
    rank_correlation,
    spearman,
)


def test_pearson_t_test_p_value() -> None:
    x = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    y = [1.2, 1.9, 3.4, 3.9, 5.5, 5.7]
    result = pearson(x, y)
    r = np.corrcoef(x, y)[0, 1]
    t = r * np.sqrt(4 / (1 - r * r))
    assert result.statistic == pytest.approx(r)
    assert result.pvalue == pytest.approx(2 * sps.t.sf(t, 4))
    assert result.pvalue == pytest.approx(sps.pearsonr(x, y).pvalue)


def test_pearson_rejects_constant_input() -> None:
    with pytest.raises(ValueError, match="constant"):
        pearson([1, 1, 1], [1, 2, 3])


def test_rank_correlations_with_ties() -> None:
    x = [1, 2, 2, 3, 4]
    y = [1, 3, 2, 2, 5]
    assert kendall_tau_b(x, y).statistic == pytest.approx(
        sps.kendalltau(x, y, variant="b").statistic
    )
    assert spearman(x, y).statistic == pytest.approx(sps.spearmanr(x, y).statistic)


def test_bootstrap_interval_covers_the_mean_and_is_seeded() -> None:
    values = np.random.default_rng(1).normal(0.3, 1.0, size=200)
    a = bootstrap_mean_ci(values, seed=7)
    b = bootstrap_mean_ci(values, seed=7)
    assert a == b
    assert a.low < values.mean() < a.high
    half_width = 1.96 * values.std(ddof=1) / np.sqrt(values.size)
    assert (a.high - a.low) / 2 == pytest.approx(half_width, rel=0.15)


def test_paired_difference_interval_and_permutation_test() -> None:
    rng = np.random.default_rng(2)
    base = rng.normal(size=100)
    better = base + 0.5 + rng.normal(scale=0.2, size=100)
    ci = bootstrap_paired_diff_ci(better, base)
    assert ci.low > 0.4 and ci.high < 0.6
    assert paired_permutation_test(better, base, n_resamples=2000).pvalue < 0.01
    same = paired_permutation_test(base + rng.normal(scale=0.1, size=100), base, n_resamples=2000)
    assert same.pvalue > 0.01


def test_constant_values_give_a_degenerate_interval() -> None:
    ci = bootstrap_mean_ci([0.5, 0.5, 0.5])
    assert (ci.low, ci.estimate, ci.high) == (0.5, 0.5, 0.5)


# --- eRAG Table 1 cells: Kendall τ-b and Spearman ρ with bootstrap intervals -------------------


def test_rank_correlation_of_a_perfect_and_a_reversed_order() -> None:
    perfect = rank_correlation([1, 2, 3, 4, 5], [10, 20, 30, 40, 50], n_resamples=200)
    assert (perfect.tau, perfect.rho, perfect.undefined) == (
        pytest.approx(1.0),
        pytest.approx(1.0),
        None,
    )
    # Every resample of a monotone pair is monotone (or constant, and skipped).
    assert perfect.tau_low == pytest.approx(1.0) and perfect.rho_high == pytest.approx(1.0)
    reversed_ = rank_correlation([1, 2, 3, 4, 5], [5, 4, 3, 2, 1], n_resamples=200)
    assert reversed_.tau == pytest.approx(-1.0) and reversed_.rho == pytest.approx(-1.0)
    assert reversed_.tau_high == pytest.approx(-1.0)


def test_rank_correlation_with_ties_by_hand() -> None:
    # x ties its 2nd and 3rd values: 5 concordant pairs, 0 discordant, 1 pair tied in x only.
    # tau_b = (5 - 0) / sqrt((6 - 1) * (6 - 0)); rho = Pearson of ranks [1, 2.5, 2.5, 4] and [1..4].
    result = rank_correlation([1, 2, 2, 3], [1, 2, 3, 4], n_resamples=100)
    assert result.tau == pytest.approx(5 / np.sqrt(30))
    assert result.rho == pytest.approx(4.5 / np.sqrt(4.5 * 5))
    assert result.n == 4


def test_binary_pairs_give_equal_tau_b_and_rho_as_in_erag_table_1() -> None:
    # eRAG Table 1 prints the same τ and ρ for R and Hit Ratio (binary against binary EM):
    # τ-b = ρ = φ on a 2 × 2 table; τ-a would be smaller.
    x = [1, 1, 0, 0, 1, 0, 1, 0, 0, 1]
    y = [1, 0, 0, 0, 1, 1, 1, 0, 0, 1]
    result = rank_correlation(x, y, n_resamples=50)
    assert result.tau == pytest.approx(result.rho)
    assert result.tau == pytest.approx(np.corrcoef(x, y)[0, 1])
    pairs = [(i, j) for i in range(10) for j in range(i + 1, 10)]
    tau_a = sum(np.sign(x[i] - x[j]) * np.sign(y[i] - y[j]) for i, j in pairs) / len(pairs)
    assert tau_a < result.tau


@pytest.mark.parametrize(
    ("x", "y", "reason"),
    [
        ([1, 1, 1, 1], [1, 2, 3, 4], "constant predictor"),
        ([1, 2, 3, 4], [0, 0, 0, 0], "constant target"),
        ([1, 2], [2, 1], "at least 3"),
    ],
)
def test_undefined_rank_correlation_is_null_with_its_reason(x, y, reason) -> None:
    result = rank_correlation(x, y)
    assert result.tau is None and result.rho is None and result.tau_low is None
    assert reason in result.undefined
    assert result.resamples == 0


def test_bootstrap_interval_contains_the_estimate_and_is_reproducible() -> None:
    rng = np.random.default_rng(3)
    x = rng.normal(size=60)
    y = x + rng.normal(scale=1.0, size=60)
    first = rank_correlation(x, y, n_resamples=400, seed=7)
    assert first.tau_low < first.tau < first.tau_high
    assert first.rho_low < first.rho < first.rho_high
    assert first.tau_high - first.tau_low > 0.05  # noisy data: a real interval, not a point
    assert first.resamples == 400
    assert rank_correlation(x, y, n_resamples=400, seed=7) == first
    assert rank_correlation(x, y, n_resamples=400, seed=8) != first


@pytest.mark.parametrize("n", [7, 40, 2_100])  # 2,100 queries: past the matrix limit, scipy per row
def test_bootstrap_rank_correlations_equal_scipy_row_by_row(n) -> None:
    from scipy import stats as scipy_stats

    from ragutil_dagster.metrics.stats import bootstrap_rank_correlations

    rng = np.random.default_rng(n)
    x = rng.integers(0, 4, size=n).astype(float)  # many ties, as binary / graded labels have
    y = rng.integers(0, 3, size=n).astype(float)
    index = rng.integers(0, n, size=(30, n))
    index[0] = int(np.flatnonzero(x == x[0])[0])  # one query drawn n times: both undefined
    taus, rhos = bootstrap_rank_correlations(x, y, index)
    assert np.isnan(taus[0]) and np.isnan(rhos[0])
    for row, tau, rho in zip(index[1:], taus[1:], rhos[1:]):
        expected_tau = scipy_stats.kendalltau(x[row], y[row], variant="b").statistic
        assert tau == pytest.approx(expected_tau, nan_ok=True)
        # scipy's ρ of a constant row is NaN too, and so is ragutil's wherever τ is.
        assert rho == pytest.approx(scipy_stats.spearmanr(x[row], y[row]).statistic, nan_ok=True)
