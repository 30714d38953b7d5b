"""Numerics at the edges: the scale-free measures (CKA, RSA, k-NN overlap, Procrustes rotations, GPA) and the bootstrap
give the same answer for float64 data in any units from 1e-40 to 1e40 (scale-equivariant outputs scaled accordingly),
or raise a clear ValueError; never inf, 0 or NaN in silence. Complex input is refused everywhere."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from embvar_study.align import aligned_distance, generalized_procrustes, pairwise_run_table, procrustes_align
from embvar_study.metrics import cosine_drift
from embvar_study.rsa import rsa
from embvar_study.similarity import knn_overlap, linear_cka
from embvar_study.stats import bootstrap_ci, cluster_bootstrap_ci

FAST = settings(max_examples=25, deadline=None)
scales = st.floats(-40, 40).map(lambda e: 10.0 ** e)     # log-uniform in [1e-40, 1e40]
seeds = st.integers(0, 2**32 - 1)


def rand(*shape, seed=0):
    return np.random.default_rng(seed).normal(size=shape)


# ------------------------------------------------------------------------------------- the reported defects
A, B = rand(2, 6, 4, seed=0)


@pytest.mark.parametrize("a,b", [(1e-41, 1e-41), (1e39, 1e39), (1e-85, 1.0), (1.0, 1e300), (1e-300, 1e-300)])
def test_linear_cka_repros(a, b):
    for debiased in (False, True):
        got, ref = linear_cka(A * a, B * b, debiased=debiased), linear_cka(A, B, debiased=debiased)
        assert np.isfinite(got) and got == pytest.approx(ref, rel=1e-12)


def test_procrustes_repro_overflow_is_not_called_zero_spread():
    with pytest.raises(ValueError, match="source and target: the alignment residual overflows float64") as e:
        procrustes_align(A * 1e155, B)            # the disparity ~1e309 does not fit in float64
    assert "zero spread" not in str(e.value)
    big, ref = procrustes_align(A * 1e155, B, scale=True), procrustes_align(A, B, scale=True)   # with scale it fits
    np.testing.assert_allclose(big.rotation, ref.rotation, atol=1e-12)
    assert big.scale == pytest.approx(ref.scale / 1e155, rel=1e-12) and big.disparity == pytest.approx(ref.disparity, rel=1e-12)
    np.testing.assert_allclose(big.aligned, ref.aligned, rtol=1e-12, atol=1e-12)


def test_bootstrap_repro_values_near_1e300():
    v = np.random.default_rng(0).gamma(2.0, 0.04, size=50)
    s = 1e300 / v.max()
    for method in ("bca", "percentile", "basic"):
        big, ref = bootstrap_ci(v * s, seed=0, n_resamples=999, method=method), bootstrap_ci(v, seed=0, n_resamples=999, method=method)
        got = np.array([big.estimate, big.low, big.high, big.standard_error]) / s
        assert np.isfinite(got).all()
        np.testing.assert_allclose(got, [ref.estimate, ref.low, ref.high, ref.standard_error], rtol=1e-12)
    cl = cluster_bootstrap_ci((v * s).reshape(5, 10), seed=0, n_resamples=999, method="bca")
    ref = cluster_bootstrap_ci(v.reshape(5, 10), seed=0, n_resamples=999, method="bca")
    np.testing.assert_allclose(np.array([cl.low, cl.high, cl.standard_error]) / s, [ref.low, ref.high, ref.standard_error], rtol=1e-12)


def test_overflowing_statistic_raises():
    with pytest.raises(ValueError, match="statistic: returned 1 NaN/inf value"):
        bootstrap_ci(np.full(10, 1.7e308), np.sum)


def test_complex_input_is_refused_everywhere():
    torch = pytest.importorskip("torch")
    Z = A + 1j * B
    calls = [lambda z: cosine_drift(z, A), lambda z: linear_cka(z, B), lambda z: rsa(z, B), lambda z: knn_overlap(z, B, k=2),
             lambda z: procrustes_align(z, B), lambda z: aligned_distance(z, B), lambda z: bootstrap_ci(z[0]),
             lambda z: pairwise_run_table(np.stack([z, z]))]
    for f in calls:
        for z in (Z, Z.tolist(), torch.tensor(Z)):
            with pytest.raises(ValueError, match="expected real numbers, got complex dtype complex"):
                f(z)


# ------------------------------------------------------------------------------------- scale invariance
@FAST
@given(seeds, scales, scales)
def test_cka_scale_invariant(seed, a, b):
    X, Y = rand(9, 4, seed=seed), rand(9, 6, seed=seed + 1) + 3.0
    for debiased in (False, True):
        assert linear_cka(a * X, b * Y, debiased=debiased) == pytest.approx(linear_cka(X, Y, debiased=debiased), rel=1e-9, abs=1e-12)


@FAST
@given(seeds, scales, scales)
def test_rsa_and_knn_scale_invariant(seed, a, b):
    X, Y = rand(10, 4, seed=seed), rand(10, 3, seed=seed + 1)
    for metric in ("cosine", "euclidean"):
        assert rsa(a * X, b * Y, metric=metric) == pytest.approx(rsa(X, Y, metric=metric), rel=1e-9, abs=1e-12)
    np.testing.assert_array_equal(knn_overlap(a * X, b * Y, k=3, per_point=True), knn_overlap(X, Y, k=3, per_point=True))


@FAST
@given(seeds, scales, scales, st.booleans())
def test_procrustes_scale_equivariant(seed, a, b, allow_reflection):
    X, Y = rand(12, 3, seed=seed), rand(12, 3, seed=seed + 1) + 1.0
    ref = procrustes_align(X, Y, scale=True, allow_reflection=allow_reflection)
    got = procrustes_align(a * X, b * Y, scale=True, allow_reflection=allow_reflection)
    np.testing.assert_allclose(got.rotation, ref.rotation, atol=1e-9)
    assert got.scale == pytest.approx(ref.scale * b / a, rel=1e-9)
    assert got.disparity == pytest.approx(ref.disparity, rel=1e-9)
    assert got.rmsd == pytest.approx(ref.rmsd * b, rel=1e-9)
    np.testing.assert_allclose(got.aligned / b, ref.aligned, rtol=1e-9, atol=1e-9)
    # without scale: the rotation is unchanged and the residual is the one of that rotation in the given units
    plain = procrustes_align(a * X, b * Y, allow_reflection=allow_reflection)
    R = procrustes_align(X, Y, allow_reflection=allow_reflection).rotation
    np.testing.assert_allclose(plain.rotation, R, atol=1e-9)
    A_, B_ = X - X.mean(0), Y - Y.mean(0)
    msd = ((a * A_ @ R - b * B_) ** 2).sum(-1).mean()
    assert aligned_distance(a * X, b * Y, allow_reflection=allow_reflection) == pytest.approx(msd, rel=1e-9)
    assert aligned_distance(a * X, a * Y) == pytest.approx(a * a * aligned_distance(X, Y), rel=1e-9)


@FAST
@given(seeds, scales, st.booleans())
def test_gpa_scale_equivariant(seed, a, scale):
    runs = rand(1, 15, 3, seed=seed) + 0.3 * rand(4, 15, 3, seed=seed + 1)
    ref, got = generalized_procrustes(runs, scale=scale), generalized_procrustes(a * runs, scale=scale)
    assert got.n_iter == ref.n_iter
    assert got.disparity == pytest.approx(ref.disparity, rel=1e-8, abs=1e-15)
    np.testing.assert_allclose(got.consensus / a, ref.consensus, rtol=1e-8, atol=1e-8)
    np.testing.assert_allclose(got.rotations, ref.rotations, atol=1e-8)
    np.testing.assert_allclose(got.scales, ref.scales, rtol=1e-8)


@FAST
@given(seeds, scales)
def test_pairwise_run_table_scale(seed, a):
    runs = rand(1, 8, 3, seed=seed) + 0.5 * rand(3, 8, 3, seed=seed + 1)
    ref, got = pairwise_run_table(runs, k=3), pairwise_run_table(a * runs, k=3)
    for m, power in [("raw_msd", 2), ("aligned_msd", 2), ("cos_dist", 0), ("cka", 0), ("cka_debiased", 0), ("rsa", 0), ("knn_overlap", 0)]:
        np.testing.assert_allclose(got[m] / a ** power, ref[m], rtol=1e-9, atol=1e-12, err_msg=m)


@FAST
@given(seeds, scales, st.sampled_from(["bca", "percentile", "basic"]))
def test_bootstrap_scale_equivariant(seed, a, method):
    v = np.random.default_rng(seed).gamma(2.0, 1.0, size=(2, 30))    # n = 30: no resample ties with the estimate
    ref, got = bootstrap_ci(v, seed=1, n_resamples=499, method=method), bootstrap_ci(a * v, seed=1, n_resamples=499, method=method)
    for f in ("estimate", "low", "high", "standard_error"):
        np.testing.assert_allclose(getattr(got, f) / a, getattr(ref, f), rtol=1e-9, err_msg=f)


@FAST
@given(seeds, scales, st.sampled_from(["bca", "percentile", "basic"]), st.booleans())
def test_cluster_bootstrap_scale_equivariant(seed, a, method, resample_items):
    v = np.random.default_rng(seed).gamma(2.0, 1.0, size=(6, 20))
    kw = dict(seed=1, n_resamples=499, method=method, resample_items=resample_items)
    ref, got = cluster_bootstrap_ci(v, **kw), cluster_bootstrap_ci(a * v, **kw)
    for f in ("estimate", "low", "high", "standard_error"):
        assert getattr(got, f) / a == pytest.approx(getattr(ref, f), rel=1e-9), f
