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
    assert kendall_tau_b(x, y).statistic == pytest.approx(sps.kendalltau(x, y, variant="b").statistic)
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
