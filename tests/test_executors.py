"""The local executor: device placement on fake GPUs, warm workers, a worker that dies mid-run, and no orphans
after the parent is SIGKILLed."""
import os, signal, subprocess, sys, textwrap, time
from pathlib import Path

import pytest

from embvar_study.executors import LocalExecutor, auto_runs_per_gpu, plan_workers, worker_env

FAKE_GPUS = [{"index": 0, "total_memory": 80e9}, {"index": 1, "total_memory": 80e9}]


def where(config, run_dir, *, threads):
    "A task target that reports the pinning its worker sees."
    if config.get("die"): os._exit(9)
    if config.get("sleep"): time.sleep(config["sleep"])
    return {"status": "completed", "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"), "omp": os.environ.get("OMP_NUM_THREADS"),
            "threads": threads, "pid": os.getpid(), "peak_memory": config.get("peak")}


def run_all(executor, tasks):
    got = {}
    executor.run(tasks, lambda k, r: got.update({k: r}))
    return got


def test_plan_spreads_runs_over_every_gpu_round_robin():
    plan = plan_workers(1, FAKE_GPUS, runs_per_gpu=2, cpu_count=16)
    assert [w["device"] for w in plan] == ["cuda:0", "cuda:1", "cuda:0", "cuda:1"]
    assert all(w["threads"] == 4 for w in plan)
    assert plan_workers(3, [], cpu_count=2) == [{"device": "cpu", "threads": 1}] * 3


def test_workers_are_pinned_to_their_gpu_and_stay_warm():
    got = run_all(LocalExecutor(gpus=FAKE_GPUS, runs_per_gpu=2, cpu_count=8, target=where), [(i, {}, "") for i in range(8)])
    assert sorted(got) == list(range(8))
    assert {r["cuda"] for r in got.values()} == {"0", "1"}
    assert {(r["omp"], r["threads"]) for r in got.values()} == {("2", 2)}
    assert len({r["pid"] for r in got.values()}) == 4          # 4 warm workers served 8 tasks


def test_cpu_workers_see_no_gpu():
    got = run_all(LocalExecutor(2, gpus=[], cpu_count=2, target=where), [(i, {}, "") for i in range(3)])
    assert {r["cuda"] for r in got.values()} == {""} and {r["threads"] for r in got.values()} == {1}


def test_auto_runs_per_gpu_grows_after_the_first_peak():
    ex = LocalExecutor(gpus=FAKE_GPUS[:1], runs_per_gpu="auto", cpu_count=8, target=where)
    assert len(ex.plan) == 1
    got = run_all(ex, [(i, {"peak": 25e9, "sleep": 0.3}, "") for i in range(6)])
    assert len({r["pid"] for r in got.values()}) == auto_runs_per_gpu(80e9, 25e9) == 2


def test_a_worker_that_dies_fails_only_its_own_run():
    got = run_all(LocalExecutor(2, gpus=[], cpu_count=2, target=where), [(0, {}, ""), (1, {"die": True}, ""), (2, {}, ""), (3, {}, "")])
    assert got[1]["status"] == "failed" and "exited with code 9" in got[1]["error"]
    assert all(got[k]["status"] == "completed" for k in (0, 2, 3))


def test_worker_env_pins_threads_and_device():
    assert worker_env({"device": "cuda:1", "threads": 3}) == {"OMP_NUM_THREADS": "3", "MKL_NUM_THREADS": "3", "CUDA_VISIBLE_DEVICES": "1"}


def _alive(pid: int) -> bool:
    try: os.kill(pid, 0)
    except ProcessLookupError: return False
    # a zombie is dead for our purpose
    try: return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split()[0] != "Z"
    except (OSError, IndexError): return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_sigkill_of_the_parent_ends_workers_and_resource_tracker(tmp_path):
    script = tmp_path / "parent.py"
    script.write_text(textwrap.dedent(f"""
        import sys; sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_executors import where
        from embvar_study.executors import LocalExecutor
        if __name__ == "__main__":
            LocalExecutor(2, gpus=[], cpu_count=2, target=where).run([(i, {{"sleep": 60}}, "") for i in range(2)], print)
    """))
    parent = subprocess.Popen([sys.executable, str(script)], env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        deadline = time.monotonic() + 60
        while True:   # the parent's children: two workers and multiprocessing's resource tracker
            kids = [int(p) for p in Path(f"/proc/{parent.pid}/task/{parent.pid}/children").read_text().split()]
            if len(kids) >= 3 or time.monotonic() > deadline: break
            time.sleep(0.1)
        assert len(kids) >= 3, kids
        time.sleep(1.0)                                  # workers are in their tasks
        os.kill(parent.pid, signal.SIGKILL); parent.wait()
        deadline = time.monotonic() + 10
        while any(_alive(k) for k in kids) and time.monotonic() < deadline: time.sleep(0.1)
        assert not [k for k in kids if _alive(k)], "orphans left after the parent was killed"
    finally:
        if parent.poll() is None: parent.kill()


def locker(config, run_dir, *, threads):
    "A task target that holds the writer lock of `run_dir` while it sleeps (as a run does while it trains)."
    from embvar_study.storage import FolderLock
    if not run_dir: time.sleep(config["sleep"]); return {"status": "completed"}
    with FolderLock(run_dir): time.sleep(config["sleep"])
    return {"status": "completed"}


def test_an_interrupted_study_releases_its_workers_locks(tmp_path):
    "Interrupted (SIGTERM or Ctrl-C in the parent) while a worker holds a run's lock: the worker unwinds, no stale .lock.json."
    from embvar_study.storage import lock_files, lock_holder
    run = tmp_path / "runs" / "r1"
    def stop(key, res):
        assert lock_holder(run) is not None                             # the other worker is inside its run, holding the lock
        raise KeyboardInterrupt                                         # what SIGTERM (via the CLI) or Ctrl-C raises here
    with pytest.raises(KeyboardInterrupt):
        LocalExecutor(2, gpus=[], cpu_count=2, target=locker).run([("quick", {"sleep": 4}, ""), ("held", {"sleep": 120}, str(run))], stop)
    assert lock_holder(run) is None and not lock_files(run)[1].exists()
