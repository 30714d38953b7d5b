"""GPU check: the paper profile's training step with and without tracking, compare's speed with inputs on the device,
and the tracker's probe-forward memory at GPU scale, printed as ONE table (and written as JSON), with no network.

What it runs (one process, about 3-6 minutes on one H100/H200; not yet timed on a GPU):
- paper step: the paper profile's training settings (batch 32 x 256 tokens, 1 epoch of 4,000 examples = 125 optimizer
  steps, bf16 autocast on CUDA, probes tracked every 10 steps with 128 tokens in batches of 128) on a DistilBERT-base-shaped
  model with RANDOM weights (transformers' `DistilBertConfig()` defaults: 6 layers, 768 wide; the paper's
  distilbert-base-uncased needs the Hub) over the offline MiniLM tokenizer (the same uncased 30,522-word vocabulary),
  trained by `embvar train`'s loop (`executors.run_one`) on synthetic texts made of the package's builtin probe
  sentences (each longer than 256 tokens, as IMDb reviews are). Two runs: tracking every 10 steps, and tracking only at
  step 0 and the last step (whose tracking is outside the timed training steps): step time without tracking, with
  tracking (the tracker's time spread over the steps), the overhead, one tracked step, peak GPU memory of each, tokens/s,
  MFU (6 x parameters x tokens per step against the device's dense bf16 peak);
- compare: `compare.compare` on the quick profile's shape (7 x 7 layer pairs, 48 probes, d = 384, 200 resamples) with
  numpy inputs and with torch tensors on the device, and the largest difference of any value or interval;
- metrics: drift curves, linear CKA and batched Procrustes with numpy on the CPU against torch on the device;
- tracking memory: benchmarks/bench_tracking_memory.py at GPU scale (random-weight Llama decoder, depth 24 and 6,
  hidden 1,024, 64 and 256 probes of about 250 tokens, batches of 16): peak memory of the hooked probe forward against
  the old every-hidden-state path, and the largest difference of the pooled values;
- optionally (--scaling 1,2,4,8) k runs at once on the one GPU (the local executor).

    benchmarks/gpu_check.sh                       # on a GPU machine
    benchmarks/gpu_check.sh --tiny --out x.json   # CPU smoke version (tiny sizes); tests/test_benchmarks.py runs it
"""
import argparse, json, os, platform, sys, tempfile, time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent)); sys.path.insert(0, str(HERE))
PEAK_BF16_TFLOPS = {"H200": 989, "H100": 989, "A100": 312, "L40S": 362, "A10": 125, "L4": 121, "V100": 125}   # dense, per device


def parse(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tiny", action="store_true", help="CPU smoke settings: tiny models and sizes, a few steps")
    ap.add_argument("--steps", type=int, default=None, help="optimizer steps per paper-step run (default: the profile's 125; tiny 4)")
    ap.add_argument("--scaling", default="", help="comma-separated runs at once on the one GPU, e.g. 1,2,4,8 (default: none)")
    ap.add_argument("--out", default="gpu_check.json", help="where the JSON goes")
    return ap.parse_args(argv)


def say(*a): print(*a, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- paper step
def synthetic_reviews(path: Path, n: int, sentences: int) -> Path:
    "n labelled texts of `sentences` builtin probe sentences each (no review text), alternating labels, as a CSV."
    import pandas as pd
    from embvar_study.data import load_probes
    s = load_probes("builtin")["text"].tolist()
    texts = [" ".join(s[(7 * i + j) % len(s)] for j in range(sentences)) for i in range(n)]
    pd.DataFrame({"text": texts, "label": [i % 2 for i in range(n)]}).to_csv(path, index=False)
    return path


def random_distilbert(folder: Path, tiny: bool) -> Path:
    "A DistilBERT classifier with random weights from its config (base shape; tiny: 2 x 32), saved with the MiniLM tokenizer."
    import torch
    from transformers import AutoTokenizer, DistilBertConfig, DistilBertForSequenceClassification
    from embvar_study.models import minilm_folder
    tok = AutoTokenizer.from_pretrained(str(minilm_folder()))
    size = dict(dim=32, n_layers=2, n_heads=2, hidden_dim=64) if tiny else {}
    cfg = DistilBertConfig(vocab_size=len(tok), num_labels=2, pad_token_id=tok.pad_token_id, **size)
    torch.manual_seed(0)
    DistilBertForSequenceClassification(cfg).save_pretrained(folder); tok.save_pretrained(folder)
    return folder


def paper_config(model: str, data: str, tiny: bool, steps: int | None) -> dict:
    from embvar_study.sweep import PROFILES
    base = {k: v for k, v in PROFILES["paper"]["base"].items()}
    base.update(model=model, dataset=data, n_eval=256, eval_every=10**6, device="auto")   # evaluation only at 0 and the end
    if tiny: base.update(n_train=32, n_eval=16, batch_size=8, max_length=32, probe_max_length=32, n_probes=16, track_every=2, embed_batch_size=16)
    if steps or tiny: base["max_steps"] = steps or 4
    return base


def one_run(cfg: dict, folder: Path) -> dict:
    from embvar_study.executors import run_one
    from embvar_study.runs import load_run
    res = run_one(cfg, str(folder))
    if res["status"] != "completed": raise SystemExit(f"gpu_check: the run failed: {res['error']}")
    m = load_run(folder).marker
    steps, n_train = m["steps_done"], m["derived"]["n_train"]
    return {"steps": steps, "tracked": m["tracked_steps"], "train_s": m["timing"]["train_s"], "track_s": m["timing"]["track_s"],
            "tokens_per_step": m["derived"]["train_tokens"] / max(1, -(-n_train // cfg["batch_size"])),
            "params": m["derived"]["model_summary"]["n_params"], "peak_memory_gib": (res["peak_memory"] or 0) / 2**30, "wall_s": res["seconds"]}


def paper_step(a, root: Path, device_name: str) -> dict:
    tiny = a.tiny
    n = 32 + 16 if tiny else 4000 + 256
    data = synthetic_reviews(root / "texts.csv", n, 3 if tiny else 20)
    model = random_distilbert(root / "model", tiny)
    cfg = paper_config(str(model), str(data), tiny, a.steps)
    say(f"gpu_check: paper step: {cfg['batch_size']} x {cfg['max_length']} tokens, tracking every {cfg['track_every']} ...")
    tracked = one_run(cfg, root / "tracked")
    plain = one_run({**cfg, "track_every": 10**6}, root / "plain")     # tracked at step 0 and the last only, outside train_s
    step_plain = plain["train_s"] / plain["steps"]
    step_tracked = (tracked["train_s"] + tracked["track_s"]) / tracked["steps"]
    peak = next((v for k, v in PEAK_BF16_TFLOPS.items() if k in device_name), None)
    mfu = 6 * plain["params"] * plain["tokens_per_step"] / step_plain / (peak * 1e12) if peak else None
    return {"config": cfg, "tracked": tracked, "plain": plain, "step_s_plain": step_plain, "step_s_tracked": step_tracked,
            "overhead": step_tracked / step_plain - 1, "tracked_step_s": tracked["track_s"] / tracked["tracked"],
            "tokens_per_s": plain["tokens_per_step"] / step_plain, "mfu": mfu}


# ---------------------------------------------------------------- compare
def compare_speed(tiny: bool, dev: str) -> dict:
    import numpy as np, torch
    from embvar_study.compare import compare
    L, N, d, R = (3, 16, 32, 10) if tiny else (7, 48, 384, 200)
    rng = np.random.default_rng(0)
    A = rng.standard_normal((L, N, d), dtype=np.float32)
    B = A @ (rng.standard_normal((d, d), dtype=np.float32) / np.float32(d ** 0.5)) + rng.standard_normal((L, N, d), dtype=np.float32)
    say(f"gpu_check: compare {L} x {L} layers, {N} probes, d {d}, {R} resamples ...")
    t = time.perf_counter(); ref = compare(A, B, n_resamples=R); t_np = time.perf_counter() - t
    tA, tB = torch.as_tensor(A, device=dev), torch.as_tensor(B, device=dev)
    if dev == "cuda": torch.cuda.synchronize()
    t = time.perf_counter(); got = compare(tA, tB, n_resamples=R); t_t = time.perf_counter() - t
    cols = ["value", "ci_low", "ci_high"]
    diff = float(np.nanmax(np.abs(ref[cols].to_numpy() - got[cols].to_numpy())))
    return {"shape": f"{L} x {L} layers, {N} probes, d {d}, {R} resamples", "numpy_s": t_np, "torch_s": t_t, "device": dev, "max_abs_diff": diff}


def metric_speed(tiny: bool, dev: str) -> list[dict]:
    import numpy as np, torch
    from embvar_study.metrics import drift_curve
    from embvar_study.similarity import linear_cka
    from embvar_study.align import procrustes_align_batch
    T, N, d, K = (4, 64, 32, 4) if tiny else (50, 2000, 768, 16)
    rng = np.random.default_rng(0)
    traj, X, Y = rng.normal(size=(T, N, d)).astype(np.float32), rng.normal(size=(K, N, d)), rng.normal(size=(K, N, d))
    cases = {"drift_curve (T, N, d)": (drift_curve, (traj,)), "linear_cka (K pairs)": (linear_cka, (X, Y)),
             "procrustes_align_batch (K pairs)": (lambda a, b: procrustes_align_batch(a, b), (X, Y))}
    out = []
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    for name, (f, args) in cases.items():
        f(*args)                                                        # warm-up
        t = time.perf_counter(); f(*args); t_np = time.perf_counter() - t
        targs = [torch.as_tensor(x, device=dev) for x in args]
        f(*targs); sync()
        t = time.perf_counter(); f(*targs); sync(); t_t = time.perf_counter() - t
        out.append({"metric": name, "shape": f"T={T}, N={N}, d={d}" if "drift" in name else f"K={K}, N={N}, d={d}",
                    "numpy_s": t_np, "torch_s": t_t, "device": dev})
    return out


# ---------------------------------------------------------------- tracking memory
def tracking_memory(tiny: bool, dev: str) -> dict:
    import bench_tracking_memory as btm
    if tiny: spec = dict(depth=2, hidden=32, ks=[1, "all"], probes=[8], shallow=None, join=1, max_length=32)
    else: spec = dict(depth=24, hidden=1024, ks=[1, 2, 4, 8, "all"], probes=[64, 256], shallow=6, join=12, max_length=256)
    rows = btm.configurations(spec["depth"], spec["ks"], spec["probes"], spec["shallow"])
    say(f"gpu_check: tracking memory, {len(rows)} configurations on {dev} ...")
    run = btm.run_cuda if dev == "cuda" else btm.run_cpu
    res = run(rows, spec["hidden"], spec["join"], spec["max_length"])
    how = ("torch.cuda.max_memory_allocated above the allocation before the forward" if dev == "cuda"
           else "peak RSS above the loaded model, a fresh forked process per configuration and path")
    return {"spec": {k: v for k, v in spec.items()}, "rows": res, "measure": how}


# ---------------------------------------------------------------- scaling (optional)
def scaling(cfg: dict, ks: list[int], root: Path, gpus: list[dict]) -> list[dict]:
    from embvar_study.executors import LocalExecutor, auto_runs_per_gpu
    out = []
    for k in ks:
        tasks = [(i, {**cfg, "seed": 100 * k + i}, str(root / f"k{k}_{i}")) for i in range(k)]
        t, got = time.perf_counter(), {}
        LocalExecutor(k, gpus=gpus[:1], runs_per_gpu=k if gpus else 1).run(tasks, lambda key, r: got.update({key: r}))
        wall = time.perf_counter() - t
        bad = [r["error"] for r in got.values() if r["status"] != "completed"]
        if bad: raise SystemExit(f"gpu_check: a run at k={k} failed: {bad[0]}")
        peak = max((r["peak_memory"] or 0) for r in got.values())
        out.append({"runs_at_once": k, "wall_s": wall, "runs_per_hour": 3600 * k / wall, "max_peak_memory_gib": peak / 2**30,
                    "suggested_runs_per_gpu": auto_runs_per_gpu(gpus[0]["total_memory"], peak) if gpus else None})
    return out


# ---------------------------------------------------------------- the table
def rows_of(res: dict) -> list[tuple[str, str, str]]:
    "The one table: (section, what, value); every number from `res`."
    p, c = res["paper_step"], res["compare"]
    cfg = p["config"]
    gib = lambda r: f"{r['peak_memory_gib']:.2f} GiB" if res["cuda"] else "n/a (CPU)"
    rows = [("paper step", "model", f"{p['plain']['params'] / 1e6:.1f}M parameters, random weights from DistilBertConfig"
                                    f"{' (tiny)' if res['tiny'] else ''}, MiniLM tokenizer"),
            ("paper step", "batch", f"{cfg['batch_size']} x {cfg['max_length']} tokens, {p['plain']['steps']} steps, "
                                    f"probes every {cfg['track_every']} ({p['tracked']['tracked']} tracked steps)"),
            ("paper step", "step time, no tracking", f"{p['step_s_plain'] * 1e3:.1f} ms"),
            ("paper step", f"step time, tracking every {cfg['track_every']}", f"{p['step_s_tracked'] * 1e3:.1f} ms"),
            ("paper step", "tracking overhead", f"{100 * p['overhead']:+.1f} %"),
            ("paper step", "one tracked step (probe forward + save)", f"{p['tracked_step_s'] * 1e3:.1f} ms"),
            ("paper step", "peak GPU memory, no tracking", gib(p["plain"])),
            ("paper step", "peak GPU memory, tracking", gib(p["tracked"])),
            ("paper step", "tokens/s, MFU", f"{p['tokens_per_s']:.0f}, " + (f"{100 * p['mfu']:.1f} %" if p["mfu"] is not None else "n/a")),
            ("compare", f"numpy inputs ({c['shape']})", f"{c['numpy_s']:.2f} s"),
            ("compare", f"torch inputs on {c['device']}", f"{c['torch_s']:.2f} s (x{c['numpy_s'] / c['torch_s']:.2f}), max |diff| {c['max_abs_diff']:.1e}")]
    for m in res["metrics"]:
        rows.append(("metrics", f"{m['metric']} {m['shape']}", f"numpy {m['numpy_s'] * 1e3:.1f} ms, torch/{m['device']} "
                                                               f"{m['torch_s'] * 1e3:.1f} ms (x{m['numpy_s'] / m['torch_s']:.1f})"))
    mem = res["tracking_memory"]
    for r in mem["rows"]:
        rows.append(("tracking memory", f"depth {r['depth']}, layers {r['layers']}, {r['probes']} probes",
                     f"old {r['peak_mb_old']:.1f} MB, new {r['peak_mb_new']:.1f} MB (x{r['ratio']:.1f}), max |diff| {r['max_abs_diff']:.1e}"))
    for s in res["scaling"]:
        rows.append(("scaling", f"{s['runs_at_once']} run(s) at once", f"{s['wall_s']:.1f} s wall, {s['runs_per_hour']:.0f} runs/hour, "
                                                                     f"peak {s['max_peak_memory_gib']:.2f} GiB"))
    return rows


def table(rows) -> str:
    w0, w1 = max(len(r[0]) for r in rows), max(len(r[1]) for r in rows)
    return "\n".join([f"{'section':{w0}}  {'what':{w1}}  value"] + [f"{a:{w0}}  {b:{w1}}  {c}" for a, b, c in rows])


def main(argv=None):
    a = parse(argv); t0 = time.perf_counter()
    os.environ.setdefault("HF_HUB_OFFLINE", "1"); os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch
    from embvar_study.executors import visible_gpus
    gpus = visible_gpus(); cuda = bool(gpus)
    dev = "cuda" if cuda else "cpu"
    name = gpus[0]["name"] if cuda else (platform.processor() or "cpu")
    if not cuda: say("gpu_check: no GPU visible; everything below ran on the CPU" + ("" if a.tiny else " (use --tiny for a quick smoke run)"))
    res = {"torch": torch.__version__, "cuda": cuda, "cuda_version": torch.version.cuda, "gpus": gpus, "device": name, "tiny": a.tiny}
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        res["paper_step"] = paper_step(a, root, name)
        res["compare"] = compare_speed(a.tiny, dev)
        res["metrics"] = metric_speed(a.tiny, dev)
        res["tracking_memory"] = tracking_memory(a.tiny, dev)
        ks = [int(k) for k in a.scaling.split(",") if k.strip()]
        res["scaling"] = scaling(res["paper_step"]["config"], ks, root, gpus) if ks else []
    res["total_s"] = time.perf_counter() - t0
    print(f"gpu_check on {name} ({'CUDA ' + str(torch.version.cuda) if cuda else 'no GPU: CPU only'}), torch {torch.__version__}"
          f"{', tiny sizes' if a.tiny else ''}; tracking memory: {res['tracking_memory']['measure']}")
    print(table(rows_of(res)))
    Path(a.out).write_text(json.dumps(res, indent=2, default=str) + "\n")
    print(f"gpu_check: done in {res['total_s']:.0f}s -> {a.out}")
    return res


if __name__ == "__main__":
    main()
