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
from embvar_study.run_writer import RunWriter
from embvar_study.runs import load_run
from embvar_study.similarity import linear_cka


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
    with pytest.raises(ValueError, match=r"^a, b: b and a hold different probes \(2 of a not in b, e\.g\. .*; 0 of b not in a\); give --probes FILE"):
        compare(f"{tiny_run}@step=4", f"{fewer.path}@step=4", n_resamples=0)
    r = subprocess.run([sys.executable, "-c", "from embvar_study.cli import main; main()", "compare", f"{tiny_run}@step=4",
                        f"{fewer.path}@step=4", "--out", str(tmp_path / "out")], capture_output=True, text=True)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "hold different probes" in r.stderr, r.stderr
    assert "--probes:" not in r.stderr and "a, b: " in r.stderr          # no --probes was given: the two sides are named, not the flag
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
    from embvar_study.similarity import MEASURES
    if m not in ("mutual_knn", "jaccard_knn"): return float(MEASURES[m].fn(X[r], Y[r]))
    c = np.array([len(set(p) & set(q)) for p, q in zip(_knn_ref(X, r, 5), _knn_ref(Y, r, 5))])
    return (c / 5).mean() if m == "mutual_knn" else (c / (10 - c)).mean()

BATCHED = ["linear_cka", "debiased_cka", "mutual_knn", "jaccard_knn", "cca", "svcca", "pwcca", "procrustes_angular",
           "procrustes_euclidean", "shape_angular_alpha0", "linreg_r2_xy", "linreg_r2_yx"]

def test_batched_bootstrap_equals_per_resample_loop():
    "Every batched measure's resample values, hence its interval, equal the per-resample loop on the same resamples within 1e-8."
    from embvar_study.layer_pairs import boot_counts, layer_factors, pair_scores
    rng = np.random.default_rng(1)
    X = rng.normal(size=(40, 6)); Y = X[:, :4] @ rng.normal(size=(4, 4)) + 0.5 * rng.normal(size=(40, 4))
    idx = np.random.default_rng(3).integers(0, 40, size=(30, 40))           # compare's draw for seed=3, n_resamples=30
    w = boot_counts(40, 30, 3)
    np.testing.assert_array_equal(w, [np.bincount(r, minlength=40) for r in idx])
    got = pair_scores(layer_factors(X[None]), layer_factors(Y[None]), BATCHED, w)
    for m in BATCHED:
        np.testing.assert_allclose(got[m][0, 0, 1:], [_loop_measure(m, X, Y, r) for r in idx], rtol=0, atol=1e-8, err_msg=m)
    t = compare(X[None], Y[None], None, measures=BATCHED, n_resamples=30, seed=3).set_index("measure")
    from embvar_study.similarity import MEASURES
    for m in BATCHED:                                                          # compare's interval: median-centred percentiles
        lo, med, hi = np.quantile([_loop_measure(m, X, Y, r) for r in idx], [0.025, 0.5, 0.975])
        v = t.loc[m, "value"]
        want = np.clip([v + lo - med, v + hi - med], *MEASURES[m].range)      # clipped to the declared range
        np.testing.assert_allclose(t.loc[m, ["ci_low", "ci_high"]].to_numpy(float), want, rtol=0, atol=1e-8, err_msg=m)

def test_wide_layers_equal_the_per_pair_measures():
    "d > N (the rows rotated into their N-dim span, PWCCA mapped back): every value equals the measure's own function on X."
    from embvar_study.similarity import MEASURES
    rng = np.random.default_rng(4)
    A = rng.normal(size=(2, 16, 50)); B = A[:, :, :30] @ rng.normal(size=(30, 30)) + rng.normal(size=(2, 16, 30))
    ms = [m for m in MEASURES if m != "rsa_correlation_kendall"]
    t = compare(A, B, measures=ms, n_resamples=0)
    for m in ms:
        want = [float(np.clip(MEASURES[m].fn(A[i], B[j]), *MEASURES[m].range)) for i in range(2) for j in range(2)]
        tol = 1e-7 if "angular" in m else 1e-9             # arccos near 0: rounding of 1e-16 in the cosine is sqrt(2e-16) in the angle
        np.testing.assert_allclose(t[t.measure == m]["value"], want, rtol=0, atol=tol, err_msg=m)

def test_intervals_stay_in_each_measures_range():
    "Near-identical sets (CKA, CCA near 1, Procrustes near 0) and a saturated case: no interval leaves MEASURES[m].range."
    from embvar_study.similarity import MEASURES
    rng = np.random.default_rng(7)
    ms = sorted(m for m in MEASURES if not m.startswith("rsa") and m != "cknna")
    for N, d, noise in ((30, 4, 1e-3), (24, 40, 1e-2), (60, 8, 0.3)):
        X = rng.normal(size=(2, N, d)); Y = X + noise * rng.normal(size=X.shape)
        t = compare(X, Y, measures=ms, n_resamples=60, seed=N)
        for m in ms:
            lo, hi = MEASURES[m].range
            r = t[t.measure == m]
            assert ((r.ci_low >= lo) & (r.ci_high <= hi) & (r.value >= lo) & (r.value <= hi)).all(), (N, d, m, r)

def test_saturated_measures_are_flagged_with_the_reason(tmp_path):
    "N <= d: CCA, PWCCA and R^2 of Y on X are 1 by construction; the table's flag and the page say why, CKA is not flagged."
    rng = np.random.default_rng(0)
    X = rng.normal(size=(2, 20, 40)); Y = rng.normal(size=(2, 20, 8))
    t = compare(X, Y, measures=["cca", "pwcca", "linreg_r2_xy", "linreg_r2_yx", "linear_cka", "svcca"], n_resamples=5)
    f = t.set_index(["measure", "layer_a", "layer_b"])["flag"]
    assert f["cca", 1, 0] == ("saturated: layer 1 of a spans all N - 1 = 19 centred directions (N = 20 probes <= d = 40), "
                              "so cca is 1 by construction")
    assert (t[t.measure.isin(["cca", "pwcca", "linreg_r2_xy"])].flag != "").all()
    assert (t[t.measure.isin(["linreg_r2_yx", "linear_cka", "svcca"])].flag == "").all()
    np.testing.assert_allclose(t[t.measure == "cca"]["value"], 1.0, atol=1e-12)
    page = open(write_compare_html(t, str(tmp_path))).read()
    assert "Saturated by construction" in page and "cca at 4 of 4 layer pairs" in page and "by construction" in page

def test_constant_layer_skipped_with_one_line():
    "A layer whose rows are all identical (last pooling of a decoder's layer 0) is skipped, named with its side; the rest is compared."
    rng = np.random.default_rng(0)
    X = rng.normal(size=(3, 20, 5)); X[0] = 2.0
    lines = []
    t = compare(X, X[::-1].copy(), measures=["linear_cka", "cca"], n_resamples=4, log=lines.append)
    assert lines[0] == "compare: skipped layer 0 of a: its 20 rows are all identical, so no measure is defined there"
    assert "skipped layer 2 of b" in lines[1] and sorted(set(t.layer_a)) == [1, 2] and sorted(set(t.layer_b)) == [0, 1]
    with pytest.warns(UserWarning, match="skipped layer 0 of a"):
        compare(X, X, measures=["linear_cka"], n_resamples=0)
    with pytest.raises(ValueError, match=r"^layers_a: every chosen layer of a \(\[0\]\) holds 20 identical rows"):
        compare(X, X, layers_a=[0], n_resamples=0)

def test_knn_minimum_names_the_measure_not_n_resamples():
    X = np.random.default_rng(0).normal(size=(1, 7, 4))
    with pytest.raises(ValueError) as e: compare(X, X, measures=["mutual_knn"], n_resamples=50)
    assert str(e.value).startswith("measures: mutual_knn needs 5 neighbours per probe") and "n_resamples" not in str(e.value)

def test_bad_arguments_are_one_line_before_work():
    X = np.random.default_rng(0).normal(size=(1, 10, 4))
    for kw, msg in ((dict(measures=[]), "measures: expected at least one name"), (dict(confidence=1.5), r"confidence: expected a number in \(0, 1\), e.g. 0.95, got 1.5"),
                    (dict(layers_b=[5]), r"layers_b: expected indices in \[-1, 0\] for b \(1 layers\), got \[5\]")):
        with pytest.raises(ValueError, match=msg): compare(X, X, **kw)

def test_figures_ticks_caption_legend(tmp_path):
    "Colourbar ticks short (no 1.00000000000000), heatmap ticks at the layers' own integer indices, legend beside the lines, no promise of intervals at n_resamples=0."
    import matplotlib; matplotlib.use("Agg")
    from embvar_study.compare import _diagonal_fig
    rng = np.random.default_rng(0)
    X = rng.normal(size=(4, 12, 30)); Y = rng.normal(size=(4, 12, 30))
    t = compare(X, Y, measures=["cca", "linear_cka"], layers_a=[0, 3], layers_b=[1, 3], n_resamples=0)
    fig = t.plot(); fig.canvas.draw()
    heat = [ax for ax in fig.axes if ax.get_title()]
    assert [l.get_text() for l in heat[0].get_xticklabels()] == ["1", "3"] and [l.get_text() for l in heat[0].get_yticklabels()] == ["0", "3"]
    bars = [ax for ax in fig.axes if not ax.get_title()]
    labels = [l.get_text() for ax in bars for l in ax.get_yticklabels() if l.get_text()]
    assert labels and max(len(s.replace("\u2212", "-")) for s in labels) <= 6, labels    # cca is 1 everywhere: a constant map
    d = _diagonal_fig(t); d.canvas.draw()
    ax = d.axes[0]
    assert ax.get_legend().get_window_extent().x0 >= ax.get_window_extent().x1           # the legend is beside the axes
    page = open(write_compare_html(t, str(tmp_path / "o"))).read()
    assert "no intervals: cca, linear_cka: none (n_resamples=0)" in page and "with probe-bootstrap intervals" not in page

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
    from embvar_study.similarity import MEASURES
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


# --- the CLI on run folders written from arrays (no training) ------------------------------------------------------
@pytest.fixture(scope="module")
def fake_runs(tmp_path_factory):
    "Two run folders of 12 synthetic probes at step 0 (4 layers, d = 16); layer 0 of the first is one vector for every probe."
    root, rng = tmp_path_factory.mktemp("fake"), np.random.default_rng(0)
    probes = pd.DataFrame({"id": [f"p{i}" for i in range(12)], "text": [f"synthetic probe {i}" for i in range(12)]})
    out = []
    for name in ("alpha", "beta"):
        E = rng.normal(size=(4, 12, 16)).astype(np.float32)
        if name == "alpha": E[0] = 1.0
        with RunWriter(root / name, {"synthetic": name}, probes) as w: w.save_embeddings(0, {"mean": E})
        out.append(root / name)
    return out


def _cli(*args):
    r = subprocess.run([sys.executable, "-c", "from embvar_study.cli import main; main()", "compare", *map(str, args)],
                       capture_output=True, text=True)
    return r.returncode, r.stderr.strip().splitlines(), r.stdout


def test_cli_layers_per_side_progress_and_skip(fake_runs, tmp_path):
    a, b = fake_runs
    rc, err, out = _cli(f"{a}@step=0", f"{b}@step=0", "--out", tmp_path / "o", "--layers-a", "0,2,3", "--layers-b", "-1",
                        "--measures", "linear_cka,cca", "--n-resamples", "20")
    assert rc == 0, err
    t = pd.read_csv(tmp_path / "o" / "compare.csv")
    assert sorted(set(t.layer_a)) == [2, 3] and set(t.layer_b) == {3}
    assert "compare: skipped layer 0 of a: its 12 rows are all identical, so no measure is defined there" in err
    assert "compare: 2 x 1 layer pairs, 2 measures, 12 probes, 20 resamples" in err and err[-1].startswith("compare: 20 of 20 resamples after")
    page = (tmp_path / "o" / "compare.html").read_text()
    assert "<title>compare: alpha@step=0 vs beta@step=0</title>" in page and str(a.parent) not in page.split("<main>")[1][:300]


@pytest.mark.parametrize("args, want", [
    (["--measures", ","], "embvar compare: error: --measures: expected comma-separated names from similarity.MEASURES, got ','"),
    (["--layers-a", "0-2"], "embvar compare: error: --layers-a: expected comma-separated layer indices (e.g. 0,3,-1) or 'all', got '0-2'"),
    (["--layers-b", "9"], "embvar compare: error: --layers-b: expected indices in [-4, 3] for b (4 layers), got [9]"),
    (["--layers-a", "0"], "embvar compare: error: --layers-a: every chosen layer of a ([0]) holds 12 identical rows; choose other layers"),
])
def test_cli_one_line_exit_2(fake_runs, tmp_path, args, want):
    a, b = fake_runs
    rc, err, _ = _cli(f"{a}@step=0", f"{b}@step=0", "--out", tmp_path / "o", *args)
    assert rc == 2 and err[-1] == want and len([l for l in err if "error" in l]) == 1, err
    assert not (tmp_path / "o").exists()


def test_cli_out_file_refused_before_computing(fake_runs, tmp_path, monkeypatch, capsys):
    "--out naming an existing file: one line, exit 2, and compare is never called."
    import embvar_study.compare as C
    from embvar_study.cli import main
    def boom(*a, **k): raise AssertionError("compare ran")
    monkeypatch.setattr(C, "compare", boom)
    f = tmp_path / "taken.txt"; f.write_text("x")
    a, b = fake_runs
    with pytest.raises(SystemExit) as e: main(["compare", f"{a}@step=0", f"{b}@step=0", "--out", str(f)])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and err == [f"embvar compare: error: --out: expected a folder for compare.html and compare.csv, got {str(f)!r}, an existing file"]


def test_torch_tensors_are_factored_on_their_device_and_equal_numpy():
    "Tensors: the per-layer QR runs on the tensors' device (seen by a TorchFunctionMode), and every value and interval equals numpy's."
    import torch
    from torch.overrides import TorchFunctionMode
    rng = np.random.default_rng(3)
    A = rng.normal(size=(3, 24, 96)); B = A[:, :, ::-1] * 2 + rng.normal(size=(3, 24, 96))
    seen = []
    class Devices(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func is torch.linalg.qr: seen.append(args[0].device)
            return func(*args, **(kwargs or {}))
    ref = compare(A, B, n_resamples=20)
    with Devices(): got = compare(torch.tensor(A), torch.tensor(B), n_resamples=20)
    assert seen == [torch.device("cpu")] * 2                 # one QR per side, on the inputs' device, none on a numpy copy
    pd.testing.assert_frame_equal(got[["layer_a", "layer_b", "measure", "ci_method", "flag"]], ref[["layer_a", "layer_b", "measure", "ci_method", "flag"]])
    for c in ("value", "ci_low", "ci_high"):
        np.testing.assert_allclose(got[c].to_numpy(), ref[c].to_numpy(), rtol=0, atol=1e-10, equal_nan=True)
    with pytest.raises(ValueError, match=r"^a: expected finite values"):
        bad = torch.tensor(A); bad[0, 0, 0] = float("nan"); compare(bad, B)
    with pytest.raises(ValueError, match=r"^b: expected shape \(layers, N, d\)"):
        compare(torch.tensor(A), torch.tensor(B[0]))


# --- issue 42: names given twice, a malformed @step= ----------------------------------------------------------------
def test_a_measure_named_twice_is_computed_once(fake_runs, tmp_path):
    "`--measures linear_cka,linear_cka`: one row per layer pair, equal to asking once (was pandas' duplicate-index error)."
    once = compare(A, B, measures=["linear_cka"], n_resamples=5)
    twice = compare(A, B, measures=["linear_cka", "linear_cka"], n_resamples=5)
    pd.testing.assert_frame_equal(twice, once)
    a, b = fake_runs
    rc, err, _ = _cli(f"{a}@step=0", f"{b}@step=0", "--out", tmp_path / "o", "--measures", "linear_cka,linear_cka",
                      "--layers", "1,2", "--n-resamples", "3")
    assert rc == 0, err
    assert len(pd.read_csv(tmp_path / "o" / "compare.csv")) == 4


@pytest.mark.parametrize("side", ["a", "b"])
def test_a_malformed_step_is_named_not_looked_up(fake_runs, tmp_path, side):
    "`RUN@step=abc`: one line naming the side and the form expected, with or without --probes (was a Hub lookup)."
    a, b = fake_runs
    good, bad = f"{b}@step=0", f"{a}@step=abc"
    args = [bad, good] if side == "a" else [good, bad]
    (tmp_path / "p.txt").write_text("\n".join(f"synthetic probe {i}" for i in range(12)))
    for extra in ([], ["--probes", tmp_path / "p.txt"]):
        rc, err, _ = _cli(*args, "--out", tmp_path / "o", *extra)
        assert rc == 2 and err == [f"embvar compare: error: {side}: malformed run step {bad!r}: expected PATH@step=S "
                                   "with S a whole number, e.g. runs/x@step=24"], err
        assert not (tmp_path / "o").exists()


# --- issue 42: compare at large N streams (no N x N array), and equals the N x N route where both exist -------------
STREAMED = ["linear_cka", "debiased_cka", "cca", "svcca", "pwcca", "procrustes_angular", "linreg_r2_xy"]


def test_large_n_allocates_no_n_by_n_array():
    "N = 20,000 probes, d = 64: every streamed measure is returned and the traced peak stays far below one N x N array."
    import tracemalloc
    rng = np.random.default_rng(1)
    N, d = 20_000, 64
    X = rng.normal(size=(2, N, d)); Y = X @ rng.normal(size=(d, d)) + rng.normal(size=(2, N, d))
    tracemalloc.start()
    try:
        t = compare(X, Y, measures=STREAMED, n_resamples=2)
        peak = tracemalloc.get_traced_memory()[1]
    finally: tracemalloc.stop()
    assert peak < N * N * 8 / 10, f"peak {peak / 2**20:.0f} MiB: an N x N float64 array is {N * N * 8 / 2**20:.0f} MiB"
    assert set(t.measure) == set(STREAMED) and np.isfinite(t.value).all() and len(t) == 4 * len(STREAMED)
    gram = t.measure.isin(["linear_cka", "debiased_cka"])
    assert t.loc[gram, "ci_method"].str.startswith("refused: the CKA bootstrap holds N x N").all()
    assert (t.loc[~gram, "ci_low"] <= t.loc[~gram, "ci_high"]).all()
    ref = [float(MEASURES_["linear_cka"].fn(X[i], Y[j])) for i in range(2) for j in range(2)]   # the d x d route
    np.testing.assert_allclose(t[t.measure == "linear_cka"].value, ref, rtol=1e-10)


from embvar_study.similarity import MEASURES as MEASURES_


def test_the_streamed_route_equals_the_n_by_n_route(monkeypatch):
    "Below GRAM_MAX_N (Gram matrices) and above it (patched down: no Gram, k-NN in row blocks) the values are the same."
    import embvar_study.layer_pairs as LP, embvar_study.similarity as S
    rng = np.random.default_rng(2)
    X = rng.normal(size=(2, 300, 24)); Y = X[::-1] + 0.5 * rng.normal(size=(2, 300, 24))
    ms = ["linear_cka", "debiased_cka", "mutual_knn", "cca"]
    full = compare(X, Y, measures=ms, n_resamples=0)
    assert LP.layer_factors(X).K.shape == (2, 300, 300)
    monkeypatch.setattr(LP, "GRAM_MAX_N", 100); monkeypatch.setattr(S, "KNN_ROWS_N", 100)
    assert LP.layer_factors(X).K is None
    streamed = compare(X, Y, measures=ms, n_resamples=0)
    np.testing.assert_allclose(streamed.value, full.value, rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(S.knn_indices(X, k=5), np.argsort(-np.where(np.eye(300, dtype=bool), -np.inf,
                                  (X / np.linalg.norm(X, axis=-1, keepdims=True)) @ np.swapaxes(X / np.linalg.norm(X, axis=-1, keepdims=True), 1, 2)), axis=-1)[..., :5])


def test_an_n_by_n_measure_is_refused_before_embedding(monkeypatch):
    "cknna at 5,000 probes: one line before any model is loaded or any text embedded."
    import embvar_study.compare as C
    def boom(*a, **k): raise AssertionError("embedded before refusing")
    monkeypatch.setattr(C, "_embed", boom)
    with pytest.raises(ValueError, match=r"^measures: 'cknna' holds N x N arrays, computed up to N = 4,096 probes \(got N = 5,000\)"):
        compare("tiny-distilbert", "tiny-bert", [f"probe {i}" for i in range(5000)], measures=["cknna"])


def test_memory_is_checked_before_embedding(monkeypatch):
    "Models loaded, nothing embedded: the (layers, N, d) arrays both sides will need are checked against the memory available."
    import embvar_study.compare as C
    from embvar_study.extract import embed_texts
    texts = [f"probe number {i}" for i in range(200)]
    pair = C._loaded("tiny-distilbert")
    E = embed_texts(*pair, texts[:3], layers="all")
    assert C._model_shape(pair) == (E.shape[0], E.shape[2])            # the shape the embedding will have, from the config
    def boom(*a, **k): raise AssertionError("embedded before the memory check")
    monkeypatch.setattr(C, "_embed", boom); monkeypatch.setattr(C, "_available_bytes", lambda: 1000)    # bytes
    need = 3 * 8 * 200 * (E.shape[0] * E.shape[2] + np.prod(C._model_shape(C._loaded("tiny-bert"))))
    with pytest.raises(ValueError, match=rf"^probes: N = 200 probes need about {need / 2**20:,.1f} MiB for the layer arrays \(a "):
        compare("tiny-distilbert", "tiny-bert", texts, measures=["linear_cka"])


def test_the_diagonal_caption_gives_the_tables_reason_for_no_intervals(tmp_path):
    "No interval because none was asked for, or because the bootstrap was refused at this N: the caption says which."
    import html
    page = lambda t, o: html.unescape(open(write_compare_html(t, str(tmp_path / o))).read())
    t = compare(A, B, n_resamples=0, measures=["linear_cka"])
    assert "the diagonal (no intervals: linear_cka: none (n_resamples=0))" in page(t, "zero")
    t["ci_method"] = "refused: the CKA bootstrap holds N x N Gram matrices, up to N = 4,096 probes"   # as at 5,000 probes
    got = page(t, "big")
    assert "n_resamples" not in got.split("<figcaption>")[-1].split("</figcaption>")[0]
    assert "the diagonal (no intervals: linear_cka: refused: the CKA bootstrap holds N x N Gram matrices" in got
