"""What tracking costs, measured twice in one run of this script:

1. Hugging Face `Trainer` with `tracking.EmbvarCallback` (every 10 steps, the 128 built-in probes) vs the same `Trainer`
   without it: the ratio of wall times (goal: at most 5% slower). The two are run in turn (`--repeats` pairs, without
   then with) and compared by their medians, since on a shared machine one run's wall time varies by more than 5%;
   the seconds the callback itself spent tracking (its tracker's clock) are printed too, which noise does not blur;
2. our loop with tracking vs without, and vs `Trainer` with the callback.

Same model (offline MiniLM), same data, batch size, learning rate and schedule. Held-out evaluation is off everywhere
(it is not tracking). Data: ../shared/data/imdb_train.csv when present (real IMDb reviews, a development subset that is
not part of the project), else the bundled mini-corpus; the output says which.

    .venv/bin/python benchmarks/bench_train.py [--n-train 480] [--track-every 10]
"""
import argparse, json, tempfile, time, warnings
from pathlib import Path
import torch

warnings.filterwarnings("ignore")
ap = argparse.ArgumentParser()
ap.add_argument("--n-train", type=int, default=480)
ap.add_argument("--track-every", type=int, default=10)
ap.add_argument("--batch-size", type=int, default=16)
ap.add_argument("--max-length", type=int, default=128)
ap.add_argument("--model", default="minilm-offline")
ap.add_argument("--repeats", type=int, default=3, help="pairs of Trainer runs (without, with the callback)")
a = ap.parse_args()

from embvar_study.config import TrainConfig
from embvar_study.train import train_run, prepare_data
from embvar_study.models import load_model_and_tokenizer

shared = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "imdb_train.csv"
dataset = str(shared) if shared.exists() else "bundled"
print(f"data: {dataset} ({'real IMDb subset from ../shared/data' if shared.exists() else 'bundled mini-corpus'}); model: {a.model}; "
      f"torch threads: {torch.get_num_threads()}")
base = dict(model=a.model, dataset=dataset, n_train=a.n_train, n_eval=16, batch_size=a.batch_size, max_length=a.max_length,
            epochs=1, lr=5e-5, seed=0)   # probe settings: TrainConfig defaults (128 built-in probes, embed_batch_size 16)
steps = -(-a.n_train // a.batch_size)

def ours(track_every, eval_every, **extra):
    with tempfile.TemporaryDirectory() as d:
        cfg = TrainConfig(**base, track_every=track_every, eval_every=eval_every, **extra)
        t = time.perf_counter(); p = train_run(cfg, Path(d) / "run"); wall = time.perf_counter() - t
        info = json.loads((p / "COMPLETE").read_text())
        return wall, info.get("timing", {})

def hf_trainer(every):
    "(wall time of Trainer.train(), seconds the callback spent tracking) with EmbvarCallback(every) when every is given."
    from transformers import Trainer, TrainingArguments, DataCollatorWithPadding
    from embvar_study.tracking import EmbvarCallback
    cfg = TrainConfig(**base)
    tr, ev, probes = prepare_data(cfg)
    model, tok = load_model_and_tokenizer(cfg.model, num_labels=2, init_seed=0)
    enc = tok(list(tr.text), truncation=True, max_length=cfg.max_length)
    ds = [{"input_ids": enc["input_ids"][i], "attention_mask": enc["attention_mask"][i], "labels": int(tr.label.iloc[i])} for i in range(len(tr))]
    with tempfile.TemporaryDirectory() as d:
        args = TrainingArguments(output_dir=d, per_device_train_batch_size=cfg.batch_size, learning_rate=cfg.lr, num_train_epochs=1,
                                 warmup_steps=int(round(cfg.warmup_ratio * steps)), weight_decay=cfg.weight_decay, max_grad_norm=1.0, logging_steps=1000,
                                 save_strategy="no", report_to=[], seed=0, log_level="error", use_cpu=not torch.cuda.is_available(), dataloader_num_workers=0,
                                 disable_tqdm=True)
        callbacks = [EmbvarCallback("builtin", Path(d) / "run", every=every)] if every else []
        trainer = Trainer(model=model, args=args, train_dataset=ds, data_collator=DataCollatorWithPadding(tok), processing_class=tok, callbacks=callbacks)
        t = time.perf_counter(); trainer.train(); wall = time.perf_counter() - t
        return wall, (callbacks[0].tracker.seconds if callbacks else 0.0)

big = 10 ** 9
# warm-up: imports, model files in the page cache, tokenizer and allocator warm (not timed)
with tempfile.TemporaryDirectory() as d:
    train_run(TrainConfig(**{**base, "n_train": 32, "n_eval": 16}, track_every=big, eval_every=big), Path(d) / "warm")
import statistics
pairs = [(hf_trainer(None), hf_trainer(a.track_every)) for _ in range(a.repeats)]     # without, with: in turn
w_hf0, w_hf = statistics.median(p[0][0] for p in pairs), statistics.median(p[1][0] for p in pairs)
cb_s = statistics.median(p[1][1] for p in pairs)
rows = [("HF Trainer, no callback (median)", w_hf0), (f"HF Trainer + EmbvarCallback(every={a.track_every}) (median)", w_hf)]
w_plain, tim0 = ours(big, big); rows.append(("ours, no tracking (step 0 and last only)", w_plain))
w_track, tim = ours(a.track_every, big); rows.append(("ours, tracking every %d steps" % a.track_every, w_track))
print(f"\n{steps} optimizer steps, batch {a.batch_size}, max_length {a.max_length}")
for name, w in rows: print(f"  {name:45s} {w:7.1f} s   {a.n_train / w:6.1f} examples/s")
print("\nTrainer pairs (without, with the callback), s: " + ", ".join(f"({p[0][0]:.1f}, {p[1][0]:.1f})" for p in pairs))
print(f"Trainer with the callback / without it, medians of {a.repeats}: {w_hf / w_hf0:.3f} (goal <= 1.05)")
print(f"time the callback spent tracking: {cb_s:.2f} s = {100 * cb_s / (w_hf - cb_s):.1f}% of the rest of its Trainer run (goal <= 5%)")
n_tracks = len(range(0, steps + 1, a.track_every)) + (steps % a.track_every != 0)
per_track, per_step = tim["track_s"] / n_tracks, tim["train_s"] / steps
print(f"tracking time inside our run: {tim['track_s']:.2f} s for {n_tracks} checkpoints ({per_track:.2f} s each) "
      f"vs {tim['train_s']:.2f} s for {steps} training steps ({per_step:.2f} s each)")
print(f"our loop, steady state (one checkpoint per {a.track_every} steps): {100 * per_track / (a.track_every * per_step):.1f}% (goal <= 5%)")
hf_step = (w_hf - cb_s) / steps                              # the Trainer run's own time per step, tracking taken out
print(f"the callback, steady state (one checkpoint per {a.track_every} steps): {100 * cb_s / n_tracks / (a.track_every * hf_step):.1f}% "
      f"of the Trainer's {a.track_every * hf_step:.2f} s per {a.track_every} steps (goal <= 5%)")
print(f"wall-time ratio ours tracking / no tracking: {w_track / w_plain:.3f}")
print(f"wall-time ratio ours (tracking) / HF Trainer + callback: {w_track / w_hf:.3f} (goal <= 1)")
