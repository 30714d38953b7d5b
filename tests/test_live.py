"""Live drift where fine-tuning happens: the drift a `Trainer`, a Lightning `Trainer` or a plain loop sends to the real
trackers (TensorBoard event files, an MLflow store, Trackio's local database, Lightning's CSV logger), read back with
their own readers, equals `drift_curve` of the run folder; the alarm stops a diverging run and leaves a stable one."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from embvar_study.metrics import drift_curve
from embvar_study.models import load_model_and_tokenizer
from embvar_study.runs import load_run
from embvar_study.tracking import EmbeddingTracker, EmbvarCallback, alarm_rule

from conftest import TEXTS, LABELS, PROBES   # a tiny labelled corpus and probe set for Trainer runs

transformers = pytest.importorskip("transformers")
datasets = pytest.importorskip("datasets")

ROOT = Path(__file__).resolve().parents[1]


def make_trainer(out: Path, callbacks, *, report_to=(), lr=1e-3, epochs=2, alias="tiny-distilbert", **args):
    model, tok = load_model_and_tokenizer(alias, num_labels=2, init_seed=0)
    enc = tok(TEXTS, padding="max_length", max_length=12, truncation=True)
    ds = datasets.Dataset.from_dict({**enc, "labels": LABELS})
    targs = transformers.TrainingArguments(
        output_dir=str(out), per_device_train_batch_size=4, num_train_epochs=epochs, learning_rate=lr,
        save_strategy="no", report_to=list(report_to), seed=0, use_cpu=True, disable_tqdm=True, dataloader_num_workers=0,
        **{"logging_steps": 1, **args})
    return transformers.Trainer(model=model, args=targs, train_dataset=ds, processing_class=tok, callbacks=callbacks)


def tb_scalars(logdir: Path) -> dict:
    "tag -> {step: value}, read with TensorBoard's own EventAccumulator from every event file under `logdir`."
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    out: dict = {}
    for f in sorted(Path(logdir).rglob("events.out.tfevents.*")):
        acc = EventAccumulator(str(f)); acc.Reload()
        for tag in acc.Tags()["scalars"]:
            out.setdefault(tag, {}).update({e.step: e.value for e in acc.Scalars(tag)})
    return out


def expected(run, pooling="mean") -> dict:
    "The live metrics recomputed from the run folder: drift_curve per layer, and the velocity between tracked steps."
    steps = run.steps
    per_layer = np.stack([drift_curve(run.embeddings(k, pooling)) for k in range(run.shape[0])])   # (L+1, T)
    vel = np.diff(per_layer[-1]) / np.diff(steps)
    return {"steps": steps.tolist(), "drift": per_layer[-1], "layers": per_layer, "velocity": vel}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    "One tiny Trainer run reporting to TensorBoard and MLflow (sqlite store) at once."
    out = tmp_path_factory.mktemp("live")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{out / 'mlflow.db'}")
        mp.setenv("MLFLOW_EXPERIMENT_NAME", "embvar-live")
        mp.setenv("TENSORBOARD_LOGGING_DIR", str(out / "tb"))
        cb = EmbvarCallback(PROBES, out / "run", every=2)
        trainer = make_trainer(out / "trainer", [cb], report_to=["tensorboard", "mlflow"], epochs=2, logging_steps=3)
        trainer.train()
    return {"out": out, "run": load_run(out / "run"), "trainer": trainer, "cb": cb}


def test_tensorboard_event_files_hold_the_drift_of_the_run_folder(trained):
    run, exp = trained["run"], expected(trained["run"])
    assert exp["steps"] == [0, 2, 4, 6, 8] and run.status == "completed"
    tb = tb_scalars(trained["out"] / "tb")
    drift = tb["train/embvar/drift"]                                   # TensorBoardCallback prefixes train/
    assert sorted(drift) == exp["steps"]
    np.testing.assert_allclose([drift[s] for s in exp["steps"]], exp["drift"], atol=1e-6, rtol=0)
    for k in range(run.shape[0]):
        layer = tb[f"train/embvar/drift/layer_{k}"]
        np.testing.assert_allclose([layer[s] for s in exp["steps"]], exp["layers"][k], atol=1e-6, rtol=0)
    vel = tb["train/embvar/drift_velocity"]
    assert sorted(vel) == exp["steps"][1:]
    np.testing.assert_allclose([vel[s] for s in exp["steps"][1:]], exp["velocity"], atol=1e-6, rtol=0)
    # the user's own loss logging is unchanged: logging_steps=3 gives the loss at steps 3 and 6 only
    assert sorted(tb["train/loss"]) == [3, 6]


def test_mlflow_store_holds_the_drift_of_the_run_folder(trained):
    from mlflow.tracking import MlflowClient
    client = MlflowClient(tracking_uri=f"sqlite:///{trained['out'] / 'mlflow.db'}")
    exp_id = client.get_experiment_by_name("embvar-live").experiment_id
    (mlrun,) = client.search_runs([exp_id])
    hist = {m.step: m.value for m in client.get_metric_history(mlrun.info.run_id, "embvar/drift")}
    exp = expected(trained["run"])
    assert sorted(hist) == exp["steps"]
    np.testing.assert_allclose([hist[s] for s in exp["steps"]], exp["drift"], atol=1e-6, rtol=0)
    last = {m.step: m.value for m in client.get_metric_history(mlrun.info.run_id, f"embvar/drift/layer_{trained['run'].shape[0] - 1}")}
    np.testing.assert_allclose([last[s] for s in exp["steps"]], exp["drift"], atol=1e-6, rtol=0)


def test_the_trainer_state_and_the_run_history_agree(trained):
    live = [h for h in trained["trainer"].state.log_history if "embvar/drift" in h]
    assert [h["step"] for h in live] == expected(trained["run"])["steps"]
    assert not any(c.startswith("embvar/") for c in trained["run"].history.columns)   # derived numbers stay out of history.csv
    assert trained["run"].history["step"].is_unique
    assert trained["run"].alarm is None and "alarm" not in trained["run"].config


TRACKIO_SCRIPT = r"""
import json, sys
sys.path[:0] = [sys.argv[2], sys.argv[2] + "/tests"]   # the checkout and tests/ (test_live imports conftest)
from tests.test_live import make_trainer, PROBES
from embvar_study.tracking import EmbvarCallback
from pathlib import Path
out = Path(sys.argv[1])
cb = EmbvarCallback(PROBES, out / "run", every=2)
make_trainer(out / "trainer", [cb], report_to=["trackio"], epochs=1, project="embvar-live").train()
from trackio.sqlite_storage import SQLiteStorage
runs = SQLiteStorage.get_runs("embvar-live")
logs = SQLiteStorage.get_logs("embvar-live", runs[0])
print("LOGS" + json.dumps([{k: v for k, v in r.items() if "drift" in k or k == "train/global_step"} for r in logs]))
"""


def test_trackio_local_database_holds_the_drift(tmp_path):
    pytest.importorskip("trackio")
    env = {**os.environ, "TRACKIO_DIR": str(tmp_path / "trackio"), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "GRADIO_ANALYTICS_ENABLED": "False", "HF_HUB_DISABLE_TELEMETRY": "1", "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", TRACKIO_SCRIPT, str(tmp_path), str(ROOT)], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = json.loads(next(line for line in r.stdout.splitlines() if line.startswith("LOGS"))[4:])
    got = {row["train/global_step"]: row["train/embvar/drift"] for row in rows if "train/embvar/drift" in row}
    exp = expected(load_run(tmp_path / "run"))
    assert sorted(got) == exp["steps"]
    np.testing.assert_allclose([got[s] for s in exp["steps"]], exp["drift"], atol=1e-6, rtol=0)


def test_a_plain_loop_logs_to_a_summary_writer_and_mlflow(tmp_path):
    import mlflow
    from mlflow.tracking import MlflowClient
    from torch.utils.tensorboard import SummaryWriter
    model, tok = load_model_and_tokenizer("tiny-bert", num_labels=2, init_seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch, labels = tok(TEXTS, padding=True, return_tensors="pt"), torch.tensor(LABELS)
    writer, uri = SummaryWriter(str(tmp_path / "tb")), f"sqlite:///{tmp_path / 'm.db'}"
    mlflow.set_tracking_uri(uri); mlflow.set_experiment("plain-loop")
    returned = {}
    try:
        with mlflow.start_run() as mlrun, EmbeddingTracker(model, tok, PROBES, tmp_path / "run", every=2, drift_pooling="cls",
                                                           poolings=("mean", "cls")) as tracker:
            for step in range(0, 7):
                if step:
                    model(**batch, labels=labels).loss.backward(); opt.step(); opt.zero_grad()
                m = tracker.step(step, log=[writer.add_scalar, mlflow.log_metrics])
                if m: returned[step] = m["embvar/drift"]
    finally:
        writer.close(); mlflow.set_tracking_uri(None)
    run = load_run(tmp_path / "run")
    exp = drift_curve(run.embeddings(-1, "cls"))
    np.testing.assert_allclose([returned[s] for s in run.steps], exp, atol=1e-6, rtol=0)
    tb = tb_scalars(tmp_path / "tb")["embvar/drift"]
    np.testing.assert_allclose([tb[s] for s in run.steps], exp, atol=1e-6, rtol=0)
    hist = {m.step: m.value for m in MlflowClient(tracking_uri=uri).get_metric_history(mlrun.info.run_id, "embvar/drift")}
    np.testing.assert_allclose([hist[s] for s in run.steps], exp, atol=1e-6, rtol=0)
    assert tracker.step(7) == {}                                          # not a tracked step: no numbers


def test_the_alarm_stops_a_diverging_run_and_not_a_stable_one(tmp_path):
    rule = {"noise_floor": 0.01, "k": 5, "start": 2}                     # drift above 5 x 0.01 from step 2 on
    runs = {}
    for name, lr in (("diverging", 0.3), ("stable", 1e-6)):   # (at lr 3 the loss passes 10 x its first value: status diverged)
        cb = EmbvarCallback(PROBES, tmp_path / name, every=2, alarm=rule, stop=True)
        t = make_trainer(tmp_path / f"t_{name}", [cb], lr=lr, epochs=3)
        t.train()
        runs[name] = (load_run(tmp_path / name), t)
    stopped, t = runs["diverging"]
    assert stopped.status == "stopped_by_alarm" and stopped.alarm["fired"] and stopped.alarm["step"] == 2
    assert t.state.global_step == 2 and stopped.steps.tolist() == [0, 2]
    assert stopped.alarm["value"] == pytest.approx(drift_curve(stopped.embeddings(-1, "mean"))[-1], abs=1e-6) and stopped.alarm["value"] > 0.05
    assert "drift" in stopped.alarm["reason"] and "5 x noise floor 0.01" in stopped.alarm["reason"]
    assert json.loads((stopped.path / "alarm.json").read_text()) == stopped.alarm          # written when it fired, checksummed
    assert "alarm.json" in stopped.marker["files"] and stopped.config["alarm"]["threshold"] == pytest.approx(0.05)
    assert [h["embvar/alarm"] for h in t.state.log_history if "embvar/alarm" in h] == [0.0, 1.0]
    stable, t = runs["stable"]
    assert stable.status == "completed" and stable.alarm == {"fired": False, "rule": alarm_rule(rule).to_dict()}
    assert t.state.global_step == 12 and stable.steps.tolist() == [0, 2, 4, 6, 8, 10, 12]
    assert drift_curve(stable.embeddings(-1, "mean")).max() < 0.05
    # a report of the two folders says which run its alarm stopped, at which step and why
    from embvar_study.study import study_from_runs
    from embvar_study.findings import alarm_note
    from embvar_study.experiment_sections import section_runs_overview
    note = alarm_note(study_from_runs([tmp_path / "diverging", tmp_path / "stable"], group_by="trainer.learning_rate"))
    assert note.startswith("**1 run stopped by a drift alarm**") and "at step 2" in note and "5 x noise floor 0.01" in note
    assert section_runs_overview(study_from_runs([tmp_path / "diverging", tmp_path / "stable"], group_by="trainer.learning_rate"))[0] == note


def test_an_alarm_without_stop_only_warns(tmp_path):
    cb = EmbvarCallback(PROBES, tmp_path / "r", every=2, alarm=1e-6)
    t = make_trainer(tmp_path / "t", [cb], epochs=1); t.train()
    run = load_run(tmp_path / "r")
    assert t.state.global_step == 4 and run.status == "completed" and run.alarm["step"] == 2


def test_bad_alarm_and_settings_name_the_argument(tmp_path):
    with pytest.raises(ValueError, match="stop: expected True or False, got 'yes'"):
        EmbvarCallback(PROBES, tmp_path / "a", alarm=0.1, stop="yes")
    with pytest.raises(ValueError, match="alarm: cannot read a rule from"):
        EmbvarCallback(PROBES, tmp_path / "a", alarm=str(tmp_path / "missing.json"))
    model, tok = load_model_and_tokenizer("tiny-distilbert", num_labels=2, init_seed=0)
    with pytest.raises(ValueError, match=r"drift_pooling: expected one of the tracked poolings \['mean'\], got 'cls'"):
        EmbeddingTracker(model, tok, PROBES, tmp_path / "b", drift_pooling="cls")
    with pytest.raises(ValueError, match=r"alarm: its steps \[3, 4\] hold no tracked step \(every=5\)"):
        EmbeddingTracker(model, tok, PROBES, tmp_path / "c", every=5, alarm={"threshold": 0.1, "start": 3, "end": 4})
    with pytest.raises(ValueError, match=r"drift_layer: expected an int in \[-\d+, \d+\] \(the run saves \d+ layers\), got 9"):
        EmbeddingTracker(model, tok, PROBES, tmp_path / "d", drift_layer=9)       # at construction: before any forward or write
    assert not any((tmp_path / n).exists() for n in "abcd")


def test_a_callback_outside_a_trainer_warns_and_still_tracks(tmp_path):
    model, tok = load_model_and_tokenizer("tiny-distilbert", num_labels=2, init_seed=0)
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "o"), report_to=[], use_cpu=True)
    state, control = transformers.TrainerState(), transformers.TrainerControl()
    cb = EmbvarCallback(PROBES, tmp_path / "r", every=1)
    with pytest.warns(UserWarning, match="go to the run folder only"):
        cb.on_train_begin(args, state, control, model=model, processing_class=tok)
    cb.on_train_end(args, state, control)
    assert load_run(tmp_path / "r").steps.tolist() == [0] and cb.tracker.metrics["embvar/drift"] == 0.0


def _lightning_fit(tmp_path, name, callback, lr, max_steps=6):
    pl = pytest.importorskip("pytorch_lightning")
    model, tok = load_model_and_tokenizer("tiny-distilbert", num_labels=2, init_seed=0)

    class Tiny(pl.LightningModule):
        def __init__(self):
            super().__init__(); self.model, self.tokenizer = model, tok
        def training_step(self, batch, i):
            return self.model(**batch).loss
        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=lr)

    enc = tok(TEXTS, padding="max_length", max_length=12, truncation=True, return_tensors="pt")
    rows = [{"input_ids": enc["input_ids"][i], "attention_mask": enc["attention_mask"][i], "labels": torch.tensor(LABELS[i])} for i in range(len(TEXTS))]
    loader = torch.utils.data.DataLoader(rows, batch_size=4)
    logger = pl.loggers.CSVLogger(str(tmp_path / f"csv_{name}"), name="tiny")
    trainer = pl.Trainer(max_steps=max_steps, accelerator="cpu", devices=1, logger=logger, callbacks=[callback], enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, log_every_n_steps=1)
    trainer.fit(Tiny(), loader)
    return trainer, logger


def test_lightning_callback_logs_the_drift_and_stops_on_the_alarm(tmp_path):
    import pandas as pd
    from embvar_study.tracking import EmbvarLightningCallback
    cb = EmbvarLightningCallback(PROBES, tmp_path / "run", every=2)
    trainer, logger = _lightning_fit(tmp_path, "plain", cb, lr=0.5)
    run = load_run(tmp_path / "run")
    assert run.status == "completed" and run.steps.tolist() == [0, 2, 4, 6] and trainer.global_step == 6
    csv = pd.read_csv(Path(logger.log_dir) / "metrics.csv").dropna(subset=["embvar/drift"])
    np.testing.assert_allclose(csv.set_index("step").loc[run.steps, "embvar/drift"], drift_curve(run.embeddings(-1, "mean")), atol=1e-6, rtol=0)
    assert float(trainer.callback_metrics["embvar/drift"]) == pytest.approx(drift_curve(run.embeddings(-1, "mean"))[-1], abs=1e-6)
    cb = EmbvarLightningCallback(PROBES, tmp_path / "alarm", every=2, alarm=1e-6, stop=True)
    trainer, _ = _lightning_fit(tmp_path, "alarm", cb, lr=0.5)
    run = load_run(tmp_path / "alarm")
    assert trainer.global_step == 2 and run.status == "stopped_by_alarm" and run.alarm["step"] == 2 and run.steps.tolist() == [0, 2]


def test_float16_storage_and_a_velocity_alarm_in_a_plain_loop(tmp_path):
    from embvar_study.runs import CorruptRunError
    model, tok = load_model_and_tokenizer("tiny-bert", num_labels=2, init_seed=0)
    gen = torch.Generator().manual_seed(0)
    tracker = EmbeddingTracker(model, tok, PROBES, tmp_path / "r", every=1, dtype="float16",
                               alarm={"threshold": -1.0, "signal": "drift_velocity", "layer": 0})
    got = []
    for step in range(3):
        if step:
            with torch.no_grad():
                for p in model.parameters(): p.add_(0.05 * torch.randn(p.shape, generator=gen))
        got.append(tracker.step(step))
        if tracker.alarm_fired: break
    run = load_run(tracker.close())
    exp = drift_curve(run.embeddings(-1, "mean"))                          # read back from float16 files
    np.testing.assert_allclose([m["embvar/drift"] for m in got], exp, atol=1e-6, rtol=0)
    vel0 = drift_curve(run.embeddings(0, "mean"))[1]                      # layer 0, one step
    assert run.status == "stopped_by_alarm" and run.steps.tolist() == [0, 1]   # stopped: no step after the alarm's
    assert run.alarm["step"] == 1 and run.alarm["value"] == pytest.approx(vel0, abs=1e-6)
    marker = json.loads((run.path / "COMPLETE").read_text()); marker["alarm"] = "fired"
    (run.path / "COMPLETE").write_text(json.dumps(marker))
    with pytest.raises(CorruptRunError, match="field 'alarm': expected null or a dict"):
        load_run(run.path)


def test_the_live_metrics_cost_no_second_forward_pass(tmp_path, monkeypatch):
    "Forward calls of the model (a forward hook) in a Trainer run with the live metrics sent to TensorBoard, and without them."
    calls, runs = {}, {}
    for live in (True, False):
        cb = EmbvarCallback(PROBES, tmp_path / f"run_{live}", every=2, batch_size=3, live=live)
        monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / f"tb_{live}"))
        t = make_trainer(tmp_path / f"t_{live}", [cb], report_to=["tensorboard"] if live else [], epochs=1)
        n = []
        h = t.model.register_forward_hook(lambda *_: n.append(1))
        try: t.train()
        finally: h.remove()
        calls[live], runs[live] = len(n), load_run(tmp_path / f"run_{live}")
        assert t.state.global_step == 4 and runs[live].steps.tolist() == [0, 2, 4]
    assert calls[True] == calls[False] == 4 + 3 * -(-len(PROBES) // 3)      # 4 training steps + 3 checkpoints x probe batches
    assert sorted(tb_scalars(tmp_path / "tb_True")["train/embvar/drift"]) == [0, 2, 4]     # the live run did log
    np.testing.assert_array_equal(runs[True].embeddings(-1, "mean"), runs[False].embeddings(-1, "mean"))
    with pytest.raises(ValueError, match=r"^live: an alarm needs the live metrics"):
        EmbvarCallback(PROBES, tmp_path / "x", alarm=0.05, live=False)
