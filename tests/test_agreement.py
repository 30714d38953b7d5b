"""Tests for embvar_study.agreement: the invariance table against theory entry by entry, pairwise measures against
direct calls, weighted Spearman against scipy on expanded samples, the run bootstrap weights, and the sweep tables."""
import itertools
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import scipy.stats as sps
from hypothesis import given, settings, strategies as st
from hypothesis.extra.numpy import arrays

try:
    import embvar_study  # noqa: F401
except ImportError:  # package not installed: run from the repository checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from embvar_study.agreement import (TRANSFORMS, agreement_matrix, agreement_tables, dissimilarities, expected_invariances,
                                    invariance_table, measure_agreement, pooling_sensitivity, weighted_spearman)
from embvar_study.agreement import _boot_weights
from embvar_study.align import PAIR_MEASURES, aligned_distance, pairwise_run_table
from embvar_study.metrics import cosine_drift, expected_squared_distance
from embvar_study.rsa import rsa
from embvar_study.similarity import knn_overlap, linear_cka
from embvar_study.study_folder import NotComputed


# --------------------------------------------------------------------------- invariances: one test per entry
def _datasets():
    rng = np.random.default_rng(0)
    X1 = rng.normal(size=(40, 6)) + 1.5                        # N > d, off-centre
    Y1 = X1 + 0.4 * rng.normal(size=X1.shape)
    X2 = rng.standard_t(5, size=(25, 30))                      # N < d, heavy tails
    Y2 = 0.5 * X2 + rng.normal(size=X2.shape)
    X3 = np.abs(rng.normal(size=(60, 12))) + 0.2               # positive orthant, like post-activation embeddings
    return [invariance_table(X1, Y1, seed=1, k=5), invariance_table(X2, Y2, seed=2, k=4),
            invariance_table(X3, None, seed=3, k=8)]


TABLES = _datasets()
ENTRIES = [(m, t) for m in PAIR_MEASURES for t in TRANSFORMS]


@pytest.mark.parametrize("measure,transform", ENTRIES)
def test_invariance_entry_matches_theory(measure, transform):
    expected = bool(expected_invariances().loc[measure, transform])
    for tab in TABLES:
        row = tab[(tab["measure"] == measure) & (tab["transform"] == transform)].iloc[0]
        assert row["invariant"] == expected, row.to_dict()
        assert row["expected"] == expected and row["agrees"]
        if not expected:                                   # a real change, far above the tolerance
            assert row["rel_change"] > 1e-3, row.to_dict()


def test_expected_invariances_is_consistent_theory():
    e = expected_invariances()
    assert list(e.index) == list(PAIR_MEASURES) and list(e.columns) == list(TRANSFORMS)
    assert (e["permutation"] == e["rotation"]).all()       # a permutation of coordinates is an orthogonal map
    assert not e["linear"].any()                           # none is invariant to a general invertible map
    assert e.loc["rsa"].equals(e.loc["knn_overlap"])       # both depend on Y only through its row cosines
    assert e.loc["cka"].equals(e.loc["cka_debiased"])      # both are functions of the centred Gram matrices, scale cancelling


def test_invariance_table_validates():
    with pytest.raises(ValueError, match="same shape"):
        invariance_table(np.ones((5, 3)), np.ones((5, 4)))
    with pytest.raises(ValueError, match="at least 4 probes"):
        invariance_table(np.random.default_rng(0).normal(size=(3, 3)))


# --------------------------------------------------------------------------- pairwise measures, as dissimilarities
def test_dissimilarity_orientation():
    p = pairwise_run_table(np.random.default_rng(2).normal(size=(3, 10, 4)), k=3)
    D = dissimilarities(p)
    assert list(D.columns) == list(PAIR_MEASURES)
    for m, o in PAIR_MEASURES.items():
        np.testing.assert_allclose(D[m], 1 - p[m] if o == "similarity" else p[m])
    with pytest.raises(ValueError, match="missing"):
        dissimilarities(p.drop(columns="cka"))


# --------------------------------------------------------------------------- weighted Spearman and the bootstrap
@settings(max_examples=30, deadline=None)
@given(arrays(np.int64, st.integers(3, 12), elements=st.integers(0, 4)), st.data())
def test_weighted_spearman_is_spearman_on_the_expanded_sample(x, data):
    P = x.size
    y = np.array(data.draw(st.lists(st.integers(0, 4), min_size=P, max_size=P)), float)
    w = np.array(data.draw(st.lists(st.integers(0, 3), min_size=P, max_size=P)))
    xe, ye = np.repeat(x.astype(float), w), np.repeat(y, w)
    got = weighted_spearman(x.astype(float), y, w)[0]
    if xe.size < 2 or np.ptp(xe) == 0 or np.ptp(ye) == 0:
        assert np.isnan(got)
    else:
        assert got == pytest.approx(sps.spearmanr(xe, ye).statistic, abs=1e-10)


def test_run_bootstrap_weights_count_the_pairs_of_each_resample():
    K = 5
    i, j = np.triu_indices(K, k=1)
    W = _boot_weights(i, j, K, 50, np.random.default_rng(3), "runs")
    c = np.random.default_rng(3).multinomial(K, np.full(K, 1 / K), size=50)
    for b in range(50):
        drawn = np.repeat(np.arange(K), c[b])              # the K runs of resample b
        count = np.zeros(i.size)
        for u, v in itertools.combinations(range(K), 2):  # every two positions of the resample
            r, s = sorted((drawn[u], drawn[v]))
            if r != s: count[np.flatnonzero((i == r) & (j == s))[0]] += 1
        np.testing.assert_array_equal(W[b], count)
    Wp = _boot_weights(i, j, K, 20, np.random.default_rng(0), "pairs")
    assert (Wp.sum(axis=1) == i.size).all()


def test_measure_agreement_estimates_and_perfect_agreement():
    rng = np.random.default_rng(4)
    X = rng.normal(size=(6, 30, 5))
    X /= np.linalg.norm(X, axis=-1, keepdims=True)         # unit rows: raw MSD = 2 x cosine distance exactly
    X[1:] = X[:1] + (np.arange(1, 6)[:, None, None] * 0.05) * rng.normal(size=(5, 30, 5))
    X /= np.linalg.norm(X, axis=-1, keepdims=True)
    p = pairwise_run_table(X, k=5)
    np.testing.assert_allclose(p["raw_msd"], 2 * p["cos_dist"], rtol=1e-9)
    ag = measure_agreement(p, n_resamples=300, seed=1, min_runs=2)
    assert len(ag) == 21                                   # every two of the 7 measures
    D = dissimilarities(p)
    for _, r in ag.iterrows():
        assert r["spearman"] == pytest.approx(sps.spearmanr(D[r["measure_a"]], D[r["measure_b"]]).statistic, abs=1e-12)
        assert -1 <= r["ci_low"] <= r["ci_high"] <= 1 and 0 < r["n_valid"] <= 300
    perfect = ag[(ag.measure_a == "raw_msd") & (ag.measure_b == "cos_dist")].iloc[0]
    assert perfect["spearman"] == pytest.approx(1.0) and perfect["ci_low"] == pytest.approx(1.0)
    M = agreement_matrix(ag)
    assert (np.diag(M) == 1).all() and np.allclose(M, M.T) and list(M.index) == list(PAIR_MEASURES)
    assert M.loc["cos_dist", "raw_msd"] == pytest.approx(1.0)


def test_measures_undefined_for_some_pair_are_left_out():
    p = pairwise_run_table(np.random.default_rng(6).normal(size=(4, 3, 5)), k=1)     # N = 3: debiased CKA undefined
    assert p["cka_debiased"].isna().all()
    ag = measure_agreement(p, n_resamples=50)
    assert "cka_debiased" not in set(ag.measure_a) | set(ag.measure_b) and len(ag) == 15


def test_run_bootstrap_is_not_narrower_than_pair_bootstrap():
    X = np.random.default_rng(5).normal(size=(7, 25, 4)) + np.linspace(0, 2, 7)[:, None, None]
    p = pairwise_run_table(X, k=5)
    runs = measure_agreement(p, n_resamples=800, seed=0, min_runs=2)
    pairs = measure_agreement(p, n_resamples=800, seed=0, resample="pairs", min_runs=2)
    assert (runs["ci_high"] - runs["ci_low"]).mean() >= (pairs["ci_high"] - pairs["ci_low"]).mean()
    with pytest.raises(ValueError, match="resample"):
        measure_agreement(p, resample="probes")
    with pytest.raises(ValueError, match="n_resamples"):
        measure_agreement(p, n_resamples=0)


# --------------------------------------------------------------------------- from the seed sweep of a study
@pytest.fixture(scope="module")
def study(shared_study):   # the session's synthetic study (conftest.py)
    return shared_study


@pytest.fixture(scope="module")
def seed_runs(study):
    return study.runs("seed_sweep")


def test_agreement_tables_from_runs(seed_runs):
    pairs, agree, inv = agreement_tables(seed_runs, k=5, n_resamples=200)
    assert len(seed_runs) == 6 and len(pairs) == 15          # the shared base run is used once
    X = np.stack([r.embeddings(steps=[12])[0] for r in seed_runs.runs]).astype(float)
    for _, r in pairs.iterrows():                            # every measure against a direct call of its metric
        A, B = X[r["i"]], X[r["j"]]
        ref = {"raw_msd": expected_squared_distance(A, B), "aligned_msd": aligned_distance(A, B), "cka": linear_cka(A, B),
               "cka_debiased": linear_cka(A, B, debiased=True), "rsa": rsa(A, B), "knn_overlap": knn_overlap(A, B, k=5),
               "cos_dist": cosine_drift(A, B)}
        for m, v in ref.items():
            assert r[m] == pytest.approx(float(v), rel=1e-6, abs=1e-9), m
    assert list(pairs[["run_a", "run_b"]].iloc[0]) == seed_runs.labels()[:2]
    assert set(pairs["factor_a"]) <= {"init_seed", "data_seed", "replicate"}
    assert len(agree) == 21 and inv["agrees"].all()
    np.testing.assert_allclose(inv.query("transform == 'rotation'")["value"], [pairs.iloc[0][m] for m in PAIR_MEASURES], rtol=1e-9)
    later, _, _ = agreement_tables(seed_runs, step=6, n_resamples=20)
    assert (later["raw_msd"] < pairs["raw_msd"]).sum() > 10   # seeds have moved apart less by step 6


def test_agreement_tables_errors(study, seed_runs):
    with pytest.raises(ValueError, match="step"):
        agreement_tables(seed_runs, step=4)
    with pytest.raises(NotComputed, match="needs at least 3 runs, got 2"):
        agreement_tables(study.runs("seed_sweep", "replicate"))
    with pytest.raises(ValueError, match="RunSet"):
        agreement_tables(seed_runs.table)


def test_pooling_sensitivity_matches_direct_computation(seed_runs):
    s = pooling_sensitivity(seed_runs, n_resamples=100)
    assert sorted(s.pooling.unique()) == ["cls", "mean"] and len(s) == 6 and (s.n_runs == 6).all() and (s.step == 12).all()
    E = np.stack([r.embeddings_all_layers("mean", steps=[0, 12]) for r in seed_runs.runs]).astype(float)   # (K, 2, L+1, N, d)
    for layer in range(3):
        row = s[(s.pooling == "mean") & (s.layer == layer)].iloc[0]
        assert row["drift"] == pytest.approx(cosine_drift(E[:, 0, layer], E[:, 1, layer]).mean())
        F = E[:, 1, layer]                                                  # (K, N, d)
        between = F.var(axis=0, ddof=1).sum(-1).mean()
        within = F.var(axis=1, ddof=1).sum(-1).mean()
        assert row["seed_share"] == pytest.approx(between / within)
        m = F.mean(0)
        cos_to_mean = 1 - (F * m).sum(-1) / np.linalg.norm(F, axis=-1) / np.linalg.norm(m, axis=-1)
        assert row["seed_cos"] == pytest.approx(cos_to_mean.mean())
        assert row["drift_low"] <= row["drift"] <= row["drift_high"]
    # cls = 2 x mean here: every scale-free quantity is identical under the two poolings
    m, c = s[s.pooling == "mean"].reset_index(), s[s.pooling == "cls"].reset_index()
    for col in ("drift", "seed_cos", "seed_share"):
        np.testing.assert_allclose(m[col], c[col], rtol=1e-9)


def test_pooling_sensitivity_errors(seed_runs):
    with pytest.raises(ValueError, match=r"\['max'\] not stored"):
        pooling_sensitivity(seed_runs, poolings=["max"])
    with pytest.raises(ValueError, match="step"):
        pooling_sensitivity(seed_runs, step=0)
    with pytest.raises(ValueError, match="RunSet"):
        pooling_sensitivity(pd.DataFrame({"a": [1]}))
    with pytest.raises(NotComputed, match="needs at least 2 runs"):
        pooling_sensitivity(seed_runs.where(replicate=1))


def test_values_equal_up_to_rounding_are_tied_as_scipy_ranks_the_exact_values():
    "A rotation-invariant measure gives two run pairs the same value up to the CPU's rounding: its ranks are those of the exact ties."
    from scipy.stats import rankdata
    from embvar_study.agreement import _weighted_ranks
    rng = np.random.default_rng(5)
    v = rng.choice([0.1, 0.25, 0.7, 3.0], size=40)                      # many exact ties
    noisy = v * (1 + rng.choice([-1, 0, 1], size=40) * 2e-16)            # the ties broken at the last bit, as kernels do
    assert len(np.unique(noisy)) > len(np.unique(v))
    np.testing.assert_array_equal(_weighted_ranks(noisy, np.ones((1, 40)))[0], rankdata(v))
