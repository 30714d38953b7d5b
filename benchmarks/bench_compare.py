"""`compare`'s speed against the previous per-pair implementation on the same inputs, and the memory of streaming CKA / RSA.

Speed (default): the quick profile's shape, 7 x 7 layer pairs, 48 probes, d = 384, synthetic (and two real quick-profile
runs of --runs, default build/quick, when it holds two complete runs). Each side runs in its own subprocess: this tree's
`compare` at --n-resamples, the old per-pair implementation's (the package at --old-ref, the commit before the factored
engine, extracted from this clone's history with `git archive`; or --old-tree) at --old-resamples with a timeout, this tree again at --old-resamples; the largest absolute difference of any value and interval between the two
at the same resamples (the old intervals clipped to the measures' ranges, as the new ones are), and pytorch-cka's
`cka_from_features` on the same 49 layer pairs.

Memory (--memory): each case in its own subprocess; its time, tracemalloc's peak (numpy allocations after the inputs
were made) and the subprocess's peak resident memory (getrusage maxrss: inputs, interpreter and libraries included).

    python benchmarks/bench_compare.py                               # speed, old vs new vs pytorch-cka
    python benchmarks/bench_compare.py --old-resamples 20 --n-resamples 200 --old-ref OLD_COMMIT
    python benchmarks/bench_compare.py --memory                      # every memory case at the sizes of nbs/guide_measurements.ipynb (Memory of compare at large N)
    python benchmarks/bench_compare.py --case cka_stream --n 3000 --d 64
"""
import argparse
import json
import resource
import subprocess
import sys
import time
import tracemalloc
import os
from pathlib import Path
import numpy as np

CASES = ("cka_stream", "cka_full", "dcka_stream", "dcka_full", "rsa_stream", "rsa_full", "compare")


def _inputs(n, d, layers=None):
    rng = np.random.default_rng(0)
    shape = (n, d) if layers is None else (layers, n, d)
    X = rng.standard_normal(size=shape, dtype=np.float32)
    W = rng.standard_normal(size=(d, d), dtype=np.float32) / np.float32(d ** 0.5)
    Y = X @ W + rng.standard_normal(size=shape, dtype=np.float32)
    return X, Y


def _run_case(case, n, d, block, layers):
    "One case in this process: {case, value, seconds, tracemalloc_peak_mib, maxrss_mib}."
    from embvar_study import rsa, similarity as metrics, compare
    X, Y = _inputs(n, d, layers if case == "compare" else None)
    f = {"cka_stream": lambda: metrics.linear_cka(X, Y, block=block),
         "cka_full": lambda: metrics.linear_cka(X, Y),
         "dcka_stream": lambda: metrics.linear_cka(X, Y, debiased=True, block=block),
         "dcka_full": lambda: metrics.linear_cka(X, Y, debiased=True),
         "rsa_stream": lambda: rsa.rsa(X, Y, rdm="correlation", compare="pearson", block=block),
         "rsa_full": lambda: np.corrcoef(rsa.rdm_vector(X.astype(np.float64), "correlation"),
                                         rsa.rdm_vector(Y.astype(np.float64), "correlation"))[0, 1],
         "compare": lambda: compare.compare(X, Y, layers=[layers - 1], measures=["linear_cka", "debiased_cka", "procrustes_angular", "cca"],
                                            n_resamples=0)}[case]
    tracemalloc.start(); t = time.perf_counter()
    v = f()
    dt = time.perf_counter() - t
    peak = tracemalloc.get_traced_memory()[1]; tracemalloc.stop()
    value = v.to_dict("records") if case == "compare" else float(v)
    return dict(case=case, n=n, d=d, block=block, layers=layers if case == "compare" else None, value=value, seconds=round(dt, 2),
                tracemalloc_peak_mib=round(peak / 2 ** 20, 1),
                maxrss_mib=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1))


SPEED_CODE = """
import json, sys, time, numpy as np
from embvar_study.compare import compare
A, B = np.load(sys.argv[1]), np.load(sys.argv[2])
t = time.perf_counter()
r = compare(A, B, n_resamples=int(sys.argv[3]))
dt = time.perf_counter() - t
r.to_pickle(sys.argv[4])
print(json.dumps(dict(seconds=dt)))
"""


def _timed_compare(tree, a, b, n_resamples, out, timeout):
    "seconds of `compare(a, b, n_resamples=...)` in a subprocess importing embvar_study from `tree` (None past the timeout)."
    env = {**os.environ, "PYTHONPATH": str(tree), "MPLBACKEND": "Agg"}
    try:
        r = subprocess.run([sys.executable, "-c", SPEED_CODE, str(a), str(b), str(n_resamples), str(out)], capture_output=True,
                           text=True, env=env, timeout=timeout, cwd="/tmp")
    except subprocess.TimeoutExpired: return None
    if r.returncode: raise SystemExit(f"{tree}: {r.stderr[-1500:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])["seconds"]


def _largest_difference(new, old):
    "(largest |new - old| over value, ci_low, ci_high where both are numbers, cells where only one is NaN)."
    import pandas as pd
    from embvar_study.similarity import MEASURES
    key = ["layer_a", "layer_b", "measure"]
    m = pd.merge(pd.read_pickle(new), pd.read_pickle(old), on=key, suffixes=("_new", "_old"))
    lo = m["measure"].map(lambda x: MEASURES[x].range[0]); hi = m["measure"].map(lambda x: MEASURES[x].range[1])
    worst, odd = 0.0, 0
    for c in ("value", "ci_low", "ci_high"):
        a, b = m[c + "_new"].to_numpy(float), np.clip(m[c + "_old"].to_numpy(float), lo, hi)
        both = ~np.isnan(a) & ~np.isnan(b)
        worst = max(worst, float(np.abs(a - b)[both].max()) if both.any() else 0.0)
        odd += int((np.isnan(a) != np.isnan(b)).sum())
    return worst, odd, len(m)


def _pytorch_cka(A, B, reps=5):
    "(seconds per call, values (La, Lb)) of pytorch-cka's cka_from_features on the same layers (float64 CPU tensors), or None."
    try: from cka import cka_from_features
    except ImportError: return None
    import torch
    a, b = torch.from_numpy(A), torch.from_numpy(B)
    cka_from_features(a, b)
    t = time.perf_counter()
    for _ in range(reps): v = cka_from_features(a, b)
    return (time.perf_counter() - t) / reps, v.numpy()


def _inputs_sets(tmp, runs_dir):
    "[(label, path a, path b)]: the synthetic quick-profile shape, and two real quick-profile runs if their cache is complete."
    rng = np.random.default_rng(0)
    A = rng.standard_normal((7, 48, 384)).astype(np.float32)
    B = (A + 0.5 * rng.standard_normal((7, 48, 384))).astype(np.float32)
    out = []
    np.save(tmp / "syn_a.npy", A.astype(np.float64)); np.save(tmp / "syn_b.npy", B.astype(np.float64))
    out.append(("synthetic 7 layers x 48 probes x d 384", tmp / "syn_a.npy", tmp / "syn_b.npy"))
    root = Path(runs_dir)
    if (root / "runs").is_dir():
        from embvar_study.runs import load_run
        runs = sorted(p for p in (root / "runs").iterdir() if (p / "COMPLETE").is_file())[:2]
        if len(runs) == 2:
            ra, rb = load_run(runs[0]), load_run(runs[1])
            step = max(set(ra.steps.tolist()) & set(rb.steps.tolist()))
            for r, n in ((ra, "run_a"), (rb, "run_b")):
                np.save(tmp / f"{n}.npy", np.asarray(r.embeddings_all_layers("mean", steps=[step])[0], dtype=np.float64))
            out.append((f"quick-profile runs {runs[0].name} and {runs[1].name} at step {step}", tmp / "run_a.npy", tmp / "run_b.npy"))
    if len(out) == 1: print(f"(no two complete runs in {root}/runs: the real quick-profile runs are left out)")
    return out


def speed(a):
    import tempfile
    here = Path(__file__).resolve().parents[1]
    tmp = Path(tempfile.mkdtemp(prefix="bench_compare_"))
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    if a.old_tree is None:                                   # the old implementation, from this clone's history
        a.old_tree = str(tmp / "old")
        os.makedirs(a.old_tree)
        archive = subprocess.run(["git", "-C", str(here), "archive", a.old_ref, "embvar_study"], capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", a.old_tree], input=archive, check=True)
        print(f"old implementation: embvar_study at {a.old_ref} (git archive into {a.old_tree})")
    for label, pa, pb in _inputs_sets(tmp, a.runs):
        A = np.load(pa)
        print(f"\n{label}: {A.shape[0]} x {np.load(pb).shape[0]} layer pairs, the default measures")
        new_full = _timed_compare(here, pa, pb, a.n_resamples, tmp / "new_full.pkl", None)
        new_same = _timed_compare(here, pa, pb, a.old_resamples, tmp / "new_same.pkl", None)
        old_same = _timed_compare(a.old_tree, pa, pb, a.old_resamples, tmp / "old_same.pkl", a.timeout)
        old_full = (_timed_compare(a.old_tree, pa, pb, a.n_resamples, tmp / "old_full.pkl", a.timeout)
                    if a.old_full else None)
        fmt = lambda s: f"{s:8.1f} s" if s is not None else f"> {a.timeout:.0f} s (stopped)"
        print(f"{'resamples':>10} {'new (this tree)':>18} {'old (' + str(a.old_tree) + ')':>28}")
        print(f"{a.old_resamples:>10} {fmt(new_same):>18} {fmt(old_same):>28}")
        print(f"{a.n_resamples:>10} {fmt(new_full):>18} {fmt(old_full) if a.old_full else 'not run (--old-full)':>28}")
        if old_same is not None:
            worst, odd, n = _largest_difference(tmp / "new_same.pkl", tmp / "old_same.pkl")
            print(f"largest |new - old| over the {n} cells' value, ci_low, ci_high at {a.old_resamples} resamples: {worst:.2e}"
                  f" ({odd} cells NaN in one only)")
            if old_same and new_same: print(f"speed-up at {a.old_resamples} resamples: {old_same / new_same:.1f}x")
        pc = _pytorch_cka(A, np.load(pb))
        if pc is None: print("pytorch-cka: not installed")
        else:
            import pandas as pd
            t = pd.read_pickle(tmp / "new_same.pkl")
            ours = {m: t[t.measure == m].pivot(index="layer_a", columns="layer_b", values="value").to_numpy() for m in ("linear_cka", "debiased_cka")}
            print(f"pytorch-cka cka_from_features, the same {pc[1].size} layer pairs (values only): {pc[0] * 1000:.1f} ms per call; "
                  f"|pytorch-cka - our debiased_cka| <= {np.abs(pc[1] - ours['debiased_cka']).max():.1e}, "
                  f"|pytorch-cka - our linear_cka| <= {np.abs(pc[1] - ours['linear_cka']).max():.1e}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--memory", action="store_true", help="the memory cases (streaming CKA / RSA, compare on large arrays)")
    p.add_argument("--case", choices=CASES, default=None, help="one memory case in this process (default: every case, each in a subprocess)")
    p.add_argument("--n", type=int, default=None, help="probes N (default 50000; RSA 5000)")
    p.add_argument("--d", type=int, default=768, help="width d of both sets (default 768)")
    p.add_argument("--block", type=int, default=None, help="rows per streaming block (default: CKA 2000, RSA 500)")
    p.add_argument("--layers", type=int, default=2, help="layers of each array in the compare case (default 2; the last pair is compared)")
    p.add_argument("--n-resamples", type=int, default=200, help="speed: the resamples of the new path's full run (default 200)")
    p.add_argument("--old-resamples", type=int, default=20, help="speed: resamples at which old and new are both run and compared (default 20)")
    p.add_argument("--old-ref", default="da695bf^", help="speed: the commit whose package is the old implementation (default da695bf^, before the factored engine)")
    p.add_argument("--old-tree", default=None, help="speed: a source tree of the old implementation instead of --old-ref")
    p.add_argument("--runs", default="build/quick", help="speed: a study folder whose first two complete runs are compared too (default build/quick)")
    p.add_argument("--old-full", action="store_true", help="speed: also run the old tree at --n-resamples (stopped at --timeout)")
    p.add_argument("--timeout", type=float, default=900, help="speed: seconds allowed to each old run (default 900)")
    a = p.parse_args(argv)
    if a.case is not None:
        rsa = a.case.startswith("rsa")
        n = a.n or (5000 if rsa else 50000)
        print(json.dumps(_run_case(a.case, n, a.d, a.block or (500 if rsa else 2000), a.layers)))
        return
    if not a.memory: return speed(a)
    for case in CASES:
        cmd = [sys.executable, __file__, "--case", case, "--d", str(a.d), "--layers", str(a.layers)]
        if a.n: cmd += ["--n", str(a.n)]
        if a.block: cmd += ["--block", str(a.block)]
        r = subprocess.run(cmd, capture_output=True, text=True)
        print(r.stdout.strip() if r.returncode == 0 else json.dumps(dict(case=case, error=r.stderr.strip().splitlines()[-1:])), flush=True)


if __name__ == "__main__":
    main()
