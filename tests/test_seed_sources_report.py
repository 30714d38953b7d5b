"""The report's seed-sources section (issue 38, item 6) and its Conclusions sentences, on a synthetic seed_sources study with
predictions (`synthetic.synthetic_seed_sources`): the section renders, its numbers and the sentences' are recomputed here with
numpy from the run folders, and a study without the experiment leaves the section off."""
import numpy as np
import pytest
from scipy import stats

from embvar_study.findings import key_findings, findings
from embvar_study.sections import NOT_APPLICABLE, section_items, section_seed_sources
from embvar_study.display import Figure, to_html
from embvar_study.study import load_study
from embvar_study.runs import load_run
from embvar_study.synthetic import synthetic_seed_sources
from embvar_study.words import format_value


@pytest.fixture(scope="module")
def ss(tmp_path_factory):
    return load_study(synthetic_seed_sources(tmp_path_factory.mktemp("ss") / "study"))


def _arm(study, factor, layer=-1):
    "(K, N, d) last-step embeddings of one arm's runs, read straight from the run folders."
    m = study.manifests["seed_sources"]; ids = m[m["factor"] == factor]["run_id"].drop_duplicates()
    runs = [load_run(study.study_dir / "runs" / r) for r in ids]
    return np.stack([r.embeddings(layer=layer, steps=[r.steps[-1]])[0] for r in runs]).astype(np.float64)


def test_the_section_renders_with_its_figure_table_and_subsets(ss):
    items = section_items(section_seed_sources, ss)
    kinds = [type(i).__name__ for i in items]
    assert kinds == ["str", "Figure", "Table", "str", "Table"], kinds
    tab = items[2].df
    assert list(tab["varied"]) == ["head seed", "batch-order seed", "training-subset seed", "dropout seed", "all four seeds"]
    html = "".join(to_html(i) for i in items if not isinstance(i, Figure))
    assert "no interval for the shares" in html                      # the refused interval's reason, under the table
    import re
    methods = re.findall(r'</table><p class="method">(.*?)</p>', html)
    assert len(methods) == 2 and all(m.startswith("Intervals: 95% delete-one jackknife t interval over 3 runs") for m in methods), methods
    assert "long: more than the rest" in items[3]                     # long probes move twice as far in the synthetic runs


def test_the_sentence_numbers_recomputed_with_numpy(ss):
    "All four seeds: raw seed variance (1/N) sum_i (1/K) sum_k ||e_ik - mean_k e_ik||^2 and its jackknife t interval over runs, from the arrays."
    X = _arm(ss, "all")
    K = X.shape[0]
    raw = ((X - X.mean(0)) ** 2).sum(-1).mean()
    # jackknife over runs of the unbiased pair form: mean over pairs of half the squared distance, scaled back by (K-1)/K
    half = lambda Y: np.mean([((Y[i] - Y[j]) ** 2).sum(-1).mean() / 2 for i in range(len(Y)) for j in range(i + 1, len(Y))])
    loo = np.array([half(np.delete(X, i, 0)) for i in range(K)])
    se = np.sqrt((K - 1) / K * ((loo - loo.mean()) ** 2).sum())
    h = stats.t.ppf(0.975, K - 1) * se * (K - 1) / K
    f = next(f for f in key_findings(ss) if f["key"] == "seed_rotation")
    assert f["value"] == pytest.approx(raw, rel=1e-9)
    assert f["ci"] == pytest.approx((raw - h, raw + h), rel=1e-9)
    assert f"end {format_value(raw)} [{format_value(raw - h)}, {format_value(raw + h)}] apart" in f["text"]
    # the largest share: each source's raw variance (unbiased) over all four's, the largest named
    shares = {s: half(_arm(ss, s)) / half(X) for s in ("init_seed", "order_seed", "subset_seed", "dropout_seed")}
    top = max(shares, key=shares.get)
    share = next(f for f in key_findings(ss) if f["key"] == "seed_rotation_share")
    assert share["value"] == pytest.approx(shares[top]) and share["ci"] is None and "no interval:" in share["text"]
    assert top == "init_seed" and "the head seed moves the runs furthest" in share["text"]   # the synthetic weights: 1, 0.7, 0.5, 0.3


def test_churn_recomputed_from_the_predictions(ss):
    m = ss.manifests["seed_sources"]; ids = m[m["factor"] == "all"]["run_id"].drop_duplicates()
    preds = [load_run(ss.study_dir / "runs" / r).predictions() for r in ids]
    rows = sorted(set.intersection(*[set(p["rows"].tolist()) for p in preds]))
    lab = np.stack([p["probs"][-1][np.searchsorted(p["rows"], rows)].argmax(-1) for p in preds])
    churn = np.mean([(lab[i] != lab[j]).mean() for i in range(len(lab)) for j in range(i + 1, len(lab))])
    f = next(f for f in key_findings(ss) if f["key"] == "seed_rotation_churn")
    from embvar_study.predictions import CHURN_MIN_EXAMPLES
    shown = "[" if len(rows) >= CHURN_MIN_EXAMPLES else f"(no interval: the runs share only {len(rows)} held-out examples"
    assert f"all four seeds {format_value(churn)} {shown}" in f["text"] and f"(3 runs, {len(rows)} examples)" in f["text"]
    assert f["value"] >= churn - 1e-12                                  # the finding's value: the largest churn of any arm


def test_a_study_without_the_experiment_leaves_the_section_off(shared_study):
    assert section_items(section_seed_sources, shared_study) == [NOT_APPLICABLE]
    f = next(f for f in key_findings(shared_study) if f["key"] == "seed_rotation")      # the seed sweep's head seeds, with an interval
    assert f["ci"] is not None and f["ci"][0] < f["value"] < f["ci"][1] and "only in the head seed" in f["text"]
    assert "all four seeds" not in findings(shared_study)
