"""Tracking inside anyone's loop: the `Trainer` callback's run folder is a run folder like `embvar train`'s (loadable,
drift 0 at step 0, the steps asked for), its embeddings are those of the saved checkpoints embedded by hand, the
losses are those of the same training without the callback, and the plain-loop example from the README runs."""
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from embvar_study.extract import embed_texts
from embvar_study.metrics import drift_curve
from embvar_study.models import load_model_and_tokenizer
from embvar_study.runs import load_run
from embvar_study.storage import FolderLockedError
from embvar_study.tracking import EmbeddingTracker, EmbvarCallback, probe_table

from conftest import TEXTS, LABELS, PROBES   # a tiny labelled corpus and probe set for Trainer runs

transformers = pytest.importorskip("transformers")
datasets = pytest.importorskip("datasets")



def make_trainer(out: Path, callbacks, *, steps_per_save=None, seed=0):
    model, tok = load_model_and_tokenizer("tiny-distilbert", num_labels=2, init_seed=0)
    enc = tok(TEXTS, padding="max_length", max_length=12, truncation=True)
    ds = datasets.Dataset.from_dict({**enc, "labels": LABELS})
    args = transformers.TrainingArguments(
        output_dir=str(out), per_device_train_batch_size=4, num_train_epochs=3, learning_rate=1e-3, logging_steps=1,
        save_strategy="steps" if steps_per_save else "no", save_steps=steps_per_save or 500, report_to=[], seed=seed,
        use_cpu=True, disable_tqdm=True, dataloader_num_workers=0)
    return transformers.Trainer(model=model, args=args, train_dataset=ds, processing_class=tok, callbacks=callbacks), tok


def losses(trainer) -> list:
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


@pytest.fixture(scope="module")
def tracked(tmp_path_factory):
    out = tmp_path_factory.mktemp("trainer")
    plain, _ = make_trainer(out / "plain", [])
    plain.train()
    cb = EmbvarCallback(PROBES, out / "run", every=4, poolings=("mean", "cls"))
    trainer, tok = make_trainer(out / "tracked", [cb], steps_per_save=4)
    trainer.train()
    return {"out": out, "plain": plain, "trainer": trainer, "tok": tok, "run": load_run(out / "run")}


def test_the_callback_run_folder_loads_and_starts_at_zero_drift(tracked):
    run = tracked["run"]
    assert run.status == "completed" and run.poolings == ["cls", "mean"]
    assert run.steps.tolist() == [0, 4, 8, 12]                      # step 0, every 4th step, and the last (12)
    curve = drift_curve(run.embeddings(-1, "mean"))
    assert curve[0] == 0.0 and (curve[1:] > 0).all()
    assert run.config["trainer"]["learning_rate"] == 1e-3 and run.config["seed"] == 0
    assert run.config["tracker"]["every"] == 4
    assert list(run.probes["text"]) == PROBES


def test_the_losses_are_those_of_training_without_the_callback(tracked):
    assert losses(tracked["trainer"]) == losses(tracked["plain"])
    assert tracked["run"].history.dropna(subset=["train_loss"])["train_loss"].tolist() == losses(tracked["plain"])
    assert tracked["run"].history["step"].is_unique                  # one row per step: Trainer's end summary is not a step
    summary = json.loads((tracked["out"] / "run" / "COMPLETE").read_text())["trainer_summary"]
    assert summary["mean_train_loss"] == pytest.approx(sum(losses(tracked["plain"])) / len(losses(tracked["plain"])), rel=1e-5)


def test_the_embeddings_are_the_saved_checkpoints_embedded_by_hand(tracked):
    run, tok = tracked["run"], tracked["tok"]
    for step in (4, 8, 12):
        ckpt = tracked["out"] / "tracked" / f"checkpoint-{step}"
        model = transformers.AutoModelForSequenceClassification.from_pretrained(ckpt)
        by_hand = embed_texts(model, tok, PROBES, pooling=("mean", "cls"), layers="all", batch_size=16, max_length=128, return_dict=True)
        for pooling in ("mean", "cls"):
            np.testing.assert_array_equal(run.embeddings_all_layers(pooling, steps=[step])[0], by_hand[pooling])


def test_the_readme_plain_loop_example_runs(tmp_path):
    # the README's plain-PyTorch example, verbatim in substance
    model, tok = load_model_and_tokenizer("tiny-distilbert", num_labels=2, init_seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch = tok(TEXTS, padding=True, return_tensors="pt"); labels = torch.tensor(LABELS)
    with EmbeddingTracker(model, tok, "builtin", tmp_path / "run", every=2, config={"lr": 1e-3}) as tracker:
        tracker.step(0)
        for step in range(1, 6):
            loss = model(**batch, labels=labels).loss
            loss.backward(); opt.step(); opt.zero_grad()
            tracker.step(step); tracker.log(step, train_loss=loss.item())
        tracker.step(step, force=True)
    run = load_run(tmp_path / "run")
    assert run.steps.tolist() == [0, 2, 4, 5] and len(run.probes) == 128 and run.history["step"].tolist() == [1, 2, 3, 4, 5]


def test_tracking_restores_mode_and_rng(tmp_path):
    model, tok = load_model_and_tokenizer("tiny-distilbert", num_labels=2, init_seed=0)
    model.train()
    tr = EmbeddingTracker(model, tok, PROBES, tmp_path / "r", every=1)
    torch.manual_seed(123); expected = torch.rand(3)
    torch.manual_seed(123); tr.step(0); got = torch.rand(3)
    assert torch.equal(expected, got) and model.training
    tr.close()


def test_a_second_tracker_on_a_live_folder_is_refused(tmp_path):
    model, tok = load_model_and_tokenizer("tiny-distilbert", num_labels=2, init_seed=0)
    first = EmbeddingTracker(model, tok, PROBES, tmp_path / "r", every=1)
    with pytest.raises(FolderLockedError, match="is being written by pid"):
        EmbeddingTracker(model, tok, PROBES, tmp_path / "r", every=1)
    first.close()


def test_probe_table_forms():
    assert probe_table(["a", "b"])["text"].tolist() == ["a", "b"]
    assert len(probe_table("builtin")) == 128
    with pytest.raises(ValueError, match="probes: expected a list of texts"):
        probe_table(42)


def test_report_from_callback_runs_and_embvar_train_runs_together(tmp_path):
    from embvar_study.cli import main
    from conftest import TINY, cli_args
    for seed in (0, 1):
        main(["train", *cli_args({**TINY, "lr": 1e-3, "seed": seed, "max_steps": 4}), "--out", str(tmp_path / "train" / f"s{seed}"), "--no-progress"])
    probes = load_run(tmp_path / "train" / "s0").probes["text"].tolist()     # the same probes as the embvar train runs
    for seed in (0, 1):
        cb = EmbvarCallback(probes, tmp_path / "callback" / f"s{seed}", every=4, max_length=32)
        trainer, _ = make_trainer(tmp_path / f"t{seed}", [cb], seed=seed); trainer.train()
    out = tmp_path / "report"
    main(["report", "--runs", str(tmp_path / "train"), str(tmp_path / "callback"), "--group-by", "lr", "--out", str(out)])
    page = (out / "report.html").read_text()
    assert "Traceback" not in page and "<title>Embedding drift of tracked runs" in page
    assert "4 runs" in page and "grouped by <code>lr</code>" in page
    assert "1e-3 (4 runs)" in page                                          # both kinds of run share the group lr 1e-3
    for section in ("Drift over training, per group", "Drift per layer and pooling", "Variance between the runs of a group"):
        assert section in page
    assert "Left out, because they need a designed study" in page
    assert "no two runs differ only in" in page                            # the noise floor says why it is absent
    # runs that embed different probes cannot be pooled: said in one line, not a numpy error
    cb = EmbvarCallback(PROBES, tmp_path / "other" / "r", every=4)
    trainer, _ = make_trainer(tmp_path / "t9", [cb]); trainer.train()
    main(["report", "--runs", str(tmp_path / "train"), str(tmp_path / "other"), "--group-by", "seed", "--out", str(tmp_path / "r2")])
    assert "different probe sets (6, 24 texts)" in (tmp_path / "r2" / "report.html").read_text()


# --- validated before any work; rule files; divergence (issue 33 item 4) ---

def lr_trainer(out: Path, callbacks, lr: float, epochs: int = 2):
    model, tok = load_model_and_tokenizer("tiny-distilbert", num_labels=2, init_seed=0)
    enc = tok(TEXTS, padding="max_length", max_length=12, truncation=True)
    ds = datasets.Dataset.from_dict({**enc, "labels": LABELS})
    args = transformers.TrainingArguments(
        output_dir=str(out), per_device_train_batch_size=4, num_train_epochs=epochs, learning_rate=lr, logging_steps=1,
        save_strategy="no", report_to=[], seed=0, use_cpu=True, disable_tqdm=True, dataloader_num_workers=0)
    return transformers.Trainer(model=model, args=args, train_dataset=ds, processing_class=tok, callbacks=callbacks)


def test_a_bad_alarm_layer_is_refused_before_any_forward_or_write(tmp_path):
    cb = EmbvarCallback(PROBES, tmp_path / "run", every=2, alarm={"threshold": 0.1, "layer": 99})
    trainer = lr_trainer(tmp_path / "t", [cb], 1e-3)
    calls, forward = [], trainer.model.forward
    trainer.model.forward = lambda *a, **kw: (calls.append(1), forward(*a, **kw))[1]
    with pytest.raises(ValueError) as e: trainer.train()
    assert str(e.value) == "alarm.layer: expected an int in [-3, 2] (the run saves 3 layers), got 99"
    assert calls == [] and not (tmp_path / "run").exists() and not list(tmp_path.glob(".run*"))   # nothing behind


def test_bad_tracker_settings_are_refused_at_construction(tmp_path):
    with pytest.raises(TypeError, match=r"unexpected tracker argument\(s\) \['pooling'\]"):
        EmbvarCallback(PROBES, tmp_path / "run", pooling="mean")
    with pytest.raises(ValueError, match="poolings: expected one or more distinct names"):
        EmbvarCallback(PROBES, tmp_path / "run", poolings=["avg"])
    with pytest.raises(ValueError, match="alarm.signal: expected one of"):
        EmbvarCallback(PROBES, tmp_path / "run", alarm={"threshold": 0.1, "signal": "loss"})
    model, tok = load_model_and_tokenizer("tiny-distilbert", num_labels=2, init_seed=0)
    with pytest.raises(ValueError, match=r"drift_layer: expected an int in \[-3, 2\]"):
        EmbeddingTracker(model, tok, PROBES, tmp_path / "run2", drift_layer=5)
    with pytest.raises(ValueError, match="layers: expected"):
        EmbeddingTracker(model, tok, PROBES, tmp_path / "run3", layers=[0, 7])
    assert list(tmp_path.iterdir()) == []


def test_a_rule_file_is_read_wherever_a_rule_dict_is(tmp_path):
    from embvar_study.config import TrainConfig, alarm_rule
    rule = {"threshold": 1e-4, "layer": -1, "start": 2}
    (tmp_path / "rule.json").write_text(json.dumps(rule))
    cb = EmbvarCallback(PROBES, tmp_path / "run", every=2, alarm=str(tmp_path / "rule.json"), stop=True)
    assert cb.alarm == alarm_rule(rule)
    stopped = lr_trainer(tmp_path / "t", [cb], 1e-3); stopped.train()
    assert load_run(tmp_path / "run").status == "stopped_by_alarm" and stopped.state.global_step == 2
    assert TrainConfig(alarm=str(tmp_path / "rule.json")).alarm == alarm_rule(rule).to_dict()
    with pytest.raises(ValueError, match="alarm: cannot read a rule from"):
        EmbvarCallback(PROBES, tmp_path / "run2", alarm=str(tmp_path / "missing.json"))


def test_a_trainer_run_at_lr_1e3_ends_diverged(tmp_path):
    cb = EmbvarCallback(PROBES, tmp_path / "run", every=2)
    trainer = lr_trainer(tmp_path / "t", [cb], 1e3, epochs=3)
    trainer.train()
    run = load_run(tmp_path / "run")
    assert run.status == "diverged" and "at step" in run.marker["diverged_because"]
    assert trainer.state.global_step < trainer.state.max_steps            # the training stopped, as `embvar train` stops
    assert run.history["status"].astype(str).eq("diverged").sum() == 1


def test_the_plain_tracker_marks_divergence(tmp_path):
    model, tok = load_model_and_tokenizer("tiny-distilbert", num_labels=2, init_seed=0)
    with EmbeddingTracker(model, tok, PROBES, tmp_path / "run", every=2) as t:
        t.step(0); t.log(1, train_loss=0.7); t.log(2, train_loss=0.69)
        assert t.diverged == ""
        t.log(3, train_loss=float("nan"))
        assert t.diverged.startswith("training loss nan at step 3")
    run = load_run(tmp_path / "run")
    assert run.status == "diverged" and run.marker["diverged_because"] == t.diverged


def test_a_tracker_started_after_step_0_records_its_own_reference(tmp_path):
    "Driven from step 1 with every=2: step 1 is recorded as the reference (COMPLETE says so) and the live drift at step 2 is drift from it."
    from embvar_study.runs import read_marker
    from embvar_study.metrics import cosine_drift
    model, tok = load_model_and_tokenizer("tiny-distilbert", num_labels=2, init_seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    batch = tok(TEXTS, padding=True, return_tensors="pt"); labels = torch.tensor(LABELS)
    live = {}
    with EmbeddingTracker(model, tok, PROBES, tmp_path / "run", every=2) as tracker:
        for step in range(1, 5):
            live[step] = tracker.step(step).get("embvar/drift")
            loss = model(**batch, labels=labels).loss
            loss.backward(); opt.step(); opt.zero_grad()
    run = load_run(tmp_path / "run")
    assert run.steps.tolist() == [1, 2, 4] and read_marker(tmp_path / "run")["reference_step"] == 1
    E = run.embeddings(-1, "mean")
    assert live[1] == 0.0 and live[3] is None
    np.testing.assert_allclose([live[2], live[4]], np.asarray(cosine_drift(E[:1], E[1:])), rtol=1e-5)
    assert live[2] > 0


def test_the_alarm_stop_prints_one_console_line(tmp_path, capsys):
    "A Trainer ended early by the alarm says so once, on the console: the step of how many, the rule's reason and the folder."
    cb = EmbvarCallback(PROBES, tmp_path / "run", every=2, alarm={"threshold": 1e-4, "layer": -1, "start": 2}, stop=True)
    t = lr_trainer(tmp_path / "t", [cb], 1e-3); t.train()
    run = load_run(tmp_path / "run")
    assert run.status == "stopped_by_alarm" and t.state.global_step == 2
    lines = [l for l in capsys.readouterr().out.splitlines() if l.startswith("embvar:")]
    assert lines == [f"embvar: the alarm stopped training at step 2 of {t.state.max_steps}: {run.alarm['reason']} (run folder {tmp_path / 'run'})"]


def test_a_crashed_run_keeps_the_history_rows_it_logged(tmp_path):
    "Rows logged between tracked steps (buffered) are in history.csv after an exception ends the loop; the folder stays incomplete."
    import pandas as pd
    model, tok = load_model_and_tokenizer("tiny-distilbert", num_labels=2, init_seed=0)
    with pytest.raises(RuntimeError, match="boom"):
        with EmbeddingTracker(model, tok, PROBES, tmp_path / "run", every=4) as tracker:
            tracker.step(0)
            for step in (1, 2, 3): tracker.log(step, train_loss=1.0 / step)
            raise RuntimeError("boom")
    assert not (tmp_path / "run" / "COMPLETE").exists() and not list(tmp_path.glob("**/*.lock.json"))   # released
    h = pd.read_csv(tmp_path / "run" / "history.csv")
    assert h["step"].tolist() == [1, 2, 3] and np.allclose(h["train_loss"], [1.0, 0.5, 1 / 3])


def test_importing_tracking_imports_neither_transformers_nor_peft():
    "`import embvar_study.tracking` (a plain loop's needs) leaves transformers and peft out; EmbvarCallback brings them."
    import subprocess, sys
    code = ("import sys, pickle\nimport embvar_study.tracking as t\n"
            "print('before', sorted(m for m in ('transformers', 'peft') if m in sys.modules))\n"
            "from embvar_study.tracking import EmbvarCallback\nfrom transformers import TrainerCallback\n"
            "print('after', issubclass(EmbvarCallback, TrainerCallback), t.EmbvarCallback is EmbvarCallback,\n"
            "      pickle.loads(pickle.dumps(EmbvarCallback)) is EmbvarCallback)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split("\n")[:2] == ["before []", "after True True True"], r.stdout
