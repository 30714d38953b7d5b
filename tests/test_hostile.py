"""Hostile or damaged run and study folders are refused with a CorruptRunError naming the file and field: paths that
leave the folder (.., absolute, symbolic links), malformed metadata, steps whose files are missing, manifests that
point elsewhere or at another run; nothing outside the folder is read."""
import json, shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from embvar_study.runs import CorruptRunError, load_run
from embvar_study.run_writer import RunWriter
from embvar_study.study_folder import load_manifest
from embvar_study.study import load_study
from embvar_study.synthetic import synthetic_study

PROBES = [{"text": "a"}, {"text": "b"}, {"text": "c"}]


@pytest.fixture
def run(tmp_path) -> Path:
    with RunWriter(tmp_path / "run", {"lr": 1e-4, "seed": 0}, PROBES) as w:
        for s in (0, 5): w.save_embeddings(s, {"mean": np.ones((2, 3, 4)) * (s + 1)})
        w.log(step=5, train_loss=0.5)
    (tmp_path / "outside.npy").write_bytes(b"secret")
    return tmp_path / "run"


def edit_marker(run: Path, **changes):
    m = json.loads((run / "COMPLETE").read_text()); m.update(changes); (run / "COMPLETE").write_text(json.dumps(m))


@pytest.mark.parametrize("path", ["../outside.npy", "../../outside.npy", "/etc/passwd", "embeddings/../../outside.npy", "", "C:/x.npy"])
def test_paths_in_complete_must_stay_inside(run, path):
    m = json.loads((run / "COMPLETE").read_text())
    edit_marker(run, files={**m["files"], path: "0" * 64})
    with pytest.raises(CorruptRunError, match=r"COMPLETE: path .*(is not a relative path|leaves or is not a plain path)"):
        load_run(run)


def test_a_symbolic_link_leaving_the_folder_is_refused(run):
    f = run / "embeddings" / "step_000005.mean.npy"
    f.unlink(); f.symlink_to(run.parent / "outside.npy")
    with pytest.raises(CorruptRunError, match="passes through a symbolic link"):
        load_run(run)
    shutil.rmtree(run / "embeddings"); (run / "embeddings").symlink_to(run.parent)
    with pytest.raises(CorruptRunError, match="passes through a symbolic link"):
        load_run(run, verify=False)


def test_a_pooling_name_with_a_path_is_refused(run):
    edit_marker(run, poolings=["../../outside"])
    with pytest.raises(CorruptRunError, match=r"field 'poolings': expected a list of pooling names"):
        load_run(run)


@pytest.mark.parametrize("field, value, words", [
    ("steps", ["x"], "field 'steps': expected a list of ints >= 0"), ("steps", "0,5", "field 'steps'"),
    ("shape", "abc", "field 'shape': expected null or [L+1, N, d]"), ("shape", [2, 3], "field 'shape'"),
    ("files", ["config.json"], "field 'files': expected a dict path -> sha256"), ("status", 3, "field 'status'"),
    ("config_hash", "../x", "field 'config_hash'"), ("dtype", "int8", "field 'dtype'")])
def test_malformed_metadata_names_file_and_field(run, field, value, words):
    edit_marker(run, **{field: value})
    with pytest.raises(CorruptRunError, match=rf"COMPLETE: {__import__('re').escape(words)}"):
        load_run(run)


def test_a_step_listed_without_its_files_is_refused_at_load(run):
    edit_marker(run, steps=[0, 5, 10])
    with pytest.raises(CorruptRunError, match=r"step 10 has no mean file listed"):
        load_run(run, verify=False)


def test_config_json_must_be_an_object_with_the_markers_hash(run):
    (run / "config.json").write_text("[1, 2, 3]")
    with pytest.raises(CorruptRunError, match=r"config.json: expected a JSON object, got list"):
        load_run(run, verify=False)
    (run / "config.json").write_text(json.dumps({"lr": 1, "config_hash": "0123456789ab"}))
    with pytest.raises(CorruptRunError, match=r"config.json: field 'config_hash': '0123456789ab' differs from COMPLETE's"):
        load_run(run, verify=False)


def test_a_complete_marker_that_is_not_json_is_refused(run):
    (run / "COMPLETE").write_text("{not json")
    with pytest.raises(CorruptRunError, match="COMPLETE: unreadable completion marker"):
        load_run(run)


def test_manifests_must_point_at_their_own_runs(tmp_path):
    sd = synthetic_study(tmp_path / "s")
    m = pd.read_csv(sd / "sweeps" / "lr_sweep.csv")
    m.loc[0, "path"] = "../elsewhere/run"; m.to_csv(sd / "sweeps" / "lr_sweep.csv", index=False)
    with pytest.raises(CorruptRunError, match=r"lr_sweep.csv: row 0: path '../elsewhere/run' is not runs/<run_id>"):
        load_manifest(sd, "lr_sweep")
    m.loc[0, "path"] = f"runs/{m.loc[1, 'run_id']}"; m.loc[0, "run_id"] = m.loc[1, "run_id"]
    m.to_csv(sd / "sweeps" / "lr_sweep.csv", index=False)
    load_study(sd)                                            # consistent again: a repeated run is fine
    other = m.loc[2, "run_id"]
    shutil.rmtree(sd / "runs" / other); shutil.copytree(sd / "runs" / m.loc[3, "run_id"], sd / "runs" / other)
    with pytest.raises(CorruptRunError, match=rf"the manifest names run {other}, the folder holds"):
        load_study(sd)


def test_run_ids_that_are_all_digits_stay_strings(tmp_path):
    sd = synthetic_study(tmp_path / "s")
    m = pd.read_csv(sd / "sweeps" / "perturbation.csv", dtype={"run_id": str})
    old = m.loc[0, "run_id"]; new = "000123456789"
    (sd / "runs" / old).rename(sd / "runs" / new)
    m.loc[0, "run_id"], m.loc[0, "path"] = new, f"runs/{new}"; m = m.iloc[:1]
    m.to_csv(sd / "sweeps" / "perturbation.csv", index=False)
    got = load_manifest(sd, "perturbation")
    assert got["run_id"].tolist() == [new] and got["path"].tolist() == [f"runs/{new}"]   # not 123456789, not refused
