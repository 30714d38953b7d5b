"""`embvar report --help` (`embvar_study.cli_report`) names every profile and experiment; --runs-from is refused where it cannot apply (one line, exit 2)."""
import os, subprocess, sys
from pathlib import Path

from embvar_study.sweep import PROFILES, EXPERIMENT_NAMES

ROOT = Path(__file__).resolve().parent.parent


def _embvar(*args):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "ignore"}
    return subprocess.run([sys.executable, "-c", "from embvar_study.cli import main; main()", *args], capture_output=True, text=True, env=env, timeout=60)


def test_report_help_lists_profiles_and_experiments():
    r = _embvar("report", "--help")
    assert r.returncode == 0, r.stderr
    epilog = r.stdout.split("profiles and the experiments each runs", 1)[1]
    for name, prof in PROFILES.items():      # each profile on its own line with exactly its experiments
        line = next(l for l in epilog.splitlines() if l.strip().startswith(name + ":") or l.strip().startswith(name + " ("))
        assert line.split(": ", 1)[1].split(", ") == list(prof["experiments"])
    assert all(e in epilog for e in EXPERIMENT_NAMES) and "--runs-from" in r.stdout


def test_runs_from_refused_with_only_report(tmp_path):
    r = _embvar("report", "--only-report", "--runs-from", str(tmp_path), "--out", str(tmp_path / "s"))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "--runs-from" in r.stderr and "Traceback" not in r.stderr
    r = _embvar("report", "--runs", str(tmp_path), "--runs-from", str(tmp_path))
    assert r.returncode == 2 and "--runs-from cannot be used with --runs" in r.stderr
