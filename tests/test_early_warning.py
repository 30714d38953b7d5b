"""Tests for embvar_study.early_warning: thresholds, crossings and failure rules on synthetic curves/histories with
known answers, AUC against brute force and a loop bootstrap, and the sweep tables."""
import sys
import tempfile
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

from embvar_study.early_warning import (DriftThreshold, OutcomeAUC, auc_ci, drift_predicts_outcome, drift_threshold,
                                        early_warning_table, failure_step, final_outcome, first_crossing,
                                        outcome_auc_table, replicate_distances, seed_distances)
from embvar_study.metrics import drift_curve
from embvar_study.run_writer import RunWriter
from embvar_study.runs import load_run
from embvar_study.study_folder import NotComputed
from embvar_study.study import RunSet


# --------------------------------------------------------------------------- drift_threshold
@settings(max_examples=30, deadline=None)
@given(arrays(np.float64, st.integers(1, 40), elements=st.floats(1e-6, 1.0)), st.floats(0.01, 1.0), st.floats(0.1, 10))
def test_threshold_is_margin_times_quantile(noise, q, margin):
    th = drift_threshold(noise, quantile=q, margin=margin)
    assert th.source == "noise_floor" and th.n_noise == noise.size
    assert th.value == pytest.approx(margin * np.quantile(noise, q))
    assert float(th) == th.value


def test_threshold_fallbacks_are_documented():
    fb = drift_threshold(np.zeros(5), fallback_drifts=[0.02, 0.04, 0.06], quantile=0.5, margin=2.0)
    assert fb.source == "fallback" and fb.value == pytest.approx(0.08) and "identical" in fb.note
    assert fb.noise_quantile == 0.0
    mn = drift_threshold(np.zeros(5), fallback_drifts=np.zeros(2), minimum=1e-3)
    assert mn.source == "minimum" and mn.value == 1e-3 and "minimum" in mn.note
    assert drift_threshold([0.0]).source == "minimum"
    none = drift_threshold([], fallback_drifts=[0.02, 0.04, 0.06], quantile=0.5)      # no replicate runs at all
    assert none.source == "fallback" and none.value == pytest.approx(0.04) and none.n_noise == 0
    assert np.isnan(none.noise_quantile) and none.note.startswith("no identical-seed reruns")
    assert drift_threshold(np.array([])).source == "minimum"
    assert isinstance(fb, DriftThreshold) and "fallback" in repr(fb)


@pytest.mark.parametrize("kw,msg", [(dict(noise_floor_drifts=[-1.0]), "non-negative"),
                                    (dict(noise_floor_drifts=[np.nan]), "finite"),
                                    (dict(noise_floor_drifts=[0.1], quantile=0), "quantile"),
                                    (dict(noise_floor_drifts=[0.1], margin=-1), "margin"),
                                    (dict(noise_floor_drifts=[0.0], fallback_drifts=[-0.2]), "fallback_drifts")])
def test_threshold_errors(kw, msg):
    with pytest.raises(ValueError, match=msg):
        drift_threshold(**kw)


# --------------------------------------------------------------------------- first_crossing
@settings(max_examples=30, deadline=None)
@given(arrays(np.float64, st.integers(1, 20), elements=st.floats(0, 1)), st.floats(0, 1))
def test_first_crossing_matches_a_loop(curve, t):
    steps = np.arange(curve.size) * 3
    expected = next((int(s) for s, c in zip(steps, curve) if c > t), None)
    assert first_crossing(steps, curve, t) == expected


def test_first_crossing_is_strict_and_validates():
    assert first_crossing([0, 1, 2], [0.0, 0.5, 0.6], 0.5) == 2
    assert first_crossing([0, 1, 2], [0.0, 0.5, 0.6], DriftThreshold(0.55, "given", 1, 1, 0, 0, "")) == 2
    with pytest.raises(ValueError, match="increasing"):
        first_crossing([0, 2, 1], [0, 0, 0], 0.1)
    with pytest.raises(ValueError, match="same length"):
        first_crossing([0, 1], [0, 0, 0], 0.1)


# --------------------------------------------------------------------------- failure rules on synthetic histories
def history(acc, loss, n=12, eval_every=2, diverge_at=None, nan_loss_at=None):
    rows = [{"step": 0, "status": "start", "eval_acc": acc(0), "eval_loss": 0.69}]
    for s in range(1, n + 1):
        if diverge_at == s:
            rows.append({"step": s, "status": "diverged", "train_loss": 1e9})
            break
        r = {"step": s, "status": "train", "train_loss": float("inf") if nan_loss_at == s else loss(s)}
        if s % eval_every == 0: r.update(eval_acc=acc(s), eval_loss=loss(s))
        rows.append(r)
    return pd.DataFrame(rows)


HEALTHY = history(lambda s: 0.5 + 0.04 * s, lambda s: 0.69 - 0.03 * s)
STUCK = history(lambda s: 0.5, lambda s: 0.69)


def test_accuracy_rule_known_answers():
    assert failure_step(HEALTHY) is None and not final_outcome(HEALTHY)
    assert failure_step(STUCK) == 6                       # min_step 3: evals 4, 6 at chance -> patience 2 at step 6
    assert failure_step(STUCK, patience=1) == 4
    assert failure_step(STUCK, patience=3) == 8
    assert failure_step(STUCK, min_step=0, patience=1) == 0
    assert failure_step(STUCK, min_step=9) == 12          # evals 10, 12
    assert final_outcome(STUCK)


def test_a_run_that_recovers_is_not_failing_and_late_failure_is_found():
    dip = history(lambda s: 0.5 if s in (4,) else 0.9, lambda s: 0.4)       # one bad eval only
    assert failure_step(dip) is None and not final_outcome(dip)
    late = history(lambda s: 0.9 if s < 8 else 0.55, lambda s: 0.4)         # collapses at step 8
    assert failure_step(late) == 10 and final_outcome(late)
    assert failure_step(late, delta=0.02) is None                             # 0.55 > 0.5 + 0.02


def test_loss_rule_known_answers():
    assert failure_step(STUCK, rule="loss") == 10         # windows after the initial one (1..5): first ends at 10
    assert failure_step(STUCK, rule="loss", window=3, min_step=7) == 7
    assert failure_step(HEALTHY, rule="loss") is None and not final_outcome(HEALTHY, rule="loss")
    late = history(lambda s: 0.9, lambda s: 0.69 if s <= 12 else 0.2, n=20)   # flat, then learns after step 12
    assert failure_step(late, rule="loss") == 10 and not final_outcome(late, rule="loss")
    assert failure_step(late, rule="loss", min_step=15) is None     # window 11..15 averages 0.396 < 0.69 - 0.05
    assert failure_step(STUCK, rule="any") == 6 and final_outcome(STUCK, rule="any")


def test_divergence_counts_for_every_rule():
    div = history(lambda s: 0.9, lambda s: 0.3, diverge_at=7)
    for rule in ("accuracy", "loss", "any"):
        assert failure_step(div, rule=rule) == 7 and final_outcome(div, rule=rule)
    nan = history(lambda s: 0.9, lambda s: 0.3, nan_loss_at=9)    # infinite loss without a status
    assert failure_step(nan.drop(columns="status")) == 9


@pytest.mark.parametrize("kw,msg", [(dict(rule="eval"), "rule"), (dict(patience=0), "patience"),
                                    (dict(window=0, rule="loss"), "window"), (dict(chance=2.0), "chance")])
def test_failure_step_errors(kw, msg):
    with pytest.raises(ValueError, match=msg):
        failure_step(STUCK, **kw)


def test_failure_step_needs_the_columns():
    with pytest.raises(ValueError, match="eval_acc"):
        failure_step(STUCK.drop(columns="eval_acc"))
    with pytest.raises(ValueError, match="history"):
        failure_step([1, 2, 3])


# --------------------------------------------------------------------------- AUC
def _brute_auc(s, y):
    pos, neg = s[y == 1], s[y == 0]
    return np.mean([(a > b) + 0.5 * (a == b) for a in pos for b in neg])


@settings(max_examples=30, deadline=None)
@given(arrays(np.int64, st.integers(2, 15), elements=st.integers(0, 5)), st.data())
def test_auc_matches_brute_force_with_ties(scores, data):
    y = np.array(data.draw(st.lists(st.integers(0, 1), min_size=scores.size, max_size=scores.size)))
    if y.min() == y.max():
        with pytest.raises(NotComputed, match="only one outcome class"):
            auc_ci(scores, y, n_resamples=10)
        return
    r = auc_ci(scores.astype(float), y, n_resamples=50, min_per_class=1)
    assert r.auc == pytest.approx(_brute_auc(scores, y))
    assert auc_ci(scores.astype(float), 1 - y, n_resamples=50, min_per_class=1).auc == pytest.approx(1 - r.auc)   # label flip
    assert 0 <= r.low <= r.high <= 1


def test_score_interval_solves_newcombes_equation():
    "The bounds are the roots of (A - t)^2 = z^2 V(t), V Hanley-McNeil's variance with N* = (n1 + n0)/2 - 1 (Newcombe 2006, method 5): scipy's brentq on each side."
    from scipy.optimize import brentq
    rng = np.random.default_rng(0)
    s = rng.normal(size=9) + np.r_[np.ones(3), np.zeros(6)]
    y = np.array([1, 1, 1, 0, 0, 0, 0, 0, 0])
    r = auc_ci(s, y, min_per_class=1)
    A, z, N = r.auc, sps.norm.ppf(0.975), (3 + 6) / 2 - 1
    f = lambda t: (A - t) ** 2 - z ** 2 * t * (1 - t) / 18 * (1 + (N - 1) * ((1 - t) / (2 - t) + t / (1 + t)))
    assert (r.low, r.high) == pytest.approx((brentq(f, 1e-12, A), brentq(f, A, 1 - 1e-12)), abs=1e-9)
    assert r.n_failed == 3 and r.n_ok == 6 and isinstance(r, OutcomeAUC) and r.method.startswith("95% Newcombe")
    top = auc_ci(np.r_[np.ones(6), np.zeros(6)], np.r_[np.ones(6), np.zeros(6)])   # perfect separation: not degenerate
    assert top.auc == 1.0 and 0.5 < top.low < 1.0 and top.high == pytest.approx(1.0)


def test_auc_one_class_message_says_so():
    with pytest.raises(NotComputed, match=r"only one outcome class is present \(no run failed: 0 failed, 3 healthy\)"):
        auc_ci([0.1, 0.2, 0.3], [0, 0, 0])
    with pytest.raises(NotComputed, match="every run failed"):
        auc_ci([0.1, 0.2], [True, True])
    with pytest.raises(ValueError, match="failed: expected one 0/1"):
        auc_ci([0.1, 0.2], [0, 2])
    with pytest.raises(ValueError, match="n_resamples"):
        auc_ci([0.1, 0.2], [0, 1], n_resamples=0)


# --------------------------------------------------------------------------- from the runs of a study
@pytest.fixture(scope="module")
def study(shared_study):   # the session's synthetic study (conftest.py)
    return shared_study


def _cos_dist(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.mean(1 - (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1))


def hand_runs(root, grid, diverge_lr=None, replicate_noise=0.0, N=10, d=5):
    "Runs written with RunWriter, (lr, seed, replicate) each: drift ~ lr x step; lr >= 5e-4 stuck at chance; one lr may diverge."
    base = np.random.default_rng(0).normal(size=(2, N, d)) + 2.0
    runs = []
    for lr, seed, rep in grid:
        direction = np.random.default_rng(seed).normal(size=(N, d))
        jitter = np.random.default_rng(99 + rep).normal(size=(N, d)) * replicate_noise * rep
        bad, div = lr >= 5e-4, lr == diverge_lr
        h = history(lambda s: 0.5 if bad else 0.5 + 0.04 * s, lambda s: 0.69 if bad else 0.69 - 0.03 * s, diverge_at=7 if div else None)
        cfg = {"lr": lr, "seed": seed, "init_seed": seed, "data_seed": seed, "dropout_seed": seed, "replicate": rep}
        path = Path(root) / f"lr{lr:g}-s{seed}-r{rep}"
        with RunWriter(path, cfg, pd.DataFrame({"text": [f"p{i}" for i in range(N)]})) as w:
            for s in range(0, 7 if div else 13, 2):
                w.save_embeddings(s, {"mean": base + (lr * 2e3) * (s / 12) * direction + (s > 0) * jitter})
            for row in h.to_dict("records"):
                w.log(flush=False, **{k: v for k, v in row.items() if pd.notna(v)})
        runs.append(load_run(path))
    return RunSet.of(runs, "hand")


def test_noise_floor_samples(study):
    reps, ext = study.runs("seed_sweep", "replicate"), study.runs("lr_extended")
    noise = replicate_distances(reps)
    assert noise.shape == (4,) and (noise == 0).all()            # one pair x 4 tracked steps after 0, identical reruns
    noisy_runs = hand_runs(tempfile.mkdtemp(), [(5e-5, 0, 0), (5e-5, 0, 1)], replicate_noise=1e-3)
    noisy = replicate_distances(noisy_runs)
    a, b = (r.embeddings() for r in noisy_runs.runs)
    np.testing.assert_allclose(noisy, [_cos_dist(a[t], b[t]) for t in range(1, 7)], rtol=1e-6)
    assert (noisy > 0).all() and drift_threshold(noisy).source == "noise_floor"
    two = ext.where(lr=5e-3)
    x, y = (r.embeddings(steps=[3, 12]) for r in two.runs)
    sd = seed_distances(two)
    assert sd.shape == (1,) and sd[0] == pytest.approx(_cos_dist(x[0], y[0]), rel=1e-6)
    assert seed_distances(two, step=12)[0] == pytest.approx(_cos_dist(x[1], y[1]), rel=1e-6) and _cos_dist(x[1], y[1]) > sd[0]


def test_noise_floor_errors(study):
    reps, ext = study.runs("seed_sweep", "replicate"), study.runs("lr_extended")
    with pytest.raises(NotComputed, match="needs at least 2 runs, got 1"):
        replicate_distances(reps.where(replicate=0))
    with pytest.raises(NotComputed, match="needs at least 2 runs"):
        seed_distances(ext.where(lr=5e-3, seed=0))
    with pytest.raises(ValueError, match="identical-seed reruns"):
        replicate_distances(ext.where(lr=5e-3))                 # different seeds are not replicates
    with pytest.raises(ValueError, match="step"):
        seed_distances(ext, step=4)
    with pytest.raises(ValueError, match="RunSet"):
        replicate_distances(pd.DataFrame({"run": [1, 2]}))


def test_early_warning_table_known_answers(study):
    ext, reps = study.runs("lr_extended"), study.runs("seed_sweep", "replicate")
    th = drift_threshold(replicate_distances(reps), fallback_drifts=seed_distances(ext.where(lr=5e-5)))
    t = early_warning_table(ext, th)
    assert len(t) == 8 and (t["threshold_source"] == "fallback").all() and (t["threshold"] == th.value).all()
    assert t["lr"].tolist() == sorted(t["lr"]) and list(t["run"])[0].startswith("lr 1e-5")
    # the lowest rate barely learns: its final held-out accuracy is below chance + 0.1, the others are above
    runs = {r.config_hash: r for r in ext.runs}
    assert t["failed"].tolist() == [runs[i].history["eval_acc"].dropna().iloc[-1] <= 0.6 for i in t["run_id"]] == [True] * 2 + [False] * 6
    assert t["failure_step"].isna().sum() == 6 and t["failure_step"].dropna().tolist() == [6, 6]
    for _, r in t.iterrows():
        np.testing.assert_allclose(r["drift"], drift_curve(runs[r["run_id"]].embeddings()))
        expected_cross = next((int(s) for s, d in zip(r["steps"], r["drift"]) if d > th.value), None)
        assert (pd.isna(r["crossing_step"]) and expected_cross is None) or r["crossing_step"] == expected_cross
        expected_lead = (r["failure_step"] - r["crossing_step"]) if pd.notna(r["failure_step"]) and pd.notna(r["crossing_step"]) else None
        assert (pd.isna(r["lead_time"]) and expected_lead is None) or r["lead_time"] == expected_lead
    t2 = early_warning_table(ext, 0.01)                        # a fixed threshold given as a float
    assert (t2["threshold_source"] == "given").all()
    big = t2[t2.lr == 5e-3]
    assert big["crossing_step"].tolist() == [int(np.asarray(s)[np.asarray(d) > 0.01][0]) for s, d in zip(big["steps"], big["drift"])]
    with pytest.raises(ValueError, match="threshold"):
        early_warning_table(ext, float("nan"))


def test_drift_predicts_outcome_from_table_and_runs():
    runs = hand_runs(tempfile.mkdtemp(), [(lr, s, 0) for lr in (1e-5, 5e-5, 5e-4) for s in (0, 1)])
    t = early_warning_table(runs, 1e-3)
    assert t["failed"].tolist() == [False] * 4 + [True] * 2
    a, b = drift_predicts_outcome(t, step=4), drift_predicts_outcome(runs, step=4)
    assert a.auc == b.auc == 1.0 and a.step == 4 and (a.low, a.high) == (b.low, b.high)
    assert drift_predicts_outcome(t, step=0).auc == 0.5      # everything is 0 at step 0: ties
    tab = outcome_auc_table(t, n_resamples=100)
    assert tab["step"].tolist() == [2, 4, 6, 8, 10, 12] and (tab["auc"] == 1.0).all()
    with pytest.raises(NotComputed, match="no run failed"):
        drift_predicts_outcome(t[~t.failed], step=2)
    with pytest.raises(NotComputed, match="no run failed"):
        outcome_auc_table(t[~t.failed])
    with pytest.raises(ValueError, match="step"):
        drift_predicts_outcome(t, step=-1)
    with pytest.raises(ValueError, match="table_or_runs"):
        drift_predicts_outcome(pd.DataFrame({"x": [1]}), step=2)
    with pytest.raises(ValueError, match="table"):
        outcome_auc_table(pd.DataFrame({"x": [1]}))


def test_outcome_auc_matches_brute_force_on_the_study(study):
    t = early_warning_table(study.runs("lr_extended"), 1e-3)
    tab = outcome_auc_table(t, n_resamples=100)
    f = t["failed"].to_numpy()
    for _, row in tab.iterrows():
        x = np.array([d[list(s).index(row["step"])] for s, d in zip(t["steps"], t["drift"])])
        assert row["auc"] == pytest.approx(_brute_auc(x, f.astype(int)))
        assert np.isnan(row["low"]) and np.isnan(row["high"]) and row["n_failed"] == 2 and row["n_ok"] == 6   # 2 failed (< 6): refused
    assert tab.attrs["ci_method"].startswith("no interval: 2 runs in the smaller class")


def test_a_diverged_run_uses_its_last_tracked_step():
    runs = hand_runs(tempfile.mkdtemp(), [(lr, s, 0) for lr in (5e-5, 1e-4) for s in (0, 1)], diverge_lr=1e-4)
    t = early_warning_table(runs, 1e-3)
    div = t[t.lr == 1e-4]
    assert div["failed"].all() and (div["failure_step"] == 7).all()
    assert all(list(s) == [0, 2, 4, 6] for s in div["steps"])
    r = drift_predicts_outcome(t, step=12)                    # diverged runs contribute their drift at step 6
    x = np.array([d[-1] for d in t["drift"]])
    assert r.auc == pytest.approx(_brute_auc(x, t["failed"].to_numpy(int)))
