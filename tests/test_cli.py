"""The command line as a user meets it: `--version`, a misspelt profile refused at once with a suggestion, negative
numbers reaching validation, help in groups, defaults that fit a small dataset, run identity from content (a changed
CSV or probe file is a new run), and every failure one line on stderr with exit code 2 naming the flag or file."""
import os, subprocess, sys
from pathlib import Path

import pytest

from conftest import TINY, cli_args
from embvar_study.cli import main
from embvar_study.runs import load_run
from embvar_study.config import TrainConfig


def embvar(*args, cwd=None, timeout=300) -> subprocess.CompletedProcess:
    "`embvar ARGS` in a fresh process, as a user runs it."
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.run([sys.executable, "-c", "from embvar_study.cli import main; main()", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def one_line_error(r, command="train") -> str:
    assert r.returncode == 2, (r.returncode, r.stdout[-1500:], r.stderr[-1500:])
    lines = [l for l in r.stderr.strip().splitlines() if l.strip()]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert lines[0].startswith(f"embvar {command}: error: "), lines[0]
    return lines[0]


def run_cli(argv, capsys):
    "main(argv) in this process: (exit code, stdout, stderr)."
    try: main(argv); code = 0
    except SystemExit as e: code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


def write_csv(path: Path, rows: int = 64, flip: bool = False) -> Path:
    words = ["good", "great", "fine", "nice", "bad", "poor", "dull", "awful"]
    lines = ["text,label"] + [f"review number {i} was {words[i % 8]} and {words[(i * 3) % 8]},{int((i % 8 < 4) != flip)}" for i in range(rows)]
    path.write_text("\n".join(lines) + "\n"); return path


def test_version():
    r = embvar("--version")
    assert r.returncode == 0 and r.stdout.startswith("embvar-study ")


HEAVY = ("torch", "transformers", "papermill", "nbformat", "datasets")   # what training or a notebook would import first


def test_misspelt_profile_is_refused_at_once_with_a_suggestion(tmp_path):
    "At once: the refusal comes before any heavy import (no model, no training, no notebook could have started) and no folder."
    probe = ("import atexit, sys; atexit.register(lambda: print('heavy:', sorted(m for m in %r if m in sys.modules))); "
             "from embvar_study.cli import main; main()" % (HEAVY,))
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    r = subprocess.run([sys.executable, "-c", probe, "report", "--profile", "smok", "--out", str(tmp_path / "x")],
                       env=env, capture_output=True, text=True, timeout=300)
    line = one_line_error(r, "report")
    assert "--profile: unknown profile 'smok' (did you mean 'smoke'?)" in line
    assert "heavy: []" in r.stdout.splitlines(), r.stdout[-500:]
    assert not (tmp_path / "x").exists()


def test_negative_numbers_reach_validation(tmp_path, capsys):
    code, _, err = run_cli(["train", *cli_args(TINY), "--lr", "-1e-4", "--out", str(tmp_path / "r")], capsys)
    assert code == 2 and "embvar train: error: --lr: expected a positive finite learning rate, got -0.0001" in err


def test_train_help_is_grouped(capsys):
    with pytest.raises(SystemExit): main(["train", "--help"])
    out = capsys.readouterr().out
    heads = [h for h in ("data:", "model:", "optimisation:", "tracking:", "seeds:", "perturbations:", "output:") if h in out]
    assert len(heads) == 7, heads
    body = out[out.index("\ndata:"):]                                   # after the usage lines
    assert body.index("data:") < body.index("--dataset") < body.index("model:") < body.index("--model") < body.index("optimisation:")
    for name in TrainConfig.__dataclass_fields__: assert "--" + name.replace("_", "-") in out, name
    assert "peak learning rate" in out


def test_defaults_fit_a_small_dataset_and_say_what_was_used(tmp_path, capsys):
    data = write_csv(tmp_path / "reviews.csv", rows=64)
    code, out, err = run_cli(["train", "--model", "tiny-distilbert", "--dataset", str(data), "--max-steps", "2", "--track-every", "1",
                              "--n-probes", "8", "--out", str(tmp_path / "r"), "--no-progress"], capsys)
    assert code == 0, err
    assert "data: 51 training / 13 held-out examples of" in out and "(64 rows)" in out
    run = load_run(tmp_path / "r")
    assert run.marker["derived"]["n_train"] == 51 and run.marker["derived"]["n_eval"] == 13


def test_a_changed_dataset_is_a_new_run_and_the_same_content_elsewhere_is_the_same(tmp_path, capsys):
    data = write_csv(tmp_path / "d.csv")
    base = ["train", "--model", "tiny-distilbert", "--dataset", str(data), "--max-steps", "1", "--n-probes", "8", "--no-progress"]
    assert run_cli([*base, "--out", str(tmp_path / "a")], capsys)[0] == 0
    first = load_run(tmp_path / "a")
    assert first.config["resolved"]["dataset"]["sha256"] and first.config["resolved"]["dataset"]["path"] == str(data.resolve())
    write_csv(data, flip=True)                                         # every label swapped
    code, out, err = run_cli([*base, "--out", str(tmp_path / "a")], capsys)
    assert code == 2 and "--out: " in err and "holds a run with config_hash" in err   # not a stale "complete"
    assert TrainConfig(model="tiny-distilbert", dataset=str(data), max_steps=1, n_probes=8).run_id() != first.config_hash
    copy = write_csv(tmp_path / "elsewhere.csv")                       # the first content again, under another name
    assert TrainConfig(model="tiny-distilbert", dataset=str(copy), max_steps=1, n_probes=8).run_id() == first.config_hash


def test_a_changed_probe_file_is_a_new_run(tmp_path):
    probes = tmp_path / "probes.csv"; probes.write_text("text\nthe film was long\nthe film was short\n")
    a = TrainConfig(model="tiny-distilbert", dataset="bundled", probes=str(probes)).run_id()
    probes.write_text("text\nthe film was long\nthe film was brief\n")
    assert TrainConfig(model="tiny-distilbert", dataset="bundled", probes=str(probes)).run_id() != a


@pytest.mark.parametrize("content, expected", [
    (b"text,label\n", "no data rows"),                              # header only
    (b"text,label\ncaf\xe9 au lait,1\ngood,0\n", "UTF-8"),          # not UTF-8
    (b'text,label\n"unclosed,1\ngood,0\n', "bad.csv"),              # unparseable
])
def test_bad_data_files_are_one_line_naming_the_file(tmp_path, content, expected):
    f = tmp_path / "bad.csv"; f.write_bytes(content)
    line = one_line_error(embvar("train", "--model", "tiny-distilbert", "--dataset", str(f), "--out", str(tmp_path / "r")))
    assert "--dataset: " in line and str(f) in line and expected in line


def test_a_folder_as_dataset_is_refused_not_sent_to_the_hub(tmp_path):
    (tmp_path / "data").mkdir()
    line = one_line_error(embvar("train", "--model", "tiny-distilbert", "--dataset", str(tmp_path / "data"), "--out", str(tmp_path / "r")))
    assert "--dataset: " in line and "is a folder" in line and "Hub" not in line.split("is a folder")[0]


def test_report_errors_are_one_line(tmp_path):
    line = one_line_error(embvar("report", "--profile", "smoke", "--set", "dataset=missing.csv", "--out", str(tmp_path / "s")), "report")
    assert "--set dataset: no such file" in line and "missing.csv" in line
    assert not (tmp_path / "s" / "runs").exists()
    line = one_line_error(embvar("report", "--profile", "smoke", "--only-report", "--out", str(tmp_path / "empty")), "report")
    assert "holds no study.json" in line
    line = one_line_error(embvar("report", "--profile", "smoke", "--set", "lr_s=[1e-4]", "--out", str(tmp_path / "t")), "report")
    assert "--set lr_s: unknown key (did you mean 'lrs'?)" in line
    line = one_line_error(embvar("report", "--runs", str(tmp_path / "nowhere")), "report")
    assert "nowhere" in line and "is not a folder" in line


def test_unknown_command_suggests():
    r = embvar("trian")
    assert r.returncode == 2 and "unknown command 'trian' (did you mean 'train'?)" in r.stderr


def test_a_full_disk_is_one_line_naming_the_file(tmp_path, capsys, monkeypatch):
    import embvar_study.runs as runs_mod
    real = runs_mod.np.save
    def full(f, a, allow_pickle=False):
        real(f, a[: max(1, len(a) // 2)], allow_pickle=allow_pickle)   # part of it fits, then the disk is full
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(runs_mod.np, "save", full)
    code, out, err = run_cli(["train", *cli_args(TINY), "--out", str(tmp_path / "r"), "--no-progress"], capsys)
    lines = [l for l in err.strip().splitlines() if l.strip()]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert "step_000000" in lines[0] and "cannot write (No space left on device)" in lines[0]
    assert not list((tmp_path / "r").rglob("*.tmp")) and not (tmp_path / "r" / "COMPLETE").exists()   # nothing half-written left


def test_templates_pointing_nowhere_is_one_line(tmp_path):
    line = one_line_error(embvar("report", "--profile", "smoke", "--experiments", "lr_sweep", "--set", "seeds=[0]", "--set", "lrs=[5e-4]",
                                 "--templates", str(tmp_path / "nowhere"), "--out", str(tmp_path / "s")), "report")
    assert "--templates: " in line and "nowhere" in line and "lr_sweep.ipynb" in line and "nor experiment.ipynb" in line


def test_a_failed_run_stops_before_the_report_with_one_line_per_run(tmp_path):
    r = embvar("report", "--profile", "smoke", "--experiments", "lr_sweep", "--set", "model=no-such-org/no-such-model", "--out", str(tmp_path / "s"))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert lines[0] == "embvar report: error: 4 run(s) failed; the report was not rendered:"
    assert len(lines) == 3 and lines[1].startswith("  4 run(s) of lr_sweep (") and "HubUnavailableError" in lines[1]   # one line per distinct error
    assert lines[-1].startswith("  tracebacks: ") and lines[-1].endswith("lr_sweep.errors.txt")
    assert not (tmp_path / "s" / "report.html").exists() and not (tmp_path / "s" / "notebooks").exists()


def test_a_failed_run_shared_by_two_experiments_is_named_under_both(tmp_path):
    import pandas as pd
    from embvar_study.cli_report import _failed_runs
    row = lambda rid, st, err: {"run_id": rid, "status": st, "error": err}
    manifests = {"lr_sweep": pd.DataFrame([row("a", "failed", "E"), row("b", "completed", None)]),
                 "schedule": pd.DataFrame([row("a", "failed", "E"), row("c", "failed", "E")])}
    lines = _failed_runs(tmp_path, manifests).splitlines()
    assert lines[0] == "2 run(s) failed; the report was not rendered:"      # distinct runs, not manifest rows
    assert lines[1] == "  2 run(s) of lr_sweep, schedule (a, c): E"
    assert _failed_runs(tmp_path, {"lr_sweep": manifests["lr_sweep"].iloc[1:]}) is None


def test_a_study_with_nothing_left_to_run_does_not_import_torch():
    # every experiment notebook re-plans its runs after the parent ran them all: checking an empty plan must stay cheap
    code = "import sys, embvar_study.sweep as s; s.check_plan_data([]); print('torch' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "False", r.stderr[-2000:]


def test_only_report_names_every_damaged_run_and_renders_nothing(tmp_path):
    from embvar_study.synthetic import synthetic_study
    study = synthetic_study(tmp_path / "s")
    runs = sorted(p for p in (study / "runs").iterdir() if p.is_dir())[:2]
    for r in runs:                                          # one byte of one embedding file flipped in each
        f = sorted((r / "embeddings").glob("*.npy"))[-1]; b = bytearray(f.read_bytes()); b[-1] ^= 1; f.write_bytes(bytes(b))
    r = embvar("report", "--profile", "smoke", "--only-report", "--out", str(study))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    lines = r.stderr.strip().splitlines()
    assert lines[0].startswith("embvar report: error: 2 damaged or missing run(s); --only-report trains nothing, so the report was not rendered"), lines[0]
    assert len(lines) == 3 and all("checksum" in l for l in lines[1:]), lines
    assert {run.name for run in runs} == {next(p for p in Path(l.split(":")[0].strip()).parts if p in {x.name for x in runs}) for l in lines[1:]}
    assert not (study / "report.html").exists() and not (study / "notebooks").exists()


def test_bad_data_for_a_study_is_one_line_before_any_run(tmp_path):
    bad = tmp_path / "nolabel.csv"; bad.write_text("text\n" + "\n".join(f"review {i}" for i in range(80)) + "\n")
    line = one_line_error(embvar("report", "--profile", "smoke", "--set", f"dataset={bad}", "--out", str(tmp_path / "s")), "report")
    assert line.startswith("embvar report: error: --set dataset: ") and "has no column(s) ['label']" in line
    assert not (tmp_path / "s" / "runs").exists()


def test_report_flags_are_checked_before_any_work(tmp_path):
    f = tmp_path / "file.txt"; f.write_text("x")
    cases = [(["--runs", str(tmp_path), "--only-report"], "--only-report: --only-report cannot be used with --runs"),
             (["--runs", str(tmp_path), "--experiments", "lr_sweep"], "--experiments: --experiments cannot be used with --runs"),
             (["--profile", "smoke", "--cpus-per-run", "0", "--out", str(tmp_path / "s")], "--cpus-per-run: expected an integer >= 1, got 0"),
             (["--profile", "smoke", "--experiments", "nosuch", "--out", str(tmp_path / "s")], "--experiments: unknown 'nosuch'"),
             (["--profile", "smoke", "--out", str(f)], f"--out: {f} is a file; expected a folder"),
             (["--profile", "smoke", "--jobs", "0", "--out", str(tmp_path / "s")], "--jobs: expected an integer >= 1 or 'auto', got '0'")]
    for args, expected in cases:
        line = one_line_error(embvar("report", *args), "report")
        assert expected in line, (args, line)
    assert not (tmp_path / "s").exists() and not list(tmp_path.glob(".s.lock*"))   # refused before the study lock


def test_group_by_a_key_no_run_has_is_one_line(tmp_path, shared_study_dir):
    study = shared_study_dir
    line = one_line_error(embvar("report", "--runs", str(study / "runs"), "--group-by", "nosuchkey", "--out", str(tmp_path / "r")), "report")
    assert "--group-by: no run has a value for 'nosuchkey'" in line


def test_argparse_errors_and_a_missing_command_are_one_line(tmp_path):
    line = one_line_error(embvar("train", "--dataset", "bundled"))
    assert "the following arguments are required: --out" in line
    r = embvar()
    assert r.returncode == 2 and r.stderr.strip() == "embvar: error: expected a command: train, report, verify or compare (see embvar --help)"
    assert "(default: None)" not in embvar("report", "--help").stdout


def test_help_describes_every_command():
    out = embvar("--help").stdout
    for cmd in ("train", "report", "verify", "compare"):
        line = next((l for l in out.splitlines() if l.strip().startswith(cmd + " ")), "")
        assert len(line.split()) > 4, (cmd, out)          # the command and what it does, not a bare name


def test_train_alarm_stops_a_diverging_run(tmp_path):
    "`embvar train --alarm 0.05` at a diverging rate ends the run at the tracked step where drift passes 0.05."
    from embvar_study.runs import load_run
    r = embvar("train", "--model", "tiny-distilbert", "--dataset", "bundled", "--n-train", "32", "--n-eval", "16", "--max-length", "32",
               "--probe-max-length", "32", "--n-probes", "16", "--track-every", "1", "--lr", "3", "--alarm", "0.05",
               "--out", str(tmp_path / "run"), "--no-progress")
    assert r.returncode == 0 and "stopped_by_alarm" in r.stdout, r.stderr[-500:]
    run = load_run(tmp_path / "run")
    assert run.alarm["fired"] and run.alarm["value"] > 0.05 and run.steps[-1] == run.alarm["step"]
    bad = one_line_error(embvar("train", "--dataset", "bundled", "--alarm", '{"signal": "x"}', "--out", str(tmp_path / "b")), "train")
    assert "alarm" in bad


def test_verify_names_its_argument_in_one_line(tmp_path):
    "A missing folder and a folder without runs: one line naming STUDY_OR_RUN (the usage's name), exit 2."
    line = one_line_error(embvar("verify", str(tmp_path / "nowhere")), "verify")
    assert "STUDY_OR_RUN: no such folder" in line and "nowhere" in line
    (tmp_path / "empty").mkdir()
    assert "STUDY_OR_RUN: " in one_line_error(embvar("verify", str(tmp_path / "empty")), "verify")


BIG_SEED = "99999999999999999999"   # > 2**64: torch's "Overflow when unpacking long long", blamed on --model, after the data


@pytest.mark.parametrize("flag", ["--seed", "--init-seed", "--probe-seed"])
def test_an_out_of_range_seed_is_named_before_any_work(tmp_path, flag):
    "One line naming the seed flag and the range, before the data are read (nothing on stdout) and before any folder."
    r = embvar("train", *cli_args(TINY), flag, BIG_SEED, "--out", str(tmp_path / "r"))
    line = one_line_error(r)
    assert line == f"embvar train: error: {flag}: expected {'None or ' if flag == '--init-seed' else ''}an integer in [0, 4294967295], got {BIG_SEED}"
    assert r.stdout == "" and not (tmp_path / "r").exists()


def test_an_out_of_range_seed_in_set_seeds_is_named_before_any_work(tmp_path):
    r = embvar("report", "--profile", "smoke", "--set", "dataset=bundled", "--set", f"seeds=[0, {BIG_SEED}]", "--out", str(tmp_path / "s"))
    line = one_line_error(r, "report")
    assert line == (f"embvar report: error: --set seeds: expected a non-empty list of seeds (integers in [0, 4294967295]), "
                    f"got [0, {BIG_SEED}]"), line
    assert not (tmp_path / "s").exists() and not list(tmp_path.glob(".s.lock*"))


def test_report_runs_names_every_folder_it_skips_on_the_console_and_the_page(tmp_path):
    "A crashed, a damaged and a no-step-0 run inside a --runs folder: one 'skipped:' line each, and the page says the same."
    import html, re
    from test_study import _runs_with_bad_ones
    root = _runs_with_bad_ones(tmp_path / "runs")
    r = embvar("report", "--runs", str(root), "--out", str(tmp_path / "rr"))
    assert r.returncode == 0, r.stderr[-2000:]
    skipped = [l for l in r.stdout.splitlines() if l.startswith("skipped: ")]
    assert [l.split(": ")[1] for l in skipped] == [str((root / n).resolve()) for n in ("crashed", "damaged", "from_step1")]
    assert "incomplete: no COMPLETE marker" in skipped[0] and ": damaged: 1 file(s)" in skipped[1]
    assert skipped[2].endswith("its drift reference is step 1, not step 0 (the first step it tracked), so its drift from step 0 is not defined")
    text = " ".join(html.unescape(re.sub(r"<[^>]+>", " ", (tmp_path / "rr" / "report.html").read_text(encoding="utf-8"))).split())
    assert "2 runs from 1 folder(s)" in text and "Skipped 3 run folder(s): " in text
    for n in ("crashed", "damaged", "from_step1"): assert f"{(root / n).resolve()} (" in text


def test_only_report_refuses_a_study_json_edited_after_the_runs(tmp_path):
    "The plan in study.json is content-hashed like a run: an edited field is one line naming it, and nothing is rendered."
    import json as _json
    from embvar_study.synthetic import synthetic_study
    study = synthetic_study(tmp_path / "s")
    spec = _json.loads((study / "study.json").read_text()); spec["resolved"]["lrs"] = [5e-5, 5e-3]   # the grid, rewritten
    (study / "study.json").write_text(_json.dumps(spec))
    line = one_line_error(embvar("report", "--profile", "smoke", "--only-report", "--out", str(study)), "report")
    assert line == (f"embvar report: error: {study / 'study.json'}: field 'resolved.lrs' was edited after the study was planned (its "
                    "content hash differs from the one written with it); the runs followed the plan as written: restore study.json, "
                    "or run the study into a new folder"), line
    assert not (study / "report.html").exists() and not (study / "notebooks").exists()


HEAVY = ("torch", "transformers", "peft")   # what `--help` must not import (issue 41: the CLI answers at once)


def modules_after(code: str) -> tuple[list[str], str]:
    "Run `code` in a fresh interpreter; (the HEAVY modules then in sys.modules, its stdout)."
    probe = f"{code}\nimport sys\nprint('HEAVY=' + ','.join(m for m in {HEAVY!r} if m in sys.modules))"
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert r.returncode == 0 and "HEAVY=" in r.stdout, r.stderr[-2000:]
    return [m for m in r.stdout.rsplit("HEAVY=", 1)[1].strip().split(",") if m], r.stdout


@pytest.mark.parametrize("argv", [["--help"], ["train", "--help"], ["report", "--help"], ["compare", "--help"],
                                  ["verify", "--help"], ["train", "--lr"]])
def test_help_imports_no_torch(argv):
    "Every command's help, and a flag error, answers without importing torch, transformers or peft (modules, not seconds)."
    heavy, out = modules_after(f"from embvar_study.cli import main\ntry: main({argv!r})\nexcept SystemExit: pass")
    assert heavy == [], f"embvar {' '.join(argv)} imported {heavy}"
    if argv[-1] == "--help": assert "usage: embvar" in out, out[:500]


def test_train_help_shows_every_field_with_its_help():
    "`embvar train --help` lists every TrainConfig field in a group, each with the help declared on the field."
    import dataclasses
    from embvar_study.cli import TRAIN_GROUPS, train_parser
    grouped = [n for names in TRAIN_GROUPS.values() for n in names]
    assert sorted(grouped) == sorted(f.name for f in dataclasses.fields(TrainConfig))
    helps = {a.dest: a.help for a in train_parser()._actions}
    blank = [n for n in grouped if not helps[n] or helps[n] == n]
    assert not blank, f"fields without help text: {blank}"
    assert helps["lr"] == "peak learning rate" and helps["replicate"].startswith("a label only")
