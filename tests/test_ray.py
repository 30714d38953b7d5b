"""The Ray executor end to end, on a local Ray cluster started inside the test (`ray.init(num_cpus=2)`, this machine
only): the smoke learning-rate grid through Ray gives complete run folders whose embeddings are byte-identical to
the local executor's; a worker killed in the middle of a run is retried and the sweep completes with no corrupt
run folder; a second driver connects by address and leaves the cluster up; a drift alarm ends a diverging run
early (a sweep with `alarm`, and a Ray Tune trial through `report_to_tune`); and bad input (no Ray, an unreachable
address, an output folder a node cannot see, more GPUs / CPUs per run than any node has) fails before any run
starts. One cluster serves the whole module (Ray takes 10-30 s to start on a loaded machine)."""
import contextlib
import io
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

ray = pytest.importorskip("ray")

from conftest import TINY_SIZES, embedding_digests, folder_state
from embvar_study import analysis, ray_executor
from embvar_study.metrics import drift_curve
from embvar_study.ray_executor import ClusterError, RayUnavailableError, cluster_nodes
from embvar_study.runs import is_complete, load_run
from embvar_study.study_folder import load_manifest
from embvar_study.sweep import EXPERIMENT_NAMES, experiment_grid, get_profile, run_sweep

pytestmark = [pytest.mark.filterwarnings("ignore:.*truncated to max_length"),
              pytest.mark.filterwarnings("ignore:.*NumPy array is not writable")]

# the smoke profile's lr_sweep grid (2 learning rates x 2 seeds), with smaller data and probes for speed
SHRINK = TINY_SIZES   # the tiny run's size (conftest.py)
PROFILE = get_profile("smoke", SHRINK)
BASE, POINTS = PROFILE["base"], experiment_grid(PROFILE, "lr_sweep")
# longer runs (about a second or more each) for the kill test
KILL_BASE = {**BASE, "max_steps": 30, "track_every": 1}
KILL_POINTS = [{"lr": 5e-5, "seed": 0}, {"lr": 5e-4, "seed": 0}]


def env() -> dict:
    "The environment for a subprocess, taken now: ray.init sets RAY_AUTH_MODE=token for the local cluster it starts."
    return {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}


@pytest.fixture(scope="module")
def cluster():
    "A local 2-CPU Ray cluster for the module; run_sweep finds Ray initialised and uses it (and leaves it up)."
    if ray.is_initialized(): ray.shutdown()
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


@pytest.fixture(scope="module")
def local_sweep(tmp_path_factory):
    "The reference: the same grid with the local executor, in this process (one torch thread, see conftest)."
    out = tmp_path_factory.mktemp("local")
    return {"out": out, "manifest": run_sweep("lr_sweep", BASE, POINTS, out, say=None)}


@pytest.fixture(scope="module")
def ray_sweep(cluster, tmp_path_factory):
    out = tmp_path_factory.mktemp("ray")
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        m = run_sweep("lr_sweep", BASE, POINTS, out, executor="ray", ray_options={"num_cpus_per_run": 1})
    return {"out": out, "manifest": m, "stdout": buf.getvalue()}


# ---------------------------------------------------------------------------------------------------------------
# Same runs, same numbers

@pytest.mark.slow
def test_ray_sweep_completes_every_run(ray_sweep):
    out, m = ray_sweep["out"], ray_sweep["manifest"]
    assert list(m["status"]) == ["completed"] * len(POINTS) and (m["error"] == "").all()
    assert (m["node"] == socket.gethostname()).all()
    for p in m["path"]:
        run = load_run(out / p, verify=True)                      # every file present and matching its checksum
        assert run.status == "completed" and not list((out / p).rglob(".*.tmp"))
    assert sorted(q.name for q in (out / "runs").iterdir() if not q.name.startswith(".")) == sorted(m["run_id"])   # (hidden: locks)
    assert not list(out.glob(".embvar-shared-check-*"))            # the shared-folder probe cleaned up
    on_disk = load_manifest(out, "lr_sweep")
    assert list(on_disk["run_id"]) == list(m["run_id"]) and list(on_disk["status"]) == list(m["status"])


@pytest.mark.slow
def test_ray_sweep_prints_progress_as_runs_complete(ray_sweep):
    text = ray_sweep["stdout"]
    assert "[ray] using the Ray cluster this process is already connected to" in text
    assert "[ray] cluster: 1 node(s), 2 CPUs, 0 GPUs; each run: 1 CPU(s), 0 GPU(s)" in text
    assert f"{len(POINTS)} grid points, {len(POINTS)} distinct runs: 0 complete, {len(POINTS)} to run" in text
    for k in range(1, len(POINTS) + 1): assert f"[{k}/{len(POINTS)}] lr_sweep lr=" in text
    for rid in ray_sweep["manifest"]["run_id"]: assert f"({rid}) -> completed" in text
    assert text.count(f"on {socket.gethostname()})") == len(POINTS)


@pytest.mark.slow
def test_ray_runs_equal_local_runs(local_sweep, ray_sweep):
    ml, mr = local_sweep["manifest"], ray_sweep["manifest"]
    assert list(ml["status"]) == ["completed"] * len(POINTS)
    assert list(mr["run_id"]) == list(ml["run_id"]) and list(mr["path"]) == list(ml["path"])
    for p in ml["path"]:
        rl, rr = load_run(local_sweep["out"] / p), load_run(ray_sweep["out"] / p)
        np.testing.assert_array_equal(drift_curve(rr.embeddings()), drift_curve(rl.embeddings()))
        assert embedding_digests(rr.path) == embedding_digests(rl.path)      # byte-identical .npy files
        pd.testing.assert_frame_equal(rr.history, rl.history)


@pytest.mark.slow
def test_the_report_tables_do_not_depend_on_the_executor(local_sweep, ray_sweep):
    "What the report computes from the runs on disk (drift curves through the manifest) is the same."
    from embvar_study.study import load_study
    tl = analysis.drift_curves(load_study(local_sweep["out"]).runs("lr_sweep"))
    tr = analysis.drift_curves(load_study(ray_sweep["out"]).runs("lr_sweep"))
    assert len(tl) > len(POINTS)
    pd.testing.assert_frame_equal(tr, tl)


@pytest.mark.slow
def test_finished_runs_are_never_recomputed(ray_sweep):
    out, m = ray_sweep["out"], ray_sweep["manifest"]
    before = {p: folder_state(out / p) for p in m["path"]}
    again = run_sweep("lr_sweep", BASE, POINTS, out, executor="ray", say=None)
    assert list(again["status"]) == ["skipped"] * len(POINTS)
    assert {p: folder_state(out / p) for p in m["path"]} == before
    # a new grid sharing a point with the old one runs the new point only
    more = run_sweep("more", BASE, POINTS[:1] + [{"lr": 5e-4, "seed": 2}], out, executor="ray", say=None)
    assert list(more["status"]) == ["skipped", "completed"]
    assert folder_state(out / m["path"][0]) == before[m["path"][0]]


def test_a_run_that_fails_for_its_own_reasons_is_recorded_not_retried(cluster, tmp_path, monkeypatch):
    "Max_retries=3 restarts a run whose worker died, never one that failed for its own reasons: the task starts once."
    bad = "no-such-org/no-such-model"                # fails inside the task (offline), not at planning
    attempts = str(tmp_path / "attempts.txt")
    real = ray_executor._ray_task

    def counted(*args):                              # a closure: pickled by value, so the worker runs it
        with open(attempts, "a") as f: f.write("started\n")
        return real(*args)
    monkeypatch.setattr(ray_executor, "_ray_task", counted)
    m = run_sweep("fail", BASE, [{"lr": 5e-5, "seed": 0, "model": bad}], tmp_path / "study", executor="ray",
                  ray_options={"max_retries": 3}, say=None)
    assert list(m["status"]) == ["failed"]
    assert m["error"][0].startswith("HubUnavailableError") and bad in m["error"][0]
    assert Path(attempts).read_text().splitlines() == ["started"]   # one attempt, no retry
    assert not is_complete(tmp_path / "study" / m["path"][0])
    assert list(load_manifest(tmp_path / "study", "fail")["status"]) == ["failed"]


# ---------------------------------------------------------------------------------------------------------------
# The drift alarm ends a run early: a sweep through the executor, and a Ray Tune trial

ALARM_BASE = {**BASE, "max_steps": 8, "track_every": 1, "alarm": {"threshold": 0.05}}   # drift above 0.05 stops the run


def test_a_ray_sweep_ends_a_diverging_run_at_its_alarm(cluster, tmp_path):
    from embvar_study.findings import alarm_note
    from embvar_study.study import study_from_runs
    m = run_sweep("alarm", ALARM_BASE, [{"lr": 3.0, "seed": 0}, {"lr": 1e-6, "seed": 0}], tmp_path, executor="ray",
                  ray_options={"num_cpus_per_run": 1}, say=None)
    assert list(m["status"]) == ["stopped_by_alarm", "completed"] and (m["error"] == "").all()
    assert list(load_manifest(tmp_path, "alarm")["status"]) == ["stopped_by_alarm", "completed"]
    stopped, stable = (load_run(tmp_path / p, verify=True) for p in m["path"])
    hit = stopped.alarm
    assert stopped.status == "stopped_by_alarm" and hit["fired"] and 1 <= hit["step"] < 8      # ended early
    assert stopped.steps[-1] == hit["step"] and stopped.marker["steps_done"] == hit["step"]   # no step after the alarm's
    curve = drift_curve(stopped.embeddings(-1, "mean"))
    assert hit["value"] == pytest.approx(curve[-1], abs=1e-6) and hit["value"] > 0.05 and (curve[:-1] <= 0.05).all()
    assert stable.status == "completed" and not stable.alarm["fired"] and stable.steps[-1] == 8
    note = alarm_note(study_from_runs([stopped.path, stable.path], group_by="lr"))
    assert note.startswith("**1 run stopped by a drift alarm**") and f"at step {hit['step']}" in note


def test_a_tune_trial_ends_at_its_alarm(cluster, tmp_path):
    "Ray Tune, two trials of a plain loop tracked with the same alarm rule: the diverging one ends at its alarm."
    from ray import tune
    from embvar_study.ray_executor import alarm_stopper
    out, rule = tmp_path / "runs", {"threshold": 0.05, "start": 1}

    def trainable(config):                       # pickled by value: everything it needs is imported inside
        import torch
        from embvar_study.models import load_model_and_tokenizer
        from embvar_study.ray_executor import report_to_tune
        from embvar_study.tracking import EmbeddingTracker
        torch.set_num_threads(1)
        model, tok = load_model_and_tokenizer("tiny-distilbert", num_labels=2, init_seed=0)
        opt = torch.optim.AdamW(model.parameters(), lr=config["lr"])
        batch = tok(["a good film", "a bad film", "great acting", "dull plot"], padding=True, return_tensors="pt")
        labels = torch.tensor([1, 0, 1, 0])
        tracker = EmbeddingTracker(model, tok, ["the movie was wonderful", "the plot made no sense", "an average evening"],
                                   Path(config["out"]) / f"lr_{config['lr']:g}", every=1, alarm=config["rule"])
        model.train()
        for step in range(9):
            loss = None
            if step:
                loss = model(**batch, labels=labels).loss
                loss.backward(); opt.step(); opt.zero_grad()
            if report_to_tune(tracker, step, loss=loss.item() if loss is not None else 0.0): return
        tracker.close()

    grid = tune.Tuner(tune.with_resources(trainable, {"cpu": 1}),
                      param_space={"lr": tune.grid_search([3.0, 1e-6]), "out": str(out), "rule": rule},
                      run_config=tune.RunConfig(storage_path=str(tmp_path / "tune"), stop=alarm_stopper(), verbose=0)).fit()
    assert not grid.errors, grid.errors
    res = {r.config["lr"]: r for r in grid}
    hist = {lr: r.metrics_dataframe.sort_values("step") for lr, r in res.items()}
    stopped, stable = load_run(out / "lr_3", verify=True), load_run(out / "lr_1e-06", verify=True)
    assert stopped.status == "stopped_by_alarm" and 1 <= stopped.alarm["step"] < 8 and stopped.steps[-1] == stopped.alarm["step"]
    assert hist[3.0]["step"].tolist() == stopped.steps.tolist()              # the trial reported nothing after its alarm
    assert hist[3.0]["embvar/alarm"].tolist() == [0.0] * (len(stopped.steps) - 1) + [1.0]
    assert stable.status == "completed" and stable.steps.tolist() == list(range(9)) and not stable.alarm["fired"]
    assert hist[1e-6]["step"].tolist() == list(range(9)) and (hist[1e-6]["embvar/alarm"] == 0).all()
    for lr, run in ((3.0, stopped), (1e-6, stable)):     # what Tune received is the drift of the run folder
        np.testing.assert_allclose(hist[lr]["embvar/drift"], drift_curve(run.embeddings(-1, "mean")), atol=1e-6, rtol=0)


# ---------------------------------------------------------------------------------------------------------------
# Fault tolerance: kill the worker process in the middle of a run

def _raylet_pid():
    try: return ray._private.worker._global_node.all_processes["raylet"][0].process.pid
    except Exception: return None


def _worker_pid(run_id: str):
    "The pid of this cluster's worker whose process title says it runs `run_id` (`ray::embvar:<run_id>`)."
    raylet = _raylet_pid()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit(): continue
        try:
            title = (d / "cmdline").read_bytes().split(b"\0")[0].strip()
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError): continue
        if title == f"ray::embvar:{run_id}".encode() and (raylet is None or ppid == raylet):
            return int(d.name)
    return None


def _saved_steps(run_dir: Path) -> set:
    d = run_dir / "embeddings"
    return {f.name.split(".")[0] for f in d.glob("step_*.npy")} if d.is_dir() else set()


def _pid_alive(pid: int) -> bool:
    try: return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError): return False


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the worker process through /proc")
def test_a_killed_worker_is_retried_and_leaves_no_corrupt_run(cluster, tmp_path):
    ref = run_sweep("kill", KILL_BASE, KILL_POINTS, tmp_path / "local", say=None)   # the local reference
    out = tmp_path / "ray"; runs = out / "runs"
    result = {}
    def sweep():
        try: result["manifest"] = run_sweep("kill", KILL_BASE, KILL_POINTS, out, executor="ray", ray_options={"max_retries": 2}, say=None)
        except BaseException as e: result["error"] = e
    th = threading.Thread(target=sweep, daemon=True); th.start()
    killed, deadline = None, time.monotonic() + 150
    while killed is None and th.is_alive():
        assert time.monotonic() < deadline, "no run was caught in the middle of training"
        for p in (runs.iterdir() if runs.exists() else []):
            if p.name.startswith("."): continue                    # a run's hidden lock files
            if is_complete(p) or len(_saved_steps(p)) < 2: continue
            pid = _worker_pid(p.name)
            if pid is None: continue
            os.kill(pid, signal.SIGKILL)
            while _pid_alive(pid): time.sleep(0.005)
            if not is_complete(p):  # it died in the middle of the run (not just after finishing it)
                killed = (p.name, pid, len(_saved_steps(p)))
            break
        time.sleep(0.005)
    th.join(timeout=300)
    assert not th.is_alive(), "the sweep did not finish after the kill"
    assert "error" not in result, result.get("error")
    assert killed is not None, "both runs finished before a worker could be killed mid-run"
    rid, pid, n_saved = killed
    assert 2 <= n_saved < 31                                   # killed after some tracked steps, before the last one
    m = result["manifest"]
    assert list(m["status"]) == ["completed", "completed"] and (m["error"] == "").all()   # retried by Ray, not failed
    for p in m["path"]:
        run = load_run(out / p, verify=True)                   # complete, every checksum matches
        assert not list((out / p).rglob(".*.tmp"))             # no half-written file of the killed attempt left
        np.testing.assert_array_equal(run.steps, np.arange(31))
        assert embedding_digests(out / p) == embedding_digests(tmp_path / "local" / p)
    assert rid in set(m["run_id"]) and list(m["run_id"]) == list(ref["run_id"])


# ---------------------------------------------------------------------------------------------------------------
# Connecting by address

DRIVER = ("import json, sys; from embvar_study.sweep import run_sweep; "
          "m = run_sweep('second', json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3], executor='ray', ray_options={'address': sys.argv[4]}); "
          "print('STATUS', list(m['status']))")


@pytest.mark.slow
def test_a_second_driver_connects_by_address_and_leaves_the_cluster_up(cluster, local_sweep, tmp_path):
    point = POINTS[-1]
    r = subprocess.run([sys.executable, "-c", DRIVER, json.dumps(BASE), json.dumps([point]), str(tmp_path), cluster],
                       env=env(), capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"[ray] connected to the Ray cluster at {cluster} (ray_address)" in r.stdout
    assert "STATUS ['completed']" in r.stdout
    p = local_sweep["manifest"]["path"].iloc[-1]
    load_run(tmp_path / p, verify=True)
    assert embedding_digests(tmp_path / p) == embedding_digests(local_sweep["out"] / p)
    # the driver disconnected; the cluster it did not start is still up and usable
    assert ray.is_initialized() and len(cluster_nodes()) == 1
    assert ray.get(ray.remote(lambda: 7).remote(), timeout=60) == 7


# ---------------------------------------------------------------------------------------------------------------
# Bad input: a clear error before any run starts

def _nothing_ran(out: Path):
    "No manifest and no run folder were written (the checks come before run_sweep creates runs/ and sweeps/)."
    assert not (out / "sweeps").exists() and not (out / "runs").exists()


def test_more_gpus_or_cpus_per_run_than_any_node_has(cluster, tmp_path):
    with pytest.raises(ValueError, match=r"num_gpus_per_run: each run asks for 1 GPU\(s\) but no node of the cluster has more than 0") as e:
        run_sweep("gpu", BASE, POINTS, tmp_path, executor="ray", ray_options={"num_gpus_per_run": 1})
    assert socket.gethostname() in str(e.value)
    with pytest.raises(ValueError, match=r"num_gpus_per_run: each run asks for 0.5 GPU"):
        run_sweep("gpu", BASE, POINTS, tmp_path, executor="ray", ray_options={"num_gpus_per_run": 0.5})
    with pytest.raises(ValueError, match=r"num_cpus_per_run: each run asks for 3 CPUs but no node of the cluster has more than 2"):
        run_sweep("gpu", BASE, POINTS, tmp_path, executor="ray", ray_options={"num_cpus_per_run": 3})
    _nothing_ran(tmp_path)


def test_an_output_folder_a_node_cannot_see(cluster, tmp_path, monkeypatch):
    # the driver "forgets" to write the token, as if out_dir were a local disk of the driver's machine: the probe task
    # pinned to the node does not find it there
    monkeypatch.setattr(ray_executor, "_write_probe_token", lambda path, token: None)
    with pytest.raises(ClusterError, match=r"study_dir: .* must be on storage that every node of the Ray cluster sees") as e:
        run_sweep("unshared", BASE, POINTS, tmp_path, executor="ray")
    assert f"{socket.gethostname()} (" in str(e.value) and f"does not see {tmp_path}" in str(e.value)
    _nothing_ran(tmp_path)


def test_ray_not_installed(tmp_path, monkeypatch, capsys):
    from embvar_study.cli import main
    monkeypatch.setitem(sys.modules, "ray", None)              # `import ray` now raises ImportError
    with pytest.raises(RayUnavailableError, match=r'pip install "embvar-study\[ray\]"'):
        run_sweep("x", BASE, POINTS, tmp_path / "sweep", executor="ray")
    with pytest.raises(SystemExit) as ex:
        main(["report", "--profile", "smoke", "--executor", "ray", "--out", str(tmp_path / "report")])
    assert ex.value.code == 2 and 'pip install "embvar-study[ray]"' in capsys.readouterr().err
    assert not (tmp_path / "sweep" / "runs").exists() and not (tmp_path / "report" / "runs").exists()


def test_unreachable_address_fails_fast_from_the_cli(tmp_path):
    "Fast: a TCP check refuses the address before `ray.init` (which retries for minutes) is ever called; nothing runs."
    out = tmp_path / "report"
    probe = ("import atexit, ray\n"
             "calls, real = [], ray.init\n"
             "ray.init = lambda *a, **k: calls.append(k) or real(*a, **k)\n"
             "atexit.register(lambda: print('ray.init calls:', len(calls)))\n"
             "from embvar_study.cli import main; main()\n")
    r = subprocess.run([sys.executable, "-c", probe, "report", "--profile", "smoke",
                        "--executor", "ray", "--ray-address", "127.0.0.1:1", "--out", str(out)],
                       env=env(), capture_output=True, text=True, timeout=600)
    assert r.returncode == 2, (r.stdout[-2000:], r.stderr[-2000:])
    assert "embvar report: error: --ray-address: cannot reach a Ray cluster at '127.0.0.1:1'" in r.stderr
    assert "ray start --head --port=1" in r.stderr
    assert "ray.init calls: 0" in r.stdout.splitlines(), r.stdout[-500:]
    assert not (out / "runs").exists() and not (out / "sweeps").exists() and not (out / "notebooks").exists()   # nothing ran


def test_every_experiment_template_takes_the_executor_parameters():
    import nbformat, papermill as pm
    from embvar_study.report import template_for
    for name in EXPERIMENT_NAMES:
        params = pm.inspect_notebook(str(template_for(name)))
        assert {"executor", "ray_address", "gpus_per_run", "cpus_per_run", "jobs", "runs_per_gpu"} <= set(params), name
        assert params["executor"]["default"] == '"local"' and params["ray_address"]["default"] == '""', name
        src = "\n".join(c.source for c in nbformat.read(template_for(name), as_version=4).cells)
        assert "executor=executor" in src and "ray_address=ray_address, gpus_per_run=gpus_per_run, cpus_per_run=cpus_per_run" in src
