"""Peak memory and time of streaming linear CKA (`metrics.linear_cka(X, Y, block=B)`) against the full computation.

Run on a quiet machine: python benchmarks/bench_compare.py --n 50000 --d 768 --block 2000
"""
import argparse
import time
import tracemalloc
import numpy as np
from embvar_study import metrics


def _measure(f):
    tracemalloc.start(); t = time.perf_counter()
    v = f()
    dt = time.perf_counter() - t
    peak = tracemalloc.get_traced_memory()[1]; tracemalloc.stop()
    return float(v), dt, peak / 2**20


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=50000, help="probes N (default 50000)")
    p.add_argument("--d", type=int, default=768, help="width d of both sets (default 768)")
    p.add_argument("--block", type=int, default=2000, help="rows per streaming block (default 2000)")
    p.add_argument("--debiased", action="store_true", help="debiased CKA")
    p.add_argument("--skip-full", action="store_true", help="only the streaming version")
    a = p.parse_args(argv)
    rng = np.random.default_rng(0)
    X = rng.normal(size=(a.n, a.d)).astype(np.float32)
    Y = (X @ rng.normal(size=(a.d, a.d)).astype(np.float32) / a.d ** 0.5 + rng.normal(size=(a.n, a.d)).astype(np.float32))
    print(f"N={a.n} d={a.d} block={a.block} debiased={a.debiased} (inputs float32, {2 * X.nbytes / 2**20:.0f} MiB, not counted)")
    v, t, m = _measure(lambda: metrics.linear_cka(X, Y, debiased=a.debiased, block=a.block))
    print(f"streaming: cka={v:.10f} time={t:.2f}s peak={m:.1f} MiB")
    if not a.skip_full:
        w, t2, m2 = _measure(lambda: metrics.linear_cka(X, Y, debiased=a.debiased))
        print(f"full:      cka={w:.10f} time={t2:.2f}s peak={m2:.1f} MiB   |diff|={abs(v - w):.2e}")


if __name__ == "__main__":
    main()
