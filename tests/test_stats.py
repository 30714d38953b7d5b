"""Tests for embvar_study.stats: agreement with scipy, closed forms, coverage simulations, error paths."""
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import scipy.stats as sps
from hypothesis import given, settings, strategies as st
from hypothesis.extra.numpy import arrays

try:
    import embvar_study  # noqa: F401
except ImportError:  # package not installed: run from the repository checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from embvar_study import stats
from embvar_study import effects
from embvar_study.effects import cohens_d, effect_size_table, hedges_g, mean_difference_ci, permutation_test
from embvar_study.stats import bootstrap_ci, cluster_bootstrap_ci, jackknife, quantile_summary

finite = st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False)
samples = arrays(np.float64, st.integers(2, 30), elements=finite)


def _spread(x):
    return np.ptp(x) > 1e-6 * max(1.0, np.abs(x).max())


# ----------------------------------------------------------------------------------------------- bootstrap_ci
@pytest.mark.parametrize("method", ["bca", "percentile", "basic"])
@pytest.mark.parametrize("statistic", [np.mean, np.median, lambda x, axis: np.std(x, axis=axis, ddof=1)])
def test_bootstrap_ci_equals_scipy(method, statistic):
    x = np.random.default_rng(11).gamma(2.0, 0.05, size=60)
    ours = bootstrap_ci(x, statistic, n_resamples=999, method=method, seed=123)
    ref = sps.bootstrap((x,), statistic, n_resamples=999, method={"bca": "BCa"}.get(method, method),
                        vectorized=True, rng=np.random.default_rng(123))
    np.testing.assert_allclose([ours.low, ours.high], [ref.confidence_interval.low, ref.confidence_interval.high],
                               rtol=1e-12)
    np.testing.assert_allclose(ours.standard_error, ref.standard_error, rtol=1e-12)
    assert ours.estimate == pytest.approx(float(statistic(x, axis=-1)), rel=1e-12)
    assert isinstance(ours.low, float) and ours.method == method and ours.n_resamples == 999


def test_bootstrap_ci_batched_axis_equals_scipy():
    x = np.random.default_rng(12).normal(size=(40, 3))        # samples along axis 0, 3 batches
    ours = bootstrap_ci(x, np.mean, n_resamples=499, seed=5, axis=0)
    ref = sps.bootstrap((x,), np.mean, n_resamples=499, axis=0, vectorized=True, rng=np.random.default_rng(5))
    assert ours.low.shape == (3,)
    np.testing.assert_allclose(ours.low, ref.confidence_interval.low, rtol=1e-12)
    np.testing.assert_allclose(ours.high, ref.confidence_interval.high, rtol=1e-12)
    np.testing.assert_allclose(ours.estimate, x.mean(0), rtol=1e-12)


def test_bootstrap_ci_memory_chunking_does_not_change_result(monkeypatch):
    x = np.random.default_rng(13).normal(size=(4, 50))
    full = bootstrap_ci(x, n_resamples=300, seed=1)
    monkeypatch.setattr(stats, "CHUNK_ELEMENTS", 1000)       # scipy batch of 5 resamples
    chunked = bootstrap_ci(x, n_resamples=300, seed=1)
    np.testing.assert_allclose(chunked.low, full.low, rtol=1e-12)
    np.testing.assert_allclose(chunked.high, full.high, rtol=1e-12)


def test_bootstrap_ci_degenerate():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ci = bootstrap_ci([3.0, 3.0, 3.0], seed=0)
        assert (ci.estimate, ci.low, ci.high, ci.standard_error) == (3.0, 3.0, 3.0, 0.0)
        live = np.random.default_rng(1).uniform(size=20)     # continuous: no resample mean ties with the estimate
        mixed = bootstrap_ci(np.stack([np.full(20, 1.0), live]), seed=0, n_resamples=199)
    assert mixed.low[0] == mixed.high[0] == 1.0
    assert mixed.low[1] < mixed.estimate[1] < mixed.high[1]
    # the live row equals scipy on that row alone (same resample indices)
    ref = sps.bootstrap((live,), np.mean, n_resamples=199, rng=np.random.default_rng(0))
    assert mixed.low[1] == pytest.approx(ref.confidence_interval.low, rel=1e-12)


def test_bootstrap_ci_accepts_torch():
    torch = pytest.importorskip("torch")
    t = torch.linspace(0, 1, 30, dtype=torch.float32)
    a = bootstrap_ci(t, seed=0, n_resamples=199)
    b = bootstrap_ci(t.double().numpy(), seed=0, n_resamples=199)
    assert (a.low, a.high) == (b.low, b.high)


@pytest.mark.parametrize("method", ["percentile", "bca"])
def test_bootstrap_ci_coverage(method):
    n_datasets, mu = 300, 1.5
    data = np.random.default_rng(2024).normal(mu, 2.0, size=(n_datasets, 30))
    ci = bootstrap_ci(data, n_resamples=999, method=method, seed=7)       # one batched call
    covered = int(((ci.low <= mu) & (mu <= ci.high)).sum())
    assert sps.binomtest(covered, n_datasets, 0.95).pvalue > 0.001, covered


def test_ci_repr_and_dict():
    ci = bootstrap_ci(np.arange(10.0), seed=0, n_resamples=99)
    assert repr(ci).startswith("CI(4.5 [") and "95% bca" in repr(ci)
    d = ci.as_dict()
    assert list(d) == ["estimate", "low", "high", "confidence", "method", "n_resamples", "standard_error"]
    with pytest.raises(AttributeError):
        ci.low = 0.0                                                     # frozen
    assert "shape (2,)" in repr(bootstrap_ci(np.ones((2, 5)) * np.arange(5), n_resamples=9))


def test_bca_counts_rounding_ties_with_the_estimate_as_ties():
    # linspace data: many resample means equal the estimate 0.5 in exact arithmetic, a few ulps off in floating point;
    # scipy's z0 depends on those rounding errors (and on the units), ours counts them as ties
    x = np.linspace(0, 1, 20)
    res = sps.bootstrap((x,), np.mean, n_resamples=199, rng=np.random.default_rng(0), method="percentile")
    boot = res.bootstrap_distribution
    tie = np.abs(boot - 0.5) <= 64 * np.finfo(float).eps
    assert tie.sum() > 0
    below = ((boot < 0.5) & ~tie).sum() + 0.5 * tie.sum()
    ci = bootstrap_ci(x, seed=0, n_resamples=199)
    z0 = sps.norm.ppf(below / 199)
    z = z0 + sps.norm.ppf([0.025, 0.975])
    loo = (x.sum() - x) / 19
    d = loo.mean() - loo
    a = (d ** 3).sum() / (6 * (d ** 2).sum() ** 1.5)
    lo, hi = np.quantile(boot, sps.norm.cdf(z0 + z / (1 - a * z)))
    assert (ci.low, ci.high) == pytest.approx((lo, hi), rel=1e-12)
    for s in (1e-30, 3.7, 1e30):
        scaled = bootstrap_ci(x * s, seed=0, n_resamples=199)
        assert (scaled.low / s, scaled.high / s) == pytest.approx((ci.low, ci.high), rel=1e-12)


# -------------------------------------------------------------------------------------- cluster_bootstrap_ci
def _reference_cluster_bootstrap(x, statistic, n_resamples, seed, chunk, resample_items=True):
    """Loop over resamples, straight from the definition, drawing indices with the documented recipe."""
    rng = np.random.default_rng(seed)
    C, I = x.shape
    boot = []
    for start in range(0, n_resamples, chunk):
        b = min(chunk, n_resamples - start)
        clusters = rng.integers(0, C, size=(b, C))
        items = rng.integers(0, I, size=(b, C, I), dtype=np.uint16) if resample_items else None
        for r in range(b):
            rows = [x[c][items[r, k]] if resample_items else x[c] for k, c in enumerate(clusters[r])]
            boot.append(statistic(np.concatenate(rows)))
    return np.array(boot)


@pytest.mark.parametrize("statistic", [np.mean, np.median])
@pytest.mark.parametrize("resample_items", [True, False])
@pytest.mark.parametrize("chunk_elements", [2**16, 24])          # one chunk; chunks of 2 resamples
def test_cluster_bootstrap_equals_reference_loop(monkeypatch, statistic, resample_items, chunk_elements):
    monkeypatch.setattr(stats, "_CLUSTER_CHUNK_ELEMENTS", chunk_elements)
    x = np.random.default_rng(3).normal(size=(3, 4))
    R = 7
    boot = _reference_cluster_bootstrap(x, statistic, R, seed=42, chunk=max(1, min(R, chunk_elements // 12)),
                                        resample_items=resample_items)
    ci = cluster_bootstrap_ci(x, statistic, n_resamples=R, seed=42, resample_items=resample_items)
    np.testing.assert_allclose([ci.low, ci.high], np.quantile(boot, [0.025, 0.975]), rtol=1e-12)
    np.testing.assert_allclose(ci.standard_error, boot.std(ddof=1), rtol=1e-10)
    basic = cluster_bootstrap_ci(x, statistic, n_resamples=R, seed=42, resample_items=resample_items, method="basic")
    est = statistic(x.ravel())
    np.testing.assert_allclose([basic.low, basic.high], 2 * est - np.quantile(boot, [0.975, 0.025]), rtol=1e-12)


def test_gather_matches_loop():
    x = np.arange(20.0).reshape(4, 5)
    cidx, iidx = stats._draw_cluster_indices(np.random.default_rng(0), 6, 4, 5, True)
    assert cidx.shape == (6, 4) and iidx.shape == (6, 4, 5)
    slow = np.array([[x[c, i] for k, c in enumerate(cidx[r]) for i in iidx[r, k]] for r in range(6)])
    np.testing.assert_array_equal(stats._gather_cluster_resamples(x, cidx, iidx), slow)


@pytest.mark.parametrize("method", ["percentile", "basic", "bca"])
@pytest.mark.parametrize("statistic", [np.mean, np.median])
def test_cluster_bootstrap_single_item_equals_scipy_iid(method, statistic):
    # one item per cluster, clusters only: the cluster bootstrap is scipy's iid bootstrap (same index draws)
    x = np.random.default_rng(4).gamma(2.0, 1.0, size=25)
    ours = cluster_bootstrap_ci(x[:, None], statistic, n_resamples=999, seed=9, resample_items=False, method=method)
    ref = sps.bootstrap((x,), statistic, n_resamples=999, vectorized=True, rng=np.random.default_rng(9),
                        method={"bca": "BCa"}.get(method, method))
    np.testing.assert_allclose([ours.low, ours.high], [ref.confidence_interval.low, ref.confidence_interval.high],
                               rtol=1e-10)


def test_cluster_bootstrap_coverage_vs_naive():
    n_datasets, C, I, mu = 200, 20, 20, 0.3
    rng = np.random.default_rng(99)
    data = mu + rng.normal(size=(n_datasets, C, 1)) + rng.normal(size=(n_datasets, C, I))   # ICC 0.5
    cluster = [cluster_bootstrap_ci(d, n_resamples=999, seed=i) for i, d in enumerate(data)]
    c_low, c_high = np.array([c.low for c in cluster]), np.array([c.high for c in cluster])
    naive = bootstrap_ci(data.reshape(n_datasets, C * I), n_resamples=999, method="percentile", seed=1)
    c_cov = int(((c_low <= mu) & (mu <= c_high)).sum())
    n_cov = int(((naive.low <= mu) & (mu <= naive.high)).sum())
    assert np.mean(c_high - c_low) > 2.5 * np.mean(naive.high - naive.low)
    assert sps.binomtest(c_cov, n_datasets, 0.95).pvalue > 0.001, c_cov
    assert n_cov / n_datasets < 0.8
    assert sps.binomtest(n_cov, n_datasets, 0.95, alternative="less").pvalue < 1e-6, n_cov


def test_cluster_bootstrap_bca_and_degenerate():
    x = np.random.default_rng(5).gamma(2.0, 0.05, size=(8, 50)) + np.random.default_rng(6).gamma(2.0, 0.05, (8, 1))
    ci = cluster_bootstrap_ci(x, n_resamples=1999, seed=0, method="bca")
    assert ci.low < ci.estimate < ci.high and ci.method == "bca"
    # acceleration comes from leave-one-cluster-out values
    loo = np.array([np.delete(x, i, axis=0).mean() for i in range(8)])
    d = loo.mean() - loo
    assert stats._acceleration(loo) == pytest.approx((d**3).sum() / (6 * (d**2).sum() ** 1.5))
    const = cluster_bootstrap_ci(np.full((4, 3), 2.0), method="bca", seed=0)
    assert (const.low, const.high, const.standard_error) == (2.0, 2.0, 0.0)
    # identical rows, clusters only: degenerate distribution, finite interval, no warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        same = cluster_bootstrap_ci(np.tile(np.arange(4.0), (3, 1)), seed=0, n_resamples=50,
                                    resample_items=False, method="bca")
    assert same.low == pytest.approx(1.5) and same.high == pytest.approx(1.5)


# ------------------------------------------------------------------------------------------------- jackknife
@settings(max_examples=30, deadline=None)
@given(samples)
def test_jackknife_mean_closed_form(x):
    jk = jackknife(x)
    scale = max(1.0, np.abs(x).max())
    assert jk.standard_error == pytest.approx(x.std(ddof=1) / np.sqrt(x.size), rel=1e-9, abs=1e-9 * scale)
    assert jk.bias == pytest.approx(0.0, abs=1e-9 * scale)
    np.testing.assert_allclose(jk.leave_one_out, [(x.sum() - v) / (x.size - 1) for v in x], rtol=1e-9,
                               atol=1e-9 * scale)


@settings(max_examples=30, deadline=None)
@given(samples)
def test_jackknife_variance_identity(x):
    jk = jackknife(x, np.var)                     # plug-in variance, ddof=0
    assert jk.bias_corrected == pytest.approx(x.var(ddof=1), rel=1e-8, abs=1e-8 * max(1.0, np.abs(x).max()) ** 2)


def test_jackknife_axis_and_loop_fallback():
    x = np.random.default_rng(7).normal(size=(4, 6))
    by_row = jackknife(x, np.median, axis=1)      # units along axis 1, one result per row
    for r in range(4):
        one = jackknife(x[r], np.median)
        assert by_row.estimate[r] == pytest.approx(one.estimate)
        assert by_row.standard_error[r] == pytest.approx(one.standard_error)
    assert by_row.leave_one_out.shape == (6, 4)
    vec = jackknife(x, np.mean)                    # (4,) units, result per column
    loop = jackknife(x, lambda s: s.mean(axis=0))  # no `axis` parameter: called per left-out unit
    np.testing.assert_allclose(loop.standard_error, vec.standard_error, rtol=1e-12)
    np.testing.assert_allclose(loop.bias_corrected, vec.bias_corrected, rtol=1e-12)
    assert "n=4" in repr(vec)


# ------------------------------------------------------------------------------------------ permutation_test
@pytest.mark.parametrize("paired", [False, True])
@pytest.mark.parametrize("alternative", ["two-sided", "less", "greater"])
@pytest.mark.parametrize("statistic", ["mean_diff", "median_diff"])
def test_permutation_equals_scipy(paired, alternative, statistic):
    rng = np.random.default_rng(8)
    a, b = rng.normal(0.2, 1, 25), rng.normal(0, 1, 25)
    ours = permutation_test(a, b, paired=paired, statistic=statistic, n_resamples=999, alternative=alternative,
                            seed=3)
    f = {"mean_diff": lambda x, y, axis: x.mean(axis) - y.mean(axis),
         "median_diff": lambda x, y, axis: np.median(x, axis) - np.median(y, axis)}[statistic]
    ref = sps.permutation_test((a, b), f, permutation_type="samples" if paired else "independent",
                               vectorized=True, n_resamples=999, alternative=alternative, rng=np.random.default_rng(3))
    assert ours.pvalue == ref.pvalue
    assert ours.statistic == pytest.approx(ref.statistic)
    np.testing.assert_allclose(ours.null_distribution, ref.null_distribution)


def test_permutation_paired_vs_unpaired_on_correlated_data():
    rng = np.random.default_rng(9)
    unit = rng.normal(0, 1, 40)                     # shared per-unit effect
    a, b = unit + 0.2 + rng.normal(0, 0.1, 40), unit + rng.normal(0, 0.1, 40)
    p_paired = permutation_test(a, b, paired=True, seed=0, n_resamples=1999).pvalue
    p_indep = permutation_test(a, b, paired=False, seed=0, n_resamples=1999).pvalue
    assert p_paired <= 2 / 2000 and p_indep > 0.1          # 2/(B+1): no relabelling as extreme


def test_permutation_callable_and_null_is_centred():
    rng = np.random.default_rng(10)
    a, b = rng.normal(size=30), rng.normal(size=35)
    res = permutation_test(a, b, statistic=lambda x, y, axis: x.mean(axis) - y.mean(axis), seed=1, n_resamples=2000)
    assert res.null_distribution.shape == (2000,)
    assert abs(res.null_distribution.mean()) < 0.05
    assert 0 < res.pvalue <= 1


# --------------------------------------------------------------------------------------------- effect sizes
@settings(max_examples=30, deadline=None)
@given(samples, samples)
def test_cohens_d_hand_formula(a, b):
    n1, n2 = a.size, b.size
    pooled = np.sqrt(((n1 - 1) * a.var(ddof=1) + (n2 - 1) * b.var(ddof=1)) / (n1 + n2 - 2))
    d = cohens_d(a, b)
    if pooled > 1e-6 * max(1.0, np.abs(a).max(), np.abs(b).max()):
        assert d == pytest.approx((a.mean() - b.mean()) / pooled, rel=1e-9)
        g = hedges_g(a, b)
        df = n1 + n2 - 2
        assert g == pytest.approx((1 - 3 / (4 * df - 1)) * d, rel=0.02, abs=1e-12)
        if d != 0:
            assert abs(g) < abs(d)


@settings(max_examples=30, deadline=None)
@given(samples)
def test_cohens_d_paired_is_dz(a):
    b = a[::-1] * 0.5 + 1.0
    diff = a - b
    if _spread(diff):
        assert cohens_d(a, b, paired=True) == pytest.approx(diff.mean() / diff.std(ddof=1), rel=1e-9)
        assert abs(hedges_g(a, b, paired=True)) <= abs(cohens_d(a, b, paired=True))


def test_hedges_g_is_unbiased_where_d_is_not():
    rng = np.random.default_rng(11)
    delta, n = 1.0, 5                               # df = 8, J ~ 0.90
    a = rng.normal(delta, 1, (4000, n))
    b = rng.normal(0, 1, (4000, n))
    d = np.array([cohens_d(x, y) for x, y in zip(a, b)])
    g = np.array([hedges_g(x, y) for x, y in zip(a, b)])
    se = g.std() / np.sqrt(g.size)
    assert abs(g.mean() - delta) < 4 * se
    assert d.mean() - delta > 0.05
    assert effects._hedges_j(8) == pytest.approx(1 - 3 / 31, abs=2e-3)


def test_cohens_d_zero_spread():
    assert cohens_d([1.0, 1.0], [0.0, 0.0]) == np.inf
    assert np.isnan(cohens_d([1.0, 1.0], [1.0, 1.0]))


@pytest.mark.parametrize("paired", [False, True])
def test_mean_difference_ci_equals_scipy(paired):
    rng = np.random.default_rng(12)
    a, b = rng.normal(0.3, 1, 30), rng.normal(0, 1, 30)
    ours = mean_difference_ci(a, b, paired=paired, n_resamples=999, seed=4)
    ref = sps.bootstrap((a, b), lambda x, y, axis: x.mean(axis) - y.mean(axis), paired=paired, vectorized=True,
                        n_resamples=999, rng=np.random.default_rng(4))
    np.testing.assert_allclose([ours.low, ours.high], [ref.confidence_interval.low, ref.confidence_interval.high],
                               rtol=1e-12)
    assert ours.estimate == pytest.approx(a.mean() - b.mean())
    const = mean_difference_ci([1.0, 2.0, 3.0], [0.0, 1.0, 2.0], paired=True)
    assert (const.low, const.high) == (1.0, 1.0)


def test_effect_size_table_matches_components():
    rng = np.random.default_rng(13)
    groups = {"a": rng.normal(0, 1, 12), "b": rng.normal(0.5, 1, 12), "c": rng.normal(2, 1, 12)}
    table = effect_size_table(groups, seed=0, n_resamples=499)
    assert list(zip(table["a"], table["b"])) == [("a", "b"), ("a", "c"), ("b", "c")]
    shared = np.random.default_rng(0)                # the permutation tests draw from one Generator, in row order
    for _, row in table.iterrows():
        x, y = groups[row["a"]], groups[row["b"]]
        ref = sps.ttest_ind(x, y)                    # Student t: the equal-variance model of Cohen's d
        p = permutation_test(x, y, n_resamples=499, seed=shared).pvalue
        assert (row["diff"], row["diff_low"], row["diff_high"], row["pvalue"], row["pvalue_permutation"]) == pytest.approx(
            (x.mean() - y.mean(), *ref.confidence_interval(0.95), ref.pvalue, p))
        assert row["cohens_d"] == pytest.approx(cohens_d(x, y)) and row["hedges_g"] == pytest.approx(hedges_g(x, y))
        k = np.sqrt(12 * 12 / 24)                    # d's bounds: the noncentralities where the observed t is a 2.5% tail
        assert sps.nct.cdf(row["cohens_d"] * k, 22, row["d_low"] * k) == pytest.approx(0.975, abs=1e-8)
        assert sps.nct.cdf(row["cohens_d"] * k, 22, row["d_high"] * k) == pytest.approx(0.025, abs=1e-8)
    ref_table = effect_size_table(groups, reference="a", seed=0, n_resamples=199, paired=True)
    assert list(zip(ref_table["a"], ref_table["b"])) == [("b", "a"), ("c", "a")]
    assert (ref_table["pvalue_holm"] >= ref_table["pvalue"]).all()
    assert (ref_table["pvalue_permutation_min"] == 2 / 2 ** 12).all()


def test_holm_hand_values():
    np.testing.assert_allclose(effects._holm(np.array([0.01, 0.04, 0.03])), [0.03, 0.06, 0.06])
    np.testing.assert_allclose(effects._holm(np.array([0.5, 0.9])), [1.0, 1.0])


# ---------------------------------------------------------------------------------------- quantile_summary
@settings(max_examples=30, deadline=None)
@given(arrays(np.float64, st.tuples(st.integers(1, 4), st.integers(2, 20)), elements=finite))
def test_quantile_summary_vs_numpy(x):
    qs = (0.05, 0.25, 0.5, 0.75, 0.95)
    s = quantile_summary(x, quantiles=qs, axis=1)
    assert s["n"] == x.shape[1]
    for key, q in zip(["q05", "q25", "q50", "q75", "q95"], qs):
        np.testing.assert_allclose(s[key], np.quantile(x, q, axis=1), rtol=1e-12, atol=1e-9)
    np.testing.assert_allclose(s["mean"], x.mean(1), rtol=1e-12, atol=1e-9)
    np.testing.assert_allclose(s["std"], x.std(1, ddof=1), rtol=1e-9, atol=1e-9)
    np.testing.assert_array_equal(s["min"], x.min(1))
    np.testing.assert_array_equal(s["max"], x.max(1))
    one = quantile_summary(x[0])
    assert isinstance(one["q50"], float) and one["q50"] == pytest.approx(np.median(x[0]))


# --------------------------------------------------------------------------------------------- error paths
X = np.arange(10.0)
M = np.arange(12.0).reshape(3, 4)
ERRORS = [
    (lambda: bootstrap_ci([1.0, np.nan]), "values: expected finite values, got 1 NaN/inf"),
    (lambda: bootstrap_ci([1.0, np.inf, 2.0]), "values: expected finite values"),
    (lambda: bootstrap_ci([]), "values: expected a non-empty array"),
    (lambda: bootstrap_ci([1.0]), "values: expected at least 2 samples along axis -1, got 1"),
    (lambda: bootstrap_ci(M[:1], axis=0), "values: expected at least 2 samples along axis 0, got 1"),
    (lambda: bootstrap_ci(X, confidence=1.0), "confidence: expected a number strictly between 0 and 1 (e.g. 0.95), got 1.0"),
    (lambda: bootstrap_ci(X, confidence=0), "confidence: expected a number strictly between 0 and 1"),
    (lambda: bootstrap_ci(X, n_resamples=0), "n_resamples: expected an integer >= 1, got 0"),
    (lambda: bootstrap_ci(X, n_resamples=10.5), "n_resamples: expected an integer >= 1, got 10.5"),
    (lambda: bootstrap_ci(X, method="studentized"), "method: expected one of 'bca', 'percentile', 'basic', got 'studentized'"),
    (lambda: bootstrap_ci(X, axis=1), "axis: expected an integer in [-1, 1) for values of shape (10,), got 1"),
    (lambda: bootstrap_ci(X, statistic=lambda x: x.mean()), "statistic: expected a callable accepting an `axis` keyword"),
    (lambda: bootstrap_ci(X, statistic="mean"), "statistic: expected a callable"),
    (lambda: bootstrap_ci(X, seed="abc"), "seed: expected None, a non-negative int"),
    (lambda: cluster_bootstrap_ci(X), "values: expected shape (n_clusters, n_items), e.g. (seeds, probes), got shape (10)"),
    (lambda: cluster_bootstrap_ci(M[:1]), "values: expected at least 2 clusters (rows, e.g. seeds), got 1"),
    (lambda: cluster_bootstrap_ci(np.where(M > 5, np.nan, M)), "values: expected finite values"),
    (lambda: cluster_bootstrap_ci(M, n_resamples=-1), "n_resamples: expected an integer >= 1, got -1"),
    (lambda: cluster_bootstrap_ci(M, confidence=95), "confidence: expected a number strictly between 0 and 1"),
    (lambda: cluster_bootstrap_ci(M, method="bc"), "method: expected one of 'bca', 'percentile', 'basic', got 'bc'"),
    (lambda: cluster_bootstrap_ci(M, statistic=lambda x, axis: x.sum()), "statistic: expected one value per slice"),
    (lambda: jackknife([1.0]), "values: expected at least 2 units along axis 0 (one is left out at a time), got 1"),
    (lambda: jackknife(M, axis=2), "axis: expected an integer in [-2, 2) for values of shape (3, 4), got 2"),
    (lambda: jackknife([[]]), "values: expected a non-empty array"),
    (lambda: jackknife(X, statistic=3), "statistic: expected a callable"),
    (lambda: permutation_test([1.0], X), "a: expected at least 2 samples, got 1"),
    (lambda: permutation_test(X, M), "b: expected shape (n,), got shape (3, 4)"),
    (lambda: permutation_test(X, X[:5], paired=True), "a and b: paired=True needs one b value per a value (the same length), got lengths 10 and 5"),
    (lambda: permutation_test(X, X, statistic="t"), "statistic: expected one of 'mean_diff', 'median_diff' or a callable(a, b, axis), got 't'"),
    (lambda: permutation_test(X, X, alternative="bigger"), "alternative: expected one of 'two-sided', 'less', 'greater', got 'bigger'"),
    (lambda: permutation_test(X, X, n_resamples=0), "n_resamples: expected an integer >= 1, got 0"),
    (lambda: permutation_test(X, [1.0, np.nan]), "b: expected finite values"),
    (lambda: cohens_d(X, [2.0]), "b: expected at least 2 samples, got 1"),
    (lambda: cohens_d(X, X[:3], paired=True), "a and b: paired=True needs one b value per a value"),
    (lambda: hedges_g([], X), "a: expected a non-empty array"),
    (lambda: mean_difference_ci(X, X[:4], paired=True), "a and b: paired=True needs one b value per a value"),
    (lambda: mean_difference_ci(X, X, confidence=-0.1), "confidence: expected a number strictly between 0 and 1"),
    (lambda: mean_difference_ci(X, X, n_resamples=True), "n_resamples: expected an integer >= 1, got True"),
    (lambda: mean_difference_ci(X, X, method="normal"), "method: expected one of"),
    (lambda: effect_size_table([X, X]), "groups: expected a dict name -> 1-d sample, got list"),
    (lambda: effect_size_table({"a": X}), "groups: expected at least 2 groups, got 1"),
    (lambda: effect_size_table({"a": X, "b": [1.0]}), "groups['b']: expected at least 2 samples, got 1"),
    (lambda: effect_size_table({"a": X, "b": X}, reference="c"), "reference: expected one of the group names ['a', 'b'], got 'c'"),
    (lambda: effect_size_table({"a": X, "b": X[:3]}, paired=True), "groups: paired=True needs samples of equal length"),
    (lambda: quantile_summary(X, quantiles=(0.5, 1.2)), "quantiles: expected a non-empty 1-d sequence of levels in [0, 1], got (0.5, 1.2)"),
    (lambda: quantile_summary(X, quantiles=()), "quantiles: expected a non-empty 1-d sequence"),
    (lambda: quantile_summary(X, quantiles=(0.5, 0.5)), "quantiles: expected distinct levels"),
    (lambda: quantile_summary([1.0]), "values: expected at least 2 samples along axis -1, got 1"),
    (lambda: quantile_summary(M, axis=-3), "axis: expected an integer in [-2, 2)"),
    (lambda: quantile_summary([[1.0, np.inf]]), "values: expected finite values"),
]


@pytest.mark.parametrize("call,message", ERRORS, ids=range(len(ERRORS)))
def test_error_paths(call, message):
    with pytest.raises(ValueError) as e:
        call()
    assert message in str(e.value), str(e.value)


@pytest.mark.parametrize("call", [
    lambda c: stats.bootstrap_ci(X, confidence=c, n_resamples=50, seed=0),
    lambda c: stats.cluster_bootstrap_ci(M, confidence=c, n_resamples=50, seed=0),
    lambda c: effects.mean_difference_ci(X, X + 1, confidence=c, n_resamples=50, seed=0),
    lambda c: stats.seed_interval(X, confidence=c),
    lambda c: effects.difference_interval(X, X + 1, confidence=c),
    lambda c: effects.standardized_difference_interval(0.5, 5, 5, confidence=c),
    lambda c: stats.interval_method(5, confidence=c),
    lambda c: effects.effect_size_table({"a": X, "b": X + 1}, confidence=c, n_resamples=50, seed=0),
], ids=["bootstrap_ci", "cluster_bootstrap_ci", "mean_difference_ci", "seed_interval", "difference_interval",
        "standardized_difference_interval", "interval_method", "effect_size_table"])
@pytest.mark.parametrize("bad", [1.5, -0.1, float("nan"), True, "0.95"])
def test_every_interval_refuses_a_confidence_outside_0_1_in_one_line_naming_it(call, bad):
    # issue 33: confidence=1.5 reached numpy ("Quantiles must be in the range [0, 1]"), naming no argument
    with pytest.raises(ValueError) as e: call(bad)
    msg = str(e.value)
    assert msg == f"confidence: expected a number strictly between 0 and 1 (e.g. 0.95), got {bad!r}" and "\n" not in msg


def test_a_refused_interval_is_a_value_that_reads_as_before():
    """NoInterval (issue 41, item 1): the refusals of seed_interval and the two-group intervals are values with a reason;
    their text, and the line a table shows under it, are the words they always were."""
    import pickle
    import pandas as pd
    from embvar_study.display import method_line
    notes = {"seed": stats.seed_interval(np.array([[0.3, 0.4]]))["note"],
             "difference": effects.difference_interval(np.array([0.1]), np.array([0.2, 0.3]))["note"],
             "standardized": effects.standardized_difference_interval(0.5, 1, 1)["note"]}
    before = {"seed": "no interval: 1 seed (an interval over seeds needs at least 2)",
              "difference": "no interval: 1 seed in a group (a difference over seeds needs at least 2 in each)",
              "standardized": "no interval: 0 df (needs at least 2 seeds in each group)"}
    assert {k: (type(v), str(v)) for k, v in notes.items()} == {k: (stats.NoInterval, v) for k, v in before.items()}
    assert notes["seed"].reason == "1 seed (an interval over seeds needs at least 2)"
    t = pd.DataFrame({"drift": [0.35], "ci_low": [np.nan], "ci_high": [np.nan]}); t.attrs["ci_method"] = notes["seed"]
    back = pickle.loads(pickle.dumps(t))                      # a cached table keeps the value
    assert isinstance(back.attrs["ci_method"], stats.NoInterval) and back.attrs["ci_method"].reason == notes["seed"].reason
    assert method_line(back) == "Intervals: " + before["seed"]
    given = stats.seed_interval(np.array([[0.3], [0.4]]))["note"]   # an interval that is given is plain words
    assert not isinstance(given, stats.NoInterval) and given == "95% t interval over 2 seeds (1 df)"


def test_method_line_leaves_a_per_row_method_column_to_speak():
    "A table whose rows carry their own interval method (a `method` column) gets no 'method was not recorded' line."
    import pandas as pd
    from embvar_study.display import method_line
    t = pd.DataFrame({"value": [1.0, 2.0], "ci_low": [0.5, np.nan], "ci_high": [1.5, np.nan],
                      "method": ["95% jackknife t interval", "no interval: 2 runs"]})
    assert method_line(t) == ""
    assert method_line(t.drop(columns="method")) == "Intervals: 95%; the method was not recorded with this table"
