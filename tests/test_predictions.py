"""predictions: churn and flip rates against plain loops over pairs of runs and examples; matching by dataset row;
refusals (2 runs, runs without predictions, an unknown step)."""
import itertools

import numpy as np
import pytest
from scipy import stats as sps

from embvar_study.analysis import prediction_churn, prediction_flips
from embvar_study.predictions import SPREAD_NOT_COMPUTED, shared_predictions
from embvar_study.run_writer import RunWriter
from embvar_study.runs import load_run
from embvar_study.study_folder import NotComputed


def _run(folder, rows, labels, probs_by_step, seed):
    with RunWriter(folder, {"lr": 1e-4, "seed": seed}, [{"text": t} for t in "abc"]) as w:
        w.save_embeddings(0, {"mean": np.zeros((2, 3, 4), np.float32)})
        if probs_by_step is not None:
            w.save_array("predictions/examples.npy", np.c_[rows, labels])
            for s, p in probs_by_step.items(): w.save_array(f"predictions/step_{s:06d}.npy", np.asarray(p, np.float32))
        w.finish()
    return load_run(folder)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    "5 runs of 3 classes on 40 examples; each holds out 36 of them, in its own order."
    root, rng = tmp_path_factory.mktemp("pred"), np.random.default_rng(0)
    labels = rng.integers(0, 3, 40)
    out = []
    for k in range(5):
        keep = np.sort(rng.choice(40, 36, replace=False)); order = rng.permutation(keep)
        probs = {s: rng.dirichlet(np.ones(3), size=36) for s in (0, 6, 12)}
        out.append(_run(root / f"r{k}", order + 100, labels[order], probs, seed=k))
    return out


def test_churn_and_flips_are_plain_loops(runs):
    rows = sorted(set.intersection(*[set(r.predictions()["rows"].tolist()) for r in runs]))
    pred = []
    for r in runs:
        p = r.predictions(); where = {row: i for i, row in enumerate(p["rows"])}
        pred.append([int(np.argmax(p["probs"][-1][where[row]])) for row in rows])
    pred = np.array(pred)
    pairs = [np.mean(pred[a] != pred[b]) for a, b in itertools.combinations(range(5), 2)]
    ch = prediction_churn(runs).set_index("measure")
    assert ch.loc["churn", "value"] == pytest.approx(np.mean(pairs), rel=1e-12)
    assert ch.loc["churn", "n_examples"] == len(rows) and ch.loc["churn", "step"] == 12
    loo = [np.mean([np.mean(pred[a] != pred[b]) for a, b in itertools.combinations([i for i in range(5) if i != k], 2)]) for k in range(5)]
    se = np.sqrt(4 / 5 * np.sum((np.array(loo) - np.mean(loo)) ** 2))
    h = sps.t.ppf(0.975, 4) * se
    assert (ch.loc["churn", "ci_low"], ch.loc["churn", "ci_high"]) == pytest.approx((np.mean(pairs) - h, np.mean(pairs) + h), rel=1e-10)
    fl = prediction_flips(runs)
    assert fl["row"].tolist() == rows
    by_loop = [np.mean([pred[a, i] != pred[b, i] for a, b in itertools.combinations(range(5), 2)]) for i in range(len(rows))]
    np.testing.assert_allclose(fl["flip_rate"], by_loop, rtol=1e-12)
    assert fl["flip_rate"].mean() == pytest.approx(ch.loc["churn", "value"], rel=1e-12)
    sp = shared_predictions(runs)
    np.testing.assert_array_equal(fl["correct_share"], (pred == sp["labels"]).mean(0))


def test_spread_question_states_what_is_missing(runs):
    row = prediction_churn(runs).set_index("measure").loc["spread_vs_disagreement"]
    assert np.isnan(row["value"]) and row["method"] == SPREAD_NOT_COMPUTED and "not computed" in row["method"]


def test_step_and_refusals(runs, tmp_path):
    assert prediction_churn(runs, step=6)["step"][0] == 6
    with pytest.raises(ValueError, match=r"^step: expected a step every run evaluated \(0, 6, 12\), got 5"):
        prediction_churn(runs, step=5)
    two = prediction_churn(runs[:2]).set_index("measure").loc["churn"]
    assert np.isnan(two["ci_low"]) and two["method"].startswith("no interval: 2 runs")
    old = _run(tmp_path / "old", None, None, None, seed=99)             # a run written before predictions were kept
    assert old.predictions() is None
    with pytest.raises(NotComputed, match="1 of 3 runs kept no predictions"):
        prediction_churn(runs[:2] + [old])


def test_churn_over_few_shared_examples_has_no_interval(tmp_path):
    "Runs that share fewer than CHURN_MIN_EXAMPLES held-out examples: churn is given, its interval refused with the count."
    from embvar_study.predictions import CHURN_MIN_EXAMPLES
    rng = np.random.default_rng(5)
    for n, refused in ((CHURN_MIN_EXAMPLES - 1, True), (CHURN_MIN_EXAMPLES, False)):
        rows, labels = np.arange(n), rng.integers(0, 2, n)
        runs = [_run(tmp_path / f"n{n}_{k}", rows, labels, {4: rng.dirichlet(np.ones(2), size=n)}, seed=k) for k in range(4)]
        t = prediction_churn(runs).set_index("measure")
        assert np.isnan(t.loc["churn", "ci_low"]) == refused and np.isfinite(t.loc["churn", "value"])
        assert ("fewer than" in t.loc["churn", "method"]) == refused
