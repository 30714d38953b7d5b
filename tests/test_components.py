"""Tests for embvar_study.components: EMS estimators against projection-matrix references, unbiasedness and CI
coverage in seeded simulations, invariances, identification errors, and the crossed-sweep table builder."""
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra.numpy import arrays

try:
    import embvar_study  # noqa: F401
except ImportError:  # package not installed: run from the repository checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from embvar_study.components import (VarianceComponents, components_table, crossed_values, embedding_variance_components,
                                     variance_components, variance_components_3way)
from embvar_study.components import _design_three_way, _design_two_way, _ms_three_way, _ms_two_way
from embvar_study.run_writer import RunWriter
from embvar_study.runs import load_run
from embvar_study.study_folder import NotComputed
from embvar_study.study import RunSet

TRUTH2 = np.array([1.0, 0.5, 0.25, 1.0])                        # A, B, A:B, error
TRUTH3 = np.array([1.0, 0.5, 2.0, 0.25, 0.3, 0.2, 0.5])         # A, B, P, A:B, A:P, B:P, residual


def sim2(rng, A, B, R, n=None, s2=TRUTH2):
    s, lead = np.sqrt(s2), (() if n is None else (n,))
    g = lambda *sh: rng.normal(size=lead + sh)
    return s[0] * g(A, 1, 1) + s[1] * g(1, B, 1) + s[2] * g(A, B, 1) + s[3] * g(A, B, R)


def sim3(rng, A, B, P, n=None, s2=TRUTH3):
    s, lead = np.sqrt(s2), (() if n is None else (n,))
    g = lambda *sh: rng.normal(size=lead + sh)
    return (s[0] * g(A, 1, 1) + s[1] * g(1, B, 1) + s[2] * g(1, 1, P) + s[3] * g(A, B, 1) + s[4] * g(A, 1, P)
            + s[5] * g(1, B, P) + s[6] * g(A, B, P))


# --------------------------------------------------------------------------- mean squares vs an independent reference
def _J(n): return np.eye(n) - 1.0 / n
def _U(n): return np.full((n, n), 1.0 / n)


def _kron(*ms):
    out = ms[0]
    for m in ms[1:]: out = np.kron(out, m)
    return out


def _ref_ss(x, projections):
    v = x.reshape(-1)
    return np.array([v @ P @ v for P in projections])


finite = st.floats(-100, 100, allow_nan=False, allow_infinity=False)


@settings(max_examples=30, deadline=None)
@given(arrays(np.float64, st.tuples(st.integers(2, 4), st.integers(2, 4), st.integers(2, 4)), elements=finite))
def test_two_way_sums_of_squares_match_projections(x):
    A, B, R = x.shape
    P = [_kron(_J(A), _U(B), _U(R)), _kron(_U(A), _J(B), _U(R)), _kron(_J(A), _J(B), _U(R)),
         _kron(np.eye(A), np.eye(B), _J(R))]
    df = np.array(_design_two_way(A, B, R)[0])
    ss = _ms_two_way(x) * df
    np.testing.assert_allclose(ss, _ref_ss(x, P), rtol=1e-9, atol=1e-7)
    np.testing.assert_allclose(ss.sum(), ((x - x.mean()) ** 2).sum(), rtol=1e-9, atol=1e-7)   # the ANOVA identity


@settings(max_examples=30, deadline=None)
@given(arrays(np.float64, st.tuples(st.integers(2, 4), st.integers(2, 4), st.integers(2, 5)), elements=finite))
def test_three_way_sums_of_squares_match_projections(x):
    A, B, P_ = x.shape
    P = [_kron(_J(A), _U(B), _U(P_)), _kron(_U(A), _J(B), _U(P_)), _kron(_U(A), _U(B), _J(P_)),
         _kron(_J(A), _J(B), _U(P_)), _kron(_J(A), _U(B), _J(P_)), _kron(_U(A), _J(B), _J(P_)), _kron(_J(A), _J(B), _J(P_))]
    df = np.array(_design_three_way(A, B, P_)[0])
    ss = _ms_three_way(x) * df
    np.testing.assert_allclose(ss, _ref_ss(x, P), rtol=1e-9, atol=1e-7)
    np.testing.assert_allclose(ss.sum(), ((x - x.mean()) ** 2).sum(), rtol=1e-9, atol=1e-7)


def test_anova_table_is_consistent():
    x = sim2(np.random.default_rng(0), 4, 3, 5)
    a = variance_components(x, n_resamples=50, seed=0).anova
    np.testing.assert_allclose(a["sum_sq"] / a["df"], a["mean_sq"])
    assert list(a["df"]) == [3, 2, 6, 48]


# --------------------------------------------------------------------------- unbiasedness (untruncated) by simulation
@pytest.mark.parametrize("shape", [(6, 5, 3), (3, 3, 2)])
def test_two_way_untruncated_estimator_is_unbiased(shape):
    est = _ms_two_way(sim2(np.random.default_rng(11), *shape, n=4000)) @ _design_two_way(*shape)[2].T
    se = est.std(axis=0, ddof=1) / np.sqrt(len(est))
    assert (np.abs(est.mean(axis=0) - TRUTH2) < 4 * se).all(), (est.mean(axis=0), se)
    assert (est < 0).any()                           # negative estimates happen: truncation is not cosmetic


@pytest.mark.parametrize("shape", [(4, 3, 6), (3, 3, 30)])
def test_three_way_untruncated_estimator_is_unbiased(shape):
    est = _ms_three_way(sim3(np.random.default_rng(12), *shape, n=3000)) @ _design_three_way(*shape)[2].T
    se = est.std(axis=0, ddof=1) / np.sqrt(len(est))
    assert (np.abs(est.mean(axis=0) - TRUTH3) < 4 * se).all(), (est.mean(axis=0), se)


def test_pooled_estimator_is_unbiased():
    rng = np.random.default_rng(13)
    s2 = np.array([1.0, 0.4, 0.3])
    A, B, N, d = 4, 3, 5, 2
    est = []
    for _ in range(600):          # ~1 ms each; the function itself is what is tested
        z = (np.sqrt(s2[0]) * rng.normal(size=(A, 1, N, d)) + np.sqrt(s2[1]) * rng.normal(size=(1, B, N, d))
             + np.sqrt(s2[2]) * rng.normal(size=(A, B, N, d)) + 3 * rng.normal(size=(1, 1, N, d)))
        est.append(embedding_variance_components(z, n_resamples=2, seed=0).table["estimate_untruncated"].to_numpy())
    est = np.array(est)
    se = est.std(axis=0, ddof=1) / np.sqrt(len(est))
    assert (np.abs(est.mean(axis=0) - s2 * d) < 4 * se).all(), (est.mean(axis=0), se)


# --------------------------------------------------------------------------- CIs: seeded recovery and coverage
def test_two_way_truth_inside_ci_seeded():
    t = variance_components(sim2(np.random.default_rng(0), 10, 10, 4), n_resamples=1000, seed=0).table
    assert ((t["ci_low"] <= TRUTH2) & (TRUTH2 <= t["ci_high"])).all(), t


def test_three_way_truth_inside_ci_seeded():
    t = variance_components_3way(sim3(np.random.default_rng(2), 10, 10, 20), n_resamples=1000, seed=0).table
    assert ((t["ci_low"] <= TRUTH3) & (TRUTH3 <= t["ci_high"])).all(), t


def test_two_way_coverage_over_simulations():
    rng = np.random.default_rng(21)
    hits = np.zeros(4)
    n = 40
    for i in range(n):
        t = variance_components(sim2(rng, 8, 8, 4), n_resamples=400, seed=i).table
        hits += (t["ci_low"] <= TRUTH2) & (TRUTH2 <= t["ci_high"])
    assert (hits / n >= 0.7).all(), hits / n


def test_three_way_coverage_over_simulations():
    rng = np.random.default_rng(22)
    hits = np.zeros(7)
    n = 30
    for i in range(n):
        t = variance_components_3way(sim3(rng, 8, 8, 15), n_resamples=300, seed=i).table
        hits += (t["ci_low"] <= TRUTH3) & (TRUTH3 <= t["ci_high"])
    assert (hits / n >= 0.7).all(), hits / n


# --------------------------------------------------------------------------- properties of the result
def test_truncation_shares_and_intervals():
    x = sim2(np.random.default_rng(3), 3, 3, 2, s2=np.array([0.0, 0.0, 0.0, 1.0]))   # only noise: negatives likely
    res = variance_components(x, n_resamples=300, seed=0)
    t = res.table
    np.testing.assert_allclose(t["estimate"], np.maximum(t["estimate_untruncated"], 0))
    np.testing.assert_allclose(t["share"].sum(), 1.0)
    assert (t["ci_low"] >= 0).all() and (t["ci_low"] <= t["ci_high"]).all()
    assert ((t["share_low"] >= 0) & (t["share_high"] <= 1 + 1e-12)).all()
    assert res.total == pytest.approx(t["estimate"].sum())
    assert isinstance(res, VarianceComponents) and "two-way replicated" in repr(res)


@pytest.mark.parametrize("fn,shape", [(variance_components, (4, 3, 3)), (variance_components_3way, (4, 3, 6)),
                                      (embedding_variance_components, (4, 3, 5, 2))])
def test_location_scale_and_relabelling(fn, shape):
    rng = np.random.default_rng(4)
    x = rng.normal(size=shape) + rng.normal(size=shape[:1] + (1,) * (len(shape) - 1))
    base = fn(x, n_resamples=200, seed=1).table
    shifted = fn(x + 7.5, n_resamples=200, seed=1).table
    scaled = fn(3.0 * x, n_resamples=200, seed=1).table
    permuted = fn(x[rng.permutation(shape[0])][:, rng.permutation(shape[1])], n_resamples=200, seed=1).table
    np.testing.assert_allclose(shifted["estimate_untruncated"], base["estimate_untruncated"], rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(scaled["estimate_untruncated"], 9.0 * base["estimate_untruncated"], rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(permuted["estimate_untruncated"], base["estimate_untruncated"], rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(scaled["share"], base["share"], rtol=1e-8)


def test_reproducible_with_seed_and_accepts_torch():
    import torch
    x = sim2(np.random.default_rng(5), 3, 4, 3)
    a = variance_components(x, n_resamples=200, seed=7).table
    b = variance_components(torch.tensor(x, dtype=torch.float32), n_resamples=200, seed=7).table
    pd.testing.assert_frame_equal(a, variance_components(x, n_resamples=200, seed=7).table)
    np.testing.assert_allclose(a["estimate"], b["estimate"], rtol=1e-5)


def test_pooled_total_is_half_the_squared_distance_between_runs():
    rng = np.random.default_rng(6)
    A, B = 3, 4
    z = rng.normal(size=(A, B, 7, 3)) + rng.normal(size=(1, B, 7, 3))
    tot = embedding_variance_components(z, n_resamples=10, seed=0).table["estimate_untruncated"].sum()
    half = [0.5 * ((z[a, b] - z[c, e]) ** 2).sum(-1).mean()
            for a in range(A) for b in range(B) for c in range(A) for e in range(B) if a != c and b != e]
    assert tot == pytest.approx(np.mean(half), rel=1e-10)


def test_pooled_one_column_is_the_two_way_no_replication_estimator():
    x = np.random.default_rng(7).normal(size=(4, 5))
    A, B = x.shape
    m, ma, mb = x.mean(), x.mean(1, keepdims=True), x.mean(0, keepdims=True)
    ms_a, ms_b = B * ((ma - m) ** 2).sum() / (A - 1), A * ((mb - m) ** 2).sum() / (B - 1)
    ms_r = ((x - ma - mb + m) ** 2).sum() / ((A - 1) * (B - 1))
    got = embedding_variance_components(x[:, :, None], n_resamples=5, seed=0).table["estimate_untruncated"].to_numpy()
    np.testing.assert_allclose(got, [(ms_a - ms_r) / B, (ms_b - ms_r) / A, ms_r], rtol=1e-10)


# --------------------------------------------------------------------------- identification errors
@pytest.mark.parametrize("call,msg", [
    (lambda: variance_components(np.zeros((1, 3, 3))), "at least 2 levels of factor A"),
    (lambda: variance_components(np.zeros((3, 1, 3))), "at least 2 levels of factor B"),
    (lambda: variance_components(np.zeros((3, 3, 1))), "R >= 2 replicates"),
    (lambda: variance_components(np.zeros((3, 3))), "expected shape (A, B, R)"),
    (lambda: variance_components_3way(np.zeros((3, 3, 1))), "at least 2 levels of factor P"),
    (lambda: variance_components_3way(np.zeros((2, 1, 5))), "at least 2 levels of factor B"),
    (lambda: embedding_variance_components(np.zeros((1, 3, 4, 2))), "at least 2 levels of factor A"),
    (lambda: embedding_variance_components(np.zeros((3, 3))), "(A, B, N, ...)"),
    (lambda: variance_components([[[1.0, 2.0], [3.0]], [[1.0, 2.0], [3.0, 4.0]]]), "ragged"),
    (lambda: variance_components(np.where(np.eye(3)[:, :, None] > 0, np.nan, np.ones((3, 3, 2)))), "balanced design"),
    (lambda: variance_components(np.ones((3, 3, 2)), names=("a", "a")), "names"),
    (lambda: variance_components(np.ones((3, 3, 2)), n_resamples=0), "n_resamples"),
    (lambda: variance_components(np.ones((3, 3, 2)), confidence=1.5), "confidence"),
    (lambda: variance_components(np.ones((3, 3, 2)), seed="x"), "seed"),
])
def test_unidentifiable_or_bad_input_is_refused(call, msg):
    with pytest.raises(ValueError, match=None) as e:
        call()
    assert msg in str(e.value), str(e.value)


def test_constant_values_give_zero_components_and_nan_shares():
    t = variance_components_3way(np.ones((3, 3, 4)), n_resamples=20, seed=0).table
    assert (t["estimate"] == 0).all() and t["share"].isna().all()


# --------------------------------------------------------------------------- from the crossed sweep of a study
@pytest.fixture(scope="module")
def study(shared_study):   # the session's synthetic study (conftest.py)
    return shared_study


@pytest.fixture(scope="module")
def crossed(study):
    return study.runs("crossed")


def _cosine_drift_direct(e0, e1):
    return 1 - (e0 * e1).sum(-1) / np.linalg.norm(e0, axis=-1) / np.linalg.norm(e1, axis=-1)


def test_crossed_values_match_direct_computation(crossed):
    vals, lev = crossed_values(crossed)
    assert vals.shape == (3, 3, 24) and lev["init_seed"] == [0, 1, 2] and lev["data_seed"] == [0, 1, 2] and lev["step"] == 12
    for row, run in zip(crossed.table.itertuples(), crossed.runs):
        e = run.embeddings()
        np.testing.assert_allclose(vals[row.init_seed, row.data_seed], _cosine_drift_direct(e[0], e[-1]), atol=1e-6)
    cls, _ = crossed_values(crossed, layer=0, pooling="cls")
    run = crossed.runs[0]
    e = run.embeddings(layer=0, pooling="cls")
    np.testing.assert_allclose(cls[crossed.table["init_seed"][0], crossed.table["data_seed"][0]], _cosine_drift_direct(e[0], e[-1]), atol=1e-6)


def test_components_table_finds_the_larger_factor(crossed):
    for measure in ("final_drift", "aligned_distance"):
        t = components_table(crossed, measure, n_resamples=300).set_index("component")["estimate"]
        init, data = t["init_seed"], t["data_seed"]
        if measure == "final_drift":            # per-probe drift: the seed effects act mostly through the probe interactions
            init, data = init + t["init_seed:probe"], data + t["data_seed:probe"]
        assert init > data, (measure, t)
    t = components_table(crossed, n_resamples=50)
    assert set(t["measure"]) == {"final_drift"} and (t["step"] == 12).all() and (t["n_probes"] == 24).all()
    assert (t["n_init_seeds"] == 3).all() and (t["n_data_seeds"] == 3).all()
    rep = components_table(crossed, design="replicated", n_resamples=100)
    assert list(rep["component"]) == ["init_seed", "data_seed", "init_seed:data_seed", "error"]


def test_components_table_is_the_estimator_on_crossed_values(crossed):
    vals, _ = crossed_values(crossed)
    direct = variance_components_3way(vals, names=("init_seed", "data_seed", "probe"), n_resamples=200, seed=3).table
    t = components_table(crossed, n_resamples=200, seed=3, min_levels=2)     # intervals asked for at 3 levels
    pd.testing.assert_frame_equal(t[direct.columns].reset_index(drop=True), direct)
    refused = components_table(crossed, n_resamples=200, seed=3)             # default: 3 levels are too few for an interval
    np.testing.assert_allclose(refused["estimate"], direct["estimate"], rtol=1e-12)
    assert refused[["ci_low", "ci_high", "share_low", "share_high"]].isna().all().all()
    assert refused.attrs["ci_method"].startswith("no interval: 3 levels of a seed factor")
    raw = _ms_three_way(vals) @ _design_three_way(3, 3, 24)[2].T        # the EMS solution, by the matrix
    np.testing.assert_allclose(t["estimate_untruncated"], raw, rtol=1e-12)


def test_aligned_total_is_half_the_squared_aligned_distance(crossed):
    Z, _ = crossed_values(crossed, "aligned_distance")
    half = np.mean([0.5 * ((Z[a, b] - Z[c, e]) ** 2).sum(-1).mean()
                    for a in range(3) for b in range(3) for c in range(3) for e in range(3) if a != c and b != e])
    t = components_table(crossed, "aligned_distance", n_resamples=20)
    assert t["estimate_untruncated"].sum() == pytest.approx(half, rel=1e-9)


def _rotated_copy(rs, root):
    "The runs of `rs` rewritten with a run-specific random rotation of every embedding (a RunSet of the copies)."
    runs = []
    for n, run in enumerate(rs.runs):
        d = run.shape[-1]
        Q = np.linalg.qr(np.random.default_rng(50 + n).normal(size=(d, d)))[0]
        with RunWriter(Path(root) / run.config_hash, run.config, run.probes) as w:
            for s in run.steps:
                w.save_embeddings(int(s), {p: run.embeddings_all_layers(p, steps=[int(s)])[0] @ Q for p in run.poolings})
        runs.append(load_run(Path(root) / run.config_hash))
    return RunSet.of(runs, "crossed", "crossed")


def test_aligned_measure_ignores_run_specific_rotations(crossed):
    plain = components_table(crossed, "aligned_distance", n_resamples=50)
    rotated = components_table(_rotated_copy(crossed, tempfile.mkdtemp()), "aligned_distance", n_resamples=50)
    np.testing.assert_allclose(rotated["estimate_untruncated"], plain["estimate_untruncated"], rtol=1e-4, atol=1e-6)


def test_designs_that_cannot_be_analysed_say_why(study, crossed):
    holey = crossed.where(init_seed=[0, 1]) + crossed.where(init_seed=2, data_seed=[0, 1])
    with pytest.raises(NotComputed, match=r"no run for \(init_seed, data_seed\) = \[\(2, 2\)\]"):
        components_table(holey)
    with pytest.raises(NotComputed, match=r"2 runs share the cell \(0, 0\)"):
        components_table(crossed + study.runs("seed_sweep", "replicate"))
    with pytest.raises(NotComputed, match="at least 2 levels of init_seed and of data_seed"):
        components_table(crossed.where(data_seed=1))
    with pytest.raises(NotComputed, match=r"not fully crossed: no run for \(init_seed, data_seed\) = \[\(0, 1\)"):
        components_table(study.runs("lr_sweep").where(lr=5e-5))    # seeds vary together: only the diagonal cells


def test_wrong_arguments_are_value_errors(crossed):
    with pytest.raises(ValueError, match="measure"):
        components_table(crossed, measure="cka")
    with pytest.raises(ValueError, match="design"):
        components_table(crossed, design="pooled")
    with pytest.raises(ValueError, match="expected a study.RunSet"):
        components_table(pd.DataFrame({"x": [1]}))
    with pytest.raises(ValueError, match="factors"):
        crossed_values(crossed, factors=("init_seed", "nope"))
