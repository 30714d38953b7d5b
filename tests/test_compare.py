"embvar_study.compare: arrays of layers, the table, the HTML page, and the CLI's one-line errors."
import subprocess, sys
import numpy as np
import pytest
from embvar_study.compare import compare, write_compare_html

rng = np.random.default_rng(0)
A = rng.normal(size=(2, 30, 6))
B = A[::-1] @ np.linalg.qr(rng.normal(size=(6, 6)))[0] + 0.05 * rng.normal(size=A.shape)   # layers swapped, rotated

def test_arrays_table_and_names():
    t = compare(A, B, None, n_resamples=5)
    names = set(t["measure"])
    for part in ["svcca", "pwcca", "cka", "procrustes", "cknna", "mutual_knn", "rsa"]:
        assert any(part in n for n in names), part
    cka = t[t.measure == "linear_cka"].set_index(["layer_a", "layer_b"])["value"]
    assert cka[(0, 1)] > 0.99 and cka[(1, 0)] > 0.99 and cka[(0, 0)] < 0.9     # finds the swap
    pairwise = t.measure.str.startswith("rsa") | (t.measure == "cknna")
    assert (t.loc[~pairwise, "ci_low"] <= t.loc[~pairwise, "ci_high"]).all()
    assert t.loc[pairwise, ["ci_low", "ci_high"]].isna().all().all() and t.loc[pairwise, "ci_method"].str.startswith("refused").all()

def test_html(tmp_path):
    out = write_compare_html(compare(A, B, n_resamples=3, measures=["linear_cka", "svcca"]), str(tmp_path))
    page = open(out).read()
    assert page.count("<img") == 2 and "linear cka" in page.replace("_", " ")
    assert "figure img{max-width:100%" in page and "table-wrap" in page        # fits a 1280 px window (checked in Chromium)

def test_mismatch_one_line():
    with pytest.raises(ValueError, match="same probes"): compare(A, B[:, :20])

def test_cli_errors_exit_2(tmp_path):
    r = subprocess.run([sys.executable, "-c", "from embvar_study.cli import main; main()", "compare", "x", "y",
                        "--probes", str(tmp_path / "none.txt"), "--out", str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "--probes" in r.stderr


# --- run folders at a tracked step, probes matched by id --------------------------------------------------------
import pandas as pd
from embvar_study.runs import RunWriter, load_run
from embvar_study.metrics import linear_cka


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    "A tiny-distilbert run of 4 steps tracked at 0, 2, 4 (conftest's TINY config)."
    from conftest import TINY
    from embvar_study.train import train_run
    return train_run(dict(TINY), tmp_path_factory.mktemp("runs") / "tiny")


def _rewrite(run, path, order=None, drop=0):
    "A copy of `run` (probes and every step's embeddings) with its probes in `order`, the last `drop` left out."
    order = np.arange(len(run.probes)) if order is None else np.asarray(order)
    order = order[:len(order) - drop]
    with RunWriter(path, {"copy_of": str(run.path), "order": order.tolist()}, run.probes.iloc[order].reset_index(drop=True)) as w:
        for s in run.steps.tolist():
            w.save_embeddings(s, {p: run.embeddings_all_layers(p, steps=[s])[0][:, order] for p in run.poolings})
    return load_run(path)


def test_run_folder_at_step(tiny_run):
    run = load_run(tiny_run)
    t = compare(f"{tiny_run}@step=4", f"{tiny_run}@step=0", layers=[0, -1], measures=["linear_cka"], n_resamples=0)
    emb = lambda layer, step: run.embeddings(layer, steps=[step])[0].astype(np.float64)
    want = [[float(linear_cka(emb(la, 4), emb(lb, 0))) for lb in (0, run.n_layers)] for la in (0, run.n_layers)]
    got = t.pivot(index="layer_a", columns="layer_b", values="value").to_numpy()
    np.testing.assert_allclose(got, want, rtol=1e-12)
    with pytest.raises(ValueError, match=r"^a: step 3 of .* was not tracked; tracked steps are \[0, 2, 4\]$"):
        compare(f"{tiny_run}@step=3", f"{tiny_run}@step=0")
    with pytest.raises(ValueError, match=r"name a tracked step as .*@step=S \(tracked steps: \[0, 2, 4\]\)"):
        compare(str(tiny_run), f"{tiny_run}@step=0")


def test_run_vs_a_model_embeds_the_runs_probes(tiny_run):
    "probes=None: the model side embeds the run's own probe texts, in the run's order."
    from embvar_study.extract import embed_texts
    from embvar_study.models import load_model_and_tokenizer
    texts = load_run(tiny_run).probes["text"].tolist()
    ref = embed_texts(*load_model_and_tokenizer("tiny-distilbert"), texts, layers="all")
    ms = ["linear_cka", "procrustes_angular"]
    got = compare(f"{tiny_run}@step=0", "tiny-distilbert", measures=ms, n_resamples=0)
    want = compare(f"{tiny_run}@step=0", ref, measures=ms, n_resamples=0)
    np.testing.assert_allclose(got["value"], want["value"], rtol=1e-9, atol=1e-9)
    d = got[(got.layer_a == got.layer_b) & (got.measure == "linear_cka")]
    assert (d["value"] > 0.99).all()                      # step 0: the base model's embeddings (up to its forward pass)


def test_probes_reordered_are_matched(tiny_run, tmp_path):
    run = load_run(tiny_run)
    perm = np.random.default_rng(0).permutation(len(run.probes))
    other = _rewrite(run, tmp_path / "perm", order=perm)
    assert other.probes["text"].tolist() != run.probes["text"].tolist()
    ms = ["linear_cka", "mutual_knn", "rsa_correlation_spearman"]
    same = compare(f"{tiny_run}@step=4", f"{tiny_run}@step=2", measures=ms, n_resamples=5)
    moved = compare(f"{tiny_run}@step=4", f"{other.path}@step=2", measures=ms, n_resamples=5)
    pd.testing.assert_frame_equal(pd.DataFrame(same)[["layer_a", "layer_b", "measure", "value"]],
                                  pd.DataFrame(moved)[["layer_a", "layer_b", "measure", "value"]], rtol=1e-12)
    unmatched = compare(run.embeddings_all_layers(steps=[4])[0], other.embeddings_all_layers(steps=[2])[0],
                        measures=["linear_cka"], n_resamples=0)    # arrays carry no ids: rows taken as they are
    assert not np.allclose(unmatched["value"], same[same.measure == "linear_cka"]["value"])


def test_probe_mismatch_one_line(tiny_run, tmp_path):
    run = load_run(tiny_run)
    fewer = _rewrite(run, tmp_path / "fewer", drop=2)
    with pytest.raises(ValueError, match=r"^probes: b and a hold different probes \(2 of a not in b, e\.g\. .*; 0 of b not in a\)$"):
        compare(f"{tiny_run}@step=4", f"{fewer.path}@step=4", n_resamples=0)
    r = subprocess.run([sys.executable, "-c", "from embvar_study.cli import main; main()", "compare", f"{tiny_run}@step=4",
                        f"{fewer.path}@step=4", "--out", str(tmp_path / "out")], capture_output=True, text=True)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "hold different probes" in r.stderr, r.stderr
    r = subprocess.run([sys.executable, "-c", "from embvar_study.cli import main; main()", "compare", f"{tiny_run}@step=5",
                        f"{tiny_run}@step=0", "--out", str(tmp_path / "out")], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [r.stderr.strip()] and "tracked steps are [0, 2, 4]" in r.stderr


def test_cli_run_folders(tiny_run, tmp_path):
    from embvar_study.cli import main
    main(["compare", f"{tiny_run}@step=4", f"{tiny_run}@step=0", "--out", str(tmp_path / "o"), "--measures",
          "linear_cka,svcca", "--n-resamples", "3"])
    t = pd.read_csv(tmp_path / "o" / "compare.csv")
    assert set(t.measure) == {"linear_cka", "svcca"} and (tmp_path / "o" / "compare.html").is_file()


def _knn_ref(Z, r, k):
    "Each row's k cosine-nearest rows of the resample Z[r], a probe's own copies excluded, copies of a neighbour first-row-first (stable)."
    u = Z[r] / np.linalg.norm(Z[r], axis=1, keepdims=True)
    S = u @ u.T
    S[r[:, None] == r[None, :]] = -np.inf
    return np.argsort(-S, axis=1, kind="stable")[:, :k]

def _loop_measure(m, X, Y, r):
    "The per-resample reference: the measure on the resampled rows (copies kept); k-NN lists without a probe's own copies."
    from embvar_study.metrics import MEASURES
    if m not in ("mutual_knn", "jaccard_knn"): return float(MEASURES[m].fn(X[r], Y[r]))
    c = np.array([len(set(p) & set(q)) for p, q in zip(_knn_ref(X, r, 5), _knn_ref(Y, r, 5))])
    return (c / 5).mean() if m == "mutual_knn" else (c / (10 - c)).mean()

BATCHED = ["linear_cka", "debiased_cka", "mutual_knn", "jaccard_knn", "cca", "svcca", "pwcca", "procrustes_angular",
           "procrustes_euclidean", "shape_angular_alpha0", "linreg_r2_xy", "linreg_r2_yx"]

def test_batched_bootstrap_equals_per_resample_loop():
    "Every batched measure's resample values, hence its interval, equal the per-resample loop on the same resamples within 1e-8."
    from embvar_study.compare import _boot_counts, _weighted_side, _weighted_scores, _COV, _gram_side, _masked_hsic, _masked_knn, _masked_knn_scores
    rng = np.random.default_rng(1)
    X = rng.normal(size=(40, 6)); Y = X[:, :4] @ rng.normal(size=(4, 4)) + 0.5 * rng.normal(size=(40, 4))
    idx = np.random.default_rng(3).integers(0, 40, size=(30, 40))           # compare's draw for seed=3, n_resamples=30
    w = _boot_counts(40, 30, 3)
    np.testing.assert_array_equal(w, [np.bincount(r, minlength=40) for r in idx])
    got = _weighted_scores(_weighted_side(X, w, {1.0, 0.0}), _weighted_side(Y, w, {1.0, 0.0}), list(_COV))
    for d, m in ((False, "linear_cka"), (True, "debiased_cka")):
        K, kr, sx = _gram_side(X, w, {d}); L, lr, sy = _gram_side(Y, w, {d})
        got[m] = _masked_hsic(K, L, kr, lr, w, d) / np.sqrt(sx[d] * sy[d])
    sc = _masked_knn_scores(_masked_knn(X, w, 5), _masked_knn(Y, w, 5), w, 5)
    got["mutual_knn"], got["jaccard_knn"] = sc["mutual"], sc["jaccard"]
    for m in BATCHED:
        np.testing.assert_allclose(got[m], [_loop_measure(m, X, Y, r) for r in idx], rtol=0, atol=1e-8, err_msg=m)
    t = compare(X[None], Y[None], None, measures=BATCHED, n_resamples=30, seed=3).set_index("measure")
    for m in BATCHED:                                                          # compare's interval: median-centred percentiles
        lo, med, hi = np.quantile([_loop_measure(m, X, Y, r) for r in idx], [0.025, 0.5, 0.975])
        v = t.loc[m, "value"]
        np.testing.assert_allclose(t.loc[m, ["ci_low", "ci_high"]].to_numpy(float), [v + lo - med, v + hi - med], rtol=0, atol=1e-8, err_msg=m)

def test_interval_covers_the_estimate_gaussian():
    "Gaussian X, Y = X W + noise (N = 128, d = 16): every default measure's 95% interval holds its full-sample estimate."
    from embvar_study.compare import DEFAULT_MEASURES
    rng = np.random.default_rng(0)
    X = rng.normal(size=(1, 128, 16)); Y = X @ rng.normal(size=(16, 16)) / 4 + rng.normal(size=(1, 128, 16))
    t = compare(X, Y, measures=list(DEFAULT_MEASURES) + ["jaccard_knn", "procrustes_euclidean"], n_resamples=200)
    t = t[t.ci_method.str.startswith("probe bootstrap")]            # RSA and CKNNA: refused (tested above)
    assert len(t) >= 8 and ((t.ci_low <= t.value) & (t.value <= t.ci_high) & (t.ci_low < t.ci_high)).all(), t

def test_interval_coverage_of_the_expected_value():
    "Over 50 data sets of a Gaussian model, the 95% intervals cover E[measure at N probes] (Monte Carlo, 400 data sets) 90% of the time or more."
    from embvar_study.metrics import MEASURES
    ms = ["linear_cka", "cca", "procrustes_angular", "mutual_knn", "linreg_r2_xy"]
    N, d = 64, 4
    W = np.random.default_rng(99).normal(size=(d, d))
    def draw(rng):
        X = rng.normal(size=(N, d)); return X, X @ W / 2 + rng.normal(size=(N, d))
    rng = np.random.default_rng(5)
    sims = [draw(rng) for _ in range(400)]
    truth = {m: np.mean([float(MEASURES[m].fn(x, y)) for x, y in sims]) for m in ms}
    hit = dict.fromkeys(ms, 0)
    for r in range(50):
        x, y = draw(np.random.default_rng(1000 + r))
        t = compare(x[None], y[None], measures=ms, n_resamples=150, seed=r).set_index("measure")
        for m in ms: hit[m] += bool(t.loc[m, "ci_low"] <= truth[m] <= t.loc[m, "ci_high"])
    assert min(hit.values()) >= 45, hit
