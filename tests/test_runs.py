"Tests for embvar_study.runs: run-folder round trip, identity, atomicity, crash recovery, corruption detection."
import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings, strategies as st

import embvar_study
import embvar_study.runs as runs
import embvar_study.run_writer as run_writer
import embvar_study.storage as storage
from embvar_study.runs import CorruptRunError, IncompleteRunError, Run, find_runs, is_complete, load_run, load_runs
from embvar_study.run_writer import RunAlreadyComplete, RunWriter
from embvar_study.storage import NON_IDENTITY_KEYS, FolderLockedError, atomic_save_npy, atomic_write_bytes, atomic_write_json, atomic_write_text, config_hash, environment_info

CFG = {"model": "distilbert", "lr": 1e-4, "seed": 3, "steps": [0, 5, 10], "out_dir": "/somewhere"}
PROBES = pd.DataFrame({"text": ["the cat sat", "stocks fell", "rain again", "héllo wörld"],
                       "group": ["a", "b", "c", None], "length": [3, 2, 2, 2], "score": [0.5, np.nan, 1.0, 2.5]})


def snapshot(folder: Path) -> dict:
    "Every file of a run folder except the hidden bookkeeping (lock, holder, verification cache)."
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and not p.name.startswith(".")}


def write_run(path, cfg=CFG, steps=(0, 5, 10), seed=0, dtype="float32"):
    rng = np.random.default_rng(seed)
    emb = {s: rng.normal(size=(3, len(PROBES), 6)).astype(np.float32) for s in steps}
    with RunWriter(path, cfg, PROBES) as w:
        for s in steps:
            w.save_embeddings(s, {"mean": emb[s], "max": emb[s] ** 2}, dtype=dtype)
            w.log(step=s, epoch=s // 5, train_loss=np.float32(1.0 / (s + 1)), status="ok")
        w.log(step=steps[-1], eval_loss=0.25, eval_acc=0.75)
    return emb


# ---------------------------------------------------------------- identity

def test_config_hash_identity():
    h = config_hash(CFG)
    assert len(h) == 12 and int(h, 16) >= 0
    reordered = dict(reversed(list(CFG.items())))
    assert config_hash(reordered) == h
    noise = {k: f"value-{i}" for i, k in enumerate(NON_IDENTITY_KEYS)}
    assert config_hash({**CFG, **noise}) == h
    assert config_hash({k: v for k, v in CFG.items() if k not in NON_IDENTITY_KEYS}) == h
    # independent reference: sha256 of canonical JSON
    ident = {k: v for k, v in CFG.items() if k not in NON_IDENTITY_KEYS}
    ref = hashlib.sha256(json.dumps(ident, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:12]
    assert h == ref
    assert config_hash({**CFG, "steps": (0, 5, 10), "seed": np.int64(3)}) == h
    for k, v in [("lr", 2e-4), ("seed", 4), ("steps", [0, 5]), ("model", "bert"), ("new_key", None)]:
        assert config_hash({**CFG, k: v}) != h
    with pytest.raises(ValueError, match="config"):
        config_hash({"x": object()})
    with pytest.raises(ValueError, match="config"):
        config_hash([("a", 1)])


@settings(max_examples=30, deadline=None)
@given(st.dictionaries(st.text(min_size=1, max_size=5),
                       st.one_of(st.integers(-10**6, 10**6), st.floats(-1e6, 1e6, allow_nan=False),
                                 st.text(max_size=5), st.booleans(), st.none()), max_size=6),
       st.randoms())
def test_config_hash_property(cfg, rnd):
    items = list(cfg.items()); rnd.shuffle(items)
    assert config_hash(dict(items)) == config_hash(cfg)
    ident = [k for k in cfg if k not in NON_IDENTITY_KEYS]
    if ident:
        k = rnd.choice(ident)
        assert config_hash({**cfg, k: ["changed", cfg[k]]}) != config_hash(cfg)


# ---------------------------------------------------------------- atomic writes

def test_atomic_writes_roundtrip(tmp_path):
    atomic_write_bytes(tmp_path / "b.bin", b"\x00\x01")
    atomic_write_text(tmp_path / "sub" / "t.txt", "héllo")
    atomic_write_json(tmp_path / "j.json", {"a": np.int64(2), "p": tmp_path})
    atomic_save_npy(tmp_path / "a.npy", np.eye(3, dtype=np.float16))
    assert (tmp_path / "b.bin").read_bytes() == b"\x00\x01"
    assert (tmp_path / "sub" / "t.txt").read_text(encoding="utf-8") == "héllo"
    assert json.loads((tmp_path / "j.json").read_text()) == {"a": 2, "p": str(tmp_path)}
    a = np.load(tmp_path / "a.npy")
    assert a.dtype == np.float16 and np.array_equal(a, np.eye(3))
    assert not list(tmp_path.rglob("*.tmp"))
    if os.name != "nt":                  # normal permissions, not mkstemp's 0600
        assert (tmp_path / "b.bin").stat().st_mode & 0o777 == 0o666 & ~storage._UMASK


def test_atomic_write_failure_keeps_old_file(tmp_path, monkeypatch):
    target = tmp_path / "x.json"
    atomic_write_json(target, {"v": 1})
    before = target.read_bytes()

    def boom(*a, **k): raise OSError("disk on fire")
    monkeypatch.setattr(storage.os, "replace", boom)
    with pytest.raises(OSError, match="disk on fire"):
        atomic_write_json(target, {"v": 2})
    with pytest.raises(OSError):
        atomic_save_npy(tmp_path / "x.npy", np.ones(3))
    monkeypatch.undo()
    assert target.read_bytes() == before
    assert not (tmp_path / "x.npy").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.json"]     # temp files cleaned up

    # a write that fails midway (the data producer raises after writing some bytes)
    def half(f):
        f.write(b'{"v": 3')
        raise RuntimeError("killed midway")
    with pytest.raises(RuntimeError):
        storage._atomic_write(target, half)
    assert target.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["x.json"]


def test_fsync_called(tmp_path, monkeypatch):
    calls = []
    real = os.fsync
    monkeypatch.setattr(storage.os, "fsync", lambda fd: (calls.append(fd), real(fd)))
    atomic_write_text(tmp_path / "f.txt", "x")
    assert len(calls) == (2 if os.name != "nt" else 1)       # the file and its directory


# ---------------------------------------------------------------- round trip

def test_round_trip(tmp_path):
    emb = write_run(tmp_path / "r")
    run = load_run(tmp_path / "r")
    assert isinstance(run, Run) and run.path == tmp_path / "r"
    assert run.config == CFG and run.config_hash == config_hash(CFG) and run.status == "completed"
    assert run.environment["packages"]["numpy"] == np.__version__
    assert run.steps.dtype.kind == "i" and run.steps.tolist() == [0, 5, 10]
    assert run.poolings == ["max", "mean"] and run.n_layers == 2
    pd.testing.assert_frame_equal(run.probes, PROBES)
    h = run.history
    assert list(h.columns) == ["step", "epoch", "train_loss", "status", "eval_loss", "eval_acc"]
    assert h["step"].tolist() == [0, 5, 10, 10]
    np.testing.assert_allclose(h["train_loss"].to_numpy()[:3], [1.0, 1 / 6, 1 / 11], rtol=1e-6)
    assert h["eval_acc"].isna().tolist() == [True, True, True, False]
    for layer in (0, 1, 2, -1, -3):
        np.testing.assert_array_equal(run.embeddings(layer, "mean"), np.stack([emb[s][layer] for s in (0, 5, 10)]))
    np.testing.assert_array_equal(run.embeddings(1, "max", steps=[10, 0]), np.stack([emb[10][1] ** 2, emb[0][1] ** 2]))
    all_layers = run.embeddings_all_layers("mean")
    assert all_layers.shape == (3, 3, len(PROBES), 6) and all_layers.dtype == np.float32
    np.testing.assert_array_equal(all_layers[2], emb[10])
    marker = json.loads((tmp_path / "r" / "COMPLETE").read_text())
    assert marker["steps"] == [0, 5, 10] and set(marker["files"]) == {
        "config.json", "history.csv", "probes.jsonl",
        *[f"embeddings/step_{s:06d}.{p}.npy" for s in (0, 5, 10) for p in ("mean", "max")]}
    for rel, digest in marker["files"].items():
        assert hashlib.sha256((tmp_path / "r" / rel).read_bytes()).hexdigest() == digest


def test_float16_storage(tmp_path):
    emb = write_run(tmp_path / "r", dtype="float16")
    assert np.load(tmp_path / "r" / "embeddings" / "step_000000.mean.npy").dtype == np.float16
    e = load_run(tmp_path / "r").embeddings(-1)
    assert e.dtype == np.float32
    np.testing.assert_allclose(e[0], emb[0][-1], rtol=1e-3, atol=1e-3)


def test_bad_queries_list_valid_values(tmp_path):
    write_run(tmp_path / "r")
    run = load_run(tmp_path / "r")
    with pytest.raises(ValueError, match=r"pooling: expected one of \['max', 'mean'\]"):
        run.embeddings(pooling="cls")
    with pytest.raises(ValueError, match=r"layer: expected an int in \[-3, 2\]"):
        run.embeddings(layer=3)
    with pytest.raises(ValueError, match=r"steps: \[7\] were not tracked; valid steps are \[0, 5, 10\]"):
        run.embeddings(steps=[0, 7])


def test_embeddings_are_hashed_on_first_read_then_memory_mapped(tmp_path, monkeypatch):
    emb = write_run(tmp_path / "r")
    run = load_run(tmp_path / "r")
    runs._VERIFIED.clear()                                         # as in a fresh process
    modes, real, hashed = [], np.load, []
    def spy(*a, **k):
        modes.append(k.get("mmap_mode"))
        return real(*a, **k)
    monkeypatch.setattr(runs.np, "load", spy)
    real_verify = runs._verify_file
    monkeypatch.setattr(runs, "_verify_file", lambda d, rel, *a, **k: hashed.append(rel) or real_verify(d, rel, *a, **k))
    e = run.embeddings(1, "mean")
    assert modes == [None] * 3 and not isinstance(e, np.memmap)     # parsed from the bytes that were hashed
    assert hashed == [f"embeddings/step_{s:06d}.mean.npy" for s in (0, 5, 10)]
    np.testing.assert_array_equal(e, np.stack([emb[s][1] for s in (0, 5, 10)]))
    modes.clear()
    e2 = run.embeddings(2, "mean")                                 # unchanged files: trusted in this process, memory-mapped
    assert modes == ["r"] * 3 and not isinstance(e2, np.memmap)     # a copy of one layer, not the maps
    np.testing.assert_array_equal(e2, np.stack([emb[s][2] for s in (0, 5, 10)]))


def test_writer_validation(tmp_path):
    w = RunWriter(tmp_path / "r", CFG, PROBES)
    with pytest.raises(ValueError, match=r"arrays\['mean'\]: expected N = 4"):
        w.save_embeddings(0, {"mean": np.zeros((3, 5, 6))})
    with pytest.raises(ValueError, match=r"arrays\['mean'\]: expected shape \(L\+1, N, d\)"):
        w.save_embeddings(0, {"mean": np.zeros((4, 6))})
    with pytest.raises(ValueError, match="finite"):
        w.save_embeddings(0, {"mean": np.full((3, 4, 6), np.nan)})
    with pytest.raises(ValueError, match="overflow float16"):
        w.save_embeddings(0, {"mean": np.full((3, 4, 6), 1e6)}, dtype="float16")
    with pytest.raises(ValueError, match="step"):
        w.save_embeddings(-1, {"mean": np.zeros((3, 4, 6))})
    w.save_embeddings(0, {"mean": np.ones((3, 4, 6))})
    with pytest.raises(ValueError, match="already saved"):
        w.save_embeddings(0, {"mean": np.ones((3, 4, 6))})
    with pytest.raises(ValueError, match="poolings of earlier steps"):
        w.save_embeddings(1, {"cls": np.ones((3, 4, 6))})
    with pytest.raises(ValueError, match=r"expected shape \(3, 4, 6\)"):
        w.save_embeddings(1, {"mean": np.ones((2, 4, 6))})
    with pytest.raises(ValueError, match="log: x expected a scalar"):
        w.log(step=1, x=[1, 2])
    with pytest.raises(ValueError, match="reserved"):
        RunWriter(tmp_path / "r2", {**CFG, "config_hash": "x"}, PROBES)
    with pytest.raises(ValueError, match="probes"):
        RunWriter(tmp_path / "r3", CFG, [])
    w.finish(status="diverged", final_loss=1.5)
    with pytest.raises(RuntimeError, match="finished"):
        w.log(step=2)
    run = load_run(tmp_path / "r")
    assert run.status == "diverged" and run.marker["final_loss"] == 1.5 and run.history.empty     # the rejected row was not recorded


def test_finish_without_history_or_embeddings(tmp_path):
    RunWriter(tmp_path / "r", CFG, PROBES.to_dict("records")).finish()
    run = load_run(tmp_path / "r")
    assert run.history.empty and run.steps.size == 0 and run.n_layers is None
    with pytest.raises(ValueError, match="no saved embeddings"):
        run.embeddings()


# ---------------------------------------------------------------- existing folders

def test_incomplete_raises_naming_folder(tmp_path):
    w = RunWriter(tmp_path / "run_x", CFG, PROBES)
    w.save_embeddings(0, {"mean": np.ones((3, 4, 6))})
    with pytest.raises(IncompleteRunError, match=str(tmp_path / "run_x")) as ei:
        load_run(tmp_path / "run_x")
    assert isinstance(ei.value, ValueError)
    assert not is_complete(tmp_path / "run_x")


def test_context_manager_exception_leaves_incomplete(tmp_path):
    with pytest.raises(KeyError):
        with RunWriter(tmp_path / "r", CFG, PROBES) as w:
            w.save_embeddings(0, {"mean": np.ones((3, 4, 6))})
            raise KeyError("training blew up")
    assert (tmp_path / "r" / "config.json").exists() and not is_complete(tmp_path / "r")
    with pytest.raises(IncompleteRunError):
        load_run(tmp_path / "r")


def test_corrupt_file_named(tmp_path):
    write_run(tmp_path / "r")
    f = tmp_path / "r" / "embeddings" / "step_000005.max.npy"
    data = bytearray(f.read_bytes()); data[len(data) // 2] ^= 0x10; f.write_bytes(bytes(data))
    run = load_run(tmp_path / "r")                 # the small files verify; the array is checked when read
    run.embeddings(0, "mean")
    with pytest.raises(CorruptRunError, match=r"step_000005.max.npy: checksum mismatch with COMPLETE of run r .*nothing is computed"):
        run.embeddings(0, "max")
    with pytest.raises(CorruptRunError, match="step_000005.max.npy: checksum mismatch"):
        runs.verify_run(tmp_path / "r")
    load_run(tmp_path / "r", verify=False).embeddings(0, "max")        # skipping verification loads
    h = tmp_path / "r" / "history.csv"; h.write_text(h.read_text() + "0,0,0,0,ok\n")
    with pytest.raises(CorruptRunError, match="history.csv: checksum mismatch"):
        load_run(tmp_path / "r")                   # a small file: refused at load
    f.unlink()
    with pytest.raises(CorruptRunError, match="step_000005.max.npy: listed in COMPLETE but missing"):
        load_run(tmp_path / "r", verify=False)


def test_malformed_completion_marker_is_corrupt(tmp_path):
    write_run(tmp_path / "r")
    marker = tmp_path / "r" / "COMPLETE"
    m = json.loads(marker.read_text()); m["files"] = sorted(m["files"]); marker.write_text(json.dumps(m))
    with pytest.raises(CorruptRunError, match=r"COMPLETE: field 'files': expected a dict path -> sha256"):
        load_run(tmp_path / "r")


def test_different_config_refused_untouched(tmp_path):
    write_run(tmp_path / "done")
    w = RunWriter(tmp_path / "partial", CFG, PROBES)
    w.log(step=0, train_loss=1.0)
    other = {**CFG, "lr": 5e-4}
    with pytest.raises(FolderLockedError):          # while its writer lives, the folder is refused outright
        RunWriter(tmp_path / "partial", other, PROBES)
    w.abandon()                                     # a crashed run of CFG: refused for `other`, naming both hashes
    for name in ("done", "partial"):
        before = snapshot(tmp_path / name)
        with pytest.raises(ValueError) as ei:
            RunWriter(tmp_path / name, other, PROBES)
        msg = str(ei.value)
        assert str(tmp_path / name) in msg and config_hash(CFG) in msg and config_hash(other) in msg
        assert snapshot(tmp_path / name) == before


def test_not_a_run_folder_refused(tmp_path):
    (tmp_path / "f").mkdir(); (tmp_path / "f" / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="not a run folder"):
        RunWriter(tmp_path / "f", CFG, PROBES)
    assert (tmp_path / "f" / "notes.txt").read_text() == "mine"


def test_complete_same_hash_raises_already_complete(tmp_path):
    write_run(tmp_path / "r")
    before = snapshot(tmp_path / "r")
    with pytest.raises(RunAlreadyComplete) as ei:
        RunWriter(tmp_path / "r", {**CFG, "device": "cuda:3", "out_dir": "/elsewhere"}, PROBES)
    assert ei.value.config_hash == config_hash(CFG) and ei.value.run_dir == tmp_path / "r"
    assert snapshot(tmp_path / "r") == before


def test_incomplete_same_hash_restarts(tmp_path):
    w = RunWriter(tmp_path / "r", CFG, PROBES)
    for s in (0, 1, 2):
        w.save_embeddings(s, {"mean": np.ones((3, 4, 6)), "cls": np.ones((3, 4, 6))})
        w.log(step=s, train_loss=9.0)
    (tmp_path / "r" / ".history.csv.abc.tmp").write_text("half")          # debris of a killed write
    with pytest.raises(FolderLockedError, match="is being written by pid"):   # the first writer is alive
        RunWriter(tmp_path / "r", CFG, PROBES)
    assert len(list((tmp_path / "r" / "embeddings").iterdir())) == 6       # and its files untouched
    w.abandon()                                                             # it dies: the next writer restarts
    emb = write_run(tmp_path / "r", steps=(0, 7))
    run = load_run(tmp_path / "r")
    assert run.steps.tolist() == [0, 7] and run.poolings == ["max", "mean"]
    assert 9.0 not in run.history["train_loss"].tolist()
    assert sorted(p.name for p in (tmp_path / "r" / "embeddings").iterdir()) == [
        "step_000000.max.npy", "step_000000.mean.npy", "step_000007.max.npy", "step_000007.mean.npy"]
    assert not list((tmp_path / "r").rglob("*.tmp"))
    np.testing.assert_array_equal(run.embeddings(-1)[1], emb[7][-1])


def test_crash_by_sigkill_then_restart(tmp_path):
    if not hasattr(signal, "SIGKILL"): pytest.skip("needs SIGKILL")
    run_dir = tmp_path / "killed"
    pkg_parent = str(Path(embvar_study.__file__).resolve().parent.parent)
    inputs = tmp_path / "inputs.json"
    inputs.write_text(json.dumps({"config": CFG, "probes": json.loads(PROBES.to_json(orient="records"))}))
    script = textwrap.dedent(f"""
        import json, sys, time
        sys.path.insert(0, {pkg_parent!r})
        import numpy as np
        from embvar_study.run_writer import RunWriter
        inputs = json.load(open({str(inputs)!r}))
        w = RunWriter({str(run_dir)!r}, inputs["config"], inputs["probes"])
        for s in range(3):
            w.save_embeddings(s, {{"mean": np.full((3, 4, 6), float(s))}})
            w.log(step=s, train_loss=1.0 / (s + 1))
        print("ready", flush=True)
        time.sleep(120)
        w.finish()
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.strip() == "ready", proc.stderr.read()
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        proc.stdout.close(); proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL
    assert len(list((run_dir / "embeddings").glob("*.npy"))) == 3
    with pytest.raises(IncompleteRunError, match=str(run_dir)):
        load_run(run_dir)
    assert find_runs(tmp_path) == []
    write_run(run_dir, steps=(0, 5))
    run = load_run(run_dir)
    assert run.steps.tolist() == [0, 5] and run.config == CFG


def test_find_and_load_runs(tmp_path):
    write_run(tmp_path / "b" / "seed1", cfg={**CFG, "seed": 1})
    write_run(tmp_path / "a", cfg={**CFG, "seed": 0})
    RunWriter(tmp_path / "c", {**CFG, "seed": 2}, PROBES)                   # incomplete: not found
    assert find_runs(tmp_path) == [tmp_path / "a", tmp_path / "b" / "seed1"]
    assert is_complete(tmp_path / "a") and not is_complete(tmp_path / "c")
    loaded = load_runs(tmp_path)
    assert [r.config["seed"] for r in loaded] == [0, 1]
    assert len({r.config_hash for r in loaded}) == 2


def test_environment_info_keys():
    env = environment_info()
    for k in ("python", "platform", "packages", "torch_cuda", "cudnn", "cuda_devices", "git_commit", "git_dirty"):
        assert k in env
    assert set(env["packages"]) == {"numpy", "scipy", "torch", "transformers", "datasets", "pandas", "embvar_study"}
    assert env["packages"]["pandas"] == pd.__version__ and env["packages"]["embvar_study"] == embvar_study.__version__
    assert env["git_commit"] is None or len(env["git_commit"]) == 40
    assert env["git_dirty"] in (None, True, False)
    json.dumps(env)


def test_git_dirty_counts_code_changes_not_rendered_reports(tmp_path):
    "Rendering the quick report rewrites the tracked reports/quick/report.html; the next report must still say 'clean'."
    def git(*a): subprocess.run(["git", *a], cwd=tmp_path, check=True, capture_output=True)
    git("init", "-q"); git("config", "user.email", "t@t"); git("config", "user.name", "t")
    (tmp_path / "reports" / "quick").mkdir(parents=True); (tmp_path / "pkg").mkdir()
    (tmp_path / "reports" / "quick" / "report.html").write_text("old"); (tmp_path / "pkg" / "code.py").write_text("x = 1")
    git("add", "-A"); git("commit", "-qm", "init")
    assert storage.git_dirty(tmp_path) is False
    (tmp_path / "reports" / "quick" / "report.html").write_text("new")      # an output changed
    (tmp_path / "pkg" / "new_untracked.py").write_text("")                    # untracked files never count
    assert storage.git_dirty(tmp_path) is False and storage.git_dirty(tmp_path / "pkg") is False
    (tmp_path / "pkg" / "code.py").write_text("x = 2")                        # code changed
    assert storage.git_dirty(tmp_path) is True and storage.git_dirty(tmp_path / "reports") is True
    assert storage.git_dirty(tmp_path.parent / "nowhere") is None


# ---------------------------------------------------------------- extra arrays and buffered history

def test_save_array_perturbations_and_buffered_log(tmp_path):
    rng = np.random.default_rng(0)
    arrs = {(s, k): rng.normal(size=(4, 3, len(PROBES), 6)).astype(np.float32) for s in (0, 10) for k in ("typo", "mc_dropout")}
    with RunWriter(tmp_path / "r", CFG, PROBES) as w:
        w.save_embeddings(0, {"mean": rng.normal(size=(3, len(PROBES), 6))})
        for (s, k), a in arrs.items(): w.save_array(f"perturb/step_{s:06d}.{k}.npy", a)
        w.log(step=1, train_loss=0.5, flush=False)
        assert not (tmp_path / "r" / "history.csv").exists()   # deferred
        w.log(step=2, train_loss=0.4, flush=False)
        for bad in ("/abs/x.npy", "../x.npy", "embeddings/x.npy", "perturb/x.txt"):
            with pytest.raises(ValueError, match="relpath: expected a relative .npy path"):
                w.save_array(bad, np.zeros(2))
        with pytest.raises(ValueError, match="array: expected finite values"):
            w.save_array("perturb/nan.npy", np.array([np.nan]))
    run = load_run(tmp_path / "r")
    assert run.history["step"].tolist() == [1, 2]                # flushed by finish
    got = run.perturbations()
    assert [(k, s) for k, s, _ in got] == [("mc_dropout", 0), ("typo", 0), ("mc_dropout", 10), ("typo", 10)]
    for k, s, a in got: np.testing.assert_array_equal(a, arrs[(s, k)])
    with pytest.raises(ValueError, match="saved arrays: \\['perturb/step_000000.mc_dropout.npy'"):
        run.array("perturb/nope.npy")
    # extra arrays are checksummed like every file
    f = tmp_path / "r" / "perturb" / "step_000010.typo.npy"; b = bytearray(f.read_bytes()); b[-1] ^= 1; f.write_bytes(bytes(b))
    with pytest.raises(CorruptRunError, match="step_000010.typo.npy: checksum mismatch"):
        load_run(tmp_path / "r").array("perturb/step_000010.typo.npy")
    with pytest.raises(CorruptRunError, match="step_000010.typo.npy: checksum mismatch"):
        load_run(tmp_path / "r").perturbations()


def test_methods_written_in_their_own_cells_belong_to_their_class():
    # RunWriter, Run and FolderLock are written over several notebook cells (storage.method_of, `#| exporti`): each
    # method is its class's, under its own name, and none of them is part of the module's public API
    for cls in (run_writer.RunWriter, runs.Run, storage.FolderLock):
        for name, f in vars(cls).items():
            if callable(f) and not name.startswith("__"): assert f.__qualname__ == f"{cls.__name__}.{name}", (cls, name)
    attached = {"acquire", "save_embeddings", "log", "flush", "save_array", "finish", "abandon", "embeddings",
                "embeddings_all_layers", "array", "perturbations"}
    assert attached <= {n for c in (run_writer.RunWriter, runs.Run, storage.FolderLock) for n in vars(c)}
    assert not attached & (set(runs.__all__) | set(run_writer.__all__) | set(storage.__all__))
