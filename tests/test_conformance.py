"Conformance of metrics' comparison measures with the field's own implementations (same random data)."
import numpy as np
import pytest
import torch
from scipy.linalg import orthogonal_procrustes
from embvar_study import rsa as R, similarity as S, spectra as P

rng = np.random.default_rng(0)
X = rng.normal(size=(80, 6))
Y = X @ rng.normal(size=(6, 4)) + rng.normal(size=(80, 4))
TOL = 1e-6

def test_cca_vs_repsim_yanai():
    repsim = pytest.importorskip("repsim")
    rho = S._canon(X, Y)                                   # repsim's Yanai summary is the mean squared correlation
    assert abs(float((rho ** 2).mean()) - repsim.cca([X, Y])[0, 1]) < TOL
    assert S.cca(X, Y) == pytest.approx(float(rho.mean()), abs=1e-12)

def test_pwcca_vs_repsim_symmetrised():
    repsim = pytest.importorskip("repsim")                 # repsim averages PWCCA(X, Y) and PWCCA(Y, X)
    assert abs((S.pwcca(X, Y) + S.pwcca(Y, X)) / 2 - repsim.pwcca([X, Y])[0, 1]) < TOL

def test_debiased_cka_vs_pytorch_cka():
    cka = pytest.importorskip("cka")
    ref = float(cka.cka_from_features(torch.tensor(X), torch.tensor(Y))[0, 0])
    assert abs(S.linear_cka(X, Y, debiased=True) - ref) < TOL

@pytest.mark.parametrize("rdm", ["euclidean", "correlation"])
@pytest.mark.parametrize("compare,ref", [("spearman", "spearman"), ("kendall", "tau-a"), ("pearson", "corr")])
def test_rsa_vs_rsatoolbox(rdm, compare, ref):
    rsatoolbox = pytest.importorskip("rsatoolbox")
    a, b = X[:30], Y[:30]
    ra = rsatoolbox.rdm.calc_rdm(rsatoolbox.data.Dataset(a), method=rdm)
    rb = rsatoolbox.rdm.calc_rdm(rsatoolbox.data.Dataset(b), method=rdm)
    want = float(rsatoolbox.rdm.compare(ra, rb, method=ref)[0, 0])
    assert abs(R.rsa(a, b, rdm=rdm, compare=compare) - want) < TOL

def test_procrustes_angular_published_formula():
    "netrep (not installable here): arccos(<X Q, Y> / (|X| |Y|)) with Q the orthogonal Procrustes rotation, centred sets."
    a, b = X[:, :4] - X[:, :4].mean(0), Y - Y.mean(0)
    Q, _ = orthogonal_procrustes(a, b)
    want = np.arccos((a @ Q * b).sum() / (np.linalg.norm(a) * np.linalg.norm(b)))
    assert abs(S.procrustes_distance(X[:, :4], Y) - want) < TOL
    want_e = np.sqrt(((a @ Q - b) ** 2).sum() / len(a))
    assert abs(S.procrustes_distance(X[:, :4], Y, kind="euclidean") - want_e) < TOL

def test_mutual_knn_published_formula():
    "Huh et al. 2024: normalised features, top-k of the inner products without self, mean |A & B| / k."
    k = 5
    def nn(F):
        F = F / np.linalg.norm(F, axis=1, keepdims=True); S = F @ F.T; np.fill_diagonal(S, -1e8)
        return np.argsort(-S, axis=1)[:, :k]
    a, b = nn(X), nn(Y)
    want = np.mean([len(set(a[i]) & set(b[i])) / k for i in range(len(X))])
    assert abs(S.mutual_knn(X, Y, k=k) - want) < TOL

def test_svcca_vs_repsim_yanai():
    repsim = pytest.importorskip("repsim")                 # both keep 99% of each set's variance before CCA
    assert abs(float((S._canon(X, Y, 0.99) ** 2).mean()) - repsim.svcca([X, Y])[0, 1]) < TOL
    assert S.svcca(X, Y) == pytest.approx(float(S._canon(X, Y, 0.99).mean()), abs=1e-12)

@pytest.mark.parametrize("correct,key", [("both", "both"), ("rows", "row"), ("none", "naive")])
def test_corrected_participation_ratio_vs_dimensionality(correct, key):
    dimensionality = pytest.importorskip("dimensionality")
    Z = X @ rng.normal(size=(6, 6)) + 3
    want = dimensionality.participation_ratio(Z, return_all=True)[key]
    assert abs(P.participation_ratio_corrected(Z, correct=correct) - want) < TOL * max(1, abs(want))

def test_linear_cka_vs_repsim():
    "repsim.cka defaults to an RBF kernel (0.699 here, not linear CKA); with kernel_type='linear' and the plug-in "
    "('gretton') HSIC it is our linear CKA."
    repsim = pytest.importorskip("repsim")
    assert abs(S.linear_cka(X, Y) - repsim.cka([X, Y], kernel_type="linear", estimator="gretton")[0, 1]) < TOL
    assert abs(S.linear_cka(X, Y) - repsim.cka([X, Y])[0, 1]) > 1e-3              # the default is another measure


def test_debiased_cka_vs_repsim_song():
    "repsim.cka(estimator='song') divides the unbiased HSIC(X, Y) by the *plug-in* HSIC(X, X), HSIC(Y, Y); debiased CKA "
    "(ours, pytorch-cka, Nguyen et al. 2021) divides by the unbiased ones, i.e. the ratio of repsim.hsic(estimator='song')."
    repsim = pytest.importorskip("repsim")
    u = repsim.hsic([X, Y], kernel_type="linear", estimator="song")
    b = repsim.hsic([X, Y], kernel_type="linear", estimator="gretton")
    assert abs(S.linear_cka(X, Y, debiased=True) - u[0, 1] / np.sqrt(u[0, 0] * u[1, 1])) < TOL
    got = repsim.cka([X, Y], kernel_type="linear", estimator="song")[0, 1]
    assert abs(got - u[0, 1] / np.sqrt(b[0, 0] * b[1, 1])) < TOL                      # the documented difference
    assert abs(got - S.linear_cka(X, Y, debiased=True)) > 1e-2


@pytest.mark.parametrize("rdm", ["euclidean", "correlation"])
def test_streaming_rsa_pearson_vs_rsatoolbox(rdm):
    rsatoolbox = pytest.importorskip("rsatoolbox")
    a, b = X[:30], Y[:30]
    ra = rsatoolbox.rdm.calc_rdm(rsatoolbox.data.Dataset(a), method=rdm)
    rb = rsatoolbox.rdm.calc_rdm(rsatoolbox.data.Dataset(b), method=rdm)
    want = float(rsatoolbox.rdm.compare(ra, rb, method="corr")[0, 0])
    assert abs(R.rsa(a, b, rdm=rdm, compare="pearson", block=4) - want) < TOL


# --- Procrustes and the covariance family in N x N form when d > N ---------------------------------------------------
def _dxd_shape(x, y, alpha):
    "netrep's shape distance (angular) written in its d x d form: whitening by the eigendecomposition of c^T c (d x d)."
    def wh(c):
        if alpha >= 1: return c
        lam, V = np.linalg.eigh(c.T @ c); lam = np.clip(lam, 1e-7, None)
        g = alpha + (1 - alpha) * lam ** -0.5
        g = g * np.sqrt(lam.sum() / (alpha ** 2 * lam + 2 * alpha * (1 - alpha) * lam ** 0.5 + (1 - alpha) ** 2).sum())
        return c @ (V * g) @ V.T
    a, b = wh(x - x.mean(0)), wh(y - y.mean(0))
    return np.arccos(np.clip(np.linalg.svd(a.T @ b, compute_uv=False).sum() / np.linalg.norm(a) / np.linalg.norm(b), -1, 1))


@pytest.mark.parametrize("N, dx, dy", [(10, 60, 45), (12, 40, 8), (30, 12, 9)])
def test_nxn_forms_equal_the_dxd_forms(N, dx, dy):
    "d > N: Procrustes (scipy.linalg.orthogonal_procrustes's scale is the nuclear norm), the alpha = 0 shape distance, CCA and R^2 equal their d x d / scipy forms."
    import scipy.linalg as sl
    rng = np.random.default_rng(N + dx)
    x = rng.normal(size=(N, dx)); y = x[:, :min(dx, dy)] @ rng.normal(size=(min(dx, dy), dy)) + rng.normal(size=(N, dy))
    a, b = x - x.mean(0), y - y.mean(0)
    pad = np.zeros((N, max(dx, dy))); A, B = pad.copy(), pad.copy(); A[:, :dx] = a; B[:, :dy] = b
    scale = sl.orthogonal_procrustes(A, B)[1]                     # sum of the singular values of A^T B (d x d)
    want = np.arccos(np.clip(scale / np.linalg.norm(a) / np.linalg.norm(b), -1, 1))
    np.testing.assert_allclose(S.procrustes_distance(x, y), want, rtol=0, atol=1e-10)
    for alpha in (0.0, 0.5):    # compared as cosines: near 0 the angle turns a rounding of 1e-16 into sqrt(2e-16) ~ 1.5e-8
        np.testing.assert_allclose(np.cos(S.procrustes_distance(x, y, alpha=alpha)), np.cos(_dxd_shape(x, y, alpha)), rtol=0, atol=1e-12)
    qa, qb = sl.orth(a), sl.orth(b)
    np.testing.assert_allclose(S.cca(x, y), np.clip(np.linalg.svd(qa.T @ qb, compute_uv=False), 0, 1).mean(), rtol=0, atol=1e-10)
    beta, *_ = np.linalg.lstsq(np.c_[np.ones(N), x], y, rcond=None)
    r2 = 1 - ((y - np.c_[np.ones(N), x] @ beta) ** 2).sum() / (b ** 2).sum()
    np.testing.assert_allclose(S.linear_r2(x, y), r2, rtol=0, atol=1e-8)


def test_nxn_memory_at_d_20000():
    "N = 64, d = 20,000: every covariance-family measure peaks under 200 MB of numpy allocations (tracemalloc); the d x d form needs 3.2 GB per matrix."
    import tracemalloc
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 20000)); y = x * 2 + 0.1 * rng.normal(size=x.shape)
    for m in ["procrustes_angular", "procrustes_euclidean", "shape_angular_alpha0", "cca", "svcca", "pwcca", "linreg_r2_xy"]:
        tracemalloc.start()
        v = float(S.MEASURES[m].fn(x, y))
        peak = tracemalloc.get_traced_memory()[1]; tracemalloc.stop()
        assert np.isfinite(v) and peak < 200 * 2 ** 20, (m, peak)
