"""What tracking costs, measured in one run of this script (interleaved trials, medians, ratios to the baseline of the
same run):

1. Hugging Face `Trainer` (all arms report to TensorBoard) in three arms, run in turn `--repeats` times (the order
   rotates every repeat): no callback (the baseline); `EmbvarCallback(every, live=False)` (tracking: the probes
   embedded and saved at the checkpoints, no live metrics); `EmbvarCallback(every)` (tracking with the live metrics
   `embvar/drift`, ... computed and sent through the Trainer's log to TensorBoard). Wall-time ratios of the medians:
   live / tracking (goal <= 1.01, issue 23) and tracking / baseline. On a shared machine one run's wall time varies by
   more than 1%, so the tracker's own clocks are printed too (noise does not blur them): per checkpoint, the probes'
   forward passes, saving (finiteness check, .npy writes, checksums, flush), the live metrics, sending them to the
   trackers; and, in steady state (one checkpoint per `every` steps), each as a share of the training time of those
   `every` steps (issue 19: tracking overhead <= 3%).
2. our loop (`embvar train`) with tracking vs without, and vs `Trainer` with the callback.

Same model (offline MiniLM), same data, batch size, learning rate and schedule. Held-out evaluation is off everywhere
(it is not tracking). Data: ../shared/data/imdb_train.csv when present (real IMDb reviews, a development subset that is
not part of the project), else the bundled mini-corpus; the output says which.

    .venv/bin/python benchmarks/bench_train.py [--n-train 480] [--track-every 10] [--repeats 3]
"""
import argparse, json, os, statistics, tempfile, time, warnings
from pathlib import Path
import torch

warnings.filterwarnings("ignore")
ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--n-train", type=int, default=480)
ap.add_argument("--track-every", type=int, default=10)
ap.add_argument("--batch-size", type=int, default=16)
ap.add_argument("--max-length", type=int, default=128)
ap.add_argument("--model", default="minilm-offline")
ap.add_argument("--repeats", type=int, default=3, help="rounds of the three Trainer arms (baseline, tracking, tracking + live)")
ap.add_argument("--no-ours", action="store_true", help="skip part 2 (our loop)")
a = ap.parse_args()
for name in ("n_train", "track_every", "batch_size", "max_length", "repeats"):
    if getattr(a, name) < 1: ap.error(f"--{name.replace('_', '-')}: expected an integer >= 1, got {getattr(a, name)}")

from embvar_study.config import TrainConfig
from embvar_study.train import train_run, prepare_data
from embvar_study.models import load_model_and_tokenizer

shared = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "imdb_train.csv"
dataset = str(shared) if shared.exists() else "bundled"
print(f"data: {dataset} ({'real IMDb subset from ../shared/data' if shared.exists() else 'bundled mini-corpus'}); model: {a.model}; "
      f"torch threads: {torch.get_num_threads()}; load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
base = dict(model=a.model, dataset=dataset, n_train=a.n_train, n_eval=16, batch_size=a.batch_size, max_length=a.max_length,
            epochs=1, lr=5e-5, seed=0)   # probe settings: TrainConfig defaults (128 built-in probes, embed_batch_size 16)
steps = -(-a.n_train // a.batch_size)

def ours(track_every, eval_every, **extra):
    with tempfile.TemporaryDirectory() as d:
        cfg = TrainConfig(**base, track_every=track_every, eval_every=eval_every, **extra)
        t = time.perf_counter(); p = train_run(cfg, Path(d) / "run"); wall = time.perf_counter() - t
        info = json.loads((p / "COMPLETE").read_text())
        return wall, info.get("timing", {})

def hf_trainer(arm):
    "Wall time of Trainer.train() and the tracker's clocks, for arm 'baseline' (no callback), 'tracking' (live=False) or 'live'."
    from transformers import Trainer, TrainingArguments, DataCollatorWithPadding, PrinterCallback
    from embvar_study.tracking import EmbvarCallback
    cfg = TrainConfig(**base)
    tr, ev, probes = prepare_data(cfg)
    model, tok = load_model_and_tokenizer(cfg.model, num_labels=2, init_seed=0)
    enc = tok(list(tr.text), truncation=True, max_length=cfg.max_length)
    ds = [{"input_ids": enc["input_ids"][i], "attention_mask": enc["attention_mask"][i], "labels": int(tr.label.iloc[i])} for i in range(len(tr))]
    with tempfile.TemporaryDirectory() as d:
        os.environ["TENSORBOARD_LOGGING_DIR"] = str(Path(d) / "tb")      # every arm reports to TensorBoard
        args = TrainingArguments(output_dir=d, per_device_train_batch_size=cfg.batch_size, learning_rate=cfg.lr, num_train_epochs=1,
                                 warmup_steps=int(round(cfg.warmup_ratio * steps)), weight_decay=cfg.weight_decay, max_grad_norm=1.0, logging_steps=1000,
                                 save_strategy="no", report_to=["tensorboard"], seed=0, log_level="error", use_cpu=not torch.cuda.is_available(),
                                 dataloader_num_workers=0, disable_tqdm=True)
        callbacks = [] if arm == "baseline" else [EmbvarCallback("builtin", Path(d) / "run", every=a.track_every, live=arm == "live")]
        trainer = Trainer(model=model, args=args, train_dataset=ds, data_collator=DataCollatorWithPadding(tok), processing_class=tok, callbacks=callbacks)
        trainer.remove_callback(PrinterCallback)                        # no log lines on stdout (disable_tqdm adds it)
        t = time.perf_counter(); trainer.train(); wall = time.perf_counter() - t
        k = callbacks[0].tracker if callbacks else None
        clocks = {"total": k.seconds + k.log_seconds, "embed": k.embed_seconds, "live": k.live_seconds, "log": k.log_seconds,
                  "save": k.seconds - k.embed_seconds - k.live_seconds, "checkpoints": len(k.tracked)} if k else {}
        return {"wall": wall, **clocks}

big = 10 ** 9
# warm-up: imports, model files in the page cache, tokenizer and allocator warm (not timed)
with tempfile.TemporaryDirectory() as d:
    train_run(TrainConfig(**{**base, "n_train": 32, "n_eval": 16}, track_every=big, eval_every=big), Path(d) / "warm")
ARMS = ("baseline", "tracking", "live")
res = {arm: [] for arm in ARMS}
for r in range(a.repeats):                                     # interleaved; the order rotates so no arm always runs first
    for arm in ARMS[r % 3:] + ARMS[:r % 3]:
        res[arm].append(hf_trainer(arm))
        print(f"  round {r + 1}: {arm:8s} {res[arm][-1]['wall']:6.1f} s", flush=True)
med = {arm: {k: statistics.median(x[k] for x in res[arm]) for k in res[arm][0]} for arm in ARMS}
w0, wt, wl = (med[arm]["wall"] for arm in ARMS)
print(f"\n{steps} optimizer steps, batch {a.batch_size}, max_length {a.max_length}, checkpoints every {a.track_every} steps "
      f"({int(med['live']['checkpoints'])} per run: step 0, the multiples of {a.track_every}, the last)")
print("Trainer wall times, s (round by round):")
for arm in ARMS: print(f"  {arm:8s} " + ", ".join(f"{x['wall']:.1f}" for x in res[arm]) + f"   median {med[arm]['wall']:.1f}")
print(f"ratios of the medians (same run): tracking / baseline {wt / w0:.3f}; live / baseline {wl / w0:.3f}; "
      f"live / tracking {wl / wt:.3f} (goal <= 1.01)")
L, T = med["live"], med["tracking"]
n = L["checkpoints"]
print("tracker clocks per checkpoint, ms (medians over the rounds; live arm | tracking arm):")
for k, what in (("embed", "probe forward passes"), ("save", "saving: finite check, .npy, checksums, flush"),
                ("live", "live metrics + alarm check"), ("log", "sending them to the trackers (TensorBoard)")):
    print(f"  {what:46s} {1000 * L[k] / n:8.1f} | {1000 * T[k] / n:8.1f}")
train_step = (wl - L["total"]) / steps                     # the Trainer's own time per step, the tracker's time taken out
window = a.track_every * train_step                        # training time between two checkpoints in steady state
print(f"training time per step (live arm, tracker time taken out): {train_step:.3f} s; per {a.track_every} steps: {window:.2f} s")
live_pct = 100 * (L["live"] + L["log"]) / (wl - L["live"] - L["log"])
print(f"live logging overhead from the clocks: {1000 * (L['live'] + L['log']) / n:.1f} ms per checkpoint = "
      f"{live_pct:.3f}% of the rest of the live run (goal <= 1%); in steady state {100 * (L['live'] + L['log']) / n / window:.3f}%")
ss = {k: 100 * L[k] / n / window for k in ("embed", "save", "live", "log")}
print(f"tracking overhead in steady state (one checkpoint per {a.track_every} steps): {sum(ss.values()):.2f}% of the training time "
      f"(goal <= 3%) = probe forward {ss['embed']:.2f}% + the tracker's own work {ss['save'] + ss['live'] + ss['log']:.2f}% "
      f"(saving {ss['save']:.2f}%, live metrics {ss['live']:.3f}%, logging {ss['log']:.3f}%)")
print(f"the probe forward part is the built-in probes embedded once per {a.track_every} training steps: it scales as 1/every "
      f"({100 * L['embed'] / n / train_step:.1f}% at every=1, {100 * L['embed'] / n / (50 * train_step):.2f}% at every=50)")
if not a.no_ours:
    w_plain, tim0 = ours(big, big)
    w_track, tim = ours(a.track_every, big)
    print(f"\nours, no tracking (step 0 and last only): {w_plain:.1f} s; ours, tracking every {a.track_every} steps: {w_track:.1f} s")
    n_tracks = len(range(0, steps + 1, a.track_every)) + (steps % a.track_every != 0)
    per_track, per_step = tim["track_s"] / n_tracks, tim["train_s"] / steps
    print(f"tracking time inside our run: {tim['track_s']:.2f} s for {n_tracks} checkpoints ({per_track:.2f} s each) "
          f"vs {tim['train_s']:.2f} s for {steps} training steps ({per_step:.2f} s each)")
    print(f"our loop, steady state (one checkpoint per {a.track_every} steps): {100 * per_track / (a.track_every * per_step):.1f}% (goal <= 3%)")
    print(f"wall-time ratio ours tracking / no tracking: {w_track / w_plain:.3f}; ours (tracking) / Trainer + callback (live): {w_track / wl:.3f} (goal <= 1)")
print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
