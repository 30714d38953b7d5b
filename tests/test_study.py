"""A study folder read back: `load_study` on a synthetic study (run sets per experiment and factor, design columns,
labels, the design in words, NotComputed for what was not run or is too small), `all_runs`, `study_from_runs`, the
RunSet operations, and the study lock. Every expectation is derived from the parameters the study was made with,
from the files on disk (read with json / numpy, not through the module), or from the documented formats."""
import json, os, shutil, subprocess, sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from embvar_study.run_writer import RunWriter
from embvar_study.runs import load_run
from embvar_study.study import DESIGN_COLUMNS, RunSet, load_study, study_from_runs
from embvar_study.study_folder import NotComputed, study_lock
from embvar_study.synthetic import synthetic_study

# a small synthetic study with non-default parameters: 3 rates, 2 seeds, 8 steps tracked every 3 (and at the end)
LRS, SEEDS, STEPS, EVERY, N, D, L = (2e-5, 4e-4, 1e-3), (3, 5), 8, 3, 6, 4, 1
TRACKED = [0, 3, 6, 8]
# learning rates as the documented format writes them (mantissa without trailing zeros, exponent unpadded, >= 0.01 as %g)
LR_WORDS = {2e-5: "2e-5", 4e-4: "4e-4", 1e-3: "1e-3", 2e-5 / 5: "4e-6", 1e-3 * 10: "0.01"}


@pytest.fixture(scope="module")
def study_dir(tmp_path_factory) -> Path:
    return synthetic_study(tmp_path_factory.mktemp("syn") / "study", lrs=LRS, seeds=SEEDS, steps=STEPS, every=EVERY,
                           n_probes=N, dim=D, n_layers=L)


@pytest.fixture(scope="module")
def study(study_dir):
    return load_study(study_dir)


def disk_config(study_dir: Path, run_id: str) -> dict:
    "A run's config as written in its config.json, read without the module."
    return json.loads((study_dir / "runs" / run_id / "config.json").read_text())


def run_folders(study_dir: Path) -> set:
    return {p.name for p in (study_dir / "runs").iterdir() if p.is_dir() and not p.name.startswith(".")}


# ---------------------------------------------------------------- run sets per experiment and factor

def test_run_sets_have_one_row_per_distinct_run_of_each_experiment(study):
    k, s = len(LRS), len(SEEDS)
    # distinct runs per experiment, from the documented design: the seed sweep's replicate 0 and the two seed axes meet
    # at the reference run; the crossed design is head seeds x data seeds; lr_extended adds lrs[0]/5 and lrs[-1]*10
    expected = {"lr_sweep": k * s, "seed_sweep": 1 + (s - 1) + (s - 1) + 1, "crossed": s * s, "schedule": k * 2 * s,
                "lr_extended": (k + 2) * min(s, 2), "perturbation": k}
    assert study.experiments == list(expected)
    assert {e: len(study.runs(e)) for e in expected} == expected
    assert len(study.runs("seed_sweep", "init_seed")) == s and len(study.runs("seed_sweep", "data_seed")) == s
    assert len(study.runs("seed_sweep", "replicate")) == 2


def test_design_columns_come_from_each_runs_own_config(study, study_dir):
    for experiment in study.experiments:
        rs = study.runs(experiment)
        assert list(rs.table.columns[:len(DESIGN_COLUMNS)]) == DESIGN_COLUMNS
        for row in rs.table.to_dict("records"):
            c = disk_config(study_dir, row["run_id"])
            assert row["experiment"] == experiment and row["status"] == "completed"
            assert {k: row[k] for k in ("lr", "schedule", "seed", "init_seed", "data_seed", "dropout_seed", "replicate")} == \
                   {k: c[k] for k in ("lr", "schedule", "seed", "init_seed", "data_seed", "dropout_seed", "replicate")}
    init = study.runs("seed_sweep", "init_seed").table
    assert sorted(init["init_seed"]) == sorted(SEEDS) and set(init["data_seed"]) == {SEEDS[0]} and set(init["lr"]) == {LRS[0]}


def test_labels_name_what_varies_in_words(study):
    lr = study.runs("lr_sweep")
    want = [f"lr {LR_WORDS[r['lr']]} · init seed {r['seed']} · data seed {r['seed']} · dropout seed {r['seed']}"
            for r in lr.table.to_dict("records")]
    assert lr.labels() == want
    init = study.runs("seed_sweep", "init_seed")
    assert init.labels() == [f"init seed {v}" for v in init.table["init_seed"]]
    assert lr.labels(["lr"]) == [f"lr {LR_WORDS[v]}" for v in lr.table["lr"]]


def test_the_design_in_words(study):
    k, s = len(LRS), len(SEEDS)
    words = ", ".join(LR_WORDS[x] for x in LRS)
    seeds = ", ".join(map(str, SEEDS))
    assert study.design("crossed") == f"{s} head seeds x {s} data seeds at lr {LR_WORDS[LRS[0]]}"
    assert study.design("seed_sweep") == (f"at lr {LR_WORDS[LRS[0]]}: head seeds {seeds} (data seed fixed), data seeds {seeds} "
                                          "(head seed fixed), and 2 identical-seed replicates")
    assert study.design("lr_sweep") == f"{k} learning rates ({words}), {s} seeds each"
    assert study.design("schedule") == f"{k} learning rates ({words}) x schedules constant, linear x {s} seeds"
    ext = [LRS[0] / 5, *LRS, LRS[-1] * 10]
    assert study.design("lr_extended") == f"{len(ext)} learning rates ({', '.join(LR_WORDS[x] for x in ext)}), 2 seeds each"
    assert study.design("perturbation") == f"{k} learning rates ({words}), 1 seed each"


def test_the_design_is_read_from_the_runs_there_are(study_dir, tmp_path):
    copy = tmp_path / "copy"; shutil.copytree(study_dir, copy)
    m = pd.read_csv(copy / "sweeps" / "crossed.csv", dtype={"run_id": str}, keep_default_na=False)
    m[m["data_seed"] == SEEDS[0]].to_csv(copy / "sweeps" / "crossed.csv", index=False)      # one data seed left
    assert load_study(copy).design("crossed") == f"{len(SEEDS)} head seeds x 1 data seeds at lr {LR_WORDS[LRS[0]]}"


def test_an_experiment_that_was_not_run_says_so(study_dir, tmp_path):
    copy = tmp_path / "copy"; shutil.copytree(study_dir, copy)
    (copy / "sweeps" / "crossed.csv").unlink()
    st = load_study(copy)
    with pytest.raises(NotComputed) as e: st.runs("crossed")
    rest = "lr_sweep, seed_sweep, schedule, lr_extended, perturbation"      # study.json's order, without crossed
    assert str(e.value) == f"the crossed experiment was not run in this study (run: {rest})"
    with pytest.raises(NotComputed, match="the crossed experiment was not run"): st.design("crossed")
    assert not st.has("crossed") and st.has("lr_sweep")


def test_min_runs(study):
    n = len(LRS) * len(SEEDS)
    assert len(study.runs("lr_sweep", min_runs=n)) == n
    with pytest.raises(NotComputed, match=rf"^lr_sweep has {n} complete run\(s\); this needs at least {n + 1}$"):
        study.runs("lr_sweep", min_runs=n + 1)
    with pytest.raises(NotComputed, match=r"^seed_sweep \(replicate\) has 2 complete run\(s\); this needs at least 3$"):
        study.runs("seed_sweep", "replicate", min_runs=3)
    with pytest.raises(NotComputed, match=r"has 0 complete run"):
        study.runs("lr_sweep", lr=0.5)                       # conditions that match nothing


def test_all_runs_lists_every_distinct_run_once(study, study_dir):
    every = study.all_runs()
    assert sorted(every.table["run_id"]) == sorted(run_folders(study_dir))      # each folder on disk, once
    first = {}
    for e in study.experiments:                                                 # the first experiment listing each run
        for rid in pd.read_csv(study_dir / "sweeps" / f"{e}.csv", dtype={"run_id": str})["run_id"]: first.setdefault(rid, e)
    assert dict(zip(every.table["run_id"], every.table["experiment"])) == first


# ---------------------------------------------------------------- RunSet operations

def test_where_and_groups_agree_with_the_configs_on_disk(study, study_dir):
    sched = study.runs("schedule")
    configs = {rid: disk_config(study_dir, rid) for rid in sched.table["run_id"]}
    got = sched.where(lr=[LRS[0], LRS[2]], schedule="constant")
    assert set(got.table["run_id"]) == {r for r, c in configs.items() if c["lr"] in (LRS[0], LRS[2]) and c["schedule"] == "constant"}
    groups = sched.groups("schedule")
    assert list(groups) == ["constant", "linear"]
    assert {k: set(g.table["run_id"]) for k, g in groups.items()} == \
           {s: {r for r, c in configs.items() if c["schedule"] == s} for s in ("constant", "linear")}
    pairs = sched.groups(["lr", "seed"])
    assert list(pairs) == sorted((lr, s) for lr in LRS for s in SEEDS) and all(len(g) == 2 for g in pairs.values())
    with pytest.raises(ValueError, match="lr_: not a design column"): sched.where(lr_=1)
    with pytest.raises(ValueError, match="by: expected design columns"): sched.groups("nope")


def test_common_steps_and_stack_read_the_step_files(study, study_dir):
    rs = study.runs("lr_sweep")
    assert rs.common_steps().tolist() == TRACKED
    for layer, pooling, step in [(-1, "mean", None), (0, "cls", 3)]:
        s = TRACKED[-1] if step is None else step
        want = np.stack([np.load(study_dir / "runs" / rid / "embeddings" / f"step_{s:06d}.{pooling}.npy")[layer]
                         for rid in rs.table["run_id"]]).astype(np.float32)
        assert np.array_equal(rs.stack(layer, pooling, step=step), want)
    assert rs.stack().shape == (len(rs), N, D)


def test_runs_with_different_probes_cannot_be_pooled(study, tmp_path):
    rng = np.random.default_rng(0)
    with RunWriter(tmp_path / "other", {"lr": 1e-3, "seed": 9}, [{"text": f"other {i}"} for i in range(N)]) as w:
        for s in (0, 3, 5): w.save_embeddings(s, {"mean": rng.normal(size=(L + 1, N, D))})
    other = RunSet.of([load_run(tmp_path / "other")])
    assert other.common_steps().tolist() == [0, 3, 5]
    mixed = study.runs("lr_sweep") + other
    assert len(mixed) == len(LRS) * len(SEEDS) + 1
    with pytest.raises(NotComputed, match=rf"these {len(mixed)} runs track 2 different probe sets \({N} texts\)"):
        mixed.common_steps()
    with pytest.raises(NotComputed, match="different probe sets"): mixed.stack()
    with pytest.raises(NotComputed, match="no runs"): study.runs("lr_sweep").where(seed=-1).common_steps()


def test_common_steps_are_those_every_run_tracked(study, study_dir, tmp_path):
    probes = [json.loads(line) for line in (next(iter((study_dir / "runs").glob("*/probes.jsonl")))).read_text().splitlines()]
    rng = np.random.default_rng(2)
    with RunWriter(tmp_path / "sparse", {"lr": 1e-3, "seed": 9}, probes) as w:   # the same probes, other steps
        for s in (0, 3, 7): w.save_embeddings(s, {"mean": rng.normal(size=(L + 1, N, D))})
    both = study.runs("lr_sweep") + RunSet.of([load_run(tmp_path / "sparse")])
    assert both.common_steps().tolist() == sorted(set(TRACKED) & {0, 3, 7})
    assert both.stack().shape == (len(both), N, D)          # at the last common step
    with pytest.raises(ValueError, match=r"steps: \[6\] were not tracked"): both.stack(step=6)


# ---------------------------------------------------------------- a study from any run folders

@pytest.fixture
def trainer_runs(tmp_path) -> Path:
    "Four runs as the Trainer callback writes them: parameters nested under `trainer.`, plus an optimizer section."
    rng = np.random.default_rng(1)
    for lr in (1e-4, 3e-4):
        for seed, optim in ((0, "adam"), (1, "sgd")):
            cfg = {"trainer": {"learning_rate": lr, "seed": seed, "lr_scheduler_type": "linear"}, "optim": {"name": optim}}
            with RunWriter(tmp_path / "runs" / f"lr{lr}_s{seed}", cfg, [{"text": t} for t in "abc"]) as w:
                w.save_embeddings(0, {"mean": rng.normal(size=(2, 3, 4))})
    return tmp_path / "runs"


def test_study_from_runs_groups_by_a_design_column(trainer_runs):
    st = study_from_runs([trainer_runs])                  # group_by="lr": a Trainer run's trainer.learning_rate
    assert st.experiments == ["runs"] and st.profile == "runs"
    rs = st.runs("runs")
    assert sorted(rs.table["factor"]) == ["1e-4", "1e-4", "3e-4", "3e-4"] and sorted(rs.table["lr"]) == [1e-4, 1e-4, 3e-4, 3e-4]
    assert {f: len(st.runs("runs", f)) for f in ("1e-4", "3e-4")} == {"1e-4": 2, "3e-4": 2}
    assert st.design("runs") == "2 learning rates (1e-4, 3e-4), 2 seeds each"
    by_schedule = study_from_runs([trainer_runs / "lr0.0001_s0", trainer_runs], "schedule")   # a folder named twice: once
    assert sorted(by_schedule.manifests["runs"]["factor"]) == ["linear · lr 1e-4"] * 2 + ["linear · lr 3e-4"] * 2   # lr differs: it splits
    assert by_schedule.spec["group_by"] == "schedule and lr" and by_schedule.spec["split_by"] == ["trainer.learning_rate"]


def test_study_from_runs_groups_by_a_dotted_config_key(trainer_runs):
    st = study_from_runs([trainer_runs], "optim.name")
    groups = {f: sorted(r.config["trainer"]["seed"] for r in st.runs("runs", f).runs) for f in sorted(set(st.manifests["runs"]["factor"]))}
    assert groups == {"adam · lr 1e-4": [0], "adam · lr 3e-4": [0], "sgd · lr 1e-4": [1], "sgd · lr 3e-4": [1]}   # lr splits too
    assert set(study_from_runs([trainer_runs], "trainer.seed").manifests["runs"]["factor"]) == {f"{s} · lr {lr}" for s in (0, 1) for lr in ("1e-4", "3e-4")}
    (trainer_runs.parent / "empty").mkdir()
    with pytest.raises(NotComputed, match="empty holds no complete run folder"): study_from_runs([trainer_runs.parent / "empty"])


# ---------------------------------------------------------------- the study lock

def _try_lock(study_dir: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    code = f"from embvar_study.study_folder import study_lock\nwith study_lock({str(study_dir)!r}): print('got it')"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)


def test_the_study_lock_is_reentrant_here_and_refused_to_another_process(tmp_path):
    d = tmp_path / "study"
    with study_lock(d) as outer:
        assert outer is not None and outer.held
        with study_lock(d) as inner: assert inner is None                    # re-entrant within this process
        p = _try_lock(d)
        assert p.returncode != 0 and "FolderLockedError" in p.stderr
        assert f"study folder {d.absolute()} is being written by pid {os.getpid()}" in p.stderr   # the holder is named
        # a child of the holder is refused like any other process: nothing is handed down (embvar report's notebooks
        # run with train=False and never take the lock); a stale variable of the old hand-down changes nothing
        child = _try_lock(d, env={**os.environ, "EMBVAR_STUDY_LOCK": f"{d.resolve()}:{os.getpid()}"})
        assert child.returncode != 0 and "FolderLockedError" in child.stderr
    assert not outer.held
    p = _try_lock(d)
    assert p.returncode == 0 and "got it" in p.stdout                         # released: the next writer gets it


def test_methods_written_in_their_own_cells_belong_to_their_class():
    import embvar_study.study as S
    attached = {"where", "groups", "common_steps", "stack", "labels", "runs", "all_runs", "failed", "design"}
    assert attached <= set(vars(S.RunSet)) | set(vars(S.Study)) and not attached & set(S.__all__)
    assert S.Study.runs.__qualname__ == "Study.runs" and S.RunSet.where.__qualname__ == "RunSet.where"


def _runs_with_bad_ones(root: Path) -> Path:
    "Two good runs, an incomplete one (no COMPLETE), a damaged one (a file changed) and one tracked from step 1 (no step-0 reference)."
    import shutil
    rng, probes = np.random.default_rng(0), [{"text": t} for t in "abcdef"]
    for i, (name, steps) in enumerate((("good0", (0, 2)), ("good1", (0, 2)), ("from_step1", (1, 3)), ("damaged", (0, 2)))):
        with RunWriter(root / name, {"lr": 1e-3, "seed": i}, probes) as w:
            for s in steps: w.save_embeddings(s, {"mean": rng.normal(size=(2, 6, 4))})
            w.log(step=2, train_loss=0.5)
    shutil.copytree(root / "good1", root / "crashed"); (root / "crashed" / "COMPLETE").unlink()
    f = next((root / "damaged" / "embeddings").glob("*.npy")); f.write_bytes(f.read_bytes()[:-8])   # truncated
    return root


def test_study_from_runs_names_every_folder_it_skips(tmp_path):
    "Incomplete, damaged and no-step-0-reference folders are skipped, each named with the reason, in the spec and on the page."
    from embvar_study.experiment_sections import section_runs_overview
    root = _runs_with_bad_ones(tmp_path / "runs")
    f = next((root / "damaged" / "embeddings").glob("*.npy"))
    st = study_from_runs([root])
    assert sorted(Path(r.path).name for r in st.runs("runs").runs) == ["good0", "good1"]
    why = {Path(s["path"]).name: s["why"] for s in st.spec["skipped"]}
    assert sorted(why) == ["crashed", "damaged", "from_step1"]
    assert why["crashed"].startswith("incomplete: no COMPLETE marker")
    assert why["damaged"].startswith("damaged: ") and f.name in why["damaged"]
    assert why["from_step1"] == "its drift reference is step 1, not step 0 (the first step it tracked), so its drift from step 0 is not defined"
    text = " ".join(str(x) for x in section_runs_overview(st))
    assert "**2 runs** from 1 folder(s)" in text and "Skipped 3 run folder(s): " in text
    for name, w in why.items(): assert f"`{(root / name).resolve()}` ({w})" in text


def test_an_edited_failure_rule_is_refused_on_read_naming_the_field(tmp_path):
    "study.json's failure rule changed from 0.05 to 0.45 behind the runs: load_study refuses, naming resolved.failure.delta."
    import json as _json
    from embvar_study.runs import CorruptRunError
    from embvar_study.study_folder import write_study_spec
    from embvar_study.synthetic import synthetic_study
    study = synthetic_study(tmp_path / "s")
    spec = _json.loads((study / "study.json").read_text())
    write_study_spec(study, {**spec, "resolved": {**spec["resolved"], "failure": {"delta": 0.05, "diverge_factor": 10}}})
    assert load_study(study).spec["resolved"]["failure"]["delta"] == 0.05
    text = (study / "study.json").read_text()
    (study / "study.json").write_text(text.replace('"delta": 0.05', '"delta": 0.45'))
    with pytest.raises(CorruptRunError, match=r"study.json: field 'resolved.failure.delta' was edited after the study was planned"):
        load_study(study)
    (study / "study.json").write_text(text)                  # restored: read again
    assert load_study(study).spec["resolved"]["failure"]["delta"] == 0.05
