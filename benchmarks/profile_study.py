"""Where a study's wall time goes: start-up, model and data loading, training steps, tracking, evaluation, notebooks,
analysis and rendering. Reads a finished study folder (the runs' COMPLETE timings, the manifests' per-run seconds, and
`logs/timing.json` written by `embvar report`); for a study made by an older version, give the console log
(`--log`, for the notebook times) and the total wall time (`--wall`, as measured by `time`).

    python benchmarks/profile_study.py reports/quick [--wall 367] [--log old_console.log]
"""
import argparse, json, re
from pathlib import Path

import pandas as pd


def run_times(study: Path) -> pd.DataFrame:
    "One row per distinct run: the wall seconds of the run and the parts its COMPLETE records."
    rows = []
    for f in sorted((study / "sweeps").glob("*.csv")):
        m = pd.read_csv(f, keep_default_na=False, dtype={"run_id": str})
        for _, r in m[m["status"].isin(["completed", "diverged"])].iterrows():
            c = json.loads((study / r["path"] / "COMPLETE").read_text())
            t = c.get("timing", {})
            rows.append({"run_id": r["run_id"], "seconds": float(r["seconds"]), "train_s": t.get("train_s", 0.0), "track_s": t.get("track_s", 0.0),
                         "eval_s": t.get("eval_s", 0.0), "perturb_s": t.get("perturb_s", 0.0), "threads": c.get("derived", {}).get("torch_threads")})
    return pd.DataFrame(rows).drop_duplicates("run_id")


def split(study: Path, wall: float | None, log: Path | None) -> tuple[pd.DataFrame, dict]:
    runs = run_times(study)
    parts = {"training steps": runs["train_s"].sum(), "tracking (probes + perturbations)": (runs["track_s"] + runs["perturb_s"]).sum(),
             "evaluation": runs["eval_s"].sum()}
    parts["model and data loading (per run)"] = (runs["seconds"] - runs[["train_s", "track_s", "eval_s", "perturb_s"]].sum(axis=1)).sum()
    timing_file = study / "logs" / "timing.json"
    if timing_file.is_file():                               # made by this version of embvar report
        t = json.loads(timing_file.read_text()); nb = t.get("notebooks_s", {})
        total = wall or t["total_s"]
        info = {"wall_s": total, "runs_wall_s": t.get("runs_s"), "runs_cpu_s": runs["seconds"].sum(), "threads": sorted(set(runs["threads"]))}
        rows = {**parts, "experiment notebooks (kernel start-up, imports, pages)": sum(v for k, v in nb.items() if k != "report"),
                "analysis and rendering (report notebook + HTML)": nb.get("report", 0.0) + t.get("render_s", 0.0)}
        rows["start-up and planning (CLI imports, plan, verification)"] = total - t.get("runs_s", 0) - t.get("all_notebooks_s", 0) - t.get("render_s", 0)
    else:                                                   # an older version: training ran inside the notebooks
        nb = {m.group(1): float(m.group(2)) for m in re.finditer(r"== (\w+): done in ([\d.]+)s", log.read_text())} if log else {}
        total = wall or sum(nb.values())
        info = {"wall_s": total, "runs_cpu_s": runs["seconds"].sum(), "threads": sorted(set(runs["threads"]))}
        rows = {**parts, "analysis and rendering (report notebook + HTML)": nb.get("report", 0.0),
                "start-up (kernels, imports, sweep bookkeeping)": sum(v for k, v in nb.items() if k != "report") - runs["seconds"].sum()}
        rows["start-up (kernels, imports, sweep bookkeeping)"] += total - sum(nb.values())     # the CLI's own start-up
    df = pd.DataFrame({"part": list(rows), "seconds": list(rows.values())})
    return df.assign(share_of_wall=df["seconds"] / total), info


if __name__ == "__main__":
    ap = argparse.ArgumentParser(); ap.add_argument("study"); ap.add_argument("--wall", type=float); ap.add_argument("--log", type=Path)
    a = ap.parse_args()
    df, info = split(Path(a.study), a.wall, a.log)
    print(f"{a.study}: wall {info['wall_s']:.0f}s; {len(run_times(Path(a.study)))} runs, {info['runs_cpu_s']:.0f} run-seconds, torch threads {info['threads']}"
          + (f"; training phase {info['runs_wall_s']:.0f}s wall" if info.get("runs_wall_s") else ""))
    print("| part | seconds | share of the wall time |\n|---|---|---|")
    for _, r in df.iterrows(): print(f"| {r['part']} | {r['seconds']:.0f} | {100 * r['share_of_wall']:.0f}% |")
