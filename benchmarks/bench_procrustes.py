"""Procrustes and the covariance family in N x N form when d > N: time and peak memory at N = 64, d = 20,000, and the
shape distances against their d x d forms (the same formulas with d x d eigen- and singular-value decompositions, as
netrep computes them; and scipy.linalg.orthogonal_procrustes) on the same inputs where both run.

Each case of the package runs in its own subprocess: time, tracemalloc's peak (numpy allocations after the inputs were
made) and the subprocess's peak resident memory (getrusage maxrss: inputs, interpreter and libraries included).

    python benchmarks/bench_procrustes.py                  # N = 64, d = 20,000 (N x N form); d = 2,000 both forms
    python benchmarks/bench_procrustes.py --d-both 1000
"""
import argparse, json, os, resource, subprocess, sys, time, tracemalloc
import numpy as np

MEASURES = ("procrustes_angular", "procrustes_euclidean", "shape_angular_alpha0", "cca", "svcca", "pwcca", "linreg_r2_xy", "linreg_r2_yx")


def _inputs(n, d):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(n, d))
    return X, X[:, ::-1] * 2 + 0.5 * rng.normal(size=(n, d))


SHAPES = (("procrustes_angular", 1.0, "angular"), ("procrustes_euclidean", 1.0, "euclidean"), ("shape_angular_alpha0", 0.0, "angular"))


def shape_dxd(X, Y, alpha, kind):
    "The shape distance with d x d matrices: netrep's partial whitening by an eigendecomposition of the d x d covariance, the nuclear norm by a d x d SVD."
    def whiten(c):
        if alpha >= 1: return c
        lam, V = np.linalg.eigh(c.T @ c)
        lam = np.clip(lam, 1e-7, None)
        h = lambda x: alpha ** 2 * x + 2 * alpha * (1 - alpha) * x ** 0.5 + (1 - alpha) ** 2
        w = (alpha + (1 - alpha) * lam ** -0.5) * np.sqrt(lam.sum() / h(lam).sum())
        return c @ ((V * w) @ V.T)
    a, b = whiten(X - X.mean(0)), whiten(Y - Y.mean(0))
    nuc = np.linalg.svd(a.T @ b, compute_uv=False).sum()
    na, nb = (a * a).sum(), (b * b).sum()
    if kind == "angular": return float(np.arccos(np.clip(nuc / np.sqrt(na * nb), -1, 1)))
    return float(np.sqrt(max(na + nb - 2 * nuc, 0) / X.shape[0]))


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
    a = p.parse_args(argv)
    if a.case:
        print(json.dumps(_case(int(a.case[0]), int(a.case[1]), a.case[2]))); return
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    big = _sub(a.n, a.d, here, "embvar_study.similarity", None)
    print(f"N = {a.n}, d = {a.d:,}, N x N form (this tree): peak resident {big['maxrss_mib']} MiB (inputs {2 * a.n * a.d * 8 / 2 ** 20:.0f} MiB included)")
    print(f"{'measure':22} {'seconds':>8} {'tracemalloc MiB':>16}")
    for r in big["rows"]: print(f"{r['measure']:22} {r['seconds']:8.3f} {r['tracemalloc_peak_mib']:16.1f}")
    new = _sub(a.n, a.d_both, here, "embvar_study.similarity", None)
    from scipy.linalg import orthogonal_procrustes
    X, Y = _inputs(a.n, a.d_both)
    old = []
    for name, alpha, kind in SHAPES:
        tracemalloc.start(); t = time.perf_counter()
        v = shape_dxd(X, Y, alpha, kind)
        dt = time.perf_counter() - t; peak = tracemalloc.get_traced_memory()[1]; tracemalloc.stop()
        old.append(dict(measure=name, value=v, seconds=dt, tracemalloc_peak_mib=peak / 2 ** 20))
    x, y = X - X.mean(0), Y - Y.mean(0)
    ref = np.arccos(np.clip(orthogonal_procrustes(x, y)[1] / np.linalg.norm(x) / np.linalg.norm(y), -1, 1))
    print(f"\nN = {a.n}, d = {a.d_both:,}: N x N form (the package) vs the d x d form (this script), same inputs")
    print(f"{'measure':22} {'N x N s':>8} {'d x d s':>8} {'ratio':>7} {'N x N MiB':>10} {'d x d MiB':>10} {'|difference|':>13} {'value':>9}")
    for o in old:
        r = next(r for r in new["rows"] if r["measure"] == o["measure"])
        print(f"{r['measure']:22} {r['seconds']:8.3f} {o['seconds']:8.3f} {o['seconds'] / max(r['seconds'], 1e-6):6.0f}x "
              f"{r['tracemalloc_peak_mib']:10.1f} {o['tracemalloc_peak_mib']:10.1f} {abs(r['value'] - o['value']):13.2e} {r['value']:9.4f}")
    print(f"procrustes_angular vs scipy.linalg.orthogonal_procrustes: |N x N - scipy| = {abs(new['rows'][0]['value'] - ref):.2e}")

if __name__ == "__main__":
    main()
