"""Property and reference tests for embvar_study.metrics, spectra and rsa (heavier than the notebook's inline tests)."""
import itertools
import warnings

import numpy as np
import pytest
from hypothesis import assume, given, settings, strategies as st
from hypothesis.extra import numpy as hnp
from scipy.spatial.distance import cdist, cosine as scipy_cosine, pdist
from scipy.stats import spearmanr

import embvar_study._batching as B
from embvar_study.metrics import (
    class_variance, cosine_distance_variance, cosine_drift, cosine_similarity_rows, cross_run_dispersion, drift_curve,
    early_late_summary, expected_squared_distance, norm_stats, norm_variance, pairwise_distance_summary,
    pairwise_distances, path_length, per_dimension_variance, step_drift)
from embvar_study.rsa import rsa
from embvar_study.similarity import knn_indices, knn_overlap, linear_cka
from embvar_study.spectra import (
    anisotropy, conditional_variance, covariance_frobenius, covariance_spectrum, effective_rank, explained_variance_ratio,
    participation_ratio, spectrum_summary, top_eigen_ratio, total_variance)

FAST = settings(max_examples=30, deadline=None)

# Bounded floats on a 1e-3 grid: no subnormal near-duplicates whose spread is at the rounding level.
grid = st.floats(-10, 10).map(lambda v: round(v, 3))
nonzero = st.one_of(st.floats(-10, -0.1), st.floats(0.1, 10)).map(lambda v: round(v, 3))  # rows never zero
dims = st.integers(1, 6)


def arrays(shape, elements=grid):
    return hnp.arrays(np.float64, shape, elements=elements)


def loop(f, *arrays_, lead):
    "Reference: apply f to every leading index separately (the obvious Python loop)."
    out = np.empty(lead)
    for idx in np.ndindex(*lead):
        out[idx] = f(*(a[idx] for a in arrays_))
    return out


def rand(*shape, seed=0):
    return np.random.default_rng(seed).normal(size=shape)


def orthogonal(d, seed=0):
    q, r = np.linalg.qr(rand(d, d, seed=seed))
    return q * np.sign(np.diag(r))


def not_constant(X):
    return np.all(np.ptp(X, axis=-2).max(axis=-1) > 0)


# ---------------------------------------------------------------- drift

@FAST
@given(st.data())
def test_cosine_drift_identity_scaling_and_reference(data):
    N, d = data.draw(dims), data.draw(dims)
    ref = data.draw(arrays((N, d), nonzero))
    cur = data.draw(arrays((N, d), nonzero))
    s = data.draw(arrays((N, 1), st.floats(0.01, 100)))
    assert cosine_drift(ref, ref) == 0.0
    assert cosine_drift(ref, ref * s) == pytest.approx(0.0, abs=1e-14)
    np.testing.assert_allclose(cosine_drift(ref, cur * s), cosine_drift(ref, cur), atol=1e-13)
    expected = np.array([scipy_cosine(a, b) for a, b in zip(ref, cur)])
    np.testing.assert_allclose(cosine_drift(ref, cur, per_probe=True), expected, atol=1e-13)
    np.testing.assert_allclose(cosine_similarity_rows(ref, cur), 1 - expected, atol=1e-13)
    assert 0 <= cosine_drift(ref, cur) <= 2


@FAST
@given(st.data())
def test_cosine_drift_batched_equals_loop_and_broadcasts(data):
    lead = data.draw(st.tuples(st.integers(1, 3), st.integers(1, 3)))
    N, d = data.draw(dims), data.draw(dims)
    ref = data.draw(arrays((N, d), nonzero))
    cur = data.draw(arrays(lead + (N, d), nonzero))
    got = cosine_drift(ref, cur)
    assert got.shape == lead
    np.testing.assert_allclose(got, loop(lambda c: cosine_drift(ref, c), cur, lead=lead), rtol=0, atol=1e-15)
    np.testing.assert_allclose(cosine_drift(cur, ref), got, atol=1e-15)   # symmetric, broadcast either side


@FAST
@given(st.data())
def test_trajectory_metrics(data):
    lead = data.draw(st.tuples(st.integers(1, 3)))
    T, N, d = data.draw(st.integers(2, 6)), data.draw(dims), data.draw(dims)
    traj = data.draw(arrays(lead + (T, N, d), nonzero))
    curve = drift_curve(traj)
    assert curve.shape == lead + (T,)
    assert np.all(curve[..., 0] == 0.0)
    ref_curve = np.stack([[cosine_drift(traj[b, 0], traj[b, t]) for t in range(T)] for b in range(lead[0])])
    np.testing.assert_allclose(curve, ref_curve, atol=1e-15)
    steps = step_drift(traj)
    ref_steps = np.stack([[cosine_drift(traj[b, t], traj[b, t + 1]) for t in range(T - 1)] for b in range(lead[0])])
    np.testing.assert_allclose(steps, ref_steps, atol=1e-15)
    cum = path_length(traj, cumulative=True)
    assert cum.shape == lead + (T,) and np.all(cum[..., 0] == 0)
    np.testing.assert_allclose(cum[..., -1], path_length(traj), atol=1e-14)
    np.testing.assert_allclose(np.diff(cum, axis=-1), steps, atol=1e-14)


def test_drift_curve_of_torch_float32_trajectory():
    torch = pytest.importorskip("torch")
    traj = torch.randn(4, 10, 8, generator=torch.Generator().manual_seed(0))
    got = drift_curve(traj)                     # computed on the tensor's device, in float64 there
    assert isinstance(got, torch.Tensor) and got.dtype == torch.float64 and got[0] == 0
    np.testing.assert_allclose(got.numpy(), drift_curve(traj.numpy().astype(np.float64)), atol=1e-15)


@FAST
@given(st.lists(st.floats(1e-7, 3.1), min_size=1, max_size=8), st.integers(0, 2**16))
def test_drift_keeps_relative_precision_at_any_angle(thetas, seed):
    # Row i of `cur` is row i of `ref` rotated by theta_i in a random plane of R^5: 1 - cos = 2 sin^2(theta / 2).
    # Angles straddle the switch (_SMALL_DRIFT = 1e-6) between the dot-product and the difference formula;
    # the naive 1 - cos would have an absolute error ~1e-16, i.e. ~2e-2 relative at theta = 1e-7.
    th = np.array(thetas)
    Q = orthogonal(5, seed)
    scale = np.random.default_rng(seed).uniform(0.1, 10, size=(len(th), 1))
    ref = np.broadcast_to(Q[0], (len(th), 5)) * scale
    cur = np.cos(th)[:, None] * Q[0] + np.sin(th)[:, None] * Q[1]
    np.testing.assert_allclose(cosine_drift(ref, cur, per_probe=True), 2 * np.sin(th / 2) ** 2, rtol=1e-7)


@FAST
@given(arrays(st.tuples(st.integers(1, 3), st.integers(1, 12))), st.floats(0.05, 1.0))
def test_early_late_summary(curve, frac):
    s = early_late_summary(curve, frac=frac)
    T = curve.shape[-1]
    m = max(1, int(np.floor(frac * T + 1e-9)))
    assert s["window"] == m
    np.testing.assert_allclose(s["early"], curve[:, :m].mean(-1))
    np.testing.assert_allclose(s["late"], curve[:, T - m:].mean(-1))
    np.testing.assert_allclose(s["delta"], s["late"] - s["early"])


# ---------------------------------------------------------------- within a set

@FAST
@given(st.data())
def test_variances_match_numpy(data):
    lead = data.draw(st.tuples(st.integers(1, 3)))
    N, d = data.draw(st.integers(2, 8)), data.draw(dims)
    X = data.draw(arrays(lead + (N, d)))
    np.testing.assert_allclose(per_dimension_variance(X), np.var(X, axis=-2, ddof=1), atol=1e-10)
    np.testing.assert_allclose(per_dimension_variance(X, ddof=0), np.var(X, axis=-2), atol=1e-10)
    norms = np.linalg.norm(X, axis=-1)
    np.testing.assert_allclose(norm_variance(X), np.var(norms, axis=-1, ddof=1), atol=1e-10)
    st_ = norm_stats(X)
    np.testing.assert_allclose(st_["mean"], norms.mean(-1), atol=1e-12)
    np.testing.assert_allclose(st_["std"], np.std(norms, axis=-1, ddof=1), atol=1e-10)


@FAST
@given(st.data())
def test_pairwise_distances_match_cdist(data):
    N, d = data.draw(st.integers(2, 8)), data.draw(dims)
    X = data.draw(arrays((2, N, d), nonzero))
    for metric in ("euclidean", "cosine"):
        D = pairwise_distances(X, metric=metric)
        assert D.shape == (2, N, N)
        for b in range(2):
            np.testing.assert_allclose(D[b], cdist(X[b], X[b], metric), atol=1e-6 if metric == "euclidean" else 1e-12)
            assert np.all(np.diag(D[b]) == 0) and np.array_equal(D[b], D[b].T)
        s = pairwise_distance_summary(X, metric=metric)
        for b in range(2):
            p = pairwise_distances(X[b], metric=metric)[np.triu_indices(N, 1)]
            np.testing.assert_allclose(s["mean"][b], p.mean(), atol=1e-12)
            np.testing.assert_allclose(s["var"][b], p.var(), atol=1e-12)
            np.testing.assert_allclose(s["quantiles"][b], np.quantile(p, s["levels"]), atol=1e-12)


def test_pairwise_summary_matches_pdist_quantiles():
    X = rand(3, 30, 7)
    s = pairwise_distance_summary(X, metric="cosine", quantiles=(0.1, 0.9))
    for b in range(3):
        p = pdist(X[b], "cosine")
        np.testing.assert_allclose(s["quantiles"][b], np.quantile(p, [0.1, 0.9]), atol=1e-12)
        np.testing.assert_allclose(s["mean"][b], p.mean(), atol=1e-12)


# ---------------------------------------------------------------- covariance

@FAST
@given(st.data())
def test_covariance_spectrum_matches_numpy(data):
    N, d = data.draw(st.integers(2, 9)), data.draw(st.integers(1, 9))    # covers both N < d and N >= d
    X = data.draw(arrays((N, d)))
    C = np.atleast_2d(np.cov(X.T))
    ref = np.clip(np.linalg.eigvalsh(C)[::-1], 0, None)
    ev = covariance_spectrum(X)
    tol = 1e-9 * (1 + ref.max())
    assert ev.shape == (d,) and np.all(np.diff(ev) <= 0) and np.all(ev >= 0)
    np.testing.assert_allclose(ev, ref, atol=tol)
    np.testing.assert_allclose(total_variance(X), np.trace(C), atol=tol)
    np.testing.assert_allclose(total_variance(X), per_dimension_variance(X).sum(), atol=tol)
    np.testing.assert_allclose(total_variance(X), ev.sum(), atol=tol)
    np.testing.assert_allclose(covariance_frobenius(X), np.linalg.norm(C), atol=tol)
    if N < d: assert np.all(ev[N:] == 0)


@FAST
@given(st.data())
def test_spectral_summaries(data):
    N, d = data.draw(st.integers(3, 9)), data.draw(st.integers(2, 7))
    X = data.draw(arrays((2, N, d), nonzero))
    assume(not_constant(X))
    for b in range(2):
        lam = np.clip(np.linalg.eigvalsh(np.cov(X[b].T)), 0, None)[::-1]
        p = lam / lam.sum()
        np.testing.assert_allclose(explained_variance_ratio(X)[b], p, atol=1e-9)
        nz = p[p > 0]
        np.testing.assert_allclose(effective_rank(X)[b], np.exp(-(nz * np.log(nz)).sum()), rtol=1e-7, atol=1e-7)
        np.testing.assert_allclose(participation_ratio(X)[b], lam.sum() ** 2 / (lam ** 2).sum(), rtol=1e-9)
        np.testing.assert_allclose(top_eigen_ratio(X)[b], p[0], atol=1e-9)
        np.testing.assert_allclose(anisotropy(X)[b], (1 - pdist(X[b], "cosine")).mean(), atol=1e-12)
    rank = np.linalg.matrix_rank(X - X.mean(-2, keepdims=True))
    assert np.all(effective_rank(X) >= 1 - 1e-9) and np.all(effective_rank(X) <= rank + 1e-6)
    assert np.all(participation_ratio(X) >= 1 - 1e-9) and np.all(participation_ratio(X) <= rank + 1e-6)
    np.testing.assert_allclose(explained_variance_ratio(X).sum(-1), 1.0)
    s = spectrum_summary(X)
    np.testing.assert_allclose(s["trace"], total_variance(X))
    np.testing.assert_allclose(s["frobenius"], covariance_frobenius(X))
    np.testing.assert_allclose(s["effective_rank"], effective_rank(X))
    np.testing.assert_allclose(s["participation_ratio"], participation_ratio(X))
    np.testing.assert_allclose(s["anisotropy"], anisotropy(X))
    np.testing.assert_allclose(s["top_eigen_ratio"], top_eigen_ratio(X))


def test_effective_rank_closed_forms():
    # k orthogonal directions with equal variance -> effective rank and participation ratio exactly k.
    E = np.eye(5)[:3] * 2.0
    X = np.concatenate([E, -E])   # 6 rows, variance only along 3 axes, equal
    assert effective_rank(X) == pytest.approx(3.0, rel=1e-12)
    assert participation_ratio(X) == pytest.approx(3.0, rel=1e-12)
    assert top_eigen_ratio(X) == pytest.approx(1 / 3, rel=1e-12)
    # Isotropic cloud: anisotropy near 0; identical directions: anisotropy 1.
    assert abs(anisotropy(rand(500, 50))) < 0.01
    assert anisotropy(np.outer(np.arange(1, 6), [1.0, 2.0])) == pytest.approx(1.0, abs=1e-12)


# ---------------------------------------------------------------- across runs

def naive_cka(X, Y):
    n = len(X)
    H = np.eye(n) - 1 / n
    hsic = lambda K, L: np.trace(K @ H @ L @ H) / (n - 1) ** 2
    K, L = X @ X.T, Y @ Y.T
    return hsic(K, L) / np.sqrt(hsic(K, K) * hsic(L, L))


def unbiased_hsic(K, L):
    "Song et al. (2012), eq. (5), on the raw (uncentred) Gram matrices."
    n = len(K)
    K, L = K.copy(), L.copy()
    np.fill_diagonal(K, 0); np.fill_diagonal(L, 0)
    one = np.ones(n)
    return (np.trace(K @ L) + (one @ K @ one) * (one @ L @ one) / ((n - 1) * (n - 2))
            - 2 / (n - 2) * one @ K @ L @ one) / (n * (n - 3))


def direct_debiased_cka(X, Y):
    K, L = X @ X.T, Y @ Y.T
    return unbiased_hsic(K, L) / np.sqrt(unbiased_hsic(K, K) * unbiased_hsic(L, L))


@FAST
@given(st.data())
def test_linear_cka_invariances_and_references(data):
    N, dx, dy = data.draw(st.integers(4, 10)), data.draw(dims), data.draw(dims)
    X = data.draw(arrays((N, dx)))
    Y = data.draw(arrays((N, dy)))
    assume(not_constant(X) and not_constant(Y))
    seed = data.draw(st.integers(0, 2**16))
    s = data.draw(st.floats(0.01, 100))
    shift = data.draw(arrays((dx,)))
    XQ = X @ orthogonal(dx, seed) * s + shift
    assert linear_cka(X, XQ) == pytest.approx(1.0, abs=1e-9)
    assert linear_cka(XQ, Y) == pytest.approx(linear_cka(X, Y), abs=1e-9)
    assert linear_cka(X, Y) == pytest.approx(naive_cka(X, Y), abs=1e-9)
    assert linear_cka(X, Y) == pytest.approx(linear_cka(Y, X), abs=1e-12)
    assert -1e-12 <= linear_cka(X, Y) <= 1 + 1e-12
    K, L = X @ X.T, Y @ Y.T
    kk, ll = unbiased_hsic(K, K), unbiased_hsic(L, L)
    if min(kk / np.trace(K) ** 2, ll / np.trace(L) ** 2) > 1e-6:   # well-conditioned unbiased self-similarities
        assert linear_cka(X, Y, debiased=True) == pytest.approx(direct_debiased_cka(X, Y), abs=1e-7)
    elif min(kk, ll) < -1e-9 * max(np.trace(K), np.trace(L)) ** 2:  # clearly negative self-similarity: nan
        assert np.isnan(linear_cka(X, Y, debiased=True))


@pytest.mark.parametrize("N,dx,dy", [(30, 5, 7), (6, 40, 50)])   # feature-space and Gram-matrix routes
def test_linear_cka_routes_and_batching(N, dx, dy):
    X, Y = rand(3, 2, N, dx, seed=1), rand(2, N, dy, seed=2)
    got = linear_cka(X, Y)
    assert got.shape == (3, 2)
    np.testing.assert_allclose(got, loop(lambda a, b: naive_cka(a, b), X, np.broadcast_to(Y, (3, 2, N, dy)), lead=(3, 2)), atol=1e-10)
    deb = linear_cka(X, Y, debiased=True)
    np.testing.assert_allclose(deb, loop(direct_debiased_cka, X, np.broadcast_to(Y, (3, 2, N, dy)), lead=(3, 2)), atol=1e-9)


def knn_reference(X, Y, k):
    "Brute force: Python sets of the k highest cosine similarities (ties broken by index)."
    def sets(Z):
        out = []
        for i in range(len(Z)):
            sims = sorted(((1 - scipy_cosine(Z[i], Z[j]), j) for j in range(len(Z)) if j != i), key=lambda t: (-t[0], t[1]))
            out.append({j for _, j in sims[:k]})
        return out
    return np.array([len(a & b) / len(a | b) for a, b in zip(sets(X), sets(Y))])


@FAST
@given(st.integers(0, 2**16), st.integers(3, 14), st.integers(2, 6), st.integers(2, 6), st.data())  # d=1: cosines are +-1, all tied
def test_knn_overlap_matches_brute_force(seed, N, dx, dy, data):
    k = data.draw(st.integers(1, N - 1))
    X, Y = rand(N, dx, seed=seed), rand(N, dy, seed=seed + 1)
    ref = knn_reference(X, Y, k)
    np.testing.assert_allclose(knn_overlap(X, Y, k=k, per_point=True), ref, atol=1e-15)
    assert knn_overlap(X, Y, k=k) == pytest.approx(ref.mean(), abs=1e-15)
    s = np.random.default_rng(seed).uniform(0.1, 10, size=(N, 1))
    assert knn_overlap(X, X @ orthogonal(dx, seed), k=k) == 1.0
    assert knn_overlap(X, X * s, k=k) == 1.0


def test_knn_overlap_batched_both_counting_paths():
    X, Y = rand(2, 3, 25, 6, seed=3), rand(25, 4, seed=4)
    for k in (3, 20):          # k*k <= 4N: pairwise comparison; k*k > 4N: membership mask
        got = knn_overlap(X, Y, k=k, per_point=True)
        assert got.shape == (2, 3, 25)
        for b, l in itertools.product(range(2), range(3)):
            np.testing.assert_allclose(got[b, l], knn_reference(X[b, l], Y, k), atol=1e-15)
    idx = knn_indices(X, k=4)
    sims = np.einsum("blnd,blmd->blnm", X, X) / np.linalg.norm(X, axis=-1)[..., :, None] / np.linalg.norm(X, axis=-1)[..., None, :]
    sims[..., np.arange(25), np.arange(25)] = -np.inf
    np.testing.assert_array_equal(idx, np.argsort(-sims, axis=-1)[..., :4])


@FAST
@given(st.integers(0, 2**16), st.integers(3, 12), st.integers(1, 5), st.integers(1, 5))
def test_rsa_matches_scipy(seed, N, dx, dy):
    X, Y = rand(N, dx, seed=seed), rand(N, dy, seed=seed + 7)
    for metric in ("cosine", "euclidean"):
        with np.errstate(invalid="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")          # scipy warns on constant input (d=1 cosine distances)
            ref = spearmanr(pdist(X, metric), pdist(Y, metric))[0]
        np.testing.assert_allclose(rsa(X, Y, metric=metric), ref, atol=1e-12, equal_nan=True)
    if dx >= 2:   # with d=1 all cosine distances are 0 or 2 and may all tie (rho undefined)
        assert rsa(X, 3 * X @ orthogonal(dx, seed)) == pytest.approx(1.0, abs=1e-12)


def test_rsa_batched_and_ties():
    X, Y = rand(3, 15, 4, seed=5), rand(15, 6, seed=6)
    got = rsa(X, Y)
    for b in range(3):
        assert got[b] == pytest.approx(spearmanr(pdist(X[b], "cosine"), pdist(Y, "cosine"))[0], abs=1e-12)
    np.testing.assert_allclose(rsa(Y, X), got, atol=1e-15)
    for seed in range(5):    # small integer grids: many exactly tied distances get average ranks, like scipy
        g = np.random.default_rng(seed)
        G, H = g.integers(1, 4, size=(10, 2)).astype(float), g.integers(1, 4, size=(10, 3)).astype(float)
        ref = spearmanr(pdist(G), pdist(H))[0]              # integer squared distances: exact ties in scipy too
        np.testing.assert_allclose(rsa(G, H, metric="euclidean"), ref, atol=1e-12)
        G, H = np.round(g.normal(size=(12, 2))), np.round(g.normal(size=(12, 3)))   # with duplicate rows (D = 0)
        np.testing.assert_allclose(rsa(G, H, metric="euclidean"), spearmanr(pdist(G), pdist(H))[0], atol=1e-12)
        G, H = g.integers(1, 4, size=(10, 2)).astype(float), g.integers(1, 4, size=(10, 3)).astype(float)
        # scipy's cosine distances carry their own rounding noise, so round them to expose the exact ties
        ref = spearmanr(np.round(pdist(G, "cosine"), 12), np.round(pdist(H, "cosine"), 12))[0]
        np.testing.assert_allclose(rsa(G, H), ref, atol=1e-12)


@FAST
@given(st.data())
def test_cross_run_dispersion_matches_loop(data):
    K, N, d = data.draw(st.integers(2, 4)), data.draw(dims), data.draw(dims)
    runs = data.draw(arrays((2, K, N, d), st.floats(0.1, 10).map(lambda v: round(v, 3))))   # positive: mean never 0
    out = cross_run_dispersion(runs)
    for b in range(2):
        m = runs[b].mean(0)
        sq = np.array([[np.sum((runs[b, k, i] - m[i]) ** 2) for i in range(N)] for k in range(K)])
        cd = np.array([[scipy_cosine(runs[b, k, i], m[i]) for i in range(N)] for k in range(K)])
        assert out["mean_sq_distance"][b] == pytest.approx(sq.mean(), abs=1e-10)
        assert out["mean_cosine_distance"][b] == pytest.approx(cd.mean(), abs=1e-12)
        assert out["cosine_distance_var"][b] == pytest.approx(cd.var(axis=0, ddof=1).mean(), abs=1e-12)
        assert cosine_distance_variance(runs)[b] == out["cosine_distance_var"][b]
        np.testing.assert_allclose(expected_squared_distance(runs[b, 0], runs[b, 1]),
                                   np.mean([np.sum((runs[b, 0, i] - runs[b, 1, i]) ** 2) for i in range(N)]), atol=1e-10)
    # mean squared distance to the mean = (K-1)/K * summed unbiased variance across runs
    np.testing.assert_allclose(out["mean_sq_distance"], runs.var(axis=1, ddof=1).sum(-1).mean(-1) * (K - 1) / K, atol=1e-10)


# ---------------------------------------------------------------- across inputs

@FAST
@given(st.data())
def test_class_variance_identity_and_reference(data):
    C = data.draw(st.integers(2, 4))
    counts = data.draw(st.lists(st.integers(2, 5), min_size=C, max_size=C))
    labels = np.repeat(np.array(["c%d" % c for c in range(C)]), counts)
    labels = data.draw(st.permutations(labels.tolist()))
    N, d = len(labels), data.draw(dims)
    X = data.draw(arrays((2, N, d)))
    cv = class_variance(X, labels)
    np.testing.assert_allclose(cv["total"], cv["intra_weighted"] + cv["inter"], atol=1e-9)
    np.testing.assert_allclose(cv["total"], total_variance(X) * (N - 1) / N, atol=1e-9)
    lab = np.array(labels)
    for b in range(2):
        mu = X[b].mean(0)
        W = [np.mean(np.sum((X[b][lab == c] - X[b][lab == c].mean(0)) ** 2, axis=1)) for c in cv["classes"]]
        inter = sum((lab == c).mean() * np.sum((X[b][lab == c].mean(0) - mu) ** 2) for c in cv["classes"])
        np.testing.assert_allclose(cv["per_class"][b], W, atol=1e-10)
        assert cv["intra"][b] == pytest.approx(np.mean(W), abs=1e-10)
        assert cv["inter"][b] == pytest.approx(inter, abs=1e-10)
    groups = conditional_variance(X, labels)
    assert list(groups) == cv["classes"]
    for c, v in groups.items():
        np.testing.assert_allclose(v, [np.trace(np.atleast_2d(np.cov(X[b][lab == c].T))) for b in range(2)], atol=1e-9)


def test_class_variance_closed_form():
    # Class centroids at +-a e1 (3 members each, offsets +-r e2 and 0): intra per class = 2 r^2 / 3, inter = a^2.
    a, r = 3.0, 2.0
    X = np.array([[a, r], [a, -r], [a, 0], [-a, r], [-a, -r], [-a, 0]])
    cv = class_variance(X, [1, 1, 1, 0, 0, 0])
    assert cv["classes"] == [0, 1]
    np.testing.assert_allclose(cv["per_class"], [2 * r ** 2 / 3] * 2)
    assert cv["inter"] == pytest.approx(a ** 2)
    assert cv["ratio"] == pytest.approx(2 * r ** 2 / 3 / a ** 2)
    assert cv["total"] == pytest.approx(np.mean(np.sum(X ** 2, 1)))
    mixed = class_variance(X, [1, 1, 1, "b", "b", "b"])       # non-comparable labels: first-appearance order
    assert mixed["classes"] == [1, "b"] and mixed["intra"] == pytest.approx(cv["intra"])


# ---------------------------------------------------------------- chunking

def test_chunked_results_equal_unchunked(monkeypatch):
    traj = rand(3, 5, 12, 6, seed=10)
    runs = rand(2, 3, 12, 6, seed=11)
    labels = np.arange(12) % 3
    calls = {
        "drift": lambda: drift_curve(traj), "step": lambda: step_drift(traj),
        "cos": lambda: cosine_drift(traj[:, :1], traj, per_probe=True),
        "pdv": lambda: per_dimension_variance(traj), "pd": lambda: pairwise_distances(traj, metric="cosine"),
        "pds": lambda: pairwise_distance_summary(traj)["quantiles"], "spec": lambda: covariance_spectrum(traj),
        "tv": lambda: total_variance(traj), "anis": lambda: anisotropy(traj),
        "esd": lambda: expected_squared_distance(traj[:, :1], traj),
        "disp": lambda: cross_run_dispersion(runs)["cosine_distance_var"],
        "knn": lambda: knn_overlap(traj[:, :1], traj, k=3, per_point=True), "rsa": lambda: rsa(traj[:, :1], traj),
        "cka": lambda: linear_cka(traj[:, :1], traj, debiased=True), "cv": lambda: class_variance(traj, labels)["per_class"],
        "cka2": lambda: linear_cka(traj, traj[::-1, :, :, :4]),   # no broadcast: all HSIC terms in one pass
        "cka3": lambda: linear_cka(traj[:, :, :4], np.tile(traj[:, :, :4], 4) + traj[:, :, 4:8].repeat(4, -1)),  # Gram
    }
    whole = {k: f() for k, f in calls.items()}
    for budget in (1, 200):    # one leading index per call (stack branch) and a few (concatenate branch)
        monkeypatch.setattr(B, "_CHUNK_ELEMS", budget)
        for k, f in calls.items():
            np.testing.assert_allclose(f(), whole[k], atol=1e-13, err_msg=k)


def test_float32_input_is_promoted_exactly():
    traj = rand(2, 4, 9, 5, seed=12).astype(np.float32)
    t64 = traj.astype(np.float64)
    labels = np.arange(9) % 3
    fs = [drift_curve, step_drift, lambda t: cosine_drift(t[:, :1], t), per_dimension_variance, norm_variance,
          lambda t: pairwise_distances(t, metric="cosine"), covariance_spectrum, total_variance, anisotropy,
          lambda t: spectrum_summary(t)["effective_rank"], lambda t: cross_run_dispersion(t)["cosine_distance_var"],
          lambda t: knn_overlap(t[:, :1], t, k=3), lambda t: rsa(t[:, :1], t), lambda t: linear_cka(t[:, :1], t),
          lambda t: class_variance(t, labels)["intra"], lambda t: conditional_variance(t, labels)[1]]
    for f in fs:
        np.testing.assert_array_equal(f(traj), f(t64))
    bad = traj.copy(); bad[1, 2, 3, 4] = np.nan
    with pytest.raises(ValueError, match="traj: expected finite values, got 1 NaN/inf entry"):
        drift_curve(bad)


# ---------------------------------------------------------------- error paths

X4 = rand(4, 3)
ERRORS = [
    (lambda: cosine_drift(X4, np.zeros((4, 3))), "cur: cosine needs non-zero vectors"),
    (lambda: cosine_similarity_rows(np.zeros((4, 3)), X4), "a: cosine needs non-zero vectors"),
    (lambda: cosine_drift(X4, rand(5, 3)), "ref and cur: expected the same (N, d) in their last two axes, got shapes (4, 3) and (5, 3)"),
    (lambda: cosine_drift(rand(2, 4, 3), rand(3, 4, 3)), "ref and cur: leading (batch) dimensions must broadcast, got shapes (2, 4, 3) and (3, 4, 3)"),
    (lambda: cosine_drift([[np.nan, 1.0]], [[1.0, 1.0]]), "ref: expected finite values"),
    (lambda: cosine_drift([[1.0, 1.0]], [[np.inf, 1.0]]), "cur: expected finite values"),
    (lambda: cosine_drift(np.zeros((0, 3)), np.zeros((0, 3))), "ref: expected a non-empty array"),
    (lambda: cosine_drift(np.ones(3), np.ones(3)), "ref: expected shape (..., N, d), got shape (3)"),
    (lambda: cosine_drift([[1e-300, 0.0]], [[1.0, 0.0]]), "ref: cosine needs non-zero vectors"),
    (lambda: drift_curve(X4), "traj: expected shape (..., T, N, d), got shape (4, 3)"),
    (lambda: drift_curve(np.zeros((2, 4, 3))), "traj: cosine needs non-zero vectors"),
    (lambda: step_drift(rand(1, 4, 3)), "traj: expected at least 2 checkpoints (T), got 1"),
    (lambda: path_length(rand(1, 4, 3)), "traj: expected at least 2 checkpoints (T), got 1"),
    (lambda: early_late_summary([1.0, 2.0], frac=1.5), "frac: expected a number in (0, 1], got 1.5"),
    (lambda: early_late_summary([np.nan]), "curve: expected finite values"),
    (lambda: per_dimension_variance(X4[:1]), "X: expected at least 2 rows (N) for a variance with ddof=1, got 1"),
    (lambda: per_dimension_variance(X4, ddof=4), "X: expected at least 5 rows (N) for a variance with ddof=4, got 4"),
    (lambda: norm_variance(X4, ddof=1.5), "ddof: expected a non-negative integer, got 1.5"),
    (lambda: norm_stats(np.ones(3)), "X: expected shape (..., N, d), got shape (3)"),
    (lambda: pairwise_distances(X4, metric="l1"), "metric: expected one of ('euclidean', 'cosine'), got 'l1'"),
    (lambda: pairwise_distances(np.zeros((4, 3)), metric="cosine"), "X: cosine needs non-zero vectors"),
    (lambda: pairwise_distance_summary(X4[:1]), "X: expected at least 2 rows (N), got 1"),
    (lambda: pairwise_distance_summary(X4, quantiles=[-0.1]), "quantiles: expected levels in [0, 1], got [-0.1]"),
    (lambda: pairwise_distance_summary(X4, quantiles=[]), "quantiles: expected a non-empty array"),
    (lambda: covariance_spectrum(X4[:1]), "X: expected at least 2 rows (N), got 1"),
    (lambda: total_variance([[1.0, np.inf], [0.0, 0.0]]), "X: expected finite values"),
    (lambda: covariance_frobenius(np.ones(4)), "X: expected shape (..., N, d), got shape (4)"),
    (lambda: explained_variance_ratio(np.ones((4, 3))), "X: explained_variance_ratio needs rows that are not all identical"),
    (lambda: effective_rank(np.full((4, 3), 0.1)), "X: effective_rank needs rows that are not all identical"),
    (lambda: participation_ratio(np.ones((4, 3))), "X: participation_ratio needs rows that are not all identical"),
    (lambda: top_eigen_ratio(np.ones((4, 3))), "X: top_eigen_ratio needs rows that are not all identical"),
    (lambda: spectrum_summary(np.ones((4, 3))), "X: spectrum_summary needs rows that are not all identical"),
    (lambda: anisotropy(np.zeros((4, 3))), "X: cosine needs non-zero vectors"),
    (lambda: anisotropy(X4[:1]), "X: expected at least 2 rows (N), got 1"),
    (lambda: expected_squared_distance(X4, rand(4, 2)), "X and Y: expected the same (N, d) in their last two axes, got shapes (4, 3) and (4, 2)"),
    (lambda: cross_run_dispersion(rand(1, 4, 3)), "runs: expected at least 2 runs (K, axis -3), got 1"),
    (lambda: cross_run_dispersion(X4), "runs: expected shape (..., K, N, d), got shape (4, 3)"),
    (lambda: cosine_distance_variance(np.stack([X4, -X4])), "runs (mean over the K runs): cosine needs non-zero vectors"),
    (lambda: cosine_distance_variance(np.stack([X4, np.zeros((4, 3))])), "runs: cosine needs non-zero vectors"),
    (lambda: knn_overlap(X4, X4, k=4), "k: expected an integer with 1 <= k <= N-1 = 3 (self excluded), got 4"),
    (lambda: knn_overlap(X4, X4, k=0), "k: expected an integer with 1 <= k <= N-1 = 3 (self excluded), got 0"),
    (lambda: knn_overlap(X4, X4, k=2.0), "k: expected an integer"),
    (lambda: knn_overlap(X4, rand(5, 3)), "X and Y: expected the same number of rows N (axis -2), got shapes (4, 3) and (5, 3)"),
    (lambda: knn_overlap(X4, np.zeros((4, 3)), k=1), "Y: cosine needs non-zero vectors"),
    (lambda: knn_overlap(rand(2, 4, 3), rand(3, 4, 3), k=1), "X and Y: leading (batch) dimensions must broadcast"),
    (lambda: knn_indices(X4[:1], k=1), "X: expected at least 2 rows (N), got 1"),
    (lambda: rsa(X4[:2], X4[:2]), "X: expected at least 3 rows (N), got 2"),
    (lambda: rsa(X4, rand(5, 3)), "X and Y: expected the same number of rows N (axis -2)"),
    (lambda: rsa(X4, X4, metric="cityblock"), "metric: expected one of"),
    (lambda: rsa(X4, np.zeros((4, 2))), "Y: cosine needs non-zero vectors"),
    (lambda: linear_cka(X4[:1], X4[:1]), "X: expected at least 2 rows (N), got 1"),
    (lambda: linear_cka(X4[:3], X4[:3], debiased=True), "X: expected at least 4 rows (N), got 3"),
    (lambda: linear_cka(X4, np.ones((4, 2))), "Y: linear_cka needs rows that are not all identical"),
    (lambda: linear_cka(X4, rand(5, 3)), "X and Y: expected the same number of rows N (axis -2), got shapes (4, 3) and (5, 3)"),
    (lambda: linear_cka(rand(2, 4, 3), rand(3, 4, 3)), "X and Y: leading (batch) dimensions must broadcast"),
    (lambda: class_variance(X4, [0, 0, 0, 0]), "labels: expected at least 2 classes, got 1"),
    (lambda: class_variance(X4, ["a", "a", "b", "c"]), "labels: expected at least 2 members per class, got 1 for class 'b'"),
    (lambda: class_variance(X4, [0, 1, 0]), "labels: expected shape (N,) = (4,) to label the rows of X (4, 3), got shape (3)"),
    (lambda: class_variance(X4[:3], [0, 1, 0]), "X: expected at least 4 rows (N), got 3"),
    (lambda: conditional_variance(X4, [0, 0, 0, 1]), "groups: expected at least 2 members per class, got 1 for class 1"),
    (lambda: conditional_variance(X4, [[0, 1], [0, 1]]), "groups: expected shape (N,) = (4,)"),
]


@pytest.mark.parametrize("call,message", ERRORS, ids=[m[:40] for _, m in ERRORS])
def test_error_paths(call, message):
    with pytest.raises(ValueError) as e:
        call()
    assert message in str(e.value)
