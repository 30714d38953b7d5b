"""Drift as an instability alarm: the `alarm` field of TrainConfig (identity unchanged when unset), a run stopped by
its alarm (status `stopped_by_alarm`, counted as done by the study), and `fit_alarm` / `apply_alarm` round-tripping
through the rule loader of the live tracker (a rule fitted offline stops a live rerun where the replay says it fires)."""
import json

import pytest

from embvar_study.config import TrainConfig
from embvar_study.early_warning import fit_alarm, apply_alarm
from embvar_study.runs import load_run
from embvar_study.storage import config_hash
from embvar_study.study import RunSet, DONE_STATUSES
from embvar_study.tracking import AlarmRule, alarm_rule
from embvar_study.train import train_run


def test_alarm_field_identity(tiny_config):
    plain, armed = TrainConfig(**tiny_config), TrainConfig(**tiny_config, alarm={"threshold": 0.01})
    assert "alarm" not in plain.identity() and armed.identity()["alarm"]["threshold"] == 0.01
    # unset, the id is the hash of exactly the fields that existed before the alarm field
    ident = plain.identity()
    assert plain.run_id() == config_hash(ident) and plain.run_id() != armed.run_id()
    assert TrainConfig(**tiny_config, alarm=0.02).alarm == alarm_rule(0.02).to_dict()
    with pytest.raises(ValueError, match="alarm.signal"): TrainConfig(**tiny_config, alarm={"threshold": 0.1, "signal": "loss"})
    with pytest.raises(ValueError, match="^alarm:"): TrainConfig(**tiny_config, alarm="0.1")
    assert "stopped_by_alarm" in DONE_STATUSES


def test_fit_apply_alarm_round_trip(tiny_config, tmp_path):
    base = {**tiny_config, "max_steps": 8, "track_every": 2, "n_eval": 8}
    calm = load_run(train_run(TrainConfig(**base, lr=1e-5), tmp_path / "a"))
    wild = load_run(train_run(TrainConfig(**base, lr=5e-3), tmp_path / "b"))
    rs = RunSet.of([calm, wild])
    rule = fit_alarm(rs, at=4, recall=1.0, failed=[False, True])
    assert isinstance(rule, AlarmRule) and rule.end == 4 and rule.calibration["recall"] == 1.0
    assert rule.calibration["n_failed"] == 1 and rule.calibration["n_runs"] == 2
    # the rule survives JSON (a file the live tracker reads) unchanged
    path = tmp_path / "rule.json"; path.write_text(json.dumps(rule.to_dict()))
    assert alarm_rule(path) == rule
    hit = apply_alarm(path, wild.path)
    assert hit["fired"] and hit["value"] > rule.threshold and hit["step"] <= 4
    assert apply_alarm(rule, calm)["fired"] == (rule.calibration["successful_stopped"] == 1)
    # a live rerun of the failed run with the rule stops where the replay says it fires
    stopped = load_run(train_run(TrainConfig(**base, lr=5e-3, alarm=rule.to_dict()), tmp_path / "c"))
    assert stopped.status == "stopped_by_alarm" and stopped.alarm["step"] == hit["step"]
    assert stopped.steps[-1] == hit["step"] and stopped.marker["steps_done"] == hit["step"]
    with pytest.raises(ValueError, match="at:"): fit_alarm(rs, at=0, failed=[False, True])
    with pytest.raises(ValueError, match="no run failed"): fit_alarm(rs, at=4, failed=[False, False])


def test_stability_profile(tmp_path):
    from embvar_study.sweep import get_profile, experiment_grid, _spec, PROFILES, _CLASSIC
    data = tmp_path / "r.csv"; data.write_text("text,label\ngood,1\nbad,0\n")
    with pytest.raises(ValueError, match="^dataset: the stability profile needs"): get_profile("stability")
    p = get_profile("stability", {"dataset": str(data), "lrs": [5e-5, 1e-3], "seeds": [0, 1]})
    grid = experiment_grid(p, "stability")
    assert sorted((g["lr"], g["seed"]) for g in grid) == [(5e-5, 0), (5e-5, 1), (1e-3, 0), (1e-3, 1)]
    full = get_profile("stability", {"dataset": str(data)})
    assert len(experiment_grid(full, "stability")) == 70 and full["base"]["track_every"] == 4 == full["base"]["eval_every"]
    assert _spec(p, {}, ["stability"], None)["resolved"]["failure"]["delta"] == 0.05
    assert all("stability" not in PROFILES[k]["experiments"] for k in ("paper", "quick", "smoke")) and "stability" not in _CLASSIC


import numpy as np
import pandas as pd

from embvar_study.early_warning import STABILITY_FRACTIONS

# --- the within-configuration analysis (embvar_study.stability, issue 31) on synthetic studies at the design's size
from embvar_study import stability as ST
from embvar_study import experiment_sections as XS
from embvar_study.auc import stratified_auc


def _study(kind: str, *, seed: int, n_seeds: int = 16, lrs=(1e-4, 6e-4, 8e-4, 1e-3), p_fail=(0.0, 0.4, 0.5, 0.6),
           shared: float = 0.0) -> pd.DataFrame:
    """A signal table of len(lrs) x n_seeds runs. 'within': drift higher in a failed run than in a learned run of the same
    rate (and rising with the rate); 'rate': drift rises with the rate only, independent of the outcome within a rate;
    'loss': failure planted in the held-out loss only. The other trainer's and the field's signals are noise, plus, with
    `shared` > 0, one common factor that is `shared` SDs higher in a failed run (every base signal weakly informative)."""
    rng, r2 = np.random.default_rng(seed), np.random.default_rng(seed + 1000); rows = []   # r2: the field's signals and the common factor
    for i, (lr, p) in enumerate(zip(lrs, p_fail)):
        fail = rng.permutation(np.arange(n_seeds) < round(p * n_seeds))
        for s in range(n_seeds):
            for f in STABILITY_FRACTIONS:
                v = {f"drift_{l}": 0.1 * f + rng.normal(0, 0.02) for l in range(4)}
                v.update(velocity=rng.normal(), train_loss=rng.normal(0.69, 0.02), grad_norm=rng.normal(1, 0.1),
                         eval_acc=rng.normal(0.55, 0.03), eval_loss=rng.normal(0.69, 0.01))
                u = r2.normal() + shared * fail[s]                           # the base signals' common factor, in their SDs
                v.update(loss_decay=r2.normal(0.1, 0.02) - 0.02 * u, effective_rank=r2.normal(20, 1) - u)
                v.update(train_loss=v["train_loss"] + 0.02 * u, grad_norm=v["grad_norm"] + 0.1 * u, eval_acc=v["eval_acc"] - 0.03 * u, eval_loss=v["eval_loss"] + 0.01 * u)
                v["drift_3"] += 0.05 * i                                     # drift rises with the rate: the pooled AUC is high
                if kind == "within": v["drift_3"] += 0.06 * fail[s]
                if kind == "loss": v["eval_loss"] += 0.02 * fail[s]
                rows.append({"run_id": f"l{i}s{s:02d}", "lr": lr, "seed": s, "chance": 0.5, "failed": bool(fail[s]), "failure_step": np.nan,
                             "final_acc": 0.5 if fail[s] else 0.75 + rng.normal(0, 0.02), "fraction": f, "step": int(f * 40), "total_steps": 40, **v})
    return pd.DataFrame(rows)


def _at(t, f, col="signal", name="drift, last layer"): return t[np.isclose(t["fraction"], f) & (t[col] == name)].iloc[0]


def test_within_rate_failure_in_drift_is_recovered():
    sig = _study("within", seed=3, shared=1.0)
    wa = ST.within_auc_table(ST.within_scores(sig))
    for f in STABILITY_FRACTIONS:
        r = _at(wa, f)
        assert r["auc"] >= 0.9 and r["low"] > 0.5 and r["reading"] == "separates within rates", r
        assert (r["failed"], r["learned"]) == (24, 24)                       # the mixed rates only (1e-4 never fails)
        b = _at(wa, f, name="drift, best layer")
        assert b["auc"] >= 0.9
    inc = ST.incremental_value(sig)
    assert (inc["low"] > 0).all(), inc                                      # drift adds to weak base signals ...
    # ... but the cross-validated model without drift scores below its best single signal: the increment is refused, said why
    single = ST.within_auc_table(ST.within_scores(sig)).query("signal in @ST.BASE_NAMES").groupby("fraction")["auc"].max()
    assert (inc["auc_base"].to_numpy() < single.to_numpy()).all() and np.allclose(inc["best_single_auc"], single)
    ans = ST.stability_answer(inc, wa, ST.pooled_auc_table(sig))
    assert ans["verdict"] == "refused" and "scores below its best single signal" in ans["text"], ans
    ok = inc.assign(refused="")                                             # the same rows with a baseline at least its best signal
    ans = ST.stability_answer(ok, wa, ST.pooled_auc_table(sig))
    assert ans["verdict"] == "adds information" and ans["text"].startswith("Drift adds information")
    es = ST.early_stopping_table(sig, n_draws=500).set_index(["fraction", "selection"])
    d, r, a = es.loc[(0.2, "drift, last layer")], es.loc[(0.2, "at random")], es.loc[(0.2, "all t finished")]
    assert d["learned_kept"] > 0.99 > r["learned_kept"] and d["expected_best"] > r["expected_best"]   # drift keeps the runs that learn
    assert a["compute"] == 1 and d["compute"] == pytest.approx((8 * 8 + 2 * 32) / (8 * 40))          # t=8 started, p=2 finished from step 8 of 40
    ac = ST.alarm_cost(sig)
    a = ac[ac["signal"] == "drift, last layer"]
    assert (a["p"] < 0.05).all() and a["verdict"].str.startswith("fewer successful runs stopped").all()


def test_drift_that_tracks_the_rate_only():
    sig = _study("rate", seed=4)
    pooled = ST.pooled_auc_table(sig)
    wa = ST.within_auc_table(ST.within_scores(sig))
    for f in STABILITY_FRACTIONS:
        p = _at(pooled, f)
        assert p["auc"] >= 0.75 and p["low"] > 0.5                          # pooled over rates drift "predicts" failure ...
        lr = _at(pooled, f, name="learning rate (known before training)")
        assert lr["auc"] >= 0.75                                            # ... as the rate alone does
        w = _at(wa, f)
        assert w["low"] < 0.5 < w["high"], w                                # within rates it does not
    ans = ST.stability_answer(ST.incremental_value(sig), wa, pooled)
    assert ans["verdict"] in ("adds none", "undecided", "refused"), ans
    # the drift alarm is the learning rate in disguise: it stops no fewer successful runs than the rate alone
    ac = ST.alarm_cost(sig)
    a = ac[ac["signal"] == "drift, last layer"]
    assert (a["verdict"] == "no better than the rate").all() and (a["p"] >= 0.05).all(), a


def test_trainer_signal_planted_drift_adds_nothing():
    sig = _study("loss", seed=5)
    wa = ST.within_auc_table(ST.within_scores(sig))
    assert _at(wa, 0.2, name="held-out loss")["low"] > 0.5
    inc = ST.incremental_value(sig).set_index("fraction")
    assert inc.loc[0.2, "auc_base"] > 0.8 and inc.loc[0.2, "low"] < 0 < inc.loc[0.2, "high"] + 1e-12


def test_direction_is_never_flipped_to_below_chance():
    sig = _study("within", seed=6)
    sig["eval_acc"] = sig["eval_acc"] + 0.05 * sig["failed"]                 # failed runs have *higher* held-out accuracy here
    wa = ST.within_auc_table(ST.within_scores(sig))
    r = _at(wa, 0.2, name="held-out accuracy")
    assert r["auc"] < 0.5 and r["reading"] == "below chance: not compared" and r["direction"] == "lower = failed (definition)"
    g = _at(wa, 0.2, name="gradient norm")
    assert g["direction"].startswith("chosen on other seeds")
    ws = ST.within_scores(sig)
    s = ws[np.isclose(ws["fraction"], 0.2) & (ws["signal"] == "held-out accuracy")]
    t = sig[np.isclose(sig["fraction"], 0.2)].set_index("run_id").loc[s["run_id"]]
    assert np.allclose(s["score"].to_numpy(), -t["eval_acc"].to_numpy())    # the fixed direction, the same for every run
    assert stratified_auc(s["score"].to_numpy(), s["failed"].to_numpy(bool), s["lr"].to_numpy()) == pytest.approx(r["auc"])


def _tables(sig):  # what stability_tables returns, from a synthetic signal table (no study folder)
    from embvar_study.sweep import STABILITY_FAILURE
    return ST.stability_analysis(sig, STABILITY_FAILURE, n_draws=200)


def test_stability_section_from_tables(monkeypatch):
    """The section opens with the answer figure and the computed answer; its sentences and tables come from the tables
    (the verdict, the counts and the answer's numbers change with the data); the full AUC tables are in the appendix."""
    from embvar_study.display import Table, Figure
    out = {}
    for kind in ("within", "rate"):
        T = _tables(_study(kind, seed=3))
        monkeypatch.setattr(ST, "stability_tables", lambda study, pooling="mean", T=T: T)
        items = XS.stability_section(object())
        assert isinstance(items[0], Figure) and items[0].name == "within_auc"
        assert items[1] == "**Does drift add anything beyond the learning rate?** " + T["answer"]["text"]
        ax = items[0].fig.axes[0]; wa = T["within"]
        for j, s in enumerate(dict.fromkeys(wa["signal"])):                  # each errorbar line is the table's AUCs of one signal
            assert np.allclose(ax.containers[j].lines[0].get_ydata(), wa[wa["signal"] == s].sort_values("fraction")["auc"])
        r = wa[np.isclose(wa["fraction"], 0.2)].sort_values("auc", ascending=False).iloc[0]
        assert f"At 20% the highest is {r['signal']} ({r['auc']:.2f})" in items[0].alt
        assert sum(isinstance(i, Table) for i in items) == 6
        text = "\n".join(i for i in items if isinstance(i, str))
        assert "No interval: " in text and "of 64 runs failed" in text and "not computed" not in text
        app = items.index("**Appendix: every signal's AUC.**")
        assert [i.caption.split(" ")[0] for i in items[app:] if isinstance(i, Table)] == ["Stratified", "Pooled"]
        out[kind] = T["answer"]["verdict"]
    assert out["within"] == "refused" and out["rate"] != "adds information"


def test_early_stopping_figure_in_the_section(monkeypatch):
    "Right before the early-stopping table: one line per selection rule and the all-t reference, drawn from the table; the caption's numbers are the table's."
    import matplotlib.pyplot as plt
    from embvar_study.display import Table, Figure
    T = _tables(_study("within", seed=3))
    es = T["early"]
    for k in (0, 1):
        if k:   # the same section on a table where random selection wins at 50% and finishing all is lower: the caption follows
            es = es.copy(); es.loc[np.isclose(es["fraction"], 0.5) & (es["selection"] == "at random"), "expected_best"] = 0.99
            es.loc[es["selection"] == "all t finished", "expected_best"] = 0.6; T = {**T, "early": es}
        monkeypatch.setattr(ST, "stability_tables", lambda study, pooling="mean", T=T: T)
        items = XS.stability_section(object())
        figs = [i for i, x in enumerate(items) if isinstance(x, Figure) and x.name == "early_stopping"]
        assert len(figs) == 1
        nxt = items[figs[0] + 1]
        assert isinstance(nxt, Table) and nxt.caption.startswith("Dodge et al.'s early stopping")       # placed right before the table
        f = items[figs[0]]; ax = f.fig.axes[0]
        rules = ["drift, last layer", "held-out accuracy", "training loss", "at random"]
        assert [l.get_label() for l in ax.lines] == rules + ["all t finished (8 seeds)"]
        for line, rule in zip(ax.lines, rules):                                                         # each line is the table's column
            t = es[es["selection"] == rule].sort_values("fraction")
            assert np.allclose(line.get_xdata(), t["fraction"]) and np.allclose(line.get_ydata(), t["expected_best"])
        full = es.loc[es["selection"] == "all t finished", "expected_best"].to_numpy()
        assert np.allclose(ax.lines[-1].get_ydata(), full.mean())
        # the caption against the table, recomputed here with numpy
        cap = f.alt; r = es[es["selection"] != "all t finished"]
        fr = np.sort(r["fraction"].unique()); acc = np.array([[r[np.isclose(r["fraction"], x) & (r["selection"] == s)]["expected_best"].iloc[0] for s in rules] for x in fr])
        win = acc.argmax(1); gain = acc.max(1) - acc[:, 3]
        for x, w, g in zip(fr, win, gain):
            assert (f"{x:.0%} (random itself" if w == 3 else f"{x:.0%} ({g:+.3f} over random)") in cap, (x, cap)
        comp = [r[np.isclose(r["fraction"], x)]["compute"].iloc[0] for x in fr]
        assert "Compute spent, a share of finishing all 8: " + ", ".join(f"{c:.0%} at {x:.0%}" for c, x in zip(comp, fr)) in cap
        i, j = np.unravel_index(acc.argmax(), acc.shape); gap = full.mean() - acc[i, j]
        assert (f"The highest point, {rules[j]} at {fr[i]:.0%} ({acc[i, j]:.3f} for {comp[i]:.0%} of the compute), "
                f"is {abs(gap):.3f} {'below' if gap > 0 else 'above'} finishing all 8.") in cap, cap
        assert f"finishing all 8 ({full.mean():.3f})" in cap and cap.count("No interval: ") == 1 and ST.EARLY_STOP_CI_METHOD[len("no interval: "):] in cap
        if k == 0: assert win[:3].tolist() == [0, 0, 0] and gap > 0 and "Highest: selection by drift, last layer at 10%" in cap   # planted in drift
        else: assert win[-1] == 3 and gap < 0 and "above finishing all 8" in cap and "50% (random itself: no selection beats it)" in cap
        plt.close(f.fig)


def test_an_auc_below_half_is_worded_as_the_reverse_direction():
    "Failed runs that drift less (the within-rate AUC mirrored, as negated drift gives): never 'separates', the reverse way named."
    sig = _study("within", seed=3)
    wa, pooled, inc = ST.within_auc_table(ST.within_scores(sig)), ST.pooled_auc_table(sig), ST.incremental_value(sig)
    rev = wa.copy(); m = rev["signal"] == "drift, last layer"
    rev.loc[m, ["auc", "low", "high"]] = np.c_[1 - wa.loc[m, "auc"], 1 - wa.loc[m, "high"], 1 - wa.loc[m, "low"]]
    w = _at(rev, 0.2)
    assert w["auc"] < 0.1 and w["high"] < 0.5
    text = ST.stability_answer(inc, rev, pooled, fraction=0.2)["text"]
    assert "alone separates" not in text and "Drift at the last layer alone points the reverse way: lower in the failed than in the learned runs" in text
    assert f"AUC {w['auc']:.2f} [{w['low']:.2f}, {w['high']:.2f}] ({1 - w['auc']:.2f} read as lower values marking failure)" in text
    assert "Drift at the last layer alone separates failed from learned runs of the same rate (higher in the failed runs) with AUC" in \
        ST.stability_answer(inc, wa, pooled, fraction=0.2)["text"]


# --- the runs as a benchmark (issue 40 item 5): signals_table and score_signal
def test_signals_table_round_trip_and_drift_reproduces_the_section(tmp_path):
    sig = _study("within", seed=7)
    tab = ST.signals_table(sig)
    assert list(tab.columns[:6]) == ["run_id", "lr", "seed", "outcome", "fraction", "step"]
    assert set(tab["outcome"]) == {0, 1} and (tab["outcome"] == sig["failed"].astype(int)).all()
    assert all(pd.api.types.is_numeric_dtype(tab[c]) for c in tab.columns if c != "run_id")        # numbers only (the id a hash)
    tab.to_csv(tmp_path / "signals.csv", index=False); back = pd.read_csv(tmp_path / "signals.csv")  # as a user reads it
    sc = ST.score_signal(back, "drift_3")
    assert list(sc.columns[:8]) == ["fraction", "step", "auc", "ci_low", "ci_high", "increment", "increment_low", "increment_high"]
    wa = ST.within_auc_table(ST.within_scores(sig)); d = wa[wa["signal"] == "drift, last layer"].sort_values("fraction")
    assert np.allclose(sc["auc"], d["auc"]) and np.allclose(sc["ci_low"], d["low"]) and np.allclose(sc["ci_high"], d["high"])
    inc = ST.incremental_value(sig)
    assert np.allclose(sc["increment"], inc["diff"]) and np.allclose(sc["increment_low"], inc["low"])
    assert (sc["refused"] == inc["refused"]).all()
    # a function of one fraction's rows (no outcome column given to it) scores the same as the column
    seen = []
    f = lambda t: (seen.append("outcome" in t or "failed" in t), t["drift_3"].to_numpy())[1]
    assert np.allclose(ST.score_signal(back, f, increment=False)["auc"], sc["auc"]) and not any(seen)
    with pytest.raises(ValueError, match="^signal: expected a column"): ST.score_signal(back, "nope")
    with pytest.raises(ValueError, match="^signal: expected one score per row"): ST.score_signal(back, lambda t: np.zeros(3))
    with pytest.raises(ValueError, match="^table: expected a stability.signals_table"): ST.score_signal(back.drop(columns="outcome"), "drift_3")


def test_a_noise_signal_interval_covers_half():
    "A pure-noise column's within-rate AUC interval covers 0.5 near its nominal 95% at 14 seeds x 3 mixed rates (600 intervals)."
    tab = ST.signals_table(_study("rate", seed=8, n_seeds=14, lrs=(4e-4, 5e-4, 6e-4), p_fail=(0.25, 0.5, 0.75)))
    rng, hits, n = np.random.default_rng(0), 0, 0
    for _ in range(150):
        sc = ST.score_signal(tab.assign(noise=rng.normal(size=len(tab))), "noise", increment=False)
        hits += int(((sc["ci_low"] < 0.5) & (sc["ci_high"] > 0.5)).sum()); n += len(sc)
    assert n == 600 and 0.92 <= hits / n <= 0.985, hits / n
    few = ST.score_signal(ST.signals_table(_study("rate", seed=8, n_seeds=4, lrs=(5e-4,), p_fail=(0.5,))), "drift_3", increment=False)
    assert few["ci_low"].isna().all() and (few["no_interval"] == "fewer than 6 failed or learned runs in the mixed rates").all()   # said, not a bare NaN
