"""A tiny Trainer (or plain loop) with embedding tracking, run by tests/test_distributed.py under `torchrun` or alone.

    python -m torch.distributed.run --nproc_per_node 2 tests/distributed_worker.py OUT [--loop plain] [--alarm X --stop]
Each rank prints one line `RESULT {"rank": r, "world": w, "global_step": s, "alarm_fired": b}`.
"""
import argparse, faulthandler, json, os, sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch
from conftest import TEXTS, LABELS, PROBES


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out"); ap.add_argument("--loop", default="trainer", choices=["trainer", "plain"])
    ap.add_argument("--alarm", type=float, default=None); ap.add_argument("--stop", action="store_true")
    ap.add_argument("--lr", type=float, default=1e-3); ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--fsdp", action="store_true", help="plain loop: FSDP2 (fully_shard) instead of DDP")
    ap.add_argument("--fail-rank", type=int, default=None, help="plain loop: this rank's tracker fails at step 2 (not rank 0's)")
    a = ap.parse_args()
    torch.set_num_threads(1)
    faulthandler.dump_traceback_later(200, exit=False)   # a rank still running after 200 s prints where every thread waits
    from embvar_study.models import load_model_and_tokenizer
    from embvar_study.tracking import EmbvarCallback, EmbeddingTracker, process_rank
    model, tok = load_model_and_tokenizer("tiny-distilbert", num_labels=2, init_seed=0)
    if a.loop == "plain":
        if "RANK" in os.environ:                       # a collective that waits past 120 s raises (gloo's default: 30 min)
            import datetime
            torch.distributed.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
        rank, world = process_rank()
        torch.manual_seed(1000 + rank)                  # each rank's dropout masks: the same run every time
        if a.fsdp and world > 1:                        # FSDP2: each block and the root sharded across the ranks
            from torch.distributed.fsdp import fully_shard
            from embvar_study.extract import layer_stack
            for block in layer_stack(model): fully_shard(block)
            ddp = fully_shard(model)
        else: ddp = torch.nn.parallel.DistributedDataParallel(model) if world > 1 else model
        opt = torch.optim.SGD(ddp.parameters(), lr=a.lr)
        enc = tok(TEXTS, padding=True, return_tensors="pt")
        labels = torch.tensor(LABELS)
        with EmbeddingTracker(ddp, tok, PROBES, a.out + "/run", every=2, alarm=a.alarm) as tracker:
            if a.fail_rank == rank:                     # a failure on a rank that does not write (e.g. its shard's forward)
                record = tracker.record
                def failing(step, arrays):
                    if step == 2: raise RuntimeError(f"injected failure on rank {rank} at step 2")
                    return record(step, arrays)
                tracker.record = failing
            tracker.step(0)
            step = 0
            for step in range(1, a.steps + 1):
                idx = torch.arange(rank, len(TEXTS), world)[:4]
                loss = ddp(input_ids=enc["input_ids"][idx], attention_mask=enc["attention_mask"][idx], labels=labels[idx]).loss
                loss.backward(); opt.step(); opt.zero_grad()
                tracker.log(step, train_loss=loss.item())
                tracker.step(step, force=step == a.steps)
                if a.stop and tracker.alarm_fired: break
        print("RESULT " + json.dumps({"rank": rank, "world": world, "global_step": step, "alarm_fired": tracker.alarm_fired}), flush=True)
        if world > 1: torch.distributed.destroy_process_group()
        return
    import datasets, transformers
    enc = tok(TEXTS, padding="max_length", max_length=12, truncation=True)
    ds = datasets.Dataset.from_dict({**enc, "labels": LABELS})
    extra = {}   # (Trainer's fsdp= on a CPU-only machine trains with DDP, not FSDP: the sharded case is the plain loop's --fsdp)
    args = transformers.TrainingArguments(
        output_dir=a.out + "/trainer", per_device_train_batch_size=2, max_steps=a.steps, learning_rate=a.lr, logging_steps=1,
        save_strategy="no", report_to=[], seed=0, use_cpu=True, disable_tqdm=True, dataloader_num_workers=0, **extra)
    cb = EmbvarCallback(PROBES, a.out + "/run", every=2, alarm=a.alarm, stop=a.stop)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=ds, processing_class=tok, callbacks=[cb])
    trainer.train()
    rank, world = process_rank()
    print("RESULT " + json.dumps({"rank": rank, "world": world, "global_step": trainer.state.global_step,
                                  "alarm_fired": cb.tracker.alarm_fired, "diverged": cb.tracker.diverged,
                                  "wrapped": type(trainer.model_wrapped).__name__, "fsdp": bool(trainer.is_fsdp_enabled)}), flush=True)


if __name__ == "__main__":
    main()
