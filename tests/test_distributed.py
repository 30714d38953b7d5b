"""Tracking under `torchrun --nproc_per_node 2` (CPU, gloo): one run folder written once by rank 0, step-0 embeddings
equal to a single-process run's, the alarm stopping every rank, a rank-0 error ending every rank (no hang: each launch
is bounded by a subprocess timeout), and FSDP (every rank joins the probe forward pass)."""
import contextlib, json, os, subprocess, sys, tempfile
from pathlib import Path

import numpy as np
import psutil
import pytest

from embvar_study.runs import load_run

HERE = Path(__file__).resolve().parent
WORKER = HERE / "distributed_worker.py"
LIMIT = 240   # seconds per launch: a hang fails the test (this bounds it; it does not measure speed)


def launch(out: Path, *args, nproc: int | None = 2) -> tuple[int, list[dict], str]:
    "Run the worker under torchrun with `nproc` processes (None: plain python, one process); exit code, RESULT lines, output."
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(HERE.parent), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    pre = [sys.executable] if nproc is None else [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                                  "--nproc_per_node", str(nproc)]
    # The output goes to a file, not a pipe: torchrun starts each worker in its own session, so a worker that outlives
    # torchrun would hold a pipe open and block the read forever (a CI run stalled so for an hour).
    log = Path(tempfile.mkstemp(prefix="torchrun-", suffix=".log")[1])
    with open(log, "w") as f:
        p = subprocess.Popen(pre + [str(WORKER), str(out), *args], stdout=f, stderr=subprocess.STDOUT, text=True, env=env)
        try: p.wait(timeout=LIMIT)
        except subprocess.TimeoutExpired:
            procs = [psutil.Process(p.pid), *psutil.Process(p.pid).children(recursive=True)]
            for q in procs:                           # torchrun and every worker, whatever its session
                with contextlib.suppress(psutil.NoSuchProcess): q.kill()
            psutil.wait_procs(procs, timeout=30)
            pytest.fail(f"hang: no exit within {LIMIT}s\n{log.read_text()[-6000:]}")
    stdout = log.read_text(); log.unlink()
    results = [json.loads(l.split("RESULT ", 1)[1]) for l in stdout.splitlines() if l.startswith("RESULT ")]
    return p.returncode, sorted(results, key=lambda r: r["rank"]), stdout


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    out = tmp_path_factory.mktemp("single")
    rc, res, text = launch(out, nproc=None)
    assert rc == 0, text[-3000:]
    return load_run(out / "run")


def step0(run):
    return {p: run.embeddings(pooling=p)[0] for p in run.poolings}


def test_ddp_trainer_writes_one_folder_once_with_the_single_process_step0(tmp_path, single):
    rc, res, text = launch(tmp_path)
    assert rc == 0, text[-3000:]
    assert [(r["rank"], r["world"], r["global_step"]) for r in res] == [(0, 2, 4), (1, 2, 4)]
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == ["run", "trainer"]   # one run folder
    run = load_run(tmp_path / "run")
    assert run.status == "completed" and run.steps.tolist() == [0, 2, 4]
    assert run.config["distributed"] == {"world_size": 2, "sharded": False}
    assert "FolderLockedError" not in text
    for p, a in step0(single).items(): np.testing.assert_array_equal(step0(run)[p], a)   # identical bytes at step 0
    assert run.history["step"].is_unique                                            # rows written once, by rank 0


def test_the_alarm_stops_every_rank(tmp_path):
    rc, res, text = launch(tmp_path, "--loop", "plain", "--alarm", "1e-6", "--stop", "--lr", "0.5")
    assert rc == 0, text[-3000:]
    assert [(r["global_step"], r["alarm_fired"]) for r in res] == [(2, True), (2, True)]   # both ranks stop at step 2
    run = load_run(tmp_path / "run")
    assert run.status == "stopped_by_alarm" and run.steps.tolist() == [0, 2]


def test_plain_loop_with_a_ddp_model_matches_one_process(tmp_path):
    rc, res, text = launch(tmp_path / "two", "--loop", "plain")
    assert rc == 0, text[-3000:]
    rc1, _, text1 = launch(tmp_path / "one", "--loop", "plain", nproc=None)
    assert rc1 == 0, text1[-3000:]
    a, b = load_run(tmp_path / "two" / "run"), load_run(tmp_path / "one" / "run")
    np.testing.assert_array_equal(step0(a)["mean"], step0(b)["mean"])
    assert a.steps.tolist() == [0, 2, 4]


def test_a_rank0_refusal_ends_every_rank(tmp_path):
    "A refused folder (another run's complete folder) raises on rank 0 and, by the broadcast, on rank 1: both exit, no hang."
    rc, _, text = launch(tmp_path, "--loop", "plain")
    assert rc == 0, text[-3000:]
    rc, res, text = launch(tmp_path, "--loop", "plain", "--lr", "0.25")    # another configuration, same folder
    assert rc != 0 and res == []
    assert "rank 0 (the writer)" in text                                   # rank 1's error names rank 0's


def test_an_error_on_another_rank_ends_every_rank(tmp_path):
    "Rank 1's tracker fails at step 2: rank 0 learns it in the same agreement (one exchange per tracked step) and raises too."
    rc, res, text = launch(tmp_path, "--loop", "plain", "--fail-rank", "1")
    assert rc != 0 and res == []                                           # no rank finished the loop
    assert "RuntimeError: rank 1: RuntimeError: injected failure on rank 1 at step 2" in text   # rank 0's error names rank 1's
    assert not (tmp_path / "run" / "COMPLETE").exists()                    # rank 0 abandoned the folder


def test_fsdp_every_rank_joins_and_rank0_writes(tmp_path):
    "FSDP2 (fully_shard per block and at the root, CPU gloo): every rank runs the probe forward (a collective), rank 0 writes."
    rc, res, text = launch(tmp_path / "two", "--loop", "plain", "--fsdp")
    assert rc == 0, text[-3000:]
    assert [r["global_step"] for r in res] == [4, 4]
    run = load_run(tmp_path / "two" / "run")
    assert run.config["distributed"] == {"world_size": 2, "sharded": True} and run.steps.tolist() == [0, 2, 4]
    rc1, _, text1 = launch(tmp_path / "one", "--loop", "plain", nproc=None)
    assert rc1 == 0, text1[-3000:]
    np.testing.assert_allclose(step0(run)["mean"], step0(load_run(tmp_path / "one" / "run"))["mean"], rtol=0, atol=1e-6)
