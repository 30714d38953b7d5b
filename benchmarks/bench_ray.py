"""The smoke learning-rate grid (2 lrs x 2 seeds) run sequentially with the local executor vs as Ray tasks on a local
Ray instance with 2 workers (num_cpus=2, num_cpus_per_run=1), and Ray's fixed start-up cost, side by side.

Columns: wall time; speed-up over the sequential sweep of the same warmth (> 1: Ray is faster). "Cold" is the first
sweep of a process (the first run loads the tokenizer and model code, a Ray worker also imports torch and
transformers); "warm" is the same grid again into a new folder. Ray's start-up (ray.init + the first trivial task)
is timed on its own and added to the cold sweep for what a user waits for. Every measurement writes to its own
temporary folder. Needs Ray (pip install "embvar-study[ray]").

    .venv/bin/python benchmarks/bench_ray.py [--profile smoke] [--threads N]
"""
import argparse, os, tempfile, time, warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
warnings.filterwarnings("ignore")
ap = argparse.ArgumentParser()
ap.add_argument("--profile", default="smoke")
ap.add_argument("--threads", type=int, default=1, help="torch threads of the sequential sweep (default 1, as each Ray run: tiny models "
                "slow down with more threads on a loaded machine, and the comparison is then about parallel runs only)")
a = ap.parse_args()

import torch
import ray
from embvar_study.sweep import get_profile, experiment_grid, run_sweep
from embvar_study.runs import load_run

torch.set_num_threads(a.threads)
prof = get_profile(a.profile)
base, points = prof["base"], experiment_grid(prof, "lr_sweep")
print(f"profile {a.profile!r}: lr_sweep grid of {len(points)} runs ({prof['base']['model']}, n_train={base['n_train']}); "
      f"{os.cpu_count()} cores; sequential sweep with {torch.get_num_threads()} torch thread(s), Ray runs with 1 each")

def timed_sweep(out, **kw):
    t = time.perf_counter()
    m = run_sweep("lr_sweep", base, points, out, progress=False, **kw)
    wall = time.perf_counter() - t
    assert (m["status"] == "completed").all(), m[["run_id", "status", "error"]]
    for p in m["path"]: load_run(Path(out) / p, verify=True)
    return wall

rows = {}
with tempfile.TemporaryDirectory() as d:
    rows["sequential (local, jobs=1), cold"] = timed_sweep(Path(d) / "seq_cold")
    rows["sequential (local, jobs=1), warm"] = timed_sweep(Path(d) / "seq_warm")

    t = time.perf_counter()
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    t_init = time.perf_counter() - t
    t = time.perf_counter(); ray.get(ray.remote(lambda: 1).remote()); t_first = time.perf_counter() - t
    try:
        rows["ray: start-up only (init + first task)"] = t_init + t_first
        rows["ray: sweep, cold workers"] = timed_sweep(Path(d) / "ray_cold", executor="ray", num_cpus_per_run=1)
        rows["ray: sweep, warm workers"] = timed_sweep(Path(d) / "ray_warm", executor="ray", num_cpus_per_run=1)
    finally:
        ray.shutdown()
    rows["ray: start-up + cold sweep (what a user waits)"] = rows["ray: start-up only (init + first task)"] + rows["ray: sweep, cold workers"]

print(f"\n{'':50s} {'wall s':>8s} {'speed-up':>9s}")
for k, v in rows.items():
    ref = rows["sequential (local, jobs=1), warm" if "warm" in k else "sequential (local, jobs=1), cold"]
    print(f"{k:50s} {v:8.1f} {'' if 'start-up only' in k else f'{ref / v:8.2f}x':>9s}")
print(f"\nray.init {t_init:.1f}s + first task {t_first:.1f}s")
