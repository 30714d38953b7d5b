"""Drift as an instability alarm: the `alarm` field of TrainConfig (identity unchanged when unset), a run stopped by
its alarm (status `stopped_by_alarm`, counted as done by the study), and `fit_alarm` / `apply_alarm` round-tripping
through the rule loader of the live tracker (a rule fitted offline stops a live rerun where the replay says it fires)."""
import json

import pytest

from embvar_study.config import TrainConfig
from embvar_study.early_warning import fit_alarm, apply_alarm
from embvar_study.runs import load_run, config_hash
from embvar_study.study import RunSet, _DONE
from embvar_study.tracking import AlarmRule, alarm_rule
from embvar_study.train import train_run


def test_alarm_field_identity(tiny_config):
    plain, armed = TrainConfig(**tiny_config), TrainConfig(**tiny_config, alarm={"threshold": 0.01})
    assert "alarm" not in plain.identity() and armed.identity()["alarm"]["threshold"] == 0.01
    # unset, the id is the hash of exactly the fields that existed before the alarm field
    ident = plain.identity()
    assert plain.run_id() == config_hash(ident) and plain.run_id() != armed.run_id()
    assert TrainConfig(**tiny_config, alarm=0.02).alarm == alarm_rule(0.02).to_dict()
    with pytest.raises(ValueError, match="alarm.signal"): TrainConfig(**tiny_config, alarm={"threshold": 0.1, "signal": "loss"})
    with pytest.raises(ValueError, match="^alarm:"): TrainConfig(**tiny_config, alarm="0.1")
    assert "stopped_by_alarm" in _DONE


def test_fit_apply_alarm_round_trip(tiny_config, tmp_path):
    base = {**tiny_config, "max_steps": 8, "track_every": 2, "n_eval": 8}
    calm = load_run(train_run(TrainConfig(**base, lr=1e-5), tmp_path / "a"))
    wild = load_run(train_run(TrainConfig(**base, lr=5e-3), tmp_path / "b"))
    rs = RunSet.of([calm, wild])
    rule = fit_alarm(rs, at=4, recall=1.0, failed=[False, True])
    assert isinstance(rule, AlarmRule) and rule.end == 4 and rule.calibration["recall"] == 1.0
    assert rule.calibration["n_failed"] == 1 and rule.calibration["n_runs"] == 2
    # the rule survives JSON (a file the live tracker reads) unchanged
    path = tmp_path / "rule.json"; path.write_text(json.dumps(rule.to_dict()))
    assert alarm_rule(path) == rule
    hit = apply_alarm(path, wild.path)
    assert hit["fired"] and hit["value"] > rule.threshold and hit["step"] <= 4
    assert apply_alarm(rule, calm)["fired"] == (rule.calibration["successful_stopped"] == 1)
    # a live rerun of the failed run with the rule stops where the replay says it fires
    stopped = load_run(train_run(TrainConfig(**base, lr=5e-3, alarm=rule.to_dict()), tmp_path / "c"))
    assert stopped.status == "stopped_by_alarm" and stopped.alarm["step"] == hit["step"]
    assert stopped.steps[-1] == hit["step"] and stopped.marker["steps_done"] == hit["step"]
    with pytest.raises(ValueError, match="at:"): fit_alarm(rs, at=0, failed=[False, True])
    with pytest.raises(ValueError, match="no run failed"): fit_alarm(rs, at=4, failed=[False, False])


def test_stability_profile(tmp_path):
    from embvar_study.sweep import get_profile, experiment_grid, _spec, PROFILES, _CLASSIC
    data = tmp_path / "r.csv"; data.write_text("text,label\ngood,1\nbad,0\n")
    with pytest.raises(ValueError, match="^dataset: the stability profile needs"): get_profile("stability")
    p = get_profile("stability", {"dataset": str(data), "lrs": [5e-5, 1e-3], "seeds": [0, 1]})
    grid = experiment_grid(p, "stability")
    assert sorted((g["lr"], g["seed"]) for g in grid) == [(5e-5, 0), (5e-5, 1), (1e-3, 0), (1e-3, 1)]
    full = get_profile("stability", {"dataset": str(data)})
    assert len(experiment_grid(full, "stability")) == 36 and full["base"]["track_every"] == 2
    assert _spec(p, {}, ["stability"], None)["resolved"]["failure"]["delta"] == 0.05
    assert all("stability" not in PROFILES[k]["experiments"] for k in ("paper", "quick", "smoke")) and "stability" not in _CLASSIC
