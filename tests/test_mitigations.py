"""mitigations: each arm's effects recomputed from the run folders with plain loops over seeds and pairs (issue 39, item 5);
pairing by seed; verdicts; the EMA arm read from the baseline's runs; ensembles against loops; refusals."""
import itertools

import numpy as np
import pytest
from scipy import stats as sps

from embvar_study.mitigations import Verdict, ensemble_spread, mitigation_effects, verdict
from embvar_study.run_writer import RunWriter
from embvar_study.runs import load_run, step_file
from embvar_study.study_folder import NotComputed

N, D, M, SEEDS = 10, 4, 30, [3, 5, 7, 11, 13, 17, 19, 23]


def _run(folder, seed, emb0, emb, probs, acc, secs, ema=None):
    with RunWriter(folder, {"seed": seed, "where": folder.name}, [{"text": f"p{i}"} for i in range(N)]) as w:
        for s, e in ((0, emb0), (6, emb)): w.save_embeddings(s, {"mean": np.stack([e, e, e]).astype(np.float32)})
        extra = {}
        if ema is not None:                                              # the averaged weights' embeddings, as training writes them
            for s, e in ((0, emb0), (6, ema)): w.save_array(step_file(s, "mean", "ema"), np.stack([e, e, e]).astype(np.float32))
            extra = {"ema": {"decay": 0.9, "steps": [0, 6]}}
        w.save_array("predictions/examples.npy", np.c_[np.arange(100, 100 + M), np.arange(M) % 3])
        w.save_array("predictions/step_000006.npy", probs.astype(np.float32))
        w.log(step=3, eval_loss=1.0, eval_acc=0.1)                     # an earlier evaluation: the last one counts
        w.log(step=6, eval_loss=0.5, eval_acc=acc, **({} if ema is None else {"ema_eval_loss": 0.4, "ema_eval_acc": acc + 0.01 * seed}))
        w.finish(timing={"train_s": secs, "eval_s": 0.25, "track_s": 0.125}, **extra)
    return load_run(folder)


@pytest.fixture(scope="module")
def arms(tmp_path_factory):
    "A baseline and two arms over 8 seeds (listed in another order in one arm), 3 classes on 30 held-out examples."
    root, rng = tmp_path_factory.mktemp("mit"), np.random.default_rng(0)
    mu = rng.standard_normal((N, D))
    out = {"baseline": [], "quiet": [], "loud": []}
    for s in SEEDS:
        Z = rng.standard_normal((N, D))
        for arm, sd in (("baseline", 0.4), ("quiet", 0.15), ("loud", 0.8)):
            emb = mu + sd * Z + 0.05 * rng.standard_normal((N, D))
            ema = mu + 0.5 * sd * Z if arm == "baseline" else None
            out[arm].append(_run(root / f"{arm}{s}", s, mu, emb, rng.dirichlet(np.ones(3) * (1 + 5 * sd), size=M),
                                 0.6 + 0.05 * rng.standard_normal(), 2.0 + (arm == "loud") + 0.1 * rng.standard_normal(), ema))
    out["loud"] = out["loud"][::-1]
    return out


def _cos_drift(a, b): return np.mean([1 - a[i] @ b[i] / np.linalg.norm(a[i]) / np.linalg.norm(b[i]) for i in range(len(a))])


def _loop_effects(base, arm):
    "The effects by loops over seeds and pairs, from the files: (measure -> (baseline, value, effect, low, high))."
    by = lambda runs: {r.config["seed"]: r for r in runs}
    b, a = by(base), by(arm); seeds = sorted(set(b) & set(a)); K = len(seeds)
    emb = lambda r: np.load(r.path / "embeddings" / "step_000006.mean.npy")[-1].astype(np.float64)
    e0 = lambda r: np.load(r.path / "embeddings" / "step_000000.mean.npy")[-1].astype(np.float64)
    lab = lambda r: np.load(r.path / "predictions" / "step_000006.npy").argmax(-1)
    def raw(runs):   # the mean squared distance to the runs' mean, per probe summed over dimensions, mean over probes
        X = [emb(r) for r in runs]; m = sum(X) / len(X)
        return np.mean([sum(((x[i] - m[i]) ** 2).sum() for x in X) / len(X) for i in range(N)])
    def churn(runs):
        L = [lab(r) for r in runs]
        return np.mean([np.mean(L[i] != L[j]) for i, j in itertools.combinations(range(len(L)), 2)])
    tq = sps.t.ppf(0.975, K - 1)
    jk = lambda loo: np.sqrt((K - 1) / K * sum((v - np.mean(loo)) ** 2 for v in loo))
    A, B = (lambda keep: [a[s] for s in keep]), (lambda keep: [b[s] for s in keep])
    drop = lambda t: [s for s in seeds if s != t]
    # raw: the ratio arm / baseline; its interval from the log ratio, leaving one seed out of both arms
    lr = np.log(raw(A(seeds)) / raw(B(seeds))); se = jk([np.log(raw(A(drop(t))) / raw(B(drop(t)))) for t in seeds])
    out = {"raw": (raw(B(seeds)), raw(A(seeds)), np.exp(lr), np.exp(lr - tq * se), np.exp(lr + tq * se))}
    d = churn(A(seeds)) - churn(B(seeds)); se = jk([churn(A(drop(t))) - churn(B(drop(t))) for t in seeds])
    out["churn"] = (churn(B(seeds)), churn(A(seeds)), d, d - tq * se, d + tq * se)
    acc = lambda r: float(r.history["eval_acc"].dropna().iloc[-1])
    secs = lambda r: sum(r.marker["timing"].values())
    for name, f in (("accuracy", acc), ("drift", lambda r: _cos_drift(e0(r), emb(r))), ("seconds", secs)):
        d = [f(a[s]) - f(b[s]) for s in seeds]
        m, se = np.mean(d), np.std(d, ddof=1) / np.sqrt(K)
        out[name] = (np.mean([f(b[s]) for s in seeds]), np.mean([f(a[s]) for s in seeds]), m, m - tq * se, m + tq * se)
    return out


@pytest.mark.parametrize("arm", ["quiet", "loud"])
def test_effects_recomputed_from_the_run_folders(arms, arm):
    t = mitigation_effects(arms, "baseline").query("arm == @arm").set_index("measure")
    ref = _loop_effects(arms["baseline"], arms[arm])
    for m, (b, v, e, lo, hi) in ref.items():
        np.testing.assert_allclose(t.loc[m, ["baseline", "value", "effect", "ci_low", "ci_high"]].to_numpy(float), [b, v, e, lo, hi],
                                   rtol=1e-5, atol=1e-7, err_msg=m)
        assert t.loc[m, "verdict"] == verdict(lo, hi, 1.0 if m == "raw" else 0.0, b) and t.loc[m, "n_seeds"] == len(SEEDS)
    assert t.loc["raw", "verdict"] == (Verdict.REDUCES if arm == "quiet" else Verdict.INCREASES)
    assert np.isnan(t.loc["aligned", "ci_low"]) and "not simulated" in t.loc["aligned", "method"]


def test_ema_arm_reads_the_baseline_runs_averaged_weights(arms):
    "weights={'ema': 'ema'}: the baseline's own runs, their embeddings_ema/ and ema_eval_acc; churn refused (no predictions kept)."
    t = mitigation_effects({**arms, "ema": arms["baseline"]}, weights={"ema": "ema"}).query("arm == 'ema'").set_index("measure")
    ema = [np.load(r.path / "embeddings_ema" / "step_000006.mean.npy")[-1].astype(np.float64) for r in arms["baseline"]]
    m = sum(ema) / len(ema)
    raw = np.mean([sum(((x[i] - m[i]) ** 2).sum() for x in ema) / len(ema) for i in range(N)])
    np.testing.assert_allclose(t.loc["raw", "value"], raw, rtol=1e-5)
    np.testing.assert_allclose(t.loc["accuracy", "effect"], np.mean([0.01 * s for s in SEEDS]), rtol=1e-5)
    assert t.loc["raw", "verdict"] == Verdict.REDUCES and np.isnan(t.loc["churn", "value"]) and "not kept" in t.loc["churn", "method"]


def test_seeds_are_paired_not_positional(arms):
    "The loud arm is listed in reverse seed order: pairing by seed gives the same table as the sorted list."
    a = mitigation_effects(arms, "baseline").query("arm == 'loud'").reset_index(drop=True)
    b = mitigation_effects({**arms, "loud": arms["loud"][::-1]}, "baseline").query("arm == 'loud'").reset_index(drop=True)
    np.testing.assert_array_equal(a["effect"].to_numpy(), b["effect"].to_numpy())
    part = mitigation_effects({"baseline": arms["baseline"], "few": arms["quiet"][:3]}).set_index("measure")
    assert (part["n_seeds"] == 3).all()                            # only the seeds both arms have


def test_refusals(arms):
    with pytest.raises(ValueError, match="baseline: expected one of the arms"): mitigation_effects(arms, "nope")
    with pytest.raises(ValueError, match="weights: expected arm names"): mitigation_effects(arms, weights={"x": "ema"})
    with pytest.raises(ValueError, match="weights: expected one of"): mitigation_effects(arms, weights={"quiet": "ema"})
    with pytest.raises(NotComputed, match="at least 2 seeds"): mitigation_effects({"baseline": arms["baseline"][:1], "q": arms["quiet"][:1]})
    with pytest.raises(ValueError, match="one run per seed"): mitigation_effects({"baseline": arms["baseline"] + arms["quiet"][:1], "q": arms["quiet"]})
    two = mitigation_effects({"baseline": arms["baseline"][:2], "q": arms["quiet"][:2]}).set_index("measure")
    assert "no interval" in two.loc["raw", "method"] and two.loc["raw", "verdict"] == Verdict.NOT_SHOWN


def test_ensembles_against_loops(arms):
    runs = arms["loud"]                                             # reversed: ensembles are formed in seed order
    es = ensemble_spread(runs, sizes=(1, 2, 4, 8)).set_index(["k", "measure"])
    srt = sorted(runs, key=lambda r: r.config["seed"])
    E = [np.load(r.path / "embeddings" / "step_000006.mean.npy")[-1].astype(np.float64) for r in srt]
    P = [np.load(r.path / "predictions" / "step_000006.npy").astype(np.float64) for r in srt]
    for k in (1, 2, 4):
        groups = [list(range(g * k, (g + 1) * k)) for g in range(len(srt) // k)]
        me = [sum(E[i] for i in g) / k for g in groups]; mp = [sum(P[i] for i in g) / k for g in groups]
        pairs = list(itertools.combinations(range(len(groups)), 2))
        emb = np.mean([((me[a] - me[b]) ** 2).sum(-1).mean() / 2 for a, b in pairs])
        prob = np.mean([((mp[a] - mp[b]) ** 2).sum(-1).mean() / 2 for a, b in pairs])
        churn = np.mean([np.mean(mp[a].argmax(-1) != mp[b].argmax(-1)) for a, b in pairs])
        np.testing.assert_allclose([es.loc[(k, "embedding"), "value"], es.loc[(k, "probabilities"), "value"],
                                    es.loc[(k, "churn"), "value"]], [emb, prob, churn], rtol=1e-6)
        np.testing.assert_allclose(es.loc[(k, "embedding"), "reference"], es.loc[(1, "embedding"), "value"] / k, rtol=1e-12)
    assert np.isnan(es.loc[(8, "embedding"), "value"]) and "needs 2 (at least 16 runs)" in es.loc[(8, "churn"), "method"]


def test_verdict_reads_the_interval():
    assert [verdict(-1, -0.1), verdict(0.1, 1), verdict(-1, 1), verdict(np.nan, 1)] == \
        [Verdict.REDUCES, Verdict.INCREASES, Verdict.NOT_SHOWN, Verdict.NOT_SHOWN]


def test_an_effect_within_the_margin_is_negligible_not_a_reduction():
    "An interval that excludes no-effect but stays within 10% of it (a ratio 0.9998 [0.9997, 0.9999]) is negligible."
    from embvar_study.mitigations import MITIGATION_MARGIN
    m = MITIGATION_MARGIN
    assert verdict(0.9997, 0.9999, 1.0) == Verdict.NEGLIGIBLE == verdict(1 / (1 + m), 1 + m, 1.0)
    assert verdict(0.5, 0.9, 1.0) == Verdict.REDUCES and verdict(0.5, 1.2, 1.0) == Verdict.NOT_SHOWN
    assert verdict(-3e-7, -1e-7, 0.0, 0.0135) == Verdict.NEGLIGIBLE          # a drift difference of 3e-7 on 0.0135
    assert verdict(-0.002, -0.001, 0.0, 0.0135) == Verdict.REDUCES and verdict(-0.1, -0.01, 0.0, np.nan) == Verdict.REDUCES


def test_an_arm_identical_to_the_baseline_is_named_not_measured(arms):
    "An arm whose runs end bit-identical to the baseline's (warmup 6% of 8 steps = 0 steps) gets no effect and no verdict."
    t = mitigation_effects({"baseline": arms["baseline"], "same": arms["baseline"]}, "baseline").query("arm == 'same'")
    assert t["effect"].isna().all() and (t["verdict"] == Verdict.NOT_SHOWN).all()
    assert t["method"].str.contains("bit-identical to the baseline").all()


def test_answers_follow_the_computed_verdicts(arms):
    "The survey's statements answered from the table: an arm that lowers seed variance supports, one that raises it contradicts."
    from embvar_study.findings import mitigation_answers
    me = mitigation_effects({"baseline": arms["baseline"], "batch_32": arms["quiet"], "ema": arms["loud"], "warmup_0": arms["loud"]})
    es = ensemble_spread(arms["baseline"])
    a = mitigation_answers(me, es)
    assert a[0].startswith("**Warmup reduces instability: supported**") and "training without warmup increases" in a[0]
    assert a[1].startswith("**Larger batches lower variance across seeds: supported**")
    assert a[2].startswith("**Averaging the weights reduces variance: contradicted**")
    r = es.query("k == 4 and measure == 'embedding'").iloc[0]
    assert f"k = 4: the mean embeddings spread {r['ratio']:.3g}x 1/k" in a[3]


def test_runs_without_shared_held_out_rows_give_the_reason(tmp_path):
    "Seeds that hold out disjoint rows: churn and the ensembles' prediction spread are refused with the reason, the rest computed."
    rng, mu = np.random.default_rng(3), np.zeros((N, D))
    arms = {a: [] for a in ("baseline", "other")}
    for s in range(4):
        for a in arms:
            folder = tmp_path / f"{a}{s}"
            with RunWriter(folder, {"seed": s, "arm": a}, [{"text": f"p{i}"} for i in range(N)]) as w:
                for st, e in ((0, mu + 1), (6, mu + 1 + rng.standard_normal((N, D)))):
                    w.save_embeddings(st, {"mean": np.stack([e] * 3).astype(np.float32)})
                w.save_array("predictions/examples.npy", np.c_[np.arange(M) + 1000 * s, np.zeros(M, int)])   # rows of this seed only
                w.save_array("predictions/step_000006.npy", rng.dirichlet(np.ones(2), size=M).astype(np.float32))
                w.log(step=6, eval_loss=0.5, eval_acc=0.5); w.finish()
            arms[a].append(load_run(folder))
    t = mitigation_effects(arms).set_index("measure")
    assert np.isnan(t.loc["churn", "effect"]) and "share no held-out example" in t.loc["churn", "method"]
    assert np.isfinite(t.loc["raw", "ci_low"]) and np.isnan(t.loc["seconds", "effect"]) and "missing" in t.loc["seconds", "method"]
    es = ensemble_spread(arms["baseline"], sizes=(1, 2)).set_index(["k", "measure"])
    assert np.isfinite(es.loc[(2, "embedding"), "value"]) and "share no held-out example" in es.loc[(2, "churn"), "method"]


def test_the_ratio_axis_has_no_overlapping_minor_labels(arms):
    "The seed-variance ratios sit near 1 on a log axis: only its major ticks are labelled (minor labels ran together)."
    import matplotlib.pyplot as plt
    from embvar_study.plots import plot_mitigation_effects
    fig = plot_mitigation_effects(mitigation_effects(arms, "baseline")); fig.canvas.draw()
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and not [t.get_text() for t in ax.get_xticklabels(minor=True) if t.get_text()]
    plt.close(fig)
