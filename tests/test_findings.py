"""Every sentence of the findings is computed: on synthetic studies where drift grows with the learning rate, where the
effect is reversed (the high rate's runs hold embeddings that barely move) and where it is absent (two rates 1% apart),
`report.key_findings` says so, and `report.findings` (the Conclusions) changes with it. The numbers are checked against
the analysis tables they come from."""
import hashlib, json, shutil

import numpy as np
import pytest

from embvar_study import analysis as A
from embvar_study.findings import key_findings, findings, limitations, compare_intervals
from embvar_study.study import load_study
from embvar_study.synthetic import synthetic_study

N = 200   # bootstrap resamples: enough for the verdicts, fast


def _by_key(fs): return {f["key"]: f for f in fs}


def _swap_embeddings(study_dir, donor_dir, lr, donor_lr):
    "Give the lr_sweep runs at `lr` the embeddings of the donor study's runs at `donor_lr` (same seeds, probes and steps); COMPLETE re-hashed."
    st, donor = load_study(study_dir), load_study(donor_dir)
    for seed in st.runs("lr_sweep").where(lr=lr).table["seed"]:
        run = st.runs("lr_sweep").where(lr=lr, seed=seed).runs[0]
        src = donor.runs("lr_sweep").where(lr=donor_lr, seed=seed).runs[0]
        shutil.rmtree(run.path / "embeddings"); shutil.copytree(src.path / "embeddings", run.path / "embeddings")
        marker = json.loads((run.path / "COMPLETE").read_text())
        marker["files"] = {rel: hashlib.sha256((run.path / rel).read_bytes()).hexdigest() for rel in marker["files"]}
        (run.path / "COMPLETE").write_text(json.dumps(marker))
        (run.path / ".verified").unlink(missing_ok=True)
        for f in run.path.glob(".verif*"): f.unlink()


@pytest.fixture(scope="module")
def forward(shared_study):   # the session's synthetic study (conftest.py)
    return shared_study


def test_drift_grows_with_the_rate_and_the_findings_say_so(forward):
    fs = _by_key(key_findings(forward, n_resamples=N))
    s = A.drift_summary(forward.runs("lr_sweep"), "lr", n_resamples=N)
    last = s[s["step"] == s["step"].max()].set_index("lr")
    le = fs["lr_effect"]
    assert le["verdict"] == "larger" and le["text"].startswith("A higher learning rate moves the embeddings further")
    assert le["value"] == pytest.approx(last.loc[5e-4, "drift"] / last.loc[5e-5, "drift"])
    assert f"{le['value']:.1f} times the lowest rate's" in le["text"]
    d = fs["drift_lr_5e-4"]
    assert d["value"] == pytest.approx(last.loc[5e-4, "drift"]) and d["ci"] == pytest.approx((last.loc[5e-4, "ci_low"], last.loc[5e-4, "ci_high"]))
    for lr in ("5e-5", "5e-4"):                                  # a constant schedule spends more learning rate: more drift
        assert fs[f"schedule_constant_{lr}"]["verdict"] == "larger" and "more drift than the linear one" in fs[f"schedule_constant_{lr}"]["text"]
    ct = A.collapse_table(forward.runs("schedule"), n_resamples=N)
    comp = ct[ct["gap_cum_lr"].notna()]
    want = ("no interval" if comp["gap_cum_lr_high"].isna().all()        # the gaps' intervals are refused (see collapse_table's ci_method)
            else "yes" if (comp["gap_cum_lr_high"] <= 0.10).all() else "no" if (comp["gap_cum_lr_low"] > 0.10).any() else "unclear")
    assert fs["collapse"]["verdict"] == want                      # the 10% rule, read off the collapse table
    assert ("fall onto one curve" in fs["collapse"]["text"]) == (want == "yes")
    assert fs["collapse"]["value"] == pytest.approx(comp["gap_cum_lr"].max())
    md = findings(forward, n_resamples=N)
    assert le["text"] in md and "->" not in md and 3 <= md.count("- ") <= 5


def test_a_reversed_effect_gives_the_opposite_sentence(tmp_path):
    sd = synthetic_study(tmp_path / "rev")
    donor = synthetic_study(tmp_path / "donor", lrs=(5e-5, 5e-7))
    _swap_embeddings(sd, donor, 5e-4, 5e-7)                      # the 5e-4 runs now barely move
    st = load_study(sd)
    fs = _by_key(key_findings(st, n_resamples=N))
    le = fs["lr_effect"]
    assert le["verdict"] == "smaller" and le["text"].startswith("A higher learning rate moves the embeddings less")
    assert le["value"] < 1
    assert fs["schedule_constant_5e-4"]["verdict"] == "larger"   # the constant runs were left alone: now far above the linear ones
    assert fs["collapse"]["verdict"] in ("no", "unclear", "no interval") and "fall onto one curve" not in fs["collapse"]["text"]
    assert "moves the embeddings less" in findings(st, n_resamples=N)


def test_an_absent_effect_gives_a_not_shown_sentence(tmp_path):
    st = load_study(synthetic_study(tmp_path / "flat", lrs=(5e-5, 5.02e-5)))
    fs = _by_key(key_findings(st, n_resamples=N))
    le = fs["lr_effect"]
    assert le["verdict"] == "overlap" and le["text"].startswith("Not shown that the learning rate changes final drift")
    md = findings(st, n_resamples=N)
    assert "Not shown that the learning rate" in md and "moves the embeddings further" not in md


def test_the_interval_rule_against_its_definition():
    rng = np.random.default_rng(0)
    for _ in range(200):
        a, b = np.sort(rng.normal(size=2)), np.sort(rng.normal(size=2))
        want = "larger" if a[0] > b[1] else "smaller" if a[1] < b[0] else "overlap"
        assert compare_intervals(tuple(a), tuple(b)) == want
    assert compare_intervals((np.nan, 1.0), (0.0, 1.0)) == "no interval"


def test_limitations_are_computed_from_the_runs(forward):
    lim = limitations(forward)
    runs = forward.all_runs().runs
    steps = {int(r.marker.get("total_steps") or r.steps.max()) for r in runs}
    assert f"**Training**: {min(steps)} optimizer steps per run" in lim
    n = forward.runs("lr_sweep").table.groupby("lr").size()
    assert f"**Seeds**: {n.min()} seeds per learning rate" in lim
    assert "**Reference**: Where this study differs from the reference: the model is synthetic" in lim
