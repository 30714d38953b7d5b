"""The training options issue 39's mitigations need: a dropout rate, label smoothing and an EMA of the weights.

Each is checked against an independent reference (a closed form, scipy, a second run that must match bit for bit),
end to end through `train_run` and `embvar train` on the tiny random DistilBERT (offline, seconds per run)."""
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.special import log_softmax

from conftest import TINY, cli_args
from embvar_study.cli import main
from embvar_study.config import MITIGATION_DEFAULTS, TrainConfig
from embvar_study.models import load_model_and_tokenizer, set_dropout
from embvar_study.runs import CorruptRunError, load_run, read_marker, step_file
from embvar_study.train import Batches, WeightAverage, forward_backward, train_run

pytestmark = [pytest.mark.filterwarnings("ignore:.*truncated to max_length"),
              pytest.mark.filterwarnings("ignore:.*NumPy array is not writable")]

TINY_RUN_ID_ON_MAIN = "cf468db74950"   # TrainConfig(**TINY).run_id() on main at 612f6d2, before the options existed
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    "Tiny runs trained once for the module: the base, dropout 0 under two dropout seeds, EMA with decay 0 and 0.5."
    root = tmp_path_factory.mktemp("mitigation_runs")
    variants = {"base": {}, "drop0": {"dropout": 0.0}, "drop0_seed1": {"dropout": 0.0, "dropout_seed": 1},
                "seed1": {"dropout_seed": 1}, "ema0": {"ema_decay": 0.0}, "ema5": {"ema_decay": 0.5}}
    return {k: load_run(train_run(TrainConfig(**TINY, **v), root / k)) for k, v in variants.items()}


def tiny_batch():
    "A tiny DistilBERT in eval mode and 6 examples as micro-batches."
    model, tok = load_model_and_tokenizer("tiny-distilbert", num_labels=2, init_seed=0)
    texts = ["a good film", "bad", "a long and rather dull story about nothing", "great fun", "not for me", "fine"]
    b = Batches(tok, texts, [1, 0, 0, 1, 0, 1], 32, 6, overhead=4)
    return model.eval(), b.micro(list(range(6)))


# ---------------------------------------------------------------------------------------------------------------
# identity

def test_defaults_keep_the_run_id_of_main():
    cfg = TrainConfig(**TINY)
    assert cfg.run_id() == TINY_RUN_ID_ON_MAIN
    assert not set(MITIGATION_DEFAULTS) & set(cfg.identity())
    assert TrainConfig(**TINY, label_smoothing=0).run_id() == TINY_RUN_ID_ON_MAIN   # the default given explicitly
    ids = {TrainConfig(**TINY, **{k: v}).run_id() for k, v in (("dropout", 0.0), ("label_smoothing", 0.1), ("ema_decay", 0.9))}
    assert len(ids) == 3 and TINY_RUN_ID_ON_MAIN not in ids
    assert TrainConfig(**TINY, dropout=0).run_id() == TrainConfig(**TINY, dropout=0.0).run_id()


@pytest.mark.parametrize("field,value,expected", [
    ("dropout", 1.0, "dropout: expected None (the model's own rates) or a probability in [0, 1), got 1.0"),
    ("label_smoothing", -0.1, "label_smoothing: expected a value in [0, 1), got -0.1"),
    ("ema_decay", float("nan"), "ema_decay: expected None (no weight averaging) or a decay in [0, 1), got nan"),
    ("ema_decay", True, "ema_decay: expected None (no weight averaging) or a decay in [0, 1), got True")])
def test_bad_values_name_the_field(field, value, expected):
    with pytest.raises(ValueError) as e: TrainConfig(**TINY, **{field: value})
    assert str(e.value) == expected


# ---------------------------------------------------------------------------------------------------------------
# dropout

@pytest.mark.parametrize("name", ["tiny-distilbert", "tiny-bert", "tiny-gpt2", "tiny-llama"])
def test_dropout_zero_makes_training_mode_deterministic(name):
    model, tok = load_model_and_tokenizer(name, num_labels=2)
    x = tok(["a good film", "a bad film that goes on"], return_tensors="pt", padding=True)
    model.train()
    twice = lambda: [model(**x).logits for _ in range(2)]
    set_dropout(model, 0.5)             # every dropout, attention's included (Llama's is a float, not a module)
    assert not torch.equal(*twice()), name
    set_dropout(model, 0.0)
    assert torch.equal(*twice()), name
    model.eval(); a = model(**x).logits; model.train()
    assert torch.equal(model(**x).logits, a)   # with rate 0, training mode computes what eval mode does


def test_model_default_dropout_differs_between_passes():
    model, tok = load_model_and_tokenizer("tiny-distilbert", num_labels=2)
    x = tok(["a good film"], return_tensors="pt")
    model.train()
    assert model.config.dropout == 0.1 and not torch.equal(model(**x).logits, model(**x).logits)


def test_dropout_zero_run_no_longer_depends_on_the_dropout_seed(runs):
    "dropout_seed only draws dropout masks: with dropout 0 two seeds give bit-identical runs; with the default they differ."
    a, b = runs["drop0"], runs["drop0_seed1"]
    np.testing.assert_array_equal(a.embeddings_all_layers("mean"), b.embeddings_all_layers("mean"))
    np.testing.assert_array_equal(a.history["train_loss"].to_numpy(), b.history["train_loss"].to_numpy())
    assert not np.array_equal(runs["base"].embeddings(-1, "mean"), runs["seed1"].embeddings(-1, "mean"))
    assert a.config["dropout"] == 0.0 and runs["base"].config["dropout"] is None


# ---------------------------------------------------------------------------------------------------------------
# label smoothing

@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
def test_label_smoothing_loss_and_gradient_match_the_closed_form(eps):
    "Loss (1 - eps) * -log p_y + eps * mean_k -log p_k per example (scipy's log_softmax); bias gradient p - q."
    model, micro = tiny_batch()
    model.zero_grad()
    loss = forward_backward(model, micro, CPU, "fp32", label_smoothing=eps).item()
    grad = model.classifier.bias.grad.double().numpy()
    with torch.no_grad():
        logits = np.concatenate([model(**{k: v for k, v in m.items() if k != "labels"}).logits.double().numpy() for m in micro])
    y = np.concatenate([m["labels"].numpy() for m in micro])
    lp = log_softmax(logits, axis=-1)
    expected = np.mean(-(1 - eps) * lp[np.arange(len(y)), y] - eps * lp.mean(-1))
    q = (1 - eps) * np.eye(2)[y] + eps / 2
    np.testing.assert_allclose(loss, expected, rtol=1e-6)
    np.testing.assert_allclose(grad, (np.exp(lp) - q).mean(0), rtol=1e-5, atol=2e-7)   # float32 sums


def test_label_smoothing_zero_is_the_model_loss_bit_for_bit():
    model, micro = tiny_batch()
    model.zero_grad(); a = forward_backward(model, micro, CPU, "fp32")
    ga = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(); b = forward_backward(model, micro, CPU, "fp32", label_smoothing=0.0)
    assert torch.equal(a, b) and all(torch.equal(x, p.grad) for x, p in zip(ga, model.parameters()))


def test_label_smoothing_changes_training_not_evaluation(tmp_path, runs):
    run = load_run(train_run(TrainConfig(**TINY, label_smoothing=0.2), tmp_path / "ls"))
    base, h = runs["base"].history, run.history
    first = lambda df, col: df.loc[df["step"] == df["step"].min(), col].dropna().to_numpy()
    np.testing.assert_array_equal(first(h, "eval_loss"), first(base, "eval_loss"))   # step 0: the same model, plain CE
    tl = lambda df: df.loc[df["status"] == "train", "train_loss"].to_numpy()
    assert not np.allclose(tl(h)[0], tl(base)[0])                                        # step 1's loss is smoothed
    assert run.config["label_smoothing"] == 0.2


# ---------------------------------------------------------------------------------------------------------------
# weight averaging

@pytest.mark.parametrize("decay", [0.0, 0.5, 0.9])
def test_average_after_one_step_is_the_closed_form(decay):
    model, micro = tiny_batch()
    avg = WeightAverage(model, decay)
    w0 = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    forward_backward(model, micro, CPU, "fp32"); opt.step(); avg.update()
    w1, a = dict(model.named_parameters()), dict(avg.module.named_parameters())
    assert not torch.equal(w0["classifier.weight"], w1["classifier.weight"])
    for n in ("classifier.weight", "distilbert.transformer.layer.0.attention.q_lin.weight"):
        torch.testing.assert_close(a[n], decay * w0[n] + (1 - decay) * w1[n].detach(), rtol=1e-6, atol=1e-7)
    if decay == 0.0: assert all(torch.equal(a[n], w1[n]) for n in a)


def test_ema_decay_zero_embeddings_equal_the_model(runs):
    run = runs["ema0"]
    assert run.weights == ["model", "ema"] and run.ema == {"decay": 0.0, "steps": [0, 2, 4]}
    for p in run.poolings:
        np.testing.assert_array_equal(run.embeddings_all_layers(p, weights="ema"), run.embeddings_all_layers(p))
    h = run.history.dropna(subset=["eval_loss"])
    np.testing.assert_array_equal(h["ema_eval_loss"], h["eval_loss"])
    np.testing.assert_array_equal(h["ema_eval_acc"], h["eval_acc"])


def test_ema_does_not_change_the_training_and_averages_away_from_it(runs):
    base, ema = runs["base"], runs["ema5"]
    for p in base.poolings:   # the model itself trains bit for bit as without the average
        np.testing.assert_array_equal(ema.embeddings_all_layers(p), base.embeddings_all_layers(p))
    e, m = ema.embeddings(-1, "mean", weights="ema"), ema.embeddings(-1, "mean")
    np.testing.assert_array_equal(e[0], m[0])               # step 0: the average is the initial model
    assert all(not np.array_equal(e[t], m[t]) for t in (1, 2))
    assert "ema_eval_loss" not in base.history and ema.history["ema_eval_loss"].notna().sum() == 3


def test_ema_files_are_checksummed_and_listed(runs, tmp_path):
    import shutil
    src = runs["ema5"].path
    marker = read_marker(src)
    listed = [f for f in marker["files"] if f.startswith("embeddings_ema/")]
    assert sorted(listed) == sorted(step_file(s, p, "ema") for s in (0, 2, 4) for p in marker["poolings"])
    bad = tmp_path / "bad"; shutil.copytree(src, bad)
    f = bad / step_file(4, "mean", "ema"); raw = bytearray(f.read_bytes()); raw[-1] ^= 1; f.write_bytes(bytes(raw))
    run = load_run(bad)
    run.embeddings(-1, "mean")                               # the model's files are fine
    with pytest.raises(CorruptRunError, match="step_000004.mean.npy: checksum mismatch"): run.embeddings(-1, "mean", weights="ema")


def test_weights_of_a_run_without_ema_are_refused_by_name(runs):
    with pytest.raises(ValueError, match=r"weights: expected one of \['model'\].*trained without a moving average"):
        runs["base"].embeddings(-1, "mean", weights="ema")
    with pytest.raises(ValueError, match="weights: expected one of"): runs["ema0"].embeddings(weights="swa")


# ---------------------------------------------------------------------------------------------------------------
# command line

def test_cli_help_states_the_options(capsys):
    with pytest.raises(SystemExit): main(["train", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "regularisation and weight averaging:" in out
    for flag, words in (("--dropout", "probability of every dropout layer"), ("--label-smoothing", "label smoothing of the training loss"),
                        ("--ema-decay", "exponential moving average of the weights")):
        assert flag in out and words in out, flag


def test_cli_train_with_every_option_writes_a_complete_run(tmp_path, capsys):
    cfg = {**TINY, "dropout": 0.0, "label_smoothing": 0.1, "ema_decay": 0.9}
    main(["train", *cli_args(cfg), "--out", str(tmp_path / "run"), "--no-progress"])
    assert TrainConfig(**cfg).run_id() in capsys.readouterr().out
    run = load_run(tmp_path / "run")
    assert (run.config["dropout"], run.config["label_smoothing"], run.config["ema_decay"]) == (0.0, 0.1, 0.9)
    assert run.embeddings(-1, "cls", weights="ema").shape == run.embeddings(-1, "cls").shape
    assert json.loads((Path(tmp_path) / "run" / "COMPLETE").read_text())["ema"]["decay"] == 0.9
    main(["verify", str(tmp_path / "run")])
    assert "all 1 run(s) verify" in capsys.readouterr().out


@pytest.mark.parametrize("flag,value,words", [("--ema-decay", "1", "--ema-decay: expected None (no weight averaging) or a decay in [0, 1), got 1"),
                                              ("--dropout", "x", "--dropout: expected None (the model's own rates) or a probability")])
def test_cli_bad_option_exits_2_naming_the_flag(tmp_path, capsys, flag, value, words):
    with pytest.raises(SystemExit) as ex:
        main(["train", *cli_args(TINY), flag, value, "--out", str(tmp_path / "run"), "--no-progress"])
    assert ex.value.code == 2
    assert words in capsys.readouterr().err and not (tmp_path / "run").exists()


def test_dropout_zero_with_mc_dropout_perturbations_is_refused(tmp_path, capsys):
    with pytest.raises(ValueError, match="dropout: 0 leaves the mc_dropout perturbation nothing to draw"):
        TrainConfig(**TINY, dropout=0.0, perturb_kinds=["mc_dropout"])
    TrainConfig(**TINY, dropout=0.05, perturb_kinds=["mc_dropout"])   # any rate > 0 is fine
    with pytest.raises(SystemExit) as ex:
        main(["train", *cli_args({**TINY, "dropout": 0, "perturb_kinds": ["mc_dropout"]}), "--out", str(tmp_path / "r"), "--no-progress"])
    assert ex.value.code == 2 and "error: --dropout: 0 leaves the mc_dropout" in capsys.readouterr().err
