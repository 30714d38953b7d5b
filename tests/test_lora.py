"""LoRA through PEFT: the run identity, a tracked LoRA run whose step 0 is the base model's embeddings byte for byte,
what LoRA trains (adapter + head, body frozen), a Trainer + PEFT + EmbvarCallback run, and the CLI flags."""
import json

import numpy as np
import pytest
import torch

import embvar_study.train as train_mod
from conftest import TINY, cli_args
from embvar_study.cli import main
from embvar_study.config import TrainConfig
from embvar_study.extract import embed_texts
from embvar_study.models import apply_lora, head_parameter_names, load_model_and_tokenizer
from embvar_study.runs import load_run
from embvar_study.tracking import EmbvarCallback
from embvar_study.train import train_run

pytestmark = [pytest.mark.filterwarnings("ignore:.*truncated to max_length"),
              pytest.mark.filterwarnings("ignore:.*NumPy array is not writable")]

LORA = {**TINY, "lora_r": 4, "lr": 5e-3, "max_steps": 4}


def base_embeddings(run, cfg: TrainConfig) -> dict:
    "The probes through a freshly loaded base model (no adapter), with the run's embedding settings: pooling -> (L+1, N, d)."
    model, tok = load_model_and_tokenizer(cfg.model, num_labels=run.marker["derived"]["n_labels"], init_seed=cfg.seeds()["init_seed"])
    return embed_texts(model, tok, run.probes["text"].tolist(), pooling=tuple(cfg.poolings), layers="all",
                       batch_size=cfg.embed_batch_size, max_length=cfg.probe_max_length, return_dict=True, autocast=False)


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    train_mod.STEP0_CACHE.clear()   # step 0 must be computed from the adapted model, not reused from another run
    return load_run(train_run(LORA, tmp_path_factory.mktemp("lora") / "run"))


def test_step0_of_a_lora_run_is_the_base_model_byte_for_byte(lora_run):
    cfg = TrainConfig(**LORA)
    base = base_embeddings(lora_run, cfg)
    for pool in cfg.poolings:
        step0 = np.stack(
            [lora_run.embeddings(layer=l, pooling=pool)[0] for l in range(base[pool].shape[0])])
        assert step0.tobytes() == base[pool].astype(step0.dtype).tobytes(), pool
    # and the adapter did move the model afterwards
    last = lora_run.embeddings(layer=-1, pooling="mean")[-1]
    assert np.abs(last - base["mean"][-1]).max() > 1e-4


def test_lora_run_records_the_adapter_and_parameter_counts(lora_run):
    text = (lora_run.path / "config.json").read_text()
    assert "lora" in text and "trainable" in text
    c = lora_run.config
    assert (c["lora_r"], c["lora_alpha"], c["lora_dropout"]) == (4, 8.0, 0.0)
    assert c["lora"]["targets"] == ["q_lin", "v_lin"] and c["lora"]["modules_to_save"] == ["classifier", "pre_classifier"]
    p = c["parameters"]
    assert 0 < p["n_trainable_params"] < p["n_params"]
    s = lora_run.marker["derived"]["model_summary"]
    assert s["n_trainable_params"] == p["n_trainable_params"] and s["lora"]["r"] == 4
    # the count, independently: r x (in + out) per adapted matrix (q_lin, v_lin of 2 layers, dim 32) + the whole head
    model, _ = load_model_and_tokenizer("tiny-distilbert")
    head = sum(dict(model.named_parameters())[n].numel() for n in head_parameter_names(model))
    assert p["n_trainable_params"] == 2 * 2 * 4 * (32 + 32) + head


def test_full_fine_tuning_identity_unchanged_by_the_lora_fields():
    full = TrainConfig(**TINY)
    assert not any(k.startswith("lora") for k in full.to_dict())
    assert TrainConfig(**LORA).run_id() != TrainConfig(**{**LORA, "lora_r": None}).run_id()


def test_lora_trains_only_adapter_and_head():
    model, tok = load_model_and_tokenizer("tiny-distilbert", init_seed=0)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    lm = apply_lora(model, 4, init_seed=0)
    opt = torch.optim.AdamW([p for p in lm.parameters() if p.requires_grad], lr=1e-2)
    b = tok(["a good film", "a dull film"], padding=True, return_tensors="pt")
    lm.train()
    for _ in range(3):
        lm(**b, labels=torch.tensor([1, 0])).loss.backward(); opt.step(); opt.zero_grad()
    inner = lm.get_base_model()
    after = dict(inner.named_parameters())
    body = [n for n in before if not n.startswith(("classifier", "pre_classifier"))]
    for n in body:   # a LoRA-wrapped linear keeps its weight under base_layer
        key = n if n in after else n.replace(".weight", ".base_layer.weight").replace(".bias", ".base_layer.bias")
        assert torch.equal(after[key], before[n]), n
    moved = [n for n, p in inner.named_parameters() if "lora_B" in n and p.abs().max() > 0]
    assert moved


def test_trainer_peft_callback_run_loads(tmp_path):
    from datasets import Dataset
    from transformers import Trainer, TrainingArguments
    model, tok = load_model_and_tokenizer("tiny-distilbert", num_labels=2, init_seed=0)
    base = embed_texts(model, tok, ["a good film", "a dull film", "great acting", "not my thing"], layers="all")
    lm = apply_lora(model, 4, init_seed=0)
    texts = ["a good film", "a bad film", "great acting", "dull plot", "fine work", "awful pacing", "lovely", "boring"]
    enc = tok(texts, padding="max_length", max_length=12, truncation=True)
    ds = Dataset.from_dict({**enc, "labels": [1, 0] * 4})
    args = TrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, num_train_epochs=2, learning_rate=5e-3,
                             logging_steps=1, save_strategy="no", report_to=[], seed=0, use_cpu=True, disable_tqdm=True)
    probes = ["a good film", "a dull film", "great acting", "not my thing"]
    cb = EmbvarCallback(probes, tmp_path / "tracked", every=2)
    Trainer(model=lm, args=args, train_dataset=ds, processing_class=tok, callbacks=[cb]).train()
    run = load_run(tmp_path / "tracked")
    assert run.steps.tolist() == [0, 2, 4] and run.status == "completed"
    assert run.config["lora"]["r"] == 4 and 0 < run.config["parameters"]["n_trainable_params"] < run.config["parameters"]["n_params"]
    assert run.config["model"] == "tiny-distilbert"
    step0 = np.stack([run.embeddings(layer=l, pooling="mean")[0] for l in range(base.shape[0])])
    assert step0.tobytes() == base.tobytes()                        # the adapted model at init is the base model
    assert np.abs(run.embeddings(layer=-1, pooling="mean")[-1] - base[-1]).max() > 1e-5


def test_cli_lora_flags(tmp_path, capsys):
    out = tmp_path / "run"
    try: main(["train", *cli_args({**TINY, "max_steps": 2}), "--lora-r", "4", "--lora-alpha", "16", "--lora-targets", "q_lin", "--out", str(out)]); code = 0
    except SystemExit as e: code = e.code
    assert code == 0, capsys.readouterr().err
    c = json.loads((out / "config.json").read_text())
    assert (c["lora_r"], c["lora_alpha"], c["lora_targets"], c["lora"]["targets"]) == (4, 16.0, ["q_lin"], ["q_lin"])
    capsys.readouterr()
    with pytest.raises(SystemExit) as e: main(["train", *cli_args(TINY), "--lora-alpha", "16", "--out", str(tmp_path / "bad")])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and err.count("\n") == 0 and "--lora-alpha: LoRA is off: set lora_r too, got 16" in err
    with pytest.raises(SystemExit) as e: main(["train", *cli_args(TINY), "--lora-r", "0", "--out", str(tmp_path / "bad")])
    assert e.value.code == 2 and "--lora-r: expected None (full fine-tuning) or a LoRA rank >= 1, got 0" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()
