"""Where a study's wall time goes: start-up, model and data loading, training steps, tracking, evaluation, notebooks,
analysis and rendering. Reads a finished study folder (the runs' COMPLETE timings, the manifests' per-run seconds, and
`logs/timing.json` written by `embvar report`); for a study made by an older version, give the console log
(`--log`, for the notebook times) and the total wall time (`--wall`, as measured by `time`).

    python benchmarks/profile_study.py reports/quick [--wall 367] [--log old_console.log]
"""
import argparse, json, re, sys
from pathlib import Path

import pandas as pd


def run_times(study: Path) -> pd.DataFrame:
    "One row per distinct run: the wall seconds of the run and the parts its COMPLETE records."
    rows = []
    for f in sorted((study / "sweeps").glob("*.csv")):
        m = pd.read_csv(f, keep_default_na=False, dtype={"run_id": str})
        for _, r in m[m["status"].isin(["completed", "diverged", "skipped"])].iterrows():
            c = json.loads((study / r["path"] / "COMPLETE").read_text())
            t = c.get("timing", {})      # a manifest row says "skipped" when a later notebook found the run done: time it by COMPLETE
            took = (pd.Timestamp(c["finished_at"]) - pd.Timestamp(c["started_at"])).total_seconds() if c.get("started_at") else float(r["seconds"])
            rows.append({"run_id": r["run_id"], "seconds": took, "train_s": t.get("train_s", 0.0), "track_s": t.get("track_s", 0.0),
                         "eval_s": t.get("eval_s", 0.0), "perturb_s": t.get("perturb_s", 0.0), "threads": c.get("derived", {}).get("torch_threads")})
    return pd.DataFrame(rows).sort_values("seconds", ascending=False).drop_duplicates("run_id")   # a run shared by experiments: its timed row


def split(study: Path, wall: float | None, log: Path | None) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    "Two tables: the wall time by phase (shares of the wall), and the runs' own seconds by part (shares of run-seconds)."
    runs = run_times(study)
    inside = {"training steps": runs["train_s"].sum(), "tracking (probes + perturbations)": (runs["track_s"] + runs["perturb_s"]).sum(),
              "evaluation": runs["eval_s"].sum()}
    inside["model and data loading, bookkeeping (the rest of each run)"] = runs["seconds"].sum() - sum(inside.values())
    timing_file = study / "logs" / "timing.json"
    if timing_file.is_file():                               # made by this version of embvar report: runs first, then notebooks
        t = json.loads(timing_file.read_text()); nb = t.get("notebooks_s", {})
        if "runs_s" not in t: sys.exit(f"{timing_file}: written by `embvar report --only-report`, which times no runs; profile a study right after a full `embvar report`")
        total = wall or t["total_s"]
        phases = {"runs (all experiments, one plan)": t["runs_s"],
                  "experiment notebooks (kernel start-up, imports, pages)": sum(v for k, v in nb.items() if k != "report"),
                  "analysis and rendering (report notebook + HTML)": nb.get("report", 0.0) + t.get("render_s", 0.0)}
    else:                                                   # an older version: the runs ran inside the notebooks, one at a time
        nb = {m.group(1): float(m.group(2)) for m in re.finditer(r"== (\w+): done in ([\d.]+)s", log.read_text())} if log else {}
        total = wall or sum(nb.values())
        phases = {"runs (inside the experiment notebooks)": runs["seconds"].sum(),
                  "experiment notebooks (kernel start-up, imports, pages)": sum(v for k, v in nb.items() if k != "report") - runs["seconds"].sum(),
                  "analysis and rendering (report notebook + HTML)": nb.get("report", 0.0)}
    phases["start-up, planning, verification (the rest of the wall time)"] = total - sum(phases.values())
    info = {"wall_s": total, "runs_cpu_s": runs["seconds"].sum(), "n_runs": len(runs), "threads": sorted(set(runs["threads"]))}
    wall_df = pd.DataFrame({"part": list(phases), "seconds": list(phases.values())}).assign(share=lambda d: d["seconds"] / total)
    run_df = pd.DataFrame({"part": list(inside), "seconds": list(inside.values())}).assign(share=lambda d: d["seconds"] / runs["seconds"].sum())
    return wall_df, run_df, info


if __name__ == "__main__":
    ap = argparse.ArgumentParser(); ap.add_argument("study"); ap.add_argument("--wall", type=float); ap.add_argument("--log", type=Path)
    a = ap.parse_args()
    wall_df, run_df, info = split(Path(a.study), a.wall, a.log)
    print(f"{a.study}: wall {info['wall_s']:.0f}s; {info['n_runs']} runs, {info['runs_cpu_s']:.0f} run-seconds, torch threads {info['threads']}")
    print("| phase | seconds | share of the wall time |\n|---|---|---|")
    for _, r in wall_df.iterrows(): print(f"| {r['part']} | {r['seconds']:.0f} | {100 * r['share']:.0f}% |")
    print("| inside the runs | run-seconds | share of the run-seconds |\n|---|---|---|")
    for _, r in run_df.iterrows(): print(f"| {r['part']} | {r['seconds']:.0f} | {100 * r['share']:.0f}% |")
