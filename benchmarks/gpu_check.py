"""GPU check: paper-shaped training runs and the metrics on one accelerator, in one short script with no network.

Measures, and prints and writes as JSON (--out, default gpu_check.json):
- one run (batch 32 x 256 tokens, offline MiniLM, bundled or local data): step time, tokens/s, an MFU estimate
  (6 x parameters x tokens per step against the device's dense bf16 peak), peak memory, wall time;
- scaling: k = 1, 2, 4, 8 runs at once on the one GPU (the local executor, k workers pinned to it): total wall time
  and aggregate tokens/s, and the runs-per-GPU rule's suggestion from the measured peak memory;
- the metrics on numpy (CPU) vs torch on the device: drift curves, linear CKA, batched Procrustes.

    python benchmarks/gpu_check.py                       # on a GPU machine (about 5-7 minutes on an H100/H200)
    python benchmarks/gpu_check.py --tiny --out x.json   # a CPU smoke version (tiny model, seconds); tests/test_benchmarks.py runs it
"""
import argparse, json, os, platform, tempfile, time
from pathlib import Path

PEAK_BF16_TFLOPS = {"H200": 989, "H100": 989, "A100": 312, "L40S": 362, "A10": 125, "L4": 121, "V100": 125}   # dense, per device


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tiny", action="store_true", help="CPU smoke settings: tiny model, a few steps, k in 1, 2")
    ap.add_argument("--dataset", default=None, help="a local review file (default: ../shared/data/imdb_train.csv when present, else bundled)")
    ap.add_argument("--steps", type=int, default=None, help="optimizer steps per run (default 200; tiny: 4)")
    ap.add_argument("--scaling", default=None, help="comma-separated runs at once (default 1,2,4,8; tiny: 1,2)")
    ap.add_argument("--out", default="gpu_check.json", help="where the JSON goes")
    return ap.parse_args()


def config(a, dataset: str, device: str) -> dict:
    if a.tiny:
        return dict(model="tiny-distilbert", dataset="bundled", n_train=64, n_eval=16, batch_size=8, max_length=32, probe_max_length=32,
                    n_probes=16, max_steps=a.steps or 4, track_every=2, eval_every=10**6, device=device)
    return dict(model="minilm-offline", dataset=dataset, n_train=None, n_eval=32, batch_size=32, max_length=256, probe_max_length=128,
                epochs=100, max_steps=a.steps or 200, track_every=10, eval_every=10**6, embed_batch_size=128, device=device)


def one_run(cfg: dict, folder: Path) -> dict:
    import torch
    from embvar_study.executors import run_one
    from embvar_study.runs import load_run
    res = run_one(cfg, str(folder))
    if res["status"] != "completed": raise SystemExit(f"gpu_check: the run failed: {res['error']}")
    run = load_run(folder); m = run.marker
    steps, tokens = m["steps_done"], m["derived"]["train_tokens"]
    n_train = m["derived"]["n_train"]
    tokens_per_step = tokens / max(1, -(-n_train // cfg["batch_size"])) if steps else 0
    step_s = m["timing"]["train_s"] / max(1, steps)
    params = m["derived"]["model_summary"]["n_params"]
    name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else platform.processor() or "cpu"
    peak = next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), None)
    mfu = 6 * params * tokens_per_step / step_s / (peak * 1e12) if peak and step_s > 0 else None
    return {"device": name, "steps": steps, "step_s": step_s, "tokens_per_step": tokens_per_step, "tokens_per_s": tokens_per_step / step_s,
            "mfu": mfu, "peak_memory_gib": (res["peak_memory"] or 0) / 2**30, "wall_s": res["seconds"], "timing": m["timing"],
            "params": params, "threads": res["threads"]}


def scaling(cfg: dict, ks: list[int], root: Path, gpus: list[dict], tokens_per_run: float) -> list[dict]:
    from embvar_study.executors import LocalExecutor, auto_runs_per_gpu
    out = []
    for k in ks:
        tasks = [(i, {**cfg, "seed": 100 * k + i}, str(root / f"k{k}_{i}")) for i in range(k)]
        t, got = time.perf_counter(), {}
        LocalExecutor(k, gpus=gpus[:1], runs_per_gpu=k if gpus else 1).run(tasks, lambda key, r: got.update({key: r}))
        wall = time.perf_counter() - t
        bad = [r["error"] for r in got.values() if r["status"] != "completed"]
        if bad: raise SystemExit(f"gpu_check: a run at k={k} failed: {bad[0]}")
        peak, busy = max((r["peak_memory"] or 0) for r in got.values()), max(r["seconds"] for r in got.values())
        out.append({"runs_at_once": k, "wall_s": wall, "slowest_run_s": busy, "runs_per_hour": 3600 * k / wall,
                    "aggregate_tokens_per_s": k * tokens_per_run / busy, "max_peak_memory_gib": peak / 2**30,
                    "suggested_runs_per_gpu": auto_runs_per_gpu(gpus[0]["total_memory"], peak) if gpus else None})
        print(f"  {k} run(s) at once: {wall:.1f}s wall (worker start-up included), slowest run {busy:.1f}s, "
              f"{k * tokens_per_run / busy:.0f} tokens/s together", flush=True)
    return out


def metric_speed(tiny: bool) -> list[dict]:
    import numpy as np, torch
    from embvar_study.metrics import drift_curve
    from embvar_study.similarity import linear_cka
    from embvar_study.align import procrustes_align_batch
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    T, N, d, K = (4, 64, 32, 4) if tiny else (50, 2000, 768, 16)
    rng = np.random.default_rng(0)
    traj, X, Y = rng.normal(size=(T, N, d)).astype(np.float32), rng.normal(size=(K, N, d)), rng.normal(size=(K, N, d))
    cases = {"drift_curve (T, N, d)": (drift_curve, (traj,)), "linear_cka (K pairs)": (linear_cka, (X, Y)),
             "procrustes_align_batch (K pairs)": (lambda a, b: procrustes_align_batch(a, b), (X, Y))}
    out = []
    for name, (f, args) in cases.items():
        f(*args)                                                        # warm-up
        t = time.perf_counter(); f(*args); t_np = time.perf_counter() - t
        targs = [torch.as_tensor(a, device=dev) for a in args]
        f(*targs)
        if dev == "cuda": torch.cuda.synchronize()
        t = time.perf_counter(); f(*targs)
        if dev == "cuda": torch.cuda.synchronize()
        t_t = time.perf_counter() - t
        out.append({"metric": name, "numpy_s": t_np, "torch_s": t_t, "device": dev, "speedup": t_np / t_t if t_t > 0 else None})
        print(f"  {name:36s} numpy {t_np * 1e3:8.1f} ms   torch/{dev} {t_t * 1e3:8.1f} ms   x{t_np / t_t:.1f}", flush=True)
    return out


def main():
    a = parse(); t0 = time.perf_counter()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from embvar_study.executors import visible_gpus
    gpus = visible_gpus()
    if not gpus and not a.tiny: print("gpu_check: no GPU visible; running on the CPU (use --tiny for a quick smoke run)", flush=True)
    shared = Path(__file__).resolve().parents[2] / "shared" / "data" / "imdb_train.csv"
    dataset = a.dataset or (str(shared) if shared.exists() else "bundled")
    cfg = config(a, dataset, "auto")
    print(f"gpu_check: {len(gpus)} GPU(s) {[g['name'] for g in gpus]}; data {dataset if not a.tiny else 'bundled'}; model {cfg['model']}; "
          f"batch {cfg['batch_size']} x {cfg['max_length']} tokens", flush=True)
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        run = one_run(cfg, root / "one")
        print(f"  one run: {run['step_s'] * 1e3:.1f} ms/step, {run['tokens_per_s']:.0f} tokens/s, MFU "
              f"{'%.1f%%' % (100 * run['mfu']) if run['mfu'] is not None else 'n/a'}, peak {run['peak_memory_gib']:.2f} GiB, "
              f"wall {run['wall_s']:.1f}s", flush=True)
        ks = [int(k) for k in (a.scaling or ("1,2" if a.tiny else "1,2,4,8")).split(",")]
        scale = scaling(cfg, ks, root, gpus, run["tokens_per_step"] * run["steps"])
    metrics = metric_speed(a.tiny)
    result = {"torch": torch.__version__, "cuda": torch.version.cuda, "gpus": gpus, "config": cfg, "one_run": run,
              "scaling": scale, "metrics": metrics, "total_s": time.perf_counter() - t0}
    Path(a.out).write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"gpu_check: done in {result['total_s']:.0f}s -> {a.out}")


if __name__ == "__main__":
    main()
