"""Property-based tests for embvar_study.align against scipy and closed forms."""
import numpy as np
import pandas as pd
import pytest
import scipy.linalg
import scipy.spatial
from scipy.stats import special_ortho_group
from hypothesis import given, settings, assume, strategies as st
from hypothesis.extra.numpy import arrays

from scipy.spatial.distance import cosine as scipy_cosine, pdist
from scipy.stats import spearmanr

from embvar_study.align import (PAIR_MEASURES, ProcrustesResult, GPAResult, procrustes_align, procrustes_align_batch,
                                aligned_distance, generalized_procrustes, raw_vs_aligned, pairwise_run_table)

SETTINGS = settings(max_examples=30, deadline=None)
seeds = st.integers(0, 2**32 - 1)
dims = st.integers(1, 6)
bounded = st.floats(-10, 10, allow_nan=False, allow_infinity=False, allow_subnormal=False)


def config(seed, n, d):
    "Generic (n, d) configuration: distinct singular values, so the Procrustes rotation is unique when n > d."
    return np.random.default_rng(seed).normal(size=(n, d)) * np.linspace(1.0, 2.0, d)


def random_orthogonal(seed, d, proper=True):
    rng = np.random.default_rng(seed)
    Q, Rq = np.linalg.qr(rng.normal(size=(d, d)))
    Q = Q * np.sign(np.diag(Rq))                     # Haar-distributed orthogonal matrix
    if proper and np.linalg.det(Q) < 0: Q[:, 0] *= -1
    if not proper and np.linalg.det(Q) > 0: Q[:, 0] *= -1
    return Q


def rss(X, Y, R, s=1.0):
    A, B = X - X.mean(0), Y - Y.mean(0)
    return ((s * A @ R - B) ** 2).sum()


# --- orthogonal Procrustes -------------------------------------------------------------------------------------

@SETTINGS
@given(seeds, dims, st.integers(0, 10))
def test_rotation_matches_scipy(seed, d, extra):
    n = d + 2 + extra
    X, Y = config(seed, n, d), config(seed + 1, n, d)
    R_sp, _ = scipy.linalg.orthogonal_procrustes(X - X.mean(0), Y - Y.mean(0))
    np.testing.assert_allclose(procrustes_align(X, Y).rotation, R_sp, atol=1e-12)
    R_raw, _ = scipy.linalg.orthogonal_procrustes(X, Y)
    np.testing.assert_allclose(procrustes_align(X, Y, center=False).rotation, R_raw, atol=1e-12)


@SETTINGS
@given(seeds, st.integers(2, 6), st.floats(0.1, 10), arrays(np.float64, 6, elements=st.floats(-5, 5)))
def test_recovers_rotation_scale_translation(seed, d, s, shift):
    X = config(seed, 3 * d + 5, d)
    Q = special_ortho_group.rvs(d, random_state=seed % 2**31)
    t = shift[:d]
    Y = s * X @ Q + t
    res = procrustes_align(X, Y, scale=True, allow_reflection=False)
    np.testing.assert_allclose(res.rotation, Q, atol=1e-9)
    assert res.scale == pytest.approx(s, rel=1e-10)
    np.testing.assert_allclose(res.target_mean - res.scale * res.source_mean @ res.rotation, t, atol=1e-9)
    assert res.disparity < 1e-20 and res.rmsd < 1e-9 * s
    np.testing.assert_allclose(res.aligned, Y, atol=1e-9 * max(1, s))
    Z = np.random.default_rng(seed).normal(size=(7, d))
    np.testing.assert_allclose(res.apply(Z), s * Z @ Q + t, atol=1e-8 * max(1, s))
    # without scale: the rotation is still exact (scale does not change the rotation), scale reported 1
    res1 = procrustes_align(X, Y)
    np.testing.assert_allclose(res1.rotation, Q, atol=1e-9)
    assert res1.scale == 1.0
    # a scale the unscaled fit cannot absorb leaves a disparity; none is left when there is none to absorb (the two
    # thresholds are apart: between them, e.g. s = 0.992, the disparity is small but not zero)
    if abs(s - 1) > 1e-2: assert res1.disparity > 1e-6
    if s == 1.0: assert res1.disparity < 1e-20


@SETTINGS
@given(seeds, st.integers(2, 6))
def test_reflection_allowed_or_not(seed, d):
    X = config(seed, 3 * d + 5, d)
    P = random_orthogonal(seed, d, proper=False)            # det = -1
    Y = X @ P
    np.testing.assert_allclose(procrustes_align(X, Y).rotation, P, atol=1e-9)
    proper = procrustes_align(X, Y, allow_reflection=False)
    assert np.linalg.det(proper.rotation) == pytest.approx(1.0, abs=1e-10)
    assert proper.disparity > 1e-6
    # Kabsch optimality: no proper rotation does better (random proper rotations and the identity)
    for k in range(5):
        Q = random_orthogonal(seed + k + 1, d, proper=True)
        assert rss(X, Y, proper.rotation) <= rss(X, Y, Q) + 1e-9
    assert rss(X, Y, proper.rotation) <= rss(X, Y, np.eye(d)) + 1e-9


@SETTINGS
@given(st.integers(2, 8), st.integers(1, 4), st.data())
def test_rotation_orthogonal_and_optimal_on_arbitrary_input(n, d, data):
    X = data.draw(arrays(np.float64, (n, d), elements=bounded))
    Y = data.draw(arrays(np.float64, (n, d), elements=bounded))
    for M in (X, Y):
        assume(((M - M.mean(0)) ** 2).sum() > 1e-6)
    for allow in (True, False):
        for sc in (False, True):
            res = procrustes_align(X, Y, scale=sc, allow_reflection=allow)
            R = res.rotation
            np.testing.assert_allclose(R @ R.T, np.eye(d), atol=1e-10)
            if not allow:
                assert np.linalg.det(R) == pytest.approx(1.0, abs=1e-9)
            assert res.scale >= 0
            if sc:
                assert -1e-12 <= res.disparity <= 1 + 1e-12
            best = rss(X, Y, R, res.scale)
            assert best == pytest.approx(res.disparity * ((Y - Y.mean(0)) ** 2).sum(), rel=1e-9, abs=1e-9)
            assert res.rmsd == pytest.approx(np.sqrt(best / n), rel=1e-7, abs=1e-9)
            for k in range(3):     # no other orthogonal map (proper if required) with its optimal scale does better
                Q = random_orthogonal(k, d, proper=not allow)
                if allow and k % 2: Q = random_orthogonal(k, d, proper=False)
                A, B = X - X.mean(0), Y - Y.mean(0)
                sq = max(np.trace(Q.T @ A.T @ B), 0) / (A ** 2).sum() if sc else 1.0
                assert best <= rss(X, Y, Q, sq) + 1e-8 * (1 + (B ** 2).sum())


@SETTINGS
@given(seeds, st.integers(1, 5), st.floats(0.05, 20))
def test_scale_recovers_s_with_noise_free_data(seed, d, s):
    X = config(seed, 4 * d + 4, d)
    Q = random_orthogonal(seed, d, proper=True)
    res = procrustes_align(X, s * X @ Q - 3.0, scale=True)
    assert res.scale == pytest.approx(s, rel=1e-10)
    # reverse direction recovers 1/s
    assert procrustes_align(s * X @ Q - 3.0, X, scale=True).scale == pytest.approx(1 / s, rel=1e-10)


@SETTINGS
@given(seeds, st.integers(1, 6), st.integers(0, 10), st.floats(0.01, 3))
def test_matches_scipy_spatial_procrustes(seed, d, extra, noise):
    """scipy.spatial.procrustes(data1, data2) centres, scales both to unit Frobenius norm, maps data2 onto data1:
    its disparity is 1 - tr(S)^2 / (||A||^2 ||B||^2) = our disparity with center=True, scale=True, and its
    transformed data2 is (aligned - target_mean) / ||B||_F."""
    n = d + 2 + extra
    X = config(seed, n, d)
    Y = 3.0 * X @ random_orthogonal(seed, d) + 1.0 + noise * config(seed + 7, n, d)
    mtx1, mtx2, d_sp = scipy.spatial.procrustes(Y, X)
    res = procrustes_align(X, Y, scale=True)
    assert res.disparity == pytest.approx(d_sp, rel=1e-9, abs=1e-13)
    nB = np.linalg.norm(Y - Y.mean(0))
    np.testing.assert_allclose(res.aligned - res.target_mean, mtx2 * nB, atol=1e-9 * nB)
    np.testing.assert_allclose(mtx1 * nB, Y - Y.mean(0), atol=1e-9 * nB)
    # the scaled disparity is symmetric (scipy's is too)
    assert procrustes_align(Y, X, scale=True).disparity == pytest.approx(res.disparity, rel=1e-9, abs=1e-13)


# --- batched == loop ------------------------------------------------------------------------------------------

@SETTINGS
@given(seeds, st.integers(1, 5), st.integers(1, 3), st.integers(1, 3), st.booleans(), st.booleans(), st.booleans())
def test_batch_equals_loop(seed, d, b1, b2, center, sc, allow):
    n = d + 4
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(b1, b2, n, d)) * np.linspace(1, 2, d)
    Y = rng.normal(size=(b1, b2, n, d)) + 0.5
    rb = procrustes_align_batch(X, Y, center=center, scale=sc, allow_reflection=allow)
    assert isinstance(rb, ProcrustesResult)
    assert rb.rotation.shape == (b1, b2, d, d) and rb.scale.shape == (b1, b2) and rb.disparity.shape == (b1, b2)
    for i in range(b1):
        for j in range(b2):
            r = procrustes_align(X[i, j], Y[i, j], center=center, scale=sc, allow_reflection=allow)
            np.testing.assert_allclose(rb.rotation[i, j], r.rotation, atol=1e-9)
            assert rb.scale[i, j] == pytest.approx(r.scale, rel=1e-10)
            np.testing.assert_allclose(rb.source_mean[i, j], r.source_mean, atol=1e-14)
            np.testing.assert_allclose(rb.target_mean[i, j], r.target_mean, atol=1e-14)
            np.testing.assert_allclose(rb.aligned[i, j], r.aligned, atol=1e-9)
            assert rb.disparity[i, j] == pytest.approx(r.disparity, rel=1e-9)
            assert rb.rmsd[i, j] == pytest.approx(r.rmsd, rel=1e-9)
    ad = aligned_distance(X, Y, center=center, scale=sc, allow_reflection=allow)
    np.testing.assert_allclose(ad, rb.rmsd ** 2, rtol=1e-12)
    Z = rng.normal(size=(b1, b2, 3, d))
    np.testing.assert_allclose(rb.apply(Z)[0, 0],
                               procrustes_align(X[0, 0], Y[0, 0], center=center, scale=sc,
                                                allow_reflection=allow).apply(Z[0, 0]), atol=1e-9)


# --- aligned distance: invariance --------------------------------------------------------------------------------

@SETTINGS
@given(seeds, st.integers(2, 6), st.floats(0.01, 1.0), arrays(np.float64, 6, elements=st.floats(-5, 5)))
def test_aligned_metrics_invariant_raw_ones_not(seed, d, noise, shift):
    rng = np.random.default_rng(seed)
    K, n = 4, 3 * d + 4
    base = config(seed, n, d)
    runs = base + noise * rng.normal(size=(K, n, d))
    Q = random_orthogonal(seed + 1, d, proper=bool(seed % 2))
    moved = runs.copy()
    moved[1] = runs[1] @ Q + shift[:d]                         # re-express one run in other axes
    # pairwise
    assert aligned_distance(moved[1], moved[0]) == pytest.approx(aligned_distance(runs[1], runs[0]), rel=1e-8)
    raw = lambda a, b: ((a - b) ** 2).sum(-1).mean()
    assert abs(raw(moved[1], moved[0]) - raw(runs[1], runs[0])) > 1e-6
    assert aligned_distance(runs[1], runs[0]) <= raw(runs[1], runs[0]) + 1e-12      # identity is feasible
    assert aligned_distance(runs[0], runs[1]) == pytest.approx(aligned_distance(runs[1], runs[0]), rel=1e-9)
    # table: the alignment-free measures do not see the change of axes, the raw distance does
    t0, t1 = pairwise_run_table(runs, k=3), pairwise_run_table(moved, k=3)
    np.testing.assert_allclose(t1.aligned_msd, t0.aligned_msd, rtol=1e-8)
    np.testing.assert_allclose(t1.cka, t0.cka, rtol=1e-9)
    np.testing.assert_allclose(t1.cka_debiased, t0.cka_debiased, rtol=1e-8, atol=1e-12)
    changed = (t0.run_a == 1) | (t0.run_b == 1)
    assert np.all(np.abs(t1.raw_msd[changed] - t0.raw_msd[changed]) > 1e-6)
    np.testing.assert_allclose(t1.raw_msd[~changed], t0.raw_msd[~changed], rtol=1e-12)
    # summaries
    msd_to_mean = lambda R: float(((R - R.mean(0)) ** 2).sum(-1).mean())
    for ref in ("consensus", "first"):
        a, b = raw_vs_aligned(runs, msd_to_mean, reference=ref), raw_vs_aligned(moved, msd_to_mean, reference=ref)
        assert b["aligned"] == pytest.approx(a["aligned"], rel=1e-6)
        assert b["raw"] != pytest.approx(a["raw"], rel=1e-6)
        assert b["reduction"] == pytest.approx(1 - b["aligned"] / b["raw"])


def naive_cka(X, Y):
    H = np.eye(len(X)) - 1 / len(X)
    hsic = lambda K, L: np.trace(K @ H @ L @ H)
    return hsic(X @ X.T, Y @ Y.T) / np.sqrt(hsic(X @ X.T, X @ X.T) * hsic(Y @ Y.T, Y @ Y.T))


def knn_sets(Z, k):
    S = 1 - scipy.spatial.distance.cdist(Z, Z, "cosine")
    np.fill_diagonal(S, -np.inf)
    return [set(np.argsort(-row)[:k]) for row in S]


def test_pairwise_run_table_against_references():
    rng = np.random.default_rng(0)
    runs = rng.normal(size=(4, 20, 3)) + rng.normal(size=(1, 20, 3))      # shared structure plus run noise
    t = pairwise_run_table(runs, labels=list("abcd"), k=4)
    assert isinstance(t, pd.DataFrame)
    assert list(t.columns) == ["run_a", "run_b", "i", "j", "raw_msd", "aligned_msd", "cos_dist", "cka", "cka_debiased",
                               "rsa", "knn_overlap"]
    assert list(zip(t.run_a, t.run_b)) == [(a, b) for i, a in enumerate("abcd") for b in "abcd"[i + 1:]]
    for row in t.itertuples():
        X, Y = runs[row.i], runs[row.j]
        assert (row.run_a, row.run_b) == ("abcd"[row.i], "abcd"[row.j])
        assert row.raw_msd == pytest.approx(((X - Y) ** 2).sum(-1).mean(), rel=1e-12)
        assert row.aligned_msd == pytest.approx(procrustes_align(X, Y).rmsd ** 2, rel=1e-10)
        assert row.cos_dist == pytest.approx(np.mean([scipy_cosine(u, v) for u, v in zip(X, Y)]), rel=1e-12)
        assert row.cka == pytest.approx(naive_cka(X, Y), rel=1e-10)
        assert row.rsa == pytest.approx(spearmanr(pdist(X, "cosine"), pdist(Y, "cosine"))[0], abs=1e-12)
        assert row.knn_overlap == pytest.approx(np.mean([len(a & b) / len(a | b) for a, b in zip(knn_sets(X, 4), knn_sets(Y, 4))]))
    assert PAIR_MEASURES == {"raw_msd": "distance", "aligned_msd": "distance", "cos_dist": "distance", "cka": "similarity",
                             "cka_debiased": "similarity", "rsa": "similarity", "knn_overlap": "similarity"}


def test_pairwise_run_table_blocks_of_pairs(monkeypatch):
    import embvar_study._batching as B
    runs = np.random.default_rng(1).normal(size=(5, 12, 4))
    whole = pairwise_run_table(runs, k=3)
    monkeypatch.setattr(B, "_CHUNK_ELEMS", 10)                # one pair per block, each block ranks its two runs
    pd.testing.assert_frame_equal(pairwise_run_table(runs, k=3), whole, rtol=1e-12)
    t = pairwise_run_table(runs[:, :3], k=10)                 # N = 3: k capped at 2, debiased CKA undefined
    assert t.cka_debiased.isna().all() and t.knn_overlap.notna().all()


# --- GPA -------------------------------------------------------------------------------------------------------

@SETTINGS
@given(seeds, st.integers(2, 5), st.integers(2, 6), st.one_of(st.just(0.0), st.floats(1e-6, 0.05)), st.booleans())
def test_gpa_recovers_shape(seed, d, K, noise, sc):
    rng = np.random.default_rng(seed)
    n = 4 * d + 6
    true = config(seed, n, d)
    Qs = np.stack([random_orthogonal(seed + k, d, proper=bool(k % 2)) for k in range(K)])
    sizes = rng.uniform(0.5, 2.0, size=K) if sc else np.ones(K)
    runs = sizes[:, None, None] * (true @ Qs) + rng.normal(size=(K, 1, d)) + noise * rng.normal(size=(K, n, d))
    g = generalized_procrustes(runs, scale=sc)
    assert isinstance(g, GPAResult)
    assert g.converged and g.n_iter == len(g.disparity_history) <= 100
    assert np.all(np.diff(g.disparity_history) <= 1e-12)                       # monotone
    np.testing.assert_allclose(g.rotations @ np.swapaxes(g.rotations, -1, -2), np.broadcast_to(np.eye(d), (K, d, d)),
                               atol=1e-10)
    # the stated transform reproduces the aligned runs
    np.testing.assert_allclose(
        g.scales[:, None, None] * ((runs - g.run_means[:, None, :]) @ g.rotations), g.aligned, atol=1e-10)
    # consensus = true shape up to a similarity; residual at the noise level
    fit = procrustes_align(g.consensus, true, scale=True)
    assert fit.rmsd < max(10 * noise, 1e-8) * np.sqrt(d)
    if noise == 0:
        assert g.disparity < 1e-18
        # each run's fitted scale undoes its size, relative to the first
        np.testing.assert_allclose(g.scales * sizes, g.scales[0] * sizes[0], rtol=1e-8)
    if not sc:
        np.testing.assert_allclose(g.aligned.mean(0), g.consensus, atol=1e-12)
    else:
        assert (g.consensus ** 2).sum() == pytest.approx(((runs - runs.mean(1, keepdims=True)) ** 2).sum() / K)


@SETTINGS
@given(seeds, st.integers(1, 4), st.floats(0.1, 1.0))
def test_gpa_two_runs_closed_form(seed, d, noise):
    """K = 2, scale=False: min sum_k ||A_k R_k - C||^2 = ||A_1 R - A_2||^2 / 2 at the pairwise optimum."""
    rng = np.random.default_rng(seed)
    n = 3 * d + 4
    runs = np.stack([config(seed, n, d), config(seed, n, d) @ random_orthogonal(seed, d) + noise * rng.normal(size=(n, d))])
    g = generalized_procrustes(runs)
    total = ((runs - runs.mean(1, keepdims=True)) ** 2).sum()
    assert g.disparity * total == pytest.approx(aligned_distance(runs[0], runs[1]) * n / 2, rel=1e-8)
    msd_to_mean = lambda R: float(((R - R.mean(0)) ** 2).sum(-1).mean())
    assert raw_vs_aligned(runs, msd_to_mean)["aligned"] == pytest.approx(aligned_distance(runs[0], runs[1]) / 4, rel=1e-8)


def test_gpa_reports_non_convergence():
    rng = np.random.default_rng(1)
    runs = rng.normal(size=(4, 30, 5))                     # unrelated runs: needs several sweeps
    g = generalized_procrustes(runs, max_iter=1)
    assert g.n_iter == 1 and not g.converged


# --- bad inputs ---------------------------------------------------------------------------------------------------

X = np.random.default_rng(0).normal(size=(10, 3))


@pytest.mark.parametrize("call, message", [
    (lambda: procrustes_align(X, X[:, :2]), "source and target: expected the same shape"),
    (lambda: procrustes_align(X[:1], X[:1]), "source: expected at least 2 points"),
    (lambda: procrustes_align(np.full_like(X, np.nan), X), "source: expected finite values"),
    (lambda: procrustes_align(X, np.where(X > 1, np.inf, X)), "target: expected finite values"),
    (lambda: procrustes_align(X[None], X[None]), "source: expected shape (N, d)"),
    (lambda: procrustes_align(np.ones_like(X), X), "source: expected points that do not all coincide"),
    (lambda: procrustes_align(X, np.zeros_like(X), center=False), "target: expected points that do not all coincide"),
    (lambda: procrustes_align(X, X).apply(np.ones((2, 4))), "Z: expected shape (..., M, 3)"),
    (lambda: procrustes_align_batch(X[0], X[0]), "source: expected shape (..., N, d)"),
    (lambda: procrustes_align_batch(np.stack([X, X]), np.stack([X, X[::-1]])[:1]), "source and target: expected the same shape"),
    (lambda: procrustes_align_batch(np.stack([X, np.ones_like(X)]), np.stack([X, X])), "source: expected points that do not all coincide"),
    (lambda: aligned_distance(X, X[:5]), "X and Y: expected the same shape"),
    (lambda: aligned_distance(X, np.full_like(X, np.nan)), "Y: expected finite values"),
    (lambda: generalized_procrustes(X[None]), "runs: expected at least 2 runs"),
    (lambda: generalized_procrustes(X), "runs: expected shape (K, N, d)"),
    (lambda: generalized_procrustes(np.stack([X[:1], X[:1]])), "runs: expected at least 2 points per run"),
    (lambda: generalized_procrustes(np.stack([X, X]), max_iter=0), "max_iter: expected a positive integer"),
    (lambda: generalized_procrustes(np.stack([X, X]), tol=np.nan), "tol: expected a finite number"),
    (lambda: raw_vs_aligned(np.stack([X, X]), lambda R: 0.0, reference="middle"), "reference: expected 'consensus' or 'first'"),
    (lambda: raw_vs_aligned(np.stack([X, X]), "msd"), "metric: expected a callable"),
    (lambda: raw_vs_aligned(X[None], lambda R: 0.0, reference="first"), "runs: expected at least 2 runs"),
    (lambda: pairwise_run_table(np.stack([X, X]), labels=["a", "b", "c"]), "labels: expected 2 labels (one per run), got 3"),
    (lambda: pairwise_run_table(X), "runs: expected shape (K, N, d), got shape (10, 3)"),
    (lambda: pairwise_run_table(np.stack([X, X])[:, :2]), "runs: expected at least 3 probes (N), got 2"),
    (lambda: pairwise_run_table(np.stack([X, np.ones_like(X)])), "runs: expected points that do not all coincide"),
    (lambda: pairwise_run_table(np.stack([X, X]), k=1.5), "k: expected an integer >= 1 (capped at N-1 = 9), got 1.5"),
    (lambda: pairwise_run_table(np.stack([X, X]) + 1j), "runs: expected real numbers"),
    (lambda: procrustes_align(X * 1e155, X), "source and target: the alignment residual overflows float64"),
])
def test_bad_inputs_name_the_argument(call, message):
    with pytest.raises(ValueError, match=None) as e:
        call()
    assert message in str(e.value), str(e.value)


def test_torch_and_list_inputs():
    torch = pytest.importorskip("torch")
    Y = X @ special_ortho_group.rvs(3, random_state=0)
    r_t = procrustes_align(torch.tensor(X, dtype=torch.float32), torch.tensor(Y))
    r_l = procrustes_align(X.tolist(), Y.tolist())
    assert isinstance(r_t.rotation, torch.Tensor) and r_t.rotation.dtype == torch.float64   # computed in float64 there
    np.testing.assert_allclose(r_t.rotation.numpy(), r_l.rotation, atol=1e-5)
    assert r_l.rotation.dtype == np.float64


def test_raw_vs_aligned_zero_raw_gives_nan_reduction():
    runs = np.stack([X, X])
    out = raw_vs_aligned(runs, lambda R: float(((R - R.mean(0)) ** 2).sum()))
    assert out["raw"] == 0 and np.isnan(out["reduction"])
