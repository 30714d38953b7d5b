"""replicates.replicate_spread and analysis.seed_variance against independent references: plain loops over probes and
pairs, np.var over runs, scipy's orthogonal Procrustes on two runs, CKA from centred Gram matrices, neighbour sets from
scipy's distances, and leave-one-out recomputed from scratch."""
import numpy as np
import pandas as pd
import pytest
from scipy.linalg import orthogonal_procrustes
from scipy.spatial.distance import cdist
from scipy import stats as sps

from embvar_study.replicates import (REPLICATE_MEASURES, REPLICATE_MIN_RUNS, aligned_spread, pair_jackknife, pair_values,
                                     replicate_spread, row_space)
from embvar_study.analysis import SEED_VARIANCE_COLUMNS, dispersion_over_training, seed_variance
from embvar_study.study_folder import NotComputed


def _runs(K, N=15, d=6, seed=0, noise=0.4):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((N, d)) + noise * rng.standard_normal((K, N, d))


def _table(X, k=4):
    return pd.DataFrame(replicate_spread(X, k=k)).set_index("measure")


def _raw_loop(X):  # the survey's formula, written out
    K, N, _ = X.shape
    total = 0.0
    for i in range(N):
        m = sum(X[k, i] for k in range(K)) / K
        total += sum(float(np.dot(X[k, i] - m, X[k, i] - m)) for k in range(K)) / K
    return total / N


def _cka_gram(a, b):  # linear CKA from centred Gram matrices (Kornblith et al. 2019, eq. 4)
    H = np.eye(len(a)) - 1.0 / len(a)
    K_, L = H @ a @ a.T @ H, H @ b @ b.T @ H
    return np.sum(K_ * L) / np.sqrt(np.sum(K_ * K_) * np.sum(L * L))


def _knn_loop(a, b, k):  # Jaccard overlap of cosine k-NN sets, probe by probe
    da, db = cdist(a, a, "cosine"), cdist(b, b, "cosine")
    np.fill_diagonal(da, np.inf); np.fill_diagonal(db, np.inf)
    out = []
    for i in range(len(a)):
        sa, sb = set(np.argsort(da[i], kind="stable")[:k]), set(np.argsort(db[i], kind="stable")[:k])
        out.append(len(sa & sb) / len(sa | sb))
    return np.mean(out)


@pytest.mark.parametrize("K", [2, 3, 5])
def test_raw_is_the_formula_and_np_var(K):
    X = _runs(K, seed=K)
    t = _table(X)
    assert t.loc["raw", "value"] == pytest.approx(_raw_loop(X), rel=1e-12)
    assert t.loc["raw", "value"] == pytest.approx(np.var(X, axis=0).sum(-1).mean(), rel=1e-12)   # np.var: ddof 0 over runs


@pytest.mark.parametrize("N,d", [(12, 4), (5, 9)])   # d > N goes through row_space
def test_aligned_two_runs_is_scipy_procrustes(N, d):
    X = _runs(2, N, d, seed=N)
    A, B = X[0] - X[0].mean(0), X[1] - X[1].mean(0)
    R, _ = orthogonal_procrustes(B, A)
    # two runs aligned onto each other: each sits half-way from the other, so the spread is a quarter of the residual
    ref = ((A - B @ R) ** 2).sum(-1).mean() / 4
    assert aligned_spread(X) == pytest.approx(ref, rel=1e-7)
    assert _table(X).loc["aligned", "value"] == pytest.approx(ref, rel=1e-7)


def test_aligned_removes_rotations_and_never_adds():
    rng = np.random.default_rng(3)
    base = rng.standard_normal((10, 5))
    Q = np.stack([np.linalg.qr(rng.standard_normal((5, 5)))[0] for _ in range(4)])
    rotated = base @ Q + rng.standard_normal((4, 1, 5))               # rotated, shifted copies
    t = _table(rotated)
    assert t.loc["aligned", "value"] == pytest.approx(0.0, abs=1e-9) and t.loc["raw", "value"] > 0.1
    assert t.loc["cka_dissimilarity", "value"] == pytest.approx(0.0, abs=1e-12)   # CKA: invariant to rotation and shift
    noisy = _table(_runs(4, seed=9))
    assert noisy.loc["aligned", "value"] <= noisy.loc["raw", "value"]


def test_identical_runs_have_no_spread():
    X = np.repeat(_runs(1, seed=1), 4, axis=0)
    t = _table(X)
    assert (t.loc[["raw", "aligned", "cka_dissimilarity"], ["value", "ci_low", "ci_high"]].abs().to_numpy() < 1e-12).all()
    assert (t.loc["knn_overlap", ["value", "ci_low", "ci_high"]] == 1.0).all()


def test_cka_and_knn_are_means_over_pairs_of_independent_formulas():
    X = _runs(4, N=12, d=5, seed=4, noise=0.8)
    t = _table(X, k=3)
    pairs = [(i, j) for i in range(4) for j in range(i + 1, 4)]
    assert t.loc["cka_dissimilarity", "value"] == pytest.approx(1 - np.mean([_cka_gram(X[i], X[j]) for i, j in pairs]), rel=1e-9)
    assert t.loc["knn_overlap", "value"] == pytest.approx(np.mean([_knn_loop(X[i], X[j], 3) for i, j in pairs]), rel=1e-12)


def test_jackknife_interval_recomputed_from_scratch():
    "Leave-one-out values recomputed on K-1 runs; the raw interval is (K-1)/K times that of the unbiased statistic."
    K, X = 5, _runs(5, seed=5)
    t = _table(X)
    for m in ("raw", "cka_dissimilarity", "knn_overlap"):
        loo = np.array([pair_values(np.delete(X, i, 0), k=4)[m].mean() for i in range(K)])
        est, jk_loo = pair_jackknife(pair_values(X, k=4)[m], K)
        np.testing.assert_allclose(jk_loo, loo, rtol=1e-12)
        se = np.sqrt((K - 1) / K * ((loo - loo.mean()) ** 2).sum())
        c = (K - 1) / K if m == "raw" else 1.0
        h = sps.t.ppf(0.975, K - 1) * se * c
        assert t.loc[m, "value"] == pytest.approx(c * est, rel=1e-12)
        assert (t.loc[m, "ci_low"], t.loc[m, "ci_high"]) == pytest.approx((c * est - h, c * est + h), rel=1e-10)
    loo = np.array([aligned_spread(np.delete(X, i, 0)) * (K - 1) / (K - 2) for i in range(K)])
    se = np.sqrt((K - 1) / K * ((loo - loo.mean()) ** 2).sum()) * (K - 1) / K
    h = sps.t.ppf(0.975, K - 1) * se
    v = t.loc["aligned", "value"]
    assert (t.loc["aligned", "ci_low"], t.loc["aligned", "ci_high"]) == pytest.approx((v - h, v + h), rel=1e-9)
    assert "jackknife t interval over 5 runs (4 df)" in t.loc["raw", "method"]


def test_two_runs_refused_with_a_reason_one_run_an_error():
    t = _table(_runs(2))
    assert t[["ci_low", "ci_high"]].isna().all().all() and t["value"].notna().all()
    assert (t["method"] == f"no interval: 2 runs (a delete-one jackknife over runs needs at least {REPLICATE_MIN_RUNS})").all()
    with pytest.raises(ValueError, match=r"X: expected at least 2 runs \(K\)"):
        replicate_spread(_runs(1))
    with pytest.raises(ValueError, match="K: expected at least 3"):
        pair_jackknife([1.0], 2)


def test_row_space_keeps_gram():
    X = np.random.default_rng(0).standard_normal((2, 4, 11))
    np.testing.assert_allclose(row_space(X) @ np.swapaxes(row_space(X), -1, -2), X @ np.swapaxes(X, -1, -2), atol=1e-12)


# ------------------------------------------------------------------ on runs: a RunSet or a list
@pytest.fixture(scope="module")
def seeds(tmp_path_factory):
    from embvar_study.study import load_study
    from embvar_study.synthetic import synthetic_study
    return load_study(synthetic_study(tmp_path_factory.mktemp("syn") / "syn")).runs("seed_sweep", "init_seed")


def test_seed_variance_table(seeds):
    sv = seed_variance(seeds)
    steps = seeds.common_steps()
    assert list(sv.columns) == SEED_VARIANCE_COLUMNS and len(sv) == len(REPLICATE_MEASURES) * len(steps)
    assert list(sv["measure"][:4]) == list(REPLICATE_MEASURES) and sv["n_runs"].eq(len(seeds)).all()
    dt = dispersion_over_training(seeds)
    raw = sv[sv["measure"] == "raw"].set_index("step")["value"]
    np.testing.assert_allclose(raw.loc[steps].to_numpy(), dt["raw_dispersion"].to_numpy(), rtol=1e-9, atol=1e-15)
    X = seeds.stack(step=int(steps[-1])).astype(np.float64)
    assert raw.loc[steps[-1]] == pytest.approx(_raw_loop(X), rel=1e-9)
    listed = seed_variance(list(seeds.runs), step=int(steps[-1]))      # a plain list of runs, one step
    pd.testing.assert_frame_equal(listed.reset_index(drop=True), sv[sv["step"] == steps[-1]].reset_index(drop=True))
    folders = seed_variance([str(r.path) for r in seeds.runs], step=int(steps[-1]))   # run folders, as paths
    pd.testing.assert_frame_equal(folders.reset_index(drop=True), listed.reset_index(drop=True))


def test_seed_variance_bad_input(seeds):
    with pytest.raises(ValueError, match=r"^step: expected a step every run tracked"):
        seed_variance(seeds, step=10**9)
    with pytest.raises(NotComputed, match="at least 2 runs"):
        seed_variance(seeds.runs[:1])


# ------------------------------------------------------------------ by subsets of the probes
def test_subset_spread_is_the_measures_on_each_group_and_their_difference():
    from embvar_study.replicates import SUBSET_MEASURES, subset_spread
    rng = np.random.default_rng(11)
    g = np.array(["a"] * 7 + ["b"] * 9 + ["c"] * 6)
    X = rng.standard_normal((22, 5)) + 0.3 * rng.standard_normal((4, 22, 5))
    t = pd.DataFrame(subset_spread(X, g, k=3)).set_index(["group", "measure"])
    assert len(t) == 3 * len(SUBSET_MEASURES)
    for grp in "abc":
        inside, rest = X[:, g == grp], X[:, g != grp]
        ti, tr = _table(inside, k=3), _table(rest, k=3)                     # replicate_spread on the probes of each side
        for m in SUBSET_MEASURES:
            assert t.loc[(grp, m), "value"] == pytest.approx(ti.loc[m, "value"], rel=1e-12)
            assert (t.loc[(grp, m), "ci_low"], t.loc[(grp, m), "ci_high"]) == pytest.approx((ti.loc[m, "ci_low"], ti.loc[m, "ci_high"]), rel=1e-10)
            assert t.loc[(grp, m), "diff_vs_rest"] == pytest.approx(ti.loc[m, "value"] - tr.loc[m, "value"], rel=1e-9, abs=1e-12)
    assert (t["diff_low"] <= t["diff_vs_rest"]).all() and (t["diff_vs_rest"] <= t["diff_high"]).all()
    with pytest.raises(ValueError, match=r"^groups: expected one group per probe, shape \(22,\)"):
        subset_spread(X, g[:5])


def test_seed_variance_by_class(seeds):
    from embvar_study.analysis import seed_variance_by
    t = seed_variance_by(seeds, "sentiment")
    X, lab = seeds.stack().astype(np.float64), seeds.runs[0].probes["sentiment"].to_numpy()
    for grp, row in t[t["measure"] == "raw"].set_index("group").iterrows():
        assert row["value"] == pytest.approx(_raw_loop(X[:, lab == grp]), rel=1e-9)
        assert row["n_probes"] == (lab == grp).sum() and row["n_runs"] == len(seeds)
    with pytest.raises(ValueError, match=r"^by: expected a probe column \(sentiment\), got 'length_bucket'"):
        seed_variance_by(seeds, "length_bucket")


def test_intervals_are_clipped_to_the_measures_range_and_keep_every_in_range_value():
    "Clipping to the possible range never drops a value the t interval held inside that range: the coverage is kept."
    from embvar_study.replicates import MEASURE_RANGE, jackknife_t, pair_jackknife, pair_values, replicate_spread
    rng = np.random.default_rng(11)
    clipped_any = False
    for _ in range(40):
        X = rng.standard_normal((8, 4)) + rng.uniform(0.001, 0.5) * rng.standard_normal((3, 8, 4))   # 3 runs: wide t intervals
        t = pd.DataFrame(replicate_spread(X, k=3)).set_index("measure")
        p = pair_values(X, k=3)
        for m in ("cka_dissimilarity", "knn_overlap"):
            raw = jackknife_t(*pair_jackknife(p[m], 3))                      # unclipped
            lo, hi = MEASURE_RANGE[m]
            assert lo <= t.loc[m, "ci_low"] <= t.loc[m, "ci_high"] <= hi
            assert np.isclose(t.loc[m, "ci_low"], max(lo, raw["low"])) and np.isclose(t.loc[m, "ci_high"], min(hi, raw["high"]))
            clipped_any |= bool(raw["low"] < lo or raw["high"] > hi)
        assert t.loc["raw", "ci_low"] >= 0 and t.loc["aligned", "ci_low"] >= 0
    assert clipped_any   # the case occurs: the test exercises the clip
