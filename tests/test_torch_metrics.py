"""The torch path of metrics, spectra, similarity, rsa and align: tensors are computed on their device, in float64, and give tensors there;
results equal the numpy path; validation errors read the same; numpy users never import torch."""
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import embvar_study.metrics as M
import embvar_study.rsa as R
import embvar_study.similarity as S
import embvar_study.spectra as P
import embvar_study.align as A

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def rand(*shape, seed=0):
    return np.random.default_rng(seed).normal(size=shape)


TRAJ = rand(2, 5, 12, 6, seed=1)                     # (layers, T, N, d)
RUNS = rand(4, 12, 6, seed=2) + rand(1, 12, 6, seed=3)   # (K, N, d), shared structure
X, Y = rand(3, 12, 6, seed=4), rand(3, 12, 5, seed=5)
LABELS = np.arange(12) % 3

# name -> function of numpy-or-torch arguments; every output (array, dict of arrays, dataclass of arrays) is compared
CASES = {
    "cosine_drift": lambda t, r: M.cosine_drift(t[:, :1], t),
    "cosine_drift per probe": lambda t, r: M.cosine_drift(t[0, 0], t, per_probe=True),
    "cosine_similarity_rows": lambda t, r: M.cosine_similarity_rows(t[:, 1], t[:, 2]),
    "drift_curve": lambda t, r: M.drift_curve(t),
    "step_drift": lambda t, r: M.step_drift(t),
    "path_length": lambda t, r: M.path_length(t),
    "path_length cumulative": lambda t, r: M.path_length(t, cumulative=True),
    "early_late_summary": lambda t, r: M.early_late_summary(M.drift_curve(t), frac=0.4),
    "covariance_spectrum": lambda t, r: P.covariance_spectrum(t),
    "covariance_spectrum N<d": lambda t, r: P.covariance_spectrum(t[..., :4, :]),
    "spectrum_summary": lambda t, r: P.spectrum_summary(t),
    "explained_variance_ratio": lambda t, r: P.explained_variance_ratio(t),
    "per_dimension_variance": lambda t, r: M.per_dimension_variance(t),
    "norm_stats": lambda t, r: M.norm_stats(t),
    "pairwise_distances": lambda t, r: M.pairwise_distances(t, metric="cosine"),
    "pairwise_distance_summary": lambda t, r: M.pairwise_distance_summary(t),
    "linear_cka": lambda t, r: S.linear_cka(t[:, :1], t),
    "linear_cka debiased": lambda t, r: S.linear_cka(t, t[:, :1, :, :4], debiased=True),
    "linear_cka gram route": lambda t, r: S.linear_cka(t[..., :4, :], t[..., :4, :].flip(-1) if hasattr(t, "flip") else t[..., :4, ::-1]),
    "expected_squared_distance": lambda t, r: M.expected_squared_distance(t[:, :1], t),
    "cross_run_dispersion": lambda t, r: M.cross_run_dispersion(r + 3.0),
    "knn_indices": lambda t, r: S.knn_indices(t, k=3),
    "knn_overlap": lambda t, r: S.knn_overlap(t[:, :1], t, k=3, per_point=True),
    "knn_overlap mask route": lambda t, r: S.knn_overlap(t[:, :1], t, k=10),
    "rsa": lambda t, r: R.rsa(t[:, :1], t),
    "rsa euclidean": lambda t, r: R.rsa(t, t[:, :, :, :3], metric="euclidean"),
    "class_variance": lambda t, r: {k: v for k, v in M.class_variance(t, LABELS).items() if k not in ("classes", "counts")},
    "conditional_variance": lambda t, r: P.conditional_variance(t, LABELS),
    "procrustes_align_batch": lambda t, r: A.procrustes_align_batch(r[:2], r[2:], scale=True, allow_reflection=False),
    "procrustes_align": lambda t, r: A.procrustes_align(r[0], r[1], scale=True),
    "aligned_distance": lambda t, r: A.aligned_distance(r[:2], r[2:]),
    "generalized_procrustes": lambda t, r: A.generalized_procrustes(r, scale=True),
}


def flat(out):
    "{name: value} of every array in a result."
    if isinstance(out, dict): return {str(k): v for k, v in out.items()}
    if hasattr(out, "__dataclass_fields__"):
        return {k: getattr(out, k) for k in out.__dataclass_fields__ if k not in ("n_iter", "converged")}
    return {"": out}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(CASES))
def test_torch_equals_numpy_and_stays_on_device(name, device):
    f = CASES[name]
    ref = flat(f(TRAJ, RUNS))
    got = flat(f(torch.tensor(TRAJ, device=device), torch.tensor(RUNS, device=device)))
    assert ref.keys() == got.keys()
    for k, v in ref.items():
        g = got[k]
        if isinstance(v, float) and not isinstance(g, torch.Tensor):   # scalars by contract (e.g. window sizes)
            assert g == v; continue
        if np.ndim(v) == 0 and isinstance(v, int): assert g == v; continue
        assert isinstance(g, torch.Tensor), (name, k, type(g))
        assert g.device.type == device, (name, k, g.device)
        if g.is_floating_point(): assert g.dtype == torch.float64, (name, k, g.dtype)
        np.testing.assert_allclose(g.cpu().numpy(), np.asarray(v), rtol=1e-10, atol=1e-12, err_msg=f"{name}: {k}")


@pytest.mark.parametrize("device", DEVICES)
def test_float32_and_bf16_tensors_accumulate_in_float64(device):
    t32 = torch.tensor(TRAJ, dtype=torch.float32, device=device)
    for f in (M.drift_curve, P.covariance_spectrum, lambda t: S.linear_cka(t[:, :1], t), lambda t: R.rsa(t[:, :1], t)):
        got = f(t32)
        assert got.dtype == torch.float64 and got.device.type == device
        np.testing.assert_allclose(got.cpu().numpy(), f(TRAJ.astype(np.float32)), rtol=1e-10, atol=1e-12)
    bf = torch.tensor(TRAJ, device=device).bfloat16()
    np.testing.assert_allclose(M.drift_curve(bf).cpu().numpy(), M.drift_curve(bf.double().cpu().numpy()), atol=1e-12)


@pytest.mark.parametrize("device", DEVICES)
def test_pairwise_run_table_torch(device):
    ref = A.pairwise_run_table(RUNS, labels=list("abcd"), k=4)
    got = A.pairwise_run_table(torch.tensor(RUNS, dtype=torch.float32, device=device), labels=list("abcd"), k=4)
    ref32 = A.pairwise_run_table(RUNS.astype(np.float32), labels=list("abcd"), k=4)
    assert list(got.columns) == list(ref.columns) and list(got.run_a) == list(ref.run_a)
    for m in A.PAIR_MEASURES:
        assert got[m].dtype == np.float64
        np.testing.assert_allclose(got[m], ref32[m], rtol=1e-10, atol=1e-12, err_msg=m)
        np.testing.assert_allclose(got[m], ref[m], rtol=1e-5, atol=1e-6, err_msg=m)   # float32 input vs float64 input


def test_mixed_numpy_and_tensor_arguments():
    t = M.cosine_drift(X[0], torch.tensor(X))                  # a numpy reference joins the tensor's device
    assert isinstance(t, torch.Tensor)
    np.testing.assert_allclose(t.numpy(), M.cosine_drift(X[0], X), rtol=1e-12)
    r = A.procrustes_align(RUNS[0], torch.tensor(RUNS[1]))
    assert isinstance(r.rotation, torch.Tensor)
    assert isinstance(r.apply(RUNS[0][:2]), torch.Tensor)
    with pytest.raises(ValueError, match="X and Y: expected tensors on one device, got cpu and meta"):
        S.linear_cka(torch.tensor(X), torch.empty(3, 12, 5, device="meta"))


def test_numpy_in_numpy_out():
    assert isinstance(M.cosine_drift(X[0], X[1]), np.floating)
    assert isinstance(M.drift_curve(TRAJ), np.ndarray)
    assert isinstance(A.aligned_distance(RUNS[0], RUNS[1]), float)
    r = A.procrustes_align(RUNS[0], RUNS[1])
    assert isinstance(r.rotation, np.ndarray) and isinstance(r.scale, float)
    t = M.cosine_drift(torch.tensor(X[0]), torch.tensor(X[1]))
    assert isinstance(t, torch.Tensor) and t.ndim == 0


BAD = [
    ("cosine_drift", lambda a: M.cosine_drift(a, a[:, :2])),
    ("cosine_drift zero", lambda a: M.cosine_drift(a, a * 0)),
    ("cosine_drift nan", lambda a: M.cosine_drift(a, a * float("nan"))),
    ("cosine_drift rank", lambda a: M.cosine_drift(a[0, 0], a[0, 0])),
    ("cosine_drift complex", lambda a: M.cosine_drift(a, a * 1j)),
    ("drift_curve", lambda a: M.drift_curve(a[0])),
    ("step_drift", lambda a: M.step_drift(a[:1])),
    ("linear_cka rows", lambda a: S.linear_cka(a[:, :3], a[:, :3], debiased=True)),
    ("linear_cka constant", lambda a: S.linear_cka(a, a * 0 + 1)),
    ("linear_cka broadcast", lambda a: S.linear_cka(a, a[:2])),
    ("covariance_spectrum", lambda a: P.covariance_spectrum(a[:, :1])),
    ("spectrum_summary", lambda a: P.spectrum_summary(a * 0 + 1)),
    ("expected_squared_distance", lambda a: M.expected_squared_distance(a, a[..., :2])),
    ("knn_overlap", lambda a: S.knn_overlap(a, a, k=12)),
    ("rsa", lambda a: R.rsa(a[:, :2], a[:, :2])),
    ("procrustes_align", lambda a: A.procrustes_align(a, a)),
    ("procrustes_align spread", lambda a: A.procrustes_align(a[0], a[0] * 0 + 1)),
    ("procrustes_align_batch", lambda a: A.procrustes_align_batch(a, a[..., :2])),
    ("aligned_distance", lambda a: A.aligned_distance(a, a * float("inf"))),
    ("generalized_procrustes", lambda a: A.generalized_procrustes(a[:1])),
    ("pairwise_run_table", lambda a: A.pairwise_run_table(a[:, :2])),
    ("pairwise_run_table labels", lambda a: A.pairwise_run_table(a, labels=["x"])),
]


@pytest.mark.parametrize("name,call", BAD, ids=[b[0] for b in BAD])
def test_validation_errors_read_the_same(name, call):
    with pytest.raises(ValueError) as np_err:
        call(X.copy())
    with pytest.raises(ValueError) as t_err:
        call(torch.tensor(X))
    assert str(t_err.value) == str(np_err.value)


def test_numpy_users_never_import_torch():
    code = ("import sys, numpy as np\n"
            "import embvar_study.checks, embvar_study._batching, embvar_study.metrics as M, embvar_study.align as A, embvar_study.stats as S\n"
            "import embvar_study.similarity as Sim, embvar_study.rsa as R, embvar_study.spectra as P, embvar_study.layer_pairs, embvar_study.compare\n"
            "x = np.random.default_rng(0).normal(size=(3, 10, 4))\n"
            "M.drift_curve(x); P.spectrum_summary(x); Sim.linear_cka(x[0], x[1]); R.rsa(x[0], x[1]); Sim.knn_overlap(x[0], x[1], k=3)\n"
            "A.pairwise_run_table(x); A.generalized_procrustes(x); S.bootstrap_ci(x[0, :, 0], n_resamples=99)\n"
            "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch'))[:5]\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
