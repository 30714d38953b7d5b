"""Peak memory and time of streaming CKA and RSA against the full computations, and of `compare` on large arrays.

Each case runs in its own subprocess; it reports its time, tracemalloc's peak (numpy allocations after the inputs were
made) and the subprocess's peak resident memory (getrusage maxrss: inputs, interpreter and libraries included).

    python benchmarks/bench_compare.py                       # every case at the sizes of compare-readme.md
    python benchmarks/bench_compare.py --case cka_stream --n 3000 --d 64
"""
import argparse
import json
import resource
import subprocess
import sys
import time
import tracemalloc
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
    from embvar_study import metrics, compare
    X, Y = _inputs(n, d, layers if case == "compare" else None)
    f = {"cka_stream": lambda: metrics.linear_cka(X, Y, block=block),
         "cka_full": lambda: metrics.linear_cka(X, Y),
         "dcka_stream": lambda: metrics.linear_cka(X, Y, debiased=True, block=block),
         "dcka_full": lambda: metrics.linear_cka(X, Y, debiased=True),
         "rsa_stream": lambda: metrics.rsa(X, Y, rdm="correlation", compare="pearson", block=block),
         "rsa_full": lambda: metrics._corr(metrics._rdm_vec(X.astype(np.float64), "correlation"), metrics._rdm_vec(Y.astype(np.float64), "correlation")),
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


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--case", choices=CASES, default=None, help="one case in this process (default: every case, each in a subprocess)")
    p.add_argument("--n", type=int, default=None, help="probes N (default 50000; RSA 5000)")
    p.add_argument("--d", type=int, default=768, help="width d of both sets (default 768)")
    p.add_argument("--block", type=int, default=None, help="rows per streaming block (default: CKA 2000, RSA 500)")
    p.add_argument("--layers", type=int, default=2, help="layers of each array in the compare case (default 2; the last pair is compared)")
    a = p.parse_args(argv)
    if a.case is not None:
        rsa = a.case.startswith("rsa")
        n = a.n or (5000 if rsa else 50000)
        print(json.dumps(_run_case(a.case, n, a.d, a.block or (500 if rsa else 2000), a.layers)))
        return
    for case in CASES:
        cmd = [sys.executable, __file__, "--case", case, "--d", str(a.d), "--layers", str(a.layers)]
        if a.n: cmd += ["--n", str(a.n)]
        if a.block: cmd += ["--block", str(a.block)]
        r = subprocess.run(cmd, capture_output=True, text=True)
        print(r.stdout.strip() if r.returncode == 0 else json.dumps(dict(case=case, error=r.stderr.strip().splitlines()[-1:])), flush=True)


if __name__ == "__main__":
    main()
