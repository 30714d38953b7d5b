"""Benchmark embvar_study.stats on a drift-study-sized input: 5 runs x 1000 probes, 9999 resamples.

Run from the repository root:  .venv/bin/python benchmarks/bench_stats.py
Prints best-of-k wall times and speed ratios (higher = ours faster). Total runtime well under 60 s.

Baselines for the cluster bootstrap (5 x 1000 values, two-stage, 9999 resamples = 50M drawn probe indices):
- loop_textbook: for each resample, for each drawn run, `rng.choice(run, n_items)` (how it is usually written);
- loop_vectorized: one Python iteration per resample, the resample itself vectorized (a fair, tuned loop);
- rng_floor: only drawing the 50M uint16 item indices, no gathering or statistic; nothing can beat this
  without drawing fewer random numbers, so it bounds the achievable speed-up.
"""
import sys
import time
from pathlib import Path

import numpy as np
import scipy
import scipy.stats as sps

try:
    import embvar_study  # noqa: F401
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from embvar_study.stats import bootstrap_ci, cluster_bootstrap_ci

N_RUNS, N_PROBES, B = 5, 1000, 9999


def best_of(f, repeats):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return min(times)


def loop_textbook(x, rng):
    C, I = x.shape
    out = np.empty(B)
    for r in range(B):
        runs = rng.integers(0, C, C)
        out[r] = np.mean(np.concatenate([rng.choice(x[c], I, replace=True) for c in runs]))
    return np.quantile(out, [0.025, 0.975])


def loop_vectorized(x, rng):
    C, I = x.shape
    out = np.empty(B)
    rows = np.arange(C)[:, None]
    for r in range(B):
        runs = rng.integers(0, C, C)
        items = rng.integers(0, I, (C, I), dtype=np.uint16)
        out[r] = x[runs[rows], items].mean()
    return np.quantile(out, [0.025, 0.975])


def main():
    rng = np.random.default_rng(0)
    x = 0.08 + 0.02 * rng.standard_normal((N_RUNS, 1)) + 0.01 * rng.standard_normal((N_RUNS, N_PROBES))
    print(f"data: {N_RUNS} runs x {N_PROBES} probes, {B} resamples; numpy {np.__version__}, "
          f"scipy {scipy.__version__}; best-of-k wall time")

    print("\n== cluster bootstrap (two-stage, percentile, grand mean) ==")
    t_ours = best_of(lambda: cluster_bootstrap_ci(x, n_resamples=B, seed=1), 5)
    t_clusters_only = best_of(lambda: cluster_bootstrap_ci(x, n_resamples=B, seed=1, resample_items=False), 5)
    t_bca = best_of(lambda: cluster_bootstrap_ci(x, n_resamples=B, seed=1, method="bca"), 3)
    t_text = best_of(lambda: loop_textbook(x, np.random.default_rng(1)), 1)
    t_loop = best_of(lambda: loop_vectorized(x, np.random.default_rng(1)), 2)
    g = np.random.default_rng(1)
    t_floor = best_of(lambda: g.integers(0, N_PROBES, (B, N_RUNS, N_PROBES), dtype=np.uint16), 5)
    ci = cluster_bootstrap_ci(x, n_resamples=B, seed=1)
    ref = loop_textbook(x, np.random.default_rng(2))
    print(f"cluster_bootstrap_ci                 {t_ours * 1e3:8.1f} ms   {ci}")
    print(f"  method='bca' (+ jackknife)         {t_bca * 1e3:8.1f} ms")
    print(f"  resample_items=False (runs only)   {t_clusters_only * 1e3:8.1f} ms")
    print(f"loop_textbook (rng.choice per run)   {t_text * 1e3:8.1f} ms   [{ref[0]:.4g}, {ref[1]:.4g}]  "
          f"-> ours {t_text / t_ours:5.1f}x faster")
    print(f"loop_vectorized (1 iter/resample)    {t_loop * 1e3:8.1f} ms   -> ours {t_loop / t_ours:5.1f}x faster")
    print(f"rng_floor (draw 50M indices only)    {t_floor * 1e3:8.1f} ms   -> ours at {t_ours / t_floor:4.2f}x the floor")

    print("\n== one-sample bootstrap of 5000 flattened values (BCa, mean) ==")
    flat = x.ravel()
    t_ours = best_of(lambda: bootstrap_ci(flat, n_resamples=B, seed=1), 5)
    t_vec = best_of(lambda: sps.bootstrap((flat,), np.mean, n_resamples=B, vectorized=True,
                                          rng=np.random.default_rng(1)), 5)
    t_novec = best_of(lambda: sps.bootstrap((flat,), np.mean, n_resamples=B, vectorized=False,
                                            rng=np.random.default_rng(1)), 1)
    print(f"bootstrap_ci                          {t_ours * 1e3:8.1f} ms")
    print(f"scipy.stats.bootstrap(vectorized=True)  {t_vec * 1e3:8.1f} ms   -> ratio scipy/ours {t_vec / t_ours:5.2f}")
    print(f"scipy.stats.bootstrap(vectorized=False) {t_novec * 1e3:8.1f} ms   -> ratio scipy/ours {t_novec / t_ours:5.2f}")

    print("\n== batched: 1000 probes x 5 runs, one CI per probe over runs (BCa, mean) ==")
    t_ours = best_of(lambda: bootstrap_ci(x.T, n_resamples=B, seed=1), 3)
    t_vec = best_of(lambda: sps.bootstrap((x.T,), np.mean, n_resamples=B, vectorized=True, axis=-1,
                                          rng=np.random.default_rng(1)), 3)
    print(f"bootstrap_ci                          {t_ours * 1e3:8.1f} ms")
    print(f"scipy.stats.bootstrap(vectorized=True)  {t_vec * 1e3:8.1f} ms   -> ratio scipy/ours {t_vec / t_ours:5.2f}")


if __name__ == "__main__":
    t0 = time.perf_counter()
    main()
    print(f"\ntotal {time.perf_counter() - t0:.1f} s")
