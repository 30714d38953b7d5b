"""The cost of verifying on read (issue 33): the same study read, and its report rendered, with and without the checksums.

Every array a run holds is checked against COMPLETE's sha256 when it is first read in a process (`runs._verify_file`).
This benchmark measures what that costs, on copies of a finished study (`cp -a`; the study itself is never written):

- read: in a fresh process per trial, `load_study` and every array of every run (each step file of every pooling,
  every perturbation array), once with verification and once with `runs._verify_file` replaced by a no-op;
- render (`--render`): `embvar report --only-report` on a copy, with and without verification. "Without" puts a
  `sitecustomize.py` first on PYTHONPATH that replaces `runs._verify_file` in the CLI and in every notebook kernel; each
  process that loads it appends its pid to a file, so the run says how many processes were unverified.

    python benchmarks/bench_verify.py /work/cache/quick --trials 3
    python benchmarks/bench_verify.py /work/cache/quick --render          # also two full --only-report renders

Ratios are of times measured in the same run, on the same copies; the machine may be shared (load is printed).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

READ = r"""
import json, sys, time
t0 = time.perf_counter()
import embvar_study.runs as R
if sys.argv[2] == "off": R._verify_file = lambda *a, **k: None
from embvar_study.study import load_study
t1 = time.perf_counter()
st = load_study(sys.argv[1]); n_bytes = 0; n_files = 0
for run in st._runs.values():
    for p in run.poolings:
        a = run.embeddings_all_layers(p); n_bytes += a.nbytes; n_files += len(run.steps)
    for _, _, a in run.perturbations(): n_bytes += a.nbytes; n_files += 1
print(json.dumps({"seconds": time.perf_counter() - t1, "import_s": t1 - t0, "runs": len(st._runs), "files": n_files, "mib": n_bytes / 2**20}))
"""

SITE = """import os
if os.environ.get("EMBVAR_BENCH_NO_VERIFY"):
    import embvar_study.runs as _R
    _R._verify_file = lambda *a, **k: None
    with open(os.environ["EMBVAR_BENCH_NO_VERIFY"], "a") as _f: _f.write(f"{os.getpid()}\\n")
"""


def _env(extra: dict | None = None) -> dict:
    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep), "MPLBACKEND": "Agg"}
    return {**env, **(extra or {})}


def read_trial(study: Path, mode: str) -> dict:
    out = subprocess.run([sys.executable, "-c", READ, str(study), mode], capture_output=True, text=True, env=_env(), check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def render(study: Path, verify: bool, work: Path) -> dict:
    mark = work / "unverified_pids.txt"
    extra = {}
    if not verify:
        site = work / "site"; site.mkdir(exist_ok=True); (site / "sitecustomize.py").write_text(SITE)
        extra = {"EMBVAR_BENCH_NO_VERIFY": str(mark)}
        extra["PYTHONPATH"] = os.pathsep.join([str(site), _env()["PYTHONPATH"]])
    spec = json.loads((study / "study.json").read_text())
    t = time.perf_counter()
    r = subprocess.run([str(Path(sys.executable).parent / "embvar"), "report", "--profile", spec.get("profile", "quick"), "--only-report",
                        "--out", str(study)], capture_output=True, text=True, env=_env(extra) if not verify else _env())
    secs = time.perf_counter() - t
    if r.returncode != 0: raise SystemExit(f"render failed ({r.returncode}): {r.stderr[-2000:]}")
    pids = len(mark.read_text().split()) if mark.exists() else 0
    return {"seconds": secs, "unverified_processes": pids}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("study", type=Path, help="a finished study folder (copied, never written)")
    ap.add_argument("--trials", type=int, default=3, help="read trials per mode (alternating)")
    ap.add_argument("--render", action="store_true", help="also time two --only-report renders (minutes each)")
    a = ap.parse_args()
    if not (a.study / "study.json").is_file(): raise SystemExit(f"study: {a.study} holds no study.json")
    work = Path(tempfile.mkdtemp(prefix="bench_verify_"))
    try:
        copy = work / "study"; subprocess.run(["cp", "-a", str(a.study), str(copy)], check=True)
        print(f"load (1, 5, 15 min): {os.getloadavg()}")
        res = {"on": [], "off": []}
        for i in range(a.trials):
            for mode in (("on", "off") if i % 2 == 0 else ("off", "on")):
                res[mode].append(read_trial(copy, mode))
        first = res["on"][0]
        on = sorted(r["seconds"] for r in res["on"]); off = sorted(r["seconds"] for r in res["off"])
        med = lambda xs: xs[len(xs) // 2]
        print(f"read: {first['runs']} runs, {first['files']} array files, {first['mib']:.0f} MiB of arrays")
        print(f"read with verification:    {', '.join(f'{x:.2f}' for x in on)} s (median {med(on):.2f})")
        print(f"read without verification: {', '.join(f'{x:.2f}' for x in off)} s (median {med(off):.2f})")
        print(f"read ratio (with / without, medians): {med(on) / med(off):.2f}")
        if a.render:
            copy2 = work / "study2"; subprocess.run(["cp", "-a", str(a.study), str(copy2)], check=True)
            r_on = render(copy, True, work)
            r_off = render(copy2, False, work)
            print(f"render --only-report with verification:    {r_on['seconds']:.1f} s")
            print(f"render --only-report without verification: {r_off['seconds']:.1f} s ({r_off['unverified_processes']} processes unverified)")
            print(f"render ratio (with / without): {r_on['seconds'] / r_off['seconds']:.3f}")
        print(f"load (1, 5, 15 min): {os.getloadavg()}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
