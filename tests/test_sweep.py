"""End-to-end tests of embvar_study.sweep: profiles and grids, the manifest, skipping finished (verified) work, damaged
runs moved aside and recomputed, recovery after a killed sweep, failures recorded per run, and the warm worker pool
(jobs=2) against runs trained one at a time in this process at the same thread count."""
import contextlib
import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from conftest import TINY, embedding_digests, folder_state, kill_when_ready
from embvar_study.metrics import drift_curve
from embvar_study.runs import IncompleteRunError, is_complete, load_run
from embvar_study.study_folder import NotComputed, load_manifest
from embvar_study.study import load_study
from embvar_study.sweep import (EXPERIMENT_NAMES, PROFILE_KEYS, PROFILES, expand_grid, experiment_grid, get_profile, plan_study,
                                run_study, run_sweep)
from embvar_study.config import TrainConfig
from embvar_study.train import train_run

pytestmark = [pytest.mark.filterwarnings("ignore:.*truncated to max_length"),
              pytest.mark.filterwarnings("ignore:.*NumPy array is not writable")]

GRID = {"lr": [5e-5, 5e-4], "seed": [0, 1]}
WORKER_THREADS = max(1, (os.cpu_count() or 1) // 2)   # what the executor gives each of its jobs=2 workers


@contextlib.contextmanager
def torch_threads(n: int):
    old = torch.get_num_threads(); torch.set_num_threads(n)
    try: yield
    finally: torch.set_num_threads(old)


def run_ids(base, points):
    fields = set(TrainConfig.__dataclass_fields__)
    return [TrainConfig(**{**base, **{k: v for k, v in p.items() if k in fields}}).run_id() for p in points]


def complete_mtimes(out_dir, manifest) -> dict:
    return {p: (Path(out_dir) / p / "COMPLETE").stat().st_mtime_ns for p in manifest["path"]}


# ---------------------------------------------------------------------------------------------------------------
# Profiles and grids

def test_experiment_grids_of_the_smoke_profile():
    prof = get_profile("smoke")
    assert prof["name"] == "smoke" and prof["base"] == PROFILES["smoke"]["base"]
    lr = experiment_grid(prof, "lr_sweep")
    assert {(p["lr"], p["seed"]) for p in lr} == {(a, s) for a in prof["lrs"] for s in prof["seeds"]}
    assert len(lr) == len(prof["lrs"]) * len(prof["seeds"]) and all(p["factor"] == "lr" for p in lr)
    assert len(set(run_ids(prof["base"], lr))) == len(lr)

    seed = experiment_grid(prof, "seed_sweep")
    s0, ref = prof["seeds"][0], prof["ref_lr"]
    assert all(p["lr"] == ref for p in seed)
    init = [p for p in seed if p["factor"] == "init_seed"]
    data = [p for p in seed if p["factor"] == "data_seed"]
    rep = [p for p in seed if p["factor"] == "replicate"]
    assert [p["init_seed"] for p in init] == prof["head_seeds"] and all(p["data_seed"] == p["dropout_seed"] == s0 for p in init)
    assert [p["data_seed"] for p in data] == prof["data_seeds"] and all(p["init_seed"] == p["dropout_seed"] == s0 for p in data)
    assert [p["replicate"] for p in rep] == [0, 1]
    # one source of randomness at a time: the all-s0 point is one run shared by the three factors and by the
    # lr sweep's (ref_lr, s0) point; replicate 1 is the same config under another label, hence another run
    ids = dict(zip(map(json.dumps, seed), run_ids(prof["base"], seed)))
    shared = {ids[json.dumps(p)] for p in seed if p.get("init_seed") == p.get("data_seed") == s0 and p.get("replicate", 0) == 0}
    assert shared == set(run_ids(prof["base"], [{"lr": ref, "seed": s0}]))
    assert ids[json.dumps(rep[1])] not in shared
    assert len(set(ids.values())) == len(prof["head_seeds"]) + len(prof["data_seeds"]) - 1 + 1

    pert = experiment_grid(prof, "perturbation")
    assert [p["lr"] for p in pert] == prof["lrs"]
    for p in pert:
        cfg = TrainConfig(**{**prof["base"], **{k: v for k, v in p.items() if k != "factor"}})
        assert cfg.perturb_kinds == prof["perturb"]["perturb_kinds"] and cfg.perturb_k == prof["perturb"]["perturb_k"]


def test_get_profile_overrides_are_a_deep_copy():
    before = copy.deepcopy(PROFILES)
    prof = get_profile("smoke", {"lrs": [1e-4], "n_train": 40, "perturb": {"perturb_kinds": ["typo"]}})
    assert prof["lrs"] == [1e-4] and prof["base"]["n_train"] == 40 and prof["perturb"] == {"perturb_kinds": ["typo"]}
    assert [(p["lr"], p["seed"]) for p in experiment_grid(prof, "lr_sweep")] == [(1e-4, s) for s in PROFILES["smoke"]["seeds"]]
    prof["base"]["model"] = "changed"; prof["seeds"].append(9); prof["perturb"]["perturb_kinds"].append("mc_dropout")
    assert PROFILES == before
    assert get_profile("smoke")["base"]["model"] == "tiny-distilbert"


def test_unknown_profile_and_keys_list_the_valid_ones():
    with pytest.raises(ValueError, match=r"profile: unknown profile 'smok'") as err:
        get_profile("smok")
    for name in PROFILES: assert repr(name) in str(err.value)
    with pytest.raises(ValueError, match=r"learning_rate: unknown key") as err:
        get_profile("smoke", {"learning_rate": 1e-4})
    for k in (*PROFILE_KEYS, "lr", "n_train", "track_every"): assert repr(k) in str(err.value)
    with pytest.raises(ValueError, match=r"^n_train: "):
        get_profile("smoke", {"n_train": 0})
    with pytest.raises(ValueError, match=r"lr_sweep.*seed_sweep.*perturbation"):
        experiment_grid(get_profile("smoke"), "lr-sweep")


@pytest.mark.parametrize("key, value, expected", [
    ("seeds", [], "a non-empty list of seeds"), ("head_seeds", [0, -1], "a non-empty list of seeds"),
    ("crossed_seeds", [1.5], "a non-empty list of seeds"), ("extended_seeds", 3, "a non-empty list of seeds"),
    ("lrs", [5e-5, 0], "a non-empty list of positive learning rates"), ("extended_lrs", [], "a non-empty list of positive"),
    ("ref_lr", -1, "a positive learning rate"), ("perturb", ["typo"], "a dict of run fields")])
def test_bad_grid_keys_name_the_key(key, value, expected):
    with pytest.raises(ValueError, match=rf"^{key}: expected {expected}"):
        get_profile("smoke", {key: value})


def test_expand_grid():
    pts = expand_grid(TINY, {"lr": [1e-5, 1e-4, 1e-3], "seed": [0, 1]})
    assert pts == [{"lr": a, "seed": s} for a in (1e-5, 1e-4, 1e-3) for s in (0, 1)]
    assert expand_grid(TINY, {}) == [{}]
    with pytest.raises(ValueError, match=r"grid\['seed'\]: expected a non-empty list"):
        expand_grid(TINY, {"lr": [1e-4], "seed": []})
    with pytest.raises(ValueError, match=r"grid\['lr'\]"):
        expand_grid(TINY, {"lr": 1e-4})
    with pytest.raises(ValueError, match=r"^lr: "):
        expand_grid(TINY, {"lr": [1e-4, -1.0]})
    with pytest.raises(ValueError, match=r"unknown config key.*'sed'"):
        expand_grid(TINY, {"sed": [0]})


# ---------------------------------------------------------------------------------------------------------------
# run_sweep: a 2 lr x 2 seed grid of tiny runs, trained once for the module (with the thread count that run_sweep
# gives its jobs=2 workers, so that the process-pool test below compares like with like).

@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep")
    points = expand_grid(TINY, GRID)
    with torch_threads(WORKER_THREADS):
        manifest = run_sweep("grid", TINY, points, out, say=None)
    return {"out": out, "points": points, "manifest": manifest}


@pytest.mark.slow
def test_run_sweep_manifest(sweep):
    out, m, points = sweep["out"], sweep["manifest"], sweep["points"]
    assert list(m["status"]) == ["completed"] * 4
    assert list(m["run_id"]) == run_ids(TINY, points)
    assert list(m["path"]) == [f"runs/{rid}" for rid in m["run_id"]]
    assert list(zip(m["lr"], m["seed"])) == [(p["lr"], p["seed"]) for p in points]
    assert (m["error"] == "").all() and (m["seconds"] > 0).all()
    on_disk = load_manifest(out, "grid")
    pd.testing.assert_frame_equal(on_disk[["lr", "seed", "run_id", "path", "status"]],
                                  m[["lr", "seed", "run_id", "path", "status"]], check_dtype=False)
    for _, r in m.iterrows():
        run = load_run(out / r["path"])
        assert run.status == "completed" and run.config["lr"] == r["lr"] and run.config["seed"] == r["seed"]
        assert run.config_hash == r["run_id"]
    with pytest.raises(NotComputed, match=r"the nope experiment was not run in this study \(experiments run: grid\)"):
        load_manifest(out, "nope")


@pytest.mark.slow
def test_rerun_skips_everything_and_touches_nothing(sweep):
    out, m = sweep["out"], sweep["manifest"]
    before = {p: folder_state(out / p) for p in m["path"]}
    again = run_sweep("grid", TINY, sweep["points"], out, say=None)
    assert list(again["status"]) == ["skipped"] * 4
    assert list(again["run_id"]) == list(m["run_id"])
    assert {p: folder_state(out / p) for p in m["path"]} == before
    assert list(load_manifest(out, "grid")["status"]) == ["skipped"] * 4


def test_repeated_grid_point_runs_once(tmp_path):
    m = run_sweep("dup", TINY, [{"seed": 0, "factor": "a"}, {"seed": 0, "factor": "b"}], tmp_path, say=None)
    assert m["run_id"].nunique() == 1 and list(m["factor"]) == ["a", "b"]
    assert list(m["status"]) == ["completed", "completed"]            # both grid points share the one run
    assert len([p for p in (tmp_path / "runs").iterdir() if not p.name.startswith(".")]) == 1   # hidden: the run's lock


def test_failing_run_is_recorded_and_the_others_complete(tmp_path):
    bad = "no-such-org/no-such-model"              # fails when the run starts (offline: the Hub cannot be asked)
    points = [{"seed": 0}, {"seed": 0, "model": bad}, {"seed": 1}]
    m = run_sweep("fail", TINY, points, tmp_path, say=None)
    assert list(m["status"]) == ["completed", "failed", "completed"]
    assert "HubUnavailableError" in m["error"][1] and bad in m["error"][1]
    assert m["error"][0] == m["error"][2] == ""
    assert not is_complete(tmp_path / m["path"][1])
    on_disk = load_manifest(tmp_path, "fail")
    assert list(on_disk["status"]) == ["completed", "failed", "completed"] and bad in on_disk["error"][1]
    # the full traceback is kept next to the manifest
    errors = (tmp_path / "sweeps" / "fail.errors.txt").read_text()
    assert m["run_id"][1] in errors and "Traceback (most recent call last)" in errors and "HubUnavailableError" in errors
    # a rerun retries the failed run only
    again = run_sweep("fail", TINY, points, tmp_path, say=None)
    assert list(again["status"]) == ["skipped", "failed", "skipped"]


def test_repeats_of_a_failed_grid_point_share_its_failure(tmp_path):
    bad = {"model": "no-such-org/no-such-model"}
    m = run_sweep("dupfail", TINY, [{**bad, "factor": "a"}, {**bad, "factor": "b"}], tmp_path, say=None)
    assert list(m["status"]) == ["failed", "failed"] and m["error"][0] == m["error"][1] != ""


def test_a_missing_dataset_is_refused_before_any_run(tmp_path):
    missing = tmp_path / "no_such_data.csv"
    with pytest.raises(FileNotFoundError, match=rf"^dataset: no such file '{missing}'$"):
        run_sweep("missing", TINY, [{"seed": 0}, {"seed": 0, "dataset": str(missing)}], tmp_path / "s", say=None)
    assert not (tmp_path / "s" / "runs").exists()


# A worker process that dies without a Python exception (segfault, OOM killer): os._exit in the run of one lr,
# injected into the spawned workers through a sitecustomize module on PYTHONPATH.
CRASH_SITE = """
import os
if os.environ.get("EMBVAR_TEST_CRASH_LR"):
    import embvar_study.executors as _ex
    _original = _ex.run_one
    def run_one(config, run_dir, *, threads=None):
        if repr(config["lr"]) == os.environ["EMBVAR_TEST_CRASH_LR"]: os._exit(1)
        return _original(config, run_dir, threads=threads)
    _ex.run_one = run_one
"""


def test_a_worker_crash_fails_only_the_run_that_crashes(tmp_path, monkeypatch):
    site = tmp_path / "site"; site.mkdir(); (site / "sitecustomize.py").write_text(CRASH_SITE)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("EMBVAR_TEST_CRASH_LR", repr(1e-3))
    lrs = [1e-4, 1e-3, 2e-4, 3e-4]
    m = run_sweep("crash", {**TINY, "max_steps": 2}, [{"lr": lr} for lr in lrs], tmp_path / "study", jobs=2, say=None)
    status, error = dict(zip(m["lr"], m["status"])), dict(zip(m["lr"], m["error"]))
    assert status[1e-3] == "failed" and "worker died" in error[1e-3] and "code 1" in error[1e-3]
    assert [status[lr] for lr in lrs if lr != 1e-3] == ["completed"] * 3
    for lr, path in zip(m["lr"], m["path"]):
        if lr != 1e-3: load_run(tmp_path / "study" / path)          # complete and verified


@pytest.mark.slow
def test_a_damaged_run_is_moved_aside_named_and_recomputed(sweep, tmp_path):
    import shutil
    study = tmp_path / "study"; shutil.copytree(sweep["out"], study)
    victim = study / sweep["manifest"]["path"][1]
    f = sorted((victim / "embeddings").iterdir())[1]
    data = bytearray(f.read_bytes()); data[-1] ^= 1; f.write_bytes(bytes(data))
    lines = []
    with torch_threads(WORKER_THREADS):
        m = run_sweep("grid", TINY, sweep["points"], study, say=lines.append)
    assert list(m["status"]) == ["skipped", "completed", "skipped", "skipped"]
    moved = [l for l in lines if l.startswith("damaged run")]
    assert len(moved) == 1 and victim.name in moved[0] and f.name in moved[0] and "checksum mismatch" in moved[0]
    aside = list((study / "damaged").iterdir())
    assert len(aside) == 1 and aside[0].name.startswith(victim.name)
    assert embedding_digests(victim) == embedding_digests(sweep["out"] / sweep["manifest"]["path"][1])   # the same bytes again


# ---------------------------------------------------------------------------------------------------------------
# A sweep killed midway, then rerun

KILL_BASE = {**TINY, "max_steps": 6, "track_every": 1}
KILL_SCRIPT = ("import json, sys; from embvar_study.sweep import run_sweep; "
               "run_sweep('kill', json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3], say=None)")


def test_killed_sweep_resumes_without_recomputing_finished_runs(tmp_path):
    points = expand_grid(KILL_BASE, GRID)
    runs_dir = tmp_path / "runs"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.Popen([sys.executable, "-c", KILL_SCRIPT, json.dumps(KILL_BASE), json.dumps(points), str(tmp_path)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    def one_done_one_started():
        folders = [p for p in runs_dir.iterdir() if (p / "config.json").is_file()] if runs_dir.exists() else []   # (not the hidden locks)
        return any(is_complete(p) for p in folders) and any(not is_complete(p) for p in folders)
    kill_when_ready(proc, one_done_one_started, "the sweep", poll=0.01)
    folders = [p for p in runs_dir.iterdir() if not p.name.startswith(".")]
    done = sorted(p for p in folders if is_complete(p))
    killed = sorted(p for p in folders if not is_complete(p))
    assert 1 <= len(done) < 4 and killed
    for p in killed:
        with pytest.raises(IncompleteRunError, match=str(p)): load_run(p)
    before = {p.name: folder_state(p) for p in done}

    m = run_sweep("kill", KILL_BASE, points, tmp_path, say=None)
    status = dict(zip(m["run_id"], m["status"]))
    assert list(m["run_id"]) == run_ids(KILL_BASE, points)
    assert m["run_id"].iloc[0] in before                        # the first grid point had finished
    assert {rid for rid, s in status.items() if s == "skipped"} == set(before)
    assert {rid for rid, s in status.items() if s == "completed"} == set(status) - set(before)
    assert {p.name: folder_state(p) for p in done} == before     # not recomputed, not rewritten
    for p in m["path"]:
        run = load_run(tmp_path / p, verify=True)
        assert run.status == "completed"
        np.testing.assert_array_equal(run.steps, np.arange(7))
    assert sorted(p.name for p in runs_dir.iterdir() if not p.name.startswith(".")) == sorted(m["run_id"])


# ---------------------------------------------------------------------------------------------------------------
# The process pool

@pytest.fixture(scope="module")
def sweep_jobs2(sweep, tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep_jobs2")
    return {"out": out, "manifest": run_sweep("grid", TINY, sweep["points"], out, jobs=2, say=None)}


@pytest.mark.slow
def test_jobs_2_gives_the_same_runs_as_one_at_a_time(sweep, sweep_jobs2):
    m1, m2 = sweep["manifest"], sweep_jobs2["manifest"]
    assert list(m2["status"]) == ["completed"] * 4
    assert list(m2["run_id"]) == list(m1["run_id"])
    for p in m1["path"]:
        r1, r2 = load_run(sweep["out"] / p), load_run(sweep_jobs2["out"] / p)
        np.testing.assert_array_equal(drift_curve(r1.embeddings()), drift_curve(r2.embeddings()))
        assert embedding_digests(r1.path) == embedding_digests(r2.path)
        pd.testing.assert_frame_equal(r1.history, r2.history)
        for name in ("config.json", "history.csv", "probes.jsonl"):       # every file but COMPLETE (times, host)
            assert (r1.path / name).read_bytes() == (r2.path / name).read_bytes(), name


@pytest.mark.slow
def test_thread_count_is_recorded(sweep_jobs2):
    # CPU kernels round differently at another thread count, so a CPU run computes at its config's `threads`
    # (default 1) whatever the worker's own count, and records it.
    for p in sweep_jobs2["manifest"]["path"]:
        assert load_run(sweep_jobs2["out"] / p).marker["derived"]["torch_threads"] == TrainConfig().threads == 1


def test_step0_embeddings_reused_within_a_process_are_the_same_bytes(tmp_path):
    # two runs that differ in the head seed share step 0 (the pretrained body): the second takes it from the cache
    import embvar_study.train as train_mod
    a, b = {**TINY, "max_steps": 1, "init_seed": 1}, {**TINY, "max_steps": 1, "init_seed": 2}
    with torch_threads(1):
        train_mod.STEP0_CACHE.clear(); train_run(a, tmp_path / "a")
        assert len(train_mod.STEP0_CACHE) == 1
        train_run(b, tmp_path / "b")                               # cache hit
        train_mod.STEP0_CACHE.clear(); train_run(b, tmp_path / "b_fresh")
    step0 = lambda d: {k: v for k, v in embedding_digests(d).items() if k.startswith("step_000000")}
    assert step0(tmp_path / "b") == step0(tmp_path / "b_fresh") == step0(tmp_path / "a")


# ---------------------------------------------------------------------------------------------------------------
# Whole studies

def test_plan_dedups_shared_points_across_experiments():
    prof = get_profile("smoke")
    plan = plan_study(prof)
    default = [e for e in EXPERIMENT_NAMES if e not in ("stability", "mitigations")]   # seed_sources too (the report has its section); mitigations: 40 runs, asked for by name
    assert list(dict.fromkeys(plan["experiment"])) == PROFILES["smoke"]["experiments"] == default
    configs = {json.dumps(c, sort_keys=True) for c in plan["config"]}
    assert plan["run_id"].nunique() == len(configs)
    lin = plan[(plan.experiment == "schedule") & (plan.schedule == "linear")]
    assert set(lin["run_id"]) <= set(plan[plan.experiment == "lr_sweep"]["run_id"])   # linear points are the lr sweep's runs


@pytest.mark.slow
def test_run_study_writes_the_resolved_profile_and_refuses_another_profile(tmp_path):
    over = {"lrs": [5e-4], "seeds": [0], "schedules": ["linear", "constant"], "schedule_seeds": [0], **{k: v for k, v in TINY.items() if k != "model"}}
    ms = run_study("smoke", tmp_path / "s", overrides=json.dumps(over), experiments=["lr_sweep", "schedule"], say=None)
    assert list(ms) == ["lr_sweep", "schedule"]
    st = load_study(tmp_path / "s")
    assert st.profile == "smoke" and st.spec["overrides"] == over and st.spec["experiments"] == ["lr_sweep", "schedule"]
    assert st.spec["resolved"]["schedules"] == ["linear", "constant"] and st.grid("lrs") == [5e-4]
    assert len(st.runs("schedule")) == 2 and set(st.runs("schedule").table["schedule"]) == {"linear", "constant"}
    with pytest.raises(ValueError, match="holds a study of profile 'smoke', not 'quick'"):
        run_study("quick", tmp_path / "s", say=None)


def test_reviews_profile_needs_a_dataset():
    with pytest.raises(ValueError, match=r"dataset: the reviews profile needs a dataset: --set dataset=PATH"):
        get_profile("reviews")
    prof = get_profile("reviews", {"dataset": "bundled"})
    assert prof["base"]["probes"] == "heldout" and prof["base"]["max_length"] == 256


@pytest.mark.parametrize("name", ["quick", "reviews"])
def test_seed_sources_varies_one_source_at_a_time_then_all(name):
    "Each of the four seeds alone from the common base, then all four: every arm has >= 3 distinct runs (every interval exists)."
    from embvar_study.sweep import SEED_SOURCES
    from embvar_study.replicates import REPLICATE_MIN_RUNS
    prof = get_profile(name, {"dataset": "bundled"} if PROFILES[name]["base"].get("dataset") is None else None)
    grid = experiment_grid(prof, "seed_sources")
    s0, fields = prof["seeds"][0], set(TrainConfig.__dataclass_fields__)
    seeds = lambda p: TrainConfig.from_dict({**prof["base"], **{k: v for k, v in p.items() if k in fields}}).seeds()
    base = {k: s0 for k in ("init_seed", "data_seed", "dropout_seed", "order_seed", "subset_seed")}
    assert {p["factor"] for p in grid} == {*SEED_SOURCES, "all"}
    for src in SEED_SOURCES:
        arm = [seeds(p) for p in grid if p["factor"] == src]
        assert [a[src] for a in arm] == prof["source_seeds"] and len(arm) >= REPLICATE_MIN_RUNS
        for a in arm:   # only `src` moves away from the base (data_seed is the shorthand: it follows order and subset)
            assert {k: v for k, v in a.items() if k not in (src, "data_seed")} == {k: v for k, v in base.items() if k not in (src, "data_seed")}
    for p in (p for p in grid if p["factor"] == "all"):
        assert set(seeds(p).values()) == {p["seed"]}
    ids = run_ids(prof["base"], grid)
    assert len(set(ids)) == 1 + (len(SEED_SOURCES) + 1) * (len(prof["source_seeds"]) - 1)   # the base run shared by every arm


@pytest.mark.parametrize("name, new_runs", [("quick", 6), ("smoke", 8)])
def test_seed_sources_is_a_default_experiment_and_adds_its_runs(name, new_runs):
    "quick and smoke run seed_sources by default; it adds the runs no other experiment holds (quick: 6, counted by hand: the order, subset and dropout seeds 1 and 2)."
    prof = get_profile(name)
    assert "seed_sources" in prof["experiments"]
    without = plan_study(prof, [e for e in prof["experiments"] if e != "seed_sources"])
    assert plan_study(prof)["run_id"].nunique() - without["run_id"].nunique() == new_runs
