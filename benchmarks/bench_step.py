"""How far one training step is from this CPU's limit, before (each batch padded to its longest) and after (length-grouped
micro-batches, the measured linear kernel), in one run of this script:

- the single-thread fp32 matmul rate of each kernel path (F.linear/MKL, oneDNN) and bf16, on a transformer block's shapes;
- a step under bf16 autocast (`--precision bf16`), whose speed depends on the CPU's native bf16 support;
- the FLOPs of a step as run (torch.utils.flop_counter), the FLOPs on real tokens only, the padding share;
- per optimizer step (forward + backward + AdamW) on the quick profile's real batches: seconds, speed-up, and the achieved
  real-token GFLOP/s as a fraction of the fastest fp32 matmul rate measured here.

Interleaved trials, medians. One torch thread (as `embvar report` runs its workers on a CPU-only machine).

    .venv/bin/python benchmarks/bench_step.py [--profile quick] [--repeats 3] [--threads 1]
"""
import argparse, inspect, os, statistics as st, time, warnings
import torch
import torch.nn.functional as F

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--profile", default="quick", help="the study profile whose training batches are used (default: quick)")
ap.add_argument("--repeats", type=int, default=3, help="interleaved trials of each variant (default: 3)")
ap.add_argument("--threads", type=int, default=1, help="torch threads (default: 1)")
a = ap.parse_args()
warnings.filterwarnings("ignore")
torch.set_num_threads(a.threads)

from torch.utils.flop_counter import FlopCounterMode
from embvar_study.sweep import get_profile
from embvar_study.config import TrainConfig
from embvar_study.train import prepare_data, Batches, make_optimizer, forward_backward
from embvar_study.models import load_model_and_tokenizer
from embvar_study.kernels import linear_kernel, choose_linear_kernel, onednn_available

def rate(f, flops, n=8):
    f(); t = time.perf_counter()
    for _ in range(n): f()
    return flops * n / (time.perf_counter() - t) / 1e9

# 1. matmul rates, the shapes of a MiniLM block on ~320 tokens (the quick profile's padded batch) and of a larger batch
print(f"torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()}, threads {torch.get_num_threads()}, "
      f"oneDNN linear available: {onednn_available()}; {a.repeats} interleaved trials; load average at start "
      + " ".join(f"{x:.2f}" for x in os.getloadavg()))
peaks = {}
for M, K, N in [(320, 384, 1536), (320, 1536, 384), (2048, 384, 1536)]:
    x, w, b = torch.randn(M, K), torch.randn(N, K), torch.randn(N)
    fl = 2 * M * K * N
    r = {"F.linear (MKL) fp32": [], "oneDNN fp32": [], "bf16 F.linear": []}
    xb, wb, bb = x.bfloat16(), w.bfloat16(), b.bfloat16()
    for _ in range(3):
        r["F.linear (MKL) fp32"].append(rate(lambda: F.linear(x, w, b), fl))
        if onednn_available(): r["oneDNN fp32"].append(rate(lambda: torch.ops.mkldnn._linear_pointwise(x, w, b, "none", [], ""), fl))
        r["bf16 F.linear"].append(rate(lambda: F.linear(xb, wb, bb), fl, n=2))
    for k, v in r.items():
        if v: peaks[k] = max(peaks.get(k, 0.0), st.median(v))
    print(f"  matmul {M}x{K} @ {K}x{N}: " + ", ".join(f"{k} {st.median(v):.1f} GFLOP/s" for k, v in r.items() if v))
fp32_peak = max(v for k, v in peaks.items() if "fp32" in k)
print(f"fastest fp32 matmul measured here: {fp32_peak:.1f} GFLOP/s ({max((k for k in peaks if 'fp32' in k), key=peaks.get)})")

# 2. the profile's real training batches, and their FLOPs
prof = get_profile(a.profile, {"dataset": "bundled"} if a.profile == "reviews" else None)
cfg = TrainConfig.from_dict({**prof["base"], "lr": 5e-5})
tr, ev, pr = prepare_data(cfg)
model, tok = load_model_and_tokenizer(cfg.model, num_labels=2, init_seed=0)
B = Batches(tok, tr.text, tr.label, cfg.max_length, cfg.batch_size, set(inspect.signature(model.forward).parameters))
idx = [list(range(s, min(s + B.bs, len(B.features)))) for s in range(0, len(B.features), B.bs)]
exact = Batches(tok, tr.text, tr.label, cfg.max_length, cfg.batch_size, set(inspect.signature(model.forward).parameters), overhead=0)
def flops_of(micros):
    with FlopCounterMode(display=False) as fc: forward_backward(model, micros, torch.device("cpu"), "fp32")
    model.zero_grad(set_to_none=True); return fc.get_total_flops()
padded = [[B.batch(i)] for i in idx]; micro = [B.micro(i) for i in idx]
real_tokens = int(B.lengths.sum()); slots = sum(m["attention_mask"].numel() for b in padded for m in b)
micro_slots = sum(m["attention_mask"].numel() for b in micro for m in b)
f_pad = sum(flops_of(b) for b in padded) / len(idx); f_real = sum(flops_of(exact.micro(i)) for i in idx) / len(idx)
f_micro = sum(flops_of(b) for b in micro) / len(idx)
print(f"profile {a.profile}: {len(idx)} batches of {B.bs}; {real_tokens} real tokens in {slots} padded slots "
      f"(padding share {1 - real_tokens / slots:.0%}); micro-batches compute {micro_slots} slots ({1 - real_tokens / micro_slots:.0%} padding)")
print(f"FLOPs per step (forward + backward): padded {f_pad / 1e9:.2f} G, micro-batched {f_micro / 1e9:.2f} G, real tokens only "
      f"{f_real / 1e9:.2f} G ({f_pad / f_real:.2f}x less than padded)")

# 3. steps, interleaved
opt = make_optimizer(model, 5e-5, 0.01)
kern = choose_linear_kernel(train=True)
variants = {"before: padded, F.linear": (padded, "default", "fp32"), "after: micro-batches, F.linear": (micro, "default", "fp32")}
if onednn_available(): variants["after: micro-batches, oneDNN"] = (micro, "onednn", "fp32")
variants[f"after: micro-batches, chosen kernel ({kern['kernel']})"] = (micro, kern["kernel"], "fp32")
variants["after: micro-batches, bf16 autocast (--precision bf16)"] = (micro, "default", "bf16")
times = {k: [] for k in variants}
model.train()
for _ in range(a.repeats):
    for k, (batches, kernel, precision) in variants.items():
        t = time.perf_counter()
        for b in batches:
            with linear_kernel(kernel): forward_backward(model, b, torch.device("cpu"), precision)
            opt.step(); opt.zero_grad(set_to_none=True)
        times[k].append((time.perf_counter() - t) / len(batches))
base = st.median(times["before: padded, F.linear"])
print(f"kernel chosen for training on this machine: {kern['kernel']} ({kern['how']})")
print(f"{'variant':48s} {'s/step':>7s} {'speed-up':>8s} {'real-token GFLOP/s':>19s} {'of fp32 peak':>12s}")
for k, v in times.items():
    s = st.median(v); g = f_real / s / 1e9
    print(f"{k:48s} {s:7.3f} {base / s:7.2f}x {g:19.1f} {g / fp32_peak:11.0%}")
