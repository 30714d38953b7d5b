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
    assert (t["ci_low"] <= t["ci_high"]).all()

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


def test_batched_bootstrap_equals_per_resample_intervals():
    "The batched (Gram-mask, masked k-NN) bootstrap gives the percentile intervals of the measures on each resample's distinct probes."
    from embvar_study.metrics import MEASURES
    idx = np.random.default_rng(3).integers(0, 30, size=(40, 30))           # compare's draw for seed=3, n_resamples=40
    ms = ["linear_cka", "debiased_cka", "mutual_knn", "jaccard_knn"]
    t = compare(A, B, None, measures=ms, n_resamples=40, seed=3, layers=[0]).set_index("measure")
    for m in ms:
        boot = [float(MEASURES[m].fn(A[0][np.unique(r)], B[0][np.unique(r)])) for r in idx]
        np.testing.assert_allclose(t.loc[m, ["ci_low", "ci_high"]].to_numpy(float), np.quantile(boot, [0.025, 0.975]), rtol=1e-10)
