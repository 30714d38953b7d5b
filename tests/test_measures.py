"Every measure in metrics.MEASURES: identity value, range, and each declared invariance and non-invariance."
import numpy as np
import pytest
from embvar_study.similarity import INVARIANCES, MEASURES

rng = np.random.default_rng(0)
N, D = 40, 6
X = rng.normal(size=(N, D)) * np.linspace(0.5, 2, D)
Y = X @ rng.normal(size=(D, 5)) + 0.8 * rng.normal(size=(N, 5))

def _transform(kind, Z, seed):
    r = np.random.default_rng(seed)
    d = Z.shape[1]
    if kind == "orthogonal": return Z @ np.linalg.qr(r.normal(size=(d, d)))[0]
    if kind == "isotropic_scale": return 3.7 * Z
    if kind == "translation": return Z + 5 * r.normal(size=(1, d))
    if kind == "invertible_linear": return Z @ (r.normal(size=(d, d)) + 0.5 * np.eye(d))
    if kind == "permutation": return Z[:, r.permutation(d)]
    raise AssertionError(kind)

@pytest.mark.parametrize("name", sorted(MEASURES))
def test_identity_and_range(name):
    m = MEASURES[name]
    assert abs(float(m.fn(X, X)) - m.identity) < 1e-7
    v = float(m.fn(X, Y))
    assert m.range[0] - 1e-12 <= v <= m.range[1] + 1e-12
    assert m.direction in ("similarity", "distance")

@pytest.mark.parametrize("name", sorted(MEASURES))
@pytest.mark.parametrize("kind", INVARIANCES)
def test_declared_invariance(name, kind):
    m = MEASURES[name]
    base = float(m.fn(X, Y))
    moved = [float(m.fn(_transform(kind, X, s), _transform(kind, Y, s + 100))) for s in range(3)]
    changed = max(abs(v - base) for v in moved)
    if kind in m.invariances: assert changed < 1e-7, f"{name} declared invariant to {kind}, changed by {changed}"
    else: assert changed > 1e-4, f"{name} declared not invariant to {kind}, changed only by {changed}"

@pytest.mark.parametrize("name", [n for n in sorted(MEASURES) if MEASURES[n].is_metric])
def test_triangle_inequality(name):
    f = MEASURES[name].fn
    Z = Y[:, :4] + rng.normal(size=(N, 4))
    assert f(X, Z) <= f(X, Y) + f(Y, Z) + 1e-12
    assert abs(float(f(X, Y)) - float(f(Y, X))) < 1e-8

def test_streaming_cka_equals_full_numpy_and_torch():
    torch = pytest.importorskip("torch")
    from embvar_study.similarity import linear_cka
    A, B = rng.normal(size=(2, 257, 7)), rng.normal(size=(2, 257, 5)) + 0.1
    B[..., :3] += A[..., :3]
    for deb in (False, True):
        full = linear_cka(A, B, debiased=deb)
        assert np.abs(linear_cka(A, B, debiased=deb, block=50) - full).max() < 1e-12
        t = linear_cka(torch.tensor(A, dtype=torch.float32), torch.tensor(B, dtype=torch.float32), debiased=deb, block=64)
        assert torch.is_tensor(t) and np.abs(t.numpy() - full).max() < 1e-6
    with pytest.raises(ValueError, match="block: expected an int >= 1"): linear_cka(A, B, block=0)

def test_streaming_rsa_equals_full_numpy_and_torch():
    "rsa(compare='pearson') in row blocks equals the full RDM computation; above N = 2048 it streams by default."
    torch = pytest.importorskip("torch")
    from scipy.spatial.distance import pdist
    from embvar_study.rsa import rsa, RSA_STREAM_N
    A = rng.normal(size=(RSA_STREAM_N + 52, 6)); B = A[:, :4] + rng.normal(size=(len(A), 4))
    for rdm, dist in [("euclidean", "sqeuclidean"), ("correlation", "correlation"), ("cosine", "cosine")]:
        full = np.corrcoef(pdist(A, dist), pdist(B, dist))[0, 1]          # scipy's full RDMs (euclidean: / d cancels)
        assert abs(rsa(A, B, rdm=rdm, compare="pearson") - full) < 1e-6                 # default: streamed
        assert abs(rsa(A[:300], B[:300], rdm=rdm, compare="pearson", block=37)
                   - np.corrcoef(pdist(A[:300], dist), pdist(B[:300], dist))[0, 1]) < 1e-6
        t = rsa(torch.tensor(A[:300]), torch.tensor(B[:300]), rdm=rdm, compare="pearson", block=64)
        assert torch.is_tensor(t) and abs(t.item() - rsa(A[:300], B[:300], rdm=rdm, compare="pearson")) < 1e-6
    with pytest.raises(ValueError, match=r"^rsa: compare='spearman' ranks all N\(N-1\)/2 = 50,005,000 RDM entries"):
        rsa(np.tile(A, (5, 1))[:10_001], np.tile(B, (5, 1))[:10_001], rdm="euclidean")
