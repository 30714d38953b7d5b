"""Two writers at once, repeated: two `embvar train` of the same run into the same folder, and two `embvar report` into
the same study folder, started about 0.2 s apart. Every trial must leave a folder that verifies; the second writer
either stops with one line naming the first (exit 2) or finds the work complete; nobody prints "completed" for a
folder that does not verify, and nobody deletes a live writer's files."""
import os, subprocess, sys, time

import pytest

from conftest import TINY, cli_args
from embvar_study.runs import load_run, verify_run
from embvar_study.study import check_study, load_study

TRIALS = 10


def start(args: list[str]) -> subprocess.Popen:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.Popen([sys.executable, "-c", "from embvar_study.cli import main; main()", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(p: subprocess.Popen, timeout: float = 600) -> tuple[int, str, str]:
    out, err = p.communicate(timeout=timeout)
    return p.returncode, out, err


def check_pair(a, b, busy_word: str):
    "One writer succeeded; the other succeeded too (found it complete) or stopped with one line naming the holder."
    results = [a, b]
    assert any(code == 0 for code, _, _ in results), results
    for code, out, err in results:
        assert "Traceback" not in err, err[-2000:]
        if code != 0:
            lines = [l for l in err.strip().splitlines() if l.strip()]
            assert code == 2 and len(lines) == 1 and busy_word in lines[0] and "is being written by pid" in lines[0], err[-1500:]


@pytest.mark.parametrize("trial", range(TRIALS))
def test_two_embvar_train_into_one_folder(tmp_path, trial):
    cfg = {**TINY, "max_steps": 6, "track_every": 1, "seed": trial}
    args = ["train", *cli_args(cfg), "--out", str(tmp_path / "run"), "--no-progress"]
    first = start(args); time.sleep(0.2); second = start(args)
    a, b = finish(first), finish(second)
    check_pair(a, b, "run folder")
    run = load_run(tmp_path / "run")                     # complete, every checksum verified
    assert run.status == "completed" and list(run.steps) == list(range(7))
    for code, out, _ in (a, b):
        if "completed" in out: assert "-> " in out and run.config_hash in out


STUDY = ["--profile", "smoke", "--experiments", "lr_sweep", "--set", "seeds=[0]", "--set", "n_train=32", "--set", "n_eval=16",
         "--set", "max_length=32", "--set", "probe_max_length=32", "--set", "n_probes=24"]


@pytest.mark.parametrize("trial", range(TRIALS))
@pytest.mark.slow
def test_two_embvar_report_into_one_study(tmp_path, trial):
    out = tmp_path / "study"
    args = ["report", *STUDY, "--set", f"probe_seed={trial}", "--out", str(out)]
    first = start(args); time.sleep(0.2); second = start(args)
    a, b = finish(first), finish(second)
    check_pair(a, b, "study folder")
    assert check_study(out) == []                          # every run the manifests name verifies
    st = load_study(out)
    assert len(st.runs("lr_sweep")) == 2 and (out / "report.html").is_file()
    for r in st.runs("lr_sweep").runs: verify_run(r.path, full=True)
