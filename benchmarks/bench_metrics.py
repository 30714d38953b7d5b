"""Benchmark: batched embvar_study.metrics vs the Python loops a user would otherwise write.

Run from the repository root:  python benchmarks/bench_metrics.py [--T 50 --layers 7 --N 1000 --d 384 --sub 10]

Workload: a float32 trajectory (T checkpoints, L layers, N probes, d dims) stored as (L, T, N, d), i.e.
`(..., T, N, d)` with layers as the leading batch axis. Each metric is timed (wall clock, best of `--repeat` runs) against

* a per-probe loop: Python loops over checkpoints, layers and probes calling scipy per pair of vectors
  (scipy.spatial.distance.cosine; for CKA the textbook HSIC formula with the N x N centring matrix; for kNN
  scipy cdist + per-point sets). These are too slow to run in full: they run on a few checkpoints and are
  extrapolated linearly (marked "extrap.");
* a per-pair numpy loop: Python loops over checkpoints and layers only, each iteration fully vectorised numpy
  (the strongest naive baseline). Batching cannot beat this by much when each iteration is already a large BLAS
  call; the table says so honestly.

The heavy metrics (CKA, covariance spectrum, kNN overlap) run on the first `--sub` checkpoints to keep the whole
script under a minute on 2 CPU cores; drift metrics run on the full trajectory.
"""
import os

# One BLAS thread: on a small shared machine OpenBLAS threads spin against other processes and make timings
# erratic. Both the batched functions and the baselines run under the same setting; override from the shell.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import resource  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
from scipy.spatial.distance import cdist, cosine as scipy_cosine

from embvar_study.metrics import drift_curve, step_drift
from embvar_study.spectra import covariance_spectrum
from embvar_study.similarity import knn_overlap, linear_cka


REPEAT = 2


def timed(f, repeat=None):
    "Result of f() and its best wall-clock time over `repeat` runs (noise from other processes only adds time)."
    best = float("inf")
    for _ in range(repeat or REPEAT):
        t = time.perf_counter()
        out = f()
        best = min(best, time.perf_counter() - t)
    return out, best


# ------------------------------------------------------------------ baselines a user would write

def numpy_drift(a, b):
    a, b = a.astype(np.float64), b.astype(np.float64)
    return np.mean(1 - (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)))


def scipy_drift(a, b):
    return np.mean([scipy_cosine(u, v) for u, v in zip(a, b)])


def textbook_cka(X, Y):
    "HSIC with the N x N centring matrix, straight from the paper."
    X, Y = X.astype(np.float64), Y.astype(np.float64)
    n = len(X)
    H = np.eye(n) - np.ones((n, n)) / n
    K, L = X @ X.T, Y @ Y.T
    hsic = lambda A, B: np.trace(A @ H @ B @ H)
    return hsic(K, L) / np.sqrt(hsic(K, K) * hsic(L, L))


def feature_cka(X, Y):
    "Feature-space linear CKA (Kornblith et al. 2019 reference code), one pair at a time."
    X, Y = X.astype(np.float64), Y.astype(np.float64)
    X, Y = X - X.mean(0), Y - Y.mean(0)
    return np.linalg.norm(Y.T @ X) ** 2 / (np.linalg.norm(X.T @ X) * np.linalg.norm(Y.T @ Y))


def loop_knn_overlap(X, Y, k):
    sets = []
    for Z in (X, Y):
        D = cdist(Z, Z, "cosine")
        np.fill_diagonal(D, np.inf)
        sets.append([set(np.argsort(row)[:k]) for row in D])
    return np.mean([len(a & b) / len(a | b) for a, b in zip(*sets)])


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--T", type=int, default=50)
    p.add_argument("--layers", type=int, default=7)
    p.add_argument("--N", type=int, default=1000)
    p.add_argument("--d", type=int, default=384)
    p.add_argument("--sub", type=int, default=10, help="checkpoints used for CKA / spectrum / kNN")
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--repeat", type=int, default=2, help="best of this many runs (extrapolated baselines: 1 run)")
    a = p.parse_args()
    global REPEAT
    REPEAT = a.repeat
    T, L, N, d, S = a.T, a.layers, a.N, a.d, min(a.sub, a.T)
    rng = np.random.default_rng(0)
    # A drifting trajectory: a fixed base plus noise whose scale grows with the checkpoint index.
    base = rng.standard_normal((L, 1, N, d), dtype=np.float32) + 0.5
    traj = base + rng.standard_normal((L, T, N, d), dtype=np.float32) * np.linspace(0, 0.5, T, dtype=np.float32)[:, None, None]
    print(f"trajectory (L={L}, T={T}, N={N}, d={d}) float32 = {traj.nbytes / 2**30:.2f} GiB "
          f"({traj.nbytes * 2 / 2**30:.2f} GiB as float64); heavy metrics on the first {S} checkpoints; k={a.k}")
    rows = []

    def row(name, work, t_batch, t_base, how, err):
        rows.append((name, work, t_batch, t_base, how, err))

    # drift curve -----------------------------------------------------------------------------------------
    curve, tb = timed(lambda: drift_curve(traj))
    ref, tn = timed(lambda: np.array([[numpy_drift(traj[l, 0], traj[l, t]) for t in range(T)] for l in range(L)]))
    row("drift_curve", f"{L}x{T} sets", tb, tn, "numpy loop over (layer, t)", np.abs(curve - ref).max())
    ts = max(1, T // 25)
    sub, tsub = timed(lambda: np.array([[scipy_drift(traj[l, 0], traj[l, t]) for t in range(ts)] for l in range(L)]), repeat=1)
    row("drift_curve", f"{L}x{T} sets", tb, tsub * T / ts, f"scipy cosine per probe, {ts} ckpt extrap.",
        np.abs(curve[:, :ts] - sub).max())

    # step drift ------------------------------------------------------------------------------------------
    steps, tb = timed(lambda: step_drift(traj))
    ref, tn = timed(lambda: np.array([[numpy_drift(traj[l, t], traj[l, t + 1]) for t in range(T - 1)] for l in range(L)]))
    row("step_drift", f"{L}x{T - 1} pairs", tb, tn, "numpy loop over (layer, t)", np.abs(steps - ref).max())
    sub, tsub = timed(lambda: np.array([[scipy_drift(traj[l, t], traj[l, t + 1]) for t in range(ts)] for l in range(L)]), repeat=1)
    row("step_drift", f"{L}x{T - 1} pairs", tb, tsub * (T - 1) / ts, f"scipy cosine per probe, {ts} step extrap.",
        np.abs(steps[:, :ts] - sub).max())

    head = traj[:, :S]
    # linear CKA of every checkpoint vs checkpoint 0, per layer --------------------------------------------------
    cka, tb = timed(lambda: linear_cka(traj[:, :1], head))
    ref, tn = timed(lambda: np.array([[feature_cka(traj[l, 0], traj[l, t]) for t in range(S)] for l in range(L)]))
    row("linear_cka", f"{L}x{S} pairs", tb, tn, "feature-space CKA loop over (layer, t)", np.abs(cka - ref).max())
    sub, tsub = timed(lambda: np.array([textbook_cka(traj[0, 0], traj[0, t]) for t in range(2)]), repeat=1)
    row("linear_cka", f"{L}x{S} pairs", tb, tsub * L * S / 2, "textbook HSIC (N x N centring), 2 pairs extrap.",
        np.abs(cka[0, :2] - sub).max())

    # covariance spectrum --------------------------------------------------------------------------------------
    spec, tb = timed(lambda: covariance_spectrum(head))
    ref, tn = timed(lambda: np.array([[np.linalg.eigvalsh(np.cov(head[l, t].T.astype(np.float64)))[::-1]
                                       for t in range(S)] for l in range(L)]))
    row("covariance_spectrum", f"{L}x{S} sets", tb, tn, "eigvalsh(np.cov) loop over (layer, t)",
        np.abs(spec - np.clip(ref, 0, None)).max() / spec.max())

    # kNN overlap vs checkpoint 0 -----------------------------------------------------------------------------
    ov, tb = timed(lambda: knn_overlap(traj[:, :1], head, k=a.k))
    sub, tsub = timed(lambda: np.array([loop_knn_overlap(traj[0, 0], traj[0, t], a.k) for t in range(2)]), repeat=1)
    row("knn_overlap", f"{L}x{S} pairs", tb, tsub * L * S / 2, "cdist + per-point sets, 2 pairs extrap.",
        np.abs(ov[0, :2] - sub).max())

    print(f"\n{'metric':<20} {'workload':<13} {'batched s':>9} {'baseline s':>10} {'speedup':>8}  baseline (max |diff|)")
    for name, work, t_b, t_base, how, err in rows:
        print(f"{name:<20} {work:<13} {t_b:9.2f} {t_base:10.2f} {t_base / t_b:7.1f}x  {how} ({err:.1e})")
    print(f"\nOPENBLAS_NUM_THREADS={os.environ['OPENBLAS_NUM_THREADS']}; times are the best of {REPEAT} runs "
          f"(extrapolated baselines: one run on a subsample, scaled linearly)")
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB")


if __name__ == "__main__":
    main()
