"""Shared fixtures (see tests/README.md): offline environment, a tiny seconds-long run config, and one synthetic study
built once per session."""
import hashlib
import os
from pathlib import Path

# Set before transformers / huggingface_hub are imported by any test module: no network, headless plots.
for _var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"): os.environ[_var] = "1"
os.environ.setdefault("MPLBACKEND", "Agg")
# One intra-op thread (inherited by subprocesses, papermill kernels and sweep workers): the tiny models are 10x faster
# than with threads contending for a loaded machine's cores, and every process computes with the same thread count
# (CPU results differ in the last bits between thread counts, see test_sweep.py).
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest
import torch

torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

HANG_LIMIT = 1200   # seconds: a test still running then is ended with an error, so one hang cannot use up CI's 90 minutes


@pytest.fixture(autouse=True)
def _no_endless_test(request):
    "A hang guard, not a speed assertion: SIGALRM after HANG_LIMIT s raises in the test (faulthandler_timeout has dumped the stacks first)."
    import signal, threading
    if not hasattr(signal, "SIGALRM") or threading.current_thread() is not threading.main_thread():
        yield; return
    def hung(signum, frame): raise TimeoutError(f"{request.node.nodeid}: still running after {HANG_LIMIT} s (a hang)")
    old = signal.signal(signal.SIGALRM, hung); signal.alarm(HANG_LIMIT)
    try: yield
    finally: signal.alarm(0); signal.signal(signal.SIGALRM, old)

# A run of the tiny random DistilBERT on the bundled corpus: 4 optimizer steps, tracked at 0, 2, 4 (~1-3 s on CPU).
TINY = dict(model="tiny-distilbert", dataset="bundled", n_train=32, n_eval=16, batch_size=8, max_length=32,
            probe_max_length=32, n_probes=24, track_every=2)


# The sizes of TINY, for a whole study of a profile at the tiny run's size (`get_profile(name, TINY_SIZES)`, or
# `embvar report ... *set_args(TINY_SIZES)`).
TINY_SIZES = {k: TINY[k] for k in ("n_train", "n_eval", "max_length", "probe_max_length", "n_probes")}


def set_args(overrides: dict) -> list:
    "`embvar report --set` flags for a dict of profile keys: {'n_train': 32} -> ['--set', 'n_train=32']."
    return [a for k, v in overrides.items() for a in ("--set", f"{k}={v}")]


@pytest.fixture
def tiny_config() -> dict:
    "A fresh copy of the tiny run config (a dict of TrainConfig fields)."
    return dict(TINY)


@pytest.fixture(scope="session")
def shared_study_dir(tmp_path_factory) -> Path:
    """One synthetic study folder (`synthetic_study` with its defaults), built once per session for the tests that only
    read it. Never write into it: build your own (`synthetic_study(tmp_path / ...)`) to damage or extend a study."""
    from embvar_study.synthetic import synthetic_study
    return synthetic_study(tmp_path_factory.mktemp("shared") / "study")


@pytest.fixture(scope="session")
def shared_study(shared_study_dir):
    "`shared_study_dir` loaded (`load_study`), once per session."
    from embvar_study.study import load_study
    return load_study(shared_study_dir)


def sha256(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def embedding_digests(run_dir) -> dict:
    "{file name: sha256} of every embeddings/*.npy of a run folder."
    return {p.name: sha256(p) for p in sorted((Path(run_dir) / "embeddings").glob("step_*.npy"))}


def folder_state(folder) -> dict:
    "{relative path: (bytes, mtime_ns)} of every file under `folder`: detects any rewrite, even with equal bytes."
    folder = Path(folder)
    return {p.relative_to(folder).as_posix(): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


def cli_args(config: dict) -> list:
    "`embvar train` flags for a dict of TrainConfig fields."
    out = []
    for k, v in config.items():
        flag = "--" + k.replace("_", "-")
        out += [flag, *map(str, v)] if isinstance(v, (list, tuple)) else [flag, str(v)]
    return out


def kill_when_ready(proc, ready, what: str, timeout: float = 180, poll: float = 0.02):
    "Wait until `ready()` is true, then SIGKILL `proc` (a Popen with stderr=PIPE); fail if it exits first or stalls."
    import os, signal, time
    import pytest
    try:
        deadline = time.monotonic() + timeout
        while not ready():
            if proc.poll() is not None:
                pytest.fail(f"{what} exited ({proc.returncode}) before it was killed: {proc.stderr.read().decode()[-2000:]}")
            assert time.monotonic() < deadline, f"{what} made no progress in time"
            time.sleep(poll)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None: proc.kill(); proc.wait()
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL

# a tiny labelled corpus and probe set for Trainer and tracker tests (tests/test_tracking.py, tests/test_live.py)
TEXTS = ["a good film", "a bad film", "great acting", "dull plot", "loved it", "hated it", "fine work", "poor script"] * 2
LABELS = [1, 0, 1, 0, 1, 0, 1, 0] * 2
PROBES = ["the movie was wonderful", "the movie was terrible", "an average evening", "the plot made no sense",
          "the cast did well", "i would not watch it again"]
