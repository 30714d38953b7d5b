"""Procrustes and the covariance family in N x N form when d > N: time and peak memory at N = 64, d = 20,000, and the
values against the d x d forms (the main branch's code, and scipy.linalg.orthogonal_procrustes) where both run.

Each case runs in its own subprocess: time, tracemalloc's peak (numpy allocations after the inputs were made) and the
subprocess's peak resident memory (getrusage maxrss: inputs, interpreter and libraries included).

    python benchmarks/bench_procrustes.py                  # N = 64, d = 20,000 (new form); d = 2,000 both forms
    python benchmarks/bench_procrustes.py --old-tree /work/main --d-both 1000
"""
import argparse, json, os, resource, subprocess, sys, time, tracemalloc
import numpy as np

MEASURES = ("procrustes_angular", "procrustes_euclidean", "shape_angular_alpha0", "cca", "svcca", "pwcca", "linreg_r2_xy", "linreg_r2_yx")


def _inputs(n, d):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(n, d))
    return X, X[:, ::-1] * 2 + 0.5 * rng.normal(size=(n, d))


def _case(n, d, module):
    "Every measure at (n, d) in this process: [{measure, value, seconds, tracemalloc_peak_mib}], and maxrss."
    import importlib
    M = importlib.import_module(module).MEASURES
    X, Y = _inputs(n, d)
    out = []
    for m in MEASURES:
        tracemalloc.start(); t = time.perf_counter()
        v = float(M[m].fn(X, Y))
        dt = time.perf_counter() - t; peak = tracemalloc.get_traced_memory()[1]; tracemalloc.stop()
        out.append(dict(measure=m, value=v, seconds=round(dt, 3), tracemalloc_peak_mib=round(peak / 2 ** 20, 1)))
    return dict(rows=out, maxrss_mib=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1))


def _sub(n, d, tree, module, timeout):
    env = {**os.environ, "PYTHONPATH": tree}
    try:
        r = subprocess.run([sys.executable, __file__, "--case", str(n), str(d), module], capture_output=True, text=True,
                           env=env, timeout=timeout, cwd="/tmp")
    except subprocess.TimeoutExpired: return None
    if r.returncode: raise SystemExit(r.stderr[-2000:])
    return json.loads(r.stdout)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--case", nargs=3, default=None, help=argparse.SUPPRESS)
    p.add_argument("--n", type=int, default=64); p.add_argument("--d", type=int, default=20000)
    p.add_argument("--d-both", type=int, default=2000, help="width at which the d x d form is run too (default 2,000)")
    p.add_argument("--old-tree", default="/work/main", help="source tree of the d x d form (its embvar_study.metrics)")
    p.add_argument("--timeout", type=float, default=300, help="seconds allowed to the d x d form")
    a = p.parse_args(argv)
    if a.case:
        print(json.dumps(_case(int(a.case[0]), int(a.case[1]), a.case[2]))); return
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    big = _sub(a.n, a.d, here, "embvar_study.similarity", None)
    print(f"N = {a.n}, d = {a.d:,}, N x N form (this tree): peak resident {big['maxrss_mib']} MiB (inputs {2 * a.n * a.d * 8 / 2 ** 20:.0f} MiB included)")
    print(f"{'measure':22} {'seconds':>8} {'tracemalloc MiB':>16}")
    for r in big["rows"]: print(f"{r['measure']:22} {r['seconds']:8.3f} {r['tracemalloc_peak_mib']:16.1f}")
    new = _sub(a.n, a.d_both, here, "embvar_study.similarity", None)
    old = _sub(a.n, a.d_both, a.old_tree, "embvar_study.metrics", a.timeout)
    from scipy.linalg import orthogonal_procrustes
    X, Y = _inputs(a.n, a.d_both)
    x, y = X - X.mean(0), Y - Y.mean(0)
    ref = np.arccos(np.clip(orthogonal_procrustes(x, y)[1] / np.linalg.norm(x) / np.linalg.norm(y), -1, 1))
    print(f"\nN = {a.n}, d = {a.d_both:,}: N x N form (this tree) vs d x d form ({a.old_tree}), same inputs")
    print(f"{'measure':22} {'new s':>8} {'old s':>8} {'new MiB':>8} {'old MiB':>8} {'|new - old|':>12}")
    for i, r in enumerate(new["rows"]):
        o = old["rows"][i] if old else None
        print(f"{r['measure']:22} {r['seconds']:8.3f} {o['seconds'] if o else float('nan'):8.3f} {r['tracemalloc_peak_mib']:8.1f} "
              f"{o['tracemalloc_peak_mib'] if o else float('nan'):8.1f} {abs(r['value'] - o['value']) if o else float('nan'):12.2e}")
    print(f"procrustes_angular vs scipy.linalg.orthogonal_procrustes: |new - scipy| = {abs(new['rows'][0]['value'] - ref):.2e}")
    if old is None: print(f"(the d x d form ran past {a.timeout:.0f} s)")


if __name__ == "__main__":
    main()
