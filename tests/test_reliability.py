"""Nothing lost, nothing misreported (issue 20): diverged runs in reports, foreign --out folders, missing and case-variant
labels, subsets that lose a class, duplicates across subsets, half-executed notebooks, bit rot, byte-identical builds."""
import html as html_lib, json, re

import pytest

from embvar_study.cli import main

SMALL = ["--set", "n_train=32", "--set", "n_eval=16", "--set", "max_length=32", "--set", "probe_max_length=32", "--set", "n_probes=16"]
TRAIN = ["--model", "tiny-distilbert", "--dataset", "bundled", "--n-train", "32", "--n-eval", "16", "--max-length", "32",
         "--probe-max-length", "32", "--n-probes", "16", "--track-every", "2", "--no-progress"]


def text_of(page: str) -> str: return " ".join(html_lib.unescape(re.sub(r"<[^>]+>", " ", page)).split())


@pytest.fixture(scope="module")
def diverged_study(tmp_path_factory):
    # lr 10 diverges at its first tracked step: one checkpoint, which broke drift_curves ("expected at least 2 checkpoints")
    out = tmp_path_factory.mktemp("diverged") / "study"
    main(["report", "--profile", "smoke", "--experiments", "lr_sweep", "--set", "lrs=[5e-5,10]", "--set", "track_every=2", "--out", str(out), *SMALL])
    return out


@pytest.mark.slow
def test_a_study_with_diverged_runs_renders_and_says_which(diverged_study):
    text = text_of((diverged_study / "report.html").read_text(encoding="utf-8"))
    assert "Traceback" not in text
    assert re.search(r"2 runs diverged\s+and are left out of every table and figure", text)
    assert re.search(r"lr 10 · init seed 0 · data seed 0 · dropout seed 0 of lr_sweep at step \d+ \(training loss", text)
    assert "at lr 10," not in text                                      # Findings do not quote lr 10 as a result
    assert text.count("2 diverged runs left out of this section's tables and figures") >= 3


@pytest.mark.slow
def test_a_runs_report_with_a_diverged_run_renders(tmp_path):
    a, b, c = (tmp_path / "runs" / n for n in "abc")
    main(["train", *TRAIN, "--lr", "5e-5", "--out", str(a)]); main(["train", *TRAIN, "--lr", "5e-5", "--seed", "1", "--out", str(b)])
    main(["train", *TRAIN, "--lr", "10", "--out", str(c)])
    assert json.loads((c / "COMPLETE").read_text())["status"] == "diverged"
    main(["report", "--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "rr")])
    text = text_of((tmp_path / "rr" / "report.html").read_text(encoding="utf-8"))
    assert "Traceback" not in text and "1 diverged run left out of this section's tables and figures: lr 10" in text


def _refused(capsys, argv: list, *wanted: str) -> str:
    "Run `embvar ARGV`; it must exit 2 with one line on stderr containing every `wanted`, and no traceback."
    with pytest.raises(SystemExit) as e: main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    for w in wanted: assert w in err, err
    return err


def test_report_out_refuses_a_folder_that_is_not_a_study(tmp_path, capsys):
    theirs = tmp_path / "theirs"; (theirs / "figures").mkdir(parents=True); (theirs / "logs").mkdir()
    for f in ("report.html", "figures/drift_and_loss.png", "logs/report.log"): (theirs / f).write_text("someone else's")
    before = {p: p.read_text() for p in theirs.rglob("*") if p.is_file()}
    _refused(capsys, ["report", "--profile", "smoke", "--out", str(theirs)], "--out:", "is not an embvar study")
    _refused(capsys, ["report", "--runs", str(tmp_path), "--out", str(theirs)], "--out:", "is not a report from run folders")
    assert {p: p.read_text() for p in theirs.rglob("*") if p.is_file()} == before and not list(tmp_path.glob(".*lock"))


def test_an_unwritable_out_names_out(tmp_path, capsys):
    import os
    ro = tmp_path / "ro"
    if os.geteuid() == 0: ro = type(tmp_path)("/sys")     # root writes any folder whatever its mode; sysfs refuses it
    else: ro.mkdir(); ro.chmod(0o555)
    _refused(capsys, ["report", "--profile", "smoke", "--out", str(ro / "study")], f"--out: cannot write to {ro / 'study'}")


def _write(path, df):
    {".csv": lambda: df.to_csv(path, index=False), ".tsv": lambda: df.to_csv(path, sep="\t", index=False),
     ".jsonl": lambda: df.to_json(path, orient="records", lines=True), ".parquet": lambda: df.to_parquet(path)}[path.suffix]()
    return path


@pytest.mark.parametrize("suffix", [".csv", ".tsv", ".jsonl", ".parquet"])
def test_missing_markers_and_case_variants_are_refused_by_every_reader(tmp_path, suffix):
    import pandas as pd
    from embvar_study.data import load_texts
    texts = [f"text number {i}" for i in range(12)]
    for marker in ("NA", "NaN", "null", "None", "nan", "N/A", "#N/A"):
        labels = ["pos", "neg"] * 6; labels[3] = labels[8] = marker
        f = _write(tmp_path / f"m{suffix}", pd.DataFrame({"text": texts, "label": labels}))
        with pytest.raises(ValueError, match=r"expected a label in every row, got 2 missing label\(s\) at rows 3, 8"): load_texts(f)
    f = _write(tmp_path / f"c{suffix}", pd.DataFrame({"text": texts, "label": ["Pos", "pos", "neg"] * 4}))
    with pytest.raises(ValueError, match=r"differ only in case or surrounding spaces would be different classes: 'Pos' \(4 rows\), 'pos' \(4 rows\)"):
        load_texts(f)


def test_train_refuses_a_missing_label_and_a_class_a_subset_cannot_hold(tmp_path, capsys):
    import pandas as pd
    rows = pd.DataFrame({"text": [f"a review, number {i}" for i in range(80)], "label": ["neg"] * 79 + ["pos"]})
    one = _write(tmp_path / "one.csv", rows)
    _refused(capsys, ["train", "--dataset", str(one), "--model", "tiny-distilbert", "--n-train", "40", "--n-eval", "20", "--out", str(tmp_path / "r")],
             "class 'pos' has 1 row of 80", "(40 rows)", "(20 rows)")
    six = _write(tmp_path / "six.csv", pd.DataFrame({"text": [f"review {i}" for i in range(206)], "label": ["neg"] * 200 + ["pos"] * 6}))
    _refused(capsys, ["train", "--dataset", str(six), "--model", "tiny-distilbert", "--n-train", "16", "--n-eval", "1", "--out", str(tmp_path / "r")],
             "--n-eval: expected at least 2 rows (one of every class: 'neg', 'pos'), got 1")
    na = _write(tmp_path / "na.csv", rows.assign(label=["neg", "pos"] * 39 + ["NA", "pos"]))
    _refused(capsys, ["train", "--dataset", str(na), "--model", "tiny-distilbert", "--out", str(tmp_path / "r")], "missing label(s) at row 78 ('NA' read as missing)")
    assert not (tmp_path / "r").exists()


def test_every_subset_keeps_every_class(tmp_path):
    import pandas as pd
    from embvar_study.config import TrainConfig
    from embvar_study.train import prepare_data
    six = _write(tmp_path / "six.csv", pd.DataFrame({"text": [f"review {i}" for i in range(206)], "label": ["neg"] * 200 + ["pos"] * 6}))
    tr, ev, _ = prepare_data(TrainConfig(dataset=str(six), n_train=16, n_eval=8, n_probes=4))
    assert set(tr["label"]) == set(ev["label"]) == {0, 1}


def _rot(f):
    "Flip one bit of a float in `f` and put its modification time back: what bit rot looks like to a size/mtime cache."
    import os
    st = f.stat(); b = bytearray(f.read_bytes()); b[-2] ^= 0x10; f.write_bytes(bytes(b)); os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_verify_names_every_damaged_file_and_only_report_verify_stops(tmp_path, capsys):
    from embvar_study.runs import verify_run
    from embvar_study.synthetic import synthetic_study
    sd = synthetic_study(tmp_path / "syn")
    files = sorted((sd / "runs").glob("*/embeddings/step_000012.mean.npy"))[:2]
    for f in files: verify_run(f.parent.parent)            # cached as verified, then rotted
    for f in files: _rot(f)
    with pytest.raises(SystemExit) as e: main(["verify", str(sd)])
    err = capsys.readouterr().err
    assert e.value.code == 1 and all(f"damaged: {f}: checksum mismatch" in err for f in files) and "Traceback" not in err
    with pytest.raises(SystemExit) as e: main(["verify", str(files[0].parent.parent)])   # one run folder
    assert e.value.code == 1 and f"damaged: {files[0]}" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e: main(["report", "--profile", "smoke", "--only-report", "--verify", "--out", str(sd)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "2 damaged or missing run(s); --only-report trains nothing, so the report was not rendered" in err and not (sd / "report.html").exists()
    _refused(capsys, ["report", "--profile", "smoke", "--verify", "--out", str(sd)], "--verify: --verify goes with --only-report")
    for f in files: _rot(f)                                   # the same bit flipped back
    main(["verify", str(sd)])
    assert "embvar verify: all 27 run(s) verify" in capsys.readouterr().out


@pytest.mark.slow
def test_only_report_reexecutes_a_half_run_notebook_from_the_runs_on_disk(diverged_study, capsys):
    from conftest import folder_state
    sd, nb = diverged_study, diverged_study / "notebooks" / "lr_sweep.ipynb"
    runs = folder_state(sd / "runs")
    d = json.loads(nb.read_text()); d["metadata"]["papermill"]["end_time"] = None   # what a SIGTERM mid-notebook leaves
    nb.write_text(json.dumps(d)); capsys.readouterr()
    main(["report", "--profile", "smoke", "--only-report", "--out", str(sd)])
    out = capsys.readouterr().out
    assert "notebook(s) lr_sweep (unfinished): re-executed from the runs on disk (no training)" in out
    assert json.loads(nb.read_text())["metadata"]["papermill"]["end_time"] and folder_state(sd / "runs") == runs
    page = (sd / "report.html").read_text(encoding="utf-8")
    assert 'id="appendix-lr_sweep"' in page


@pytest.mark.slow
def test_only_report_reexecutes_a_notebook_made_by_other_code_and_reuses_one_made_by_this(diverged_study, capsys):
    "A finished experiment notebook whose recorded inputs (the code's digest among them) are not today's is executed again by --only-report, from the runs on disk, so no page is rendered by older code; one whose inputs are today's is reused."
    nb = diverged_study / "notebooks" / "lr_sweep.ipynb"
    d = json.loads(nb.read_text()); d["metadata"]["papermill"]["start_time"] = "2000-01-01T00:00:00"
    d["metadata"].setdefault("embvar", {})["inputs"] = "0" * 64; nb.write_text(json.dumps(d))        # as another version of the code left it
    main(["report", "--profile", "smoke", "--only-report", "--out", str(diverged_study)])
    assert json.loads(nb.read_text())["metadata"]["papermill"]["start_time"] != "2000-01-01T00:00:00"
    assert "notebook lr_sweep: done" in capsys.readouterr().out
    main(["report", "--profile", "smoke", "--only-report", "--out", str(diverged_study)])           # nothing changed since
    assert "notebook lr_sweep: inputs unchanged (template, parameters, code, runs): reused" in capsys.readouterr().out


@pytest.mark.slow
def test_only_report_names_a_notebook_it_cannot_reexecute_without_training(diverged_study, tmp_path, capsys):
    import shutil
    sd = tmp_path / "copy"; shutil.copytree(diverged_study, sd)
    (sd / "notebooks" / "lr_sweep.ipynb").unlink()
    m = sd / "sweeps" / "lr_sweep.csv"; lines = m.read_text().splitlines()
    rid = lines[1].split(",")[lines[0].split(",").index("run_id")]
    shutil.rmtree(sd / "runs" / rid); m.write_text("\n".join([lines[0]] + [x for x in lines[1:] if rid not in x]) + "\n")
    _refused(capsys, ["report", "--profile", "smoke", "--only-report", "--out", str(sd)],
             "notebook lr_sweep is missing and cannot be re-executed without training (1 of its 4 runs are not on disk)")


@pytest.mark.slow
def test_render_html_refuses_a_half_executed_notebook(diverged_study, tmp_path):
    import shutil
    from embvar_study.report import render_html, NotebookFailed
    nb = tmp_path / "lr_sweep.ipynb"; shutil.copy(diverged_study / "notebooks" / "lr_sweep.ipynb", nb)
    d = json.loads(nb.read_text()); d["metadata"]["papermill"]["end_time"] = None; nb.write_text(json.dumps(d))
    with pytest.raises(NotebookFailed, match="notebook lr_sweep is unfinished"):
        render_html(tmp_path, diverged_study / "notebooks" / "report.ipynb", [nb])


def test_n_probes_none_keeps_all_as_the_help_says(tmp_path, capsys):
    main(["train", "--model", "tiny-distilbert", "--dataset", "bundled", "--n-train", "16",
          "--n-eval", "8", "--max-length", "16", "--probe-max-length", "16", "--max-steps", "1", "--n-probes", "None", "--no-progress",
          "--out", str(tmp_path / "r")])
    assert json.loads((tmp_path / "r" / "config.json").read_text())["n_probes"] is None
    assert "128 probes" in capsys.readouterr().out                       # the whole built-in set


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_signal_during_worker_start_up_prints_one_line_and_no_traceback(tmp_path, sig):
    import os, signal, subprocess, sys, time
    proc = subprocess.Popen([sys.executable, "-c", "from embvar_study.cli import main; main()", "report", "--profile", "smoke",
                             "--experiments", "lr_sweep", "--jobs", "2", "--out", str(tmp_path / "s"), *SMALL],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, cwd=tmp_path)
    for line in proc.stdout:                                           # the plan is printed just before the workers start
        if "grid points" in line: break
    time.sleep(0.3)
    os.killpg(proc.pid, getattr(signal, sig))                         # as Ctrl-C does: the whole process group
    _, err = proc.communicate(timeout=60)
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    lines = [x for x in err.splitlines() if x.strip()]
    assert lines == [f"embvar report: {'interrupted' if sig == 'SIGINT' else 'terminated (SIGTERM)'}"], err
    assert proc.returncode == (130 if sig == "SIGINT" else 143)


BUILD = """
import sys, torch
from embvar_study.train import train_run
torch.set_num_threads(1)
out, warm = sys.argv[1], sys.argv[2] == "warm"
base = dict(model="tiny-distilbert", dataset="bundled", n_train=32, n_eval=16, max_length=32, probe_max_length=32, n_probes=16,
            track_every=2, batch_size=8, max_steps=4)
if warm: train_run({**base, "seed": 1, "lr": 5e-4}, out + "_other")   # a warm worker: another run (and its step-0 cache) first
train_run({**base, "seed": 0, "lr": 5e-5}, out)
"""


def test_two_builds_write_the_same_bytes_but_for_complete_even_in_a_warm_worker(tmp_path):
    import subprocess, sys
    from conftest import sha256
    for name, mode in (("cold", "cold"), ("warm", "warm")):    # two processes, different warm-up history
        subprocess.run([sys.executable, "-c", BUILD, str(tmp_path / name), mode], check=True, capture_output=True)
    files = lambda d: {p.relative_to(d).as_posix(): sha256(p) for p in sorted(d.rglob("*")) if p.is_file() and not p.name.startswith(".")}
    a, b = files(tmp_path / "cold"), files(tmp_path / "warm")
    assert a.pop("COMPLETE") and b.pop("COMPLETE") and len(a) > 5
    assert a == b, sorted(k for k in a if a[k] != b.get(k))


# COMPLETE's fields that legitimately differ between two builds of the same run: wall-clock times and durations
TIME_FIELDS = ("started_at", "finished_at", "tracking_s", "live_metrics_s", "timing")


SETS = {"lrs": [5e-5], "seeds": [0, 1], "n_train": 32, "n_eval": 16, "max_length": 32, "probe_max_length": 32, "n_probes": 16}


@pytest.fixture(scope="module")
def two_builds(tmp_path_factory):
    "The smoke profile's lr_sweep (2 tiny runs) built twice through run_study: in this process, and by 2 workers."
    import os, torch
    from embvar_study.sweep import run_study
    out = tmp_path_factory.mktemp("builds")
    old = torch.get_num_threads(); torch.set_num_threads(max(2, (os.cpu_count() or 1) // 2 + 1))   # not the workers' count
    try: run_study("smoke", out / "one", overrides=SETS, experiments=["lr_sweep"], jobs=1, say=None)
    finally: torch.set_num_threads(old)
    run_study("smoke", out / "two", overrides=SETS, experiments=["lr_sweep"], jobs=2, say=None)
    return out / "one", out / "two"


@pytest.mark.slow
def test_two_study_builds_with_1_and_2_workers_write_the_same_run_bytes(two_builds):
    # Before: `--jobs 1` trained in this process at its own torch thread count (a user's default: all cores) and
    # `--jobs 2` in workers at cores/2 threads, and the linear kernel was timed (a choice that flipped under load):
    # every trained step's embeddings differed. Now a CPU run computes at its config's `threads` with a fixed kernel.
    from conftest import sha256
    def files(study):
        return {p.relative_to(study).as_posix(): sha256(p) for p in sorted((study / "runs").rglob("*"))
                if p.is_file() and not any(part.startswith(".") for part in p.relative_to(study).parts)}
    (one, two), a, b = two_builds, *map(files, two_builds)
    completes = [k for k in a if k.endswith("/COMPLETE")]
    assert len(completes) == 2 and len(a) > 10 and set(a) == set(b)
    assert {k for k in a if a[k] != b[k]} <= set(completes), sorted(k for k in a if a[k] != b[k])
    for k in completes:                                  # COMPLETE: the same but for times (checksums, threads, kernels)
        ma, mb = (json.loads((s / k).read_text()) for s in (one, two))
        assert {f: v for f, v in ma.items() if f not in TIME_FIELDS} == {f: v for f, v in mb.items() if f not in TIME_FIELDS}
        assert ma["derived"]["torch_threads"] == 1 and set(ma) == set(mb)


@pytest.mark.slow
def test_runs_on_disk_made_with_other_numerics_are_named_not_mixed_silently(two_builds, monkeypatch):
    # a rebuild with another kernel forced keeps the runs (same identity) but names them in one line; another thread
    # count is another run (its own folder): the default's identity has no `threads`, so old run ids are unchanged
    from embvar_study.config import TrainConfig
    from embvar_study.kernels import onednn_available
    from embvar_study.sweep import run_study
    study, lines = two_builds[1], []
    monkeypatch.setenv("EMBVAR_LINEAR_KERNEL", "onednn" if onednn_available() else "default")
    m = run_study("smoke", study, overrides=SETS, experiments=["lr_sweep"], jobs=1, say=lines.append)["lr_sweep"]
    assert list(m["status"]) == ["skipped", "skipped"]
    named = [x for x in lines if "other numerics" in x]
    if onednn_available():                               # the training kernel was MKL's: both runs named, with what differs
        assert len(named) == 1 and named[0].startswith("2 of the 2 runs on disk") and "linear_kernels" in named[0], lines
        assert all(rid in named[0] for rid in m["run_id"])
    else: assert named == [], lines
    base = dict(model="tiny-distilbert", dataset="bundled")
    assert "threads" not in TrainConfig(**base).identity() and TrainConfig(**base, threads=2).identity()["threads"] == 2
    assert TrainConfig(**base, threads=2).run_id() != TrainConfig(**base).run_id()


def test_lr_1_is_diverged_not_completed(tmp_path, capsys):
    # the issue's `--lr 1`: losses far above chance (0.69) were recorded as completed, since only losses > 1e3 counted
    main(["train", *TRAIN, "--lr", "1", "--out", str(tmp_path / "r")])
    m = json.loads((tmp_path / "r" / "COMPLETE").read_text())
    assert m["status"] == "diverged" and "above 10 x the first step's" in m["diverged_because"], m.get("diverged_because")
    assert m["divergence_rule"]["factor"] == 10 and 0.5 < m["divergence_rule"]["first_loss"] < 1
    assert re.search(r": diverged \(training loss [\d.e+]+ at step \d+", capsys.readouterr().out)


def test_duplicates_across_the_subsets_leave_evaluation_and_are_counted(tmp_path):
    import pandas as pd
    from embvar_study.config import TrainConfig
    from embvar_study.train import prepare_data
    texts = [f"review number {i % 50}, said twice" for i in range(100)]           # every text in two rows
    f = _write(tmp_path / "dup.csv", pd.DataFrame({"text": texts, "label": [i % 2 for i in range(50)] * 2}))
    with pytest.warns(UserWarning, match=r"removed \d+ of \d+ evaluation examples whose text also occurs in the training subset"):
        tr, ev, _ = prepare_data(TrainConfig(dataset=str(f), n_train=40, n_eval=20, n_probes=4))
    n = tr.attrs["derived"]["eval_duplicates_removed"]
    assert n > 0 and not set(tr["text"]) & set(ev["text"]) and len(ev) == 20 - n


def test_a_runs_report_labels_runs_by_what_differs(tmp_path):
    # runs of two datasets, same seeds: labelled by the dataset (they were all "seed 0")
    from embvar_study.data import load_texts
    from embvar_study.study import study_from_runs
    other = tmp_path / "other.csv"; load_texts("bundled").sample(frac=1, random_state=1).to_csv(other, index=False)
    for name, ds in (("a", "bundled"), ("b", str(other))):
        flags = [x if x != "bundled" else ds for x in TRAIN]
        main(["train", *flags, "--max-steps", "2", "--out", str(tmp_path / "runs" / name)])
    assert study_from_runs([tmp_path / "runs"]).runs("runs").labels() == ["dataset bundled", "dataset other.csv"]


# ---------------------------------------------------------------- issue 33: nothing silently wrong

def _flip(f, byte: int = -2, mask: int = 0x40):
    "Flip bits of one byte of `f` (an exponent bit by default), size and modification time kept: bit rot."
    import os
    st = f.stat(); b = bytearray(f.read_bytes()); b[byte] ^= mask; f.write_bytes(bytes(b)); os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))


READ_IN_A_FRESH_PROCESS = """
import sys
from embvar_study.runs import load_run, CorruptRunError
try: load_run(sys.argv[1]).embeddings(-1, "mean"); print("read")
except CorruptRunError as e: print("refused:", e)
"""


def test_a_flipped_exponent_bit_is_refused_by_every_process_that_reads_it_naming_the_file(tmp_path):
    import subprocess, sys
    from embvar_study.runs import verify_run
    from embvar_study.synthetic import synthetic_study
    from embvar_study.study import load_study
    sd = synthetic_study(tmp_path / "syn")
    run = load_study(sd).runs("lr_sweep").runs[0].path; f = run / "embeddings" / "step_000012.mean.npy"
    verify_run(run)                                                   # hashed in this process, then rotted
    _flip(f)
    outs = [subprocess.run([sys.executable, "-c", READ_IN_A_FRESH_PROCESS, str(run)], capture_output=True, text=True).stdout
            for _ in range(4)]                                        # the cached check let this through 4 times of 4
    assert all(o.startswith(f"refused: {f}: checksum mismatch with COMPLETE of run {run.name}") for o in outs), outs
    assert all(len(o.strip().splitlines()) == 1 and "nothing is computed from it" in o for o in outs)
    from embvar_study import runs as R
    R._VERIFIED.clear()                                               # this process, as a new one: the Study path refuses too
    with pytest.raises(R.CorruptRunError, match="step_000012.mean.npy: checksum mismatch"):
        load_study(sd).runs("lr_sweep").stack(-1, "mean")
    _flip(f)                                                          # repaired
    g = sorted((sd / "runs").glob("*/embeddings/step_000006.mean.npy"))[0]
    import numpy as np
    n = g.stat().st_size; nan = np.float32(np.nan).tobytes()
    st = g.stat(); b = bytearray(g.read_bytes()); b[n - 8:n - 4] = nan; g.write_bytes(bytes(b))   # NaN bytes, size kept
    import os; os.utime(g, ns=(st.st_atime_ns, st.st_mtime_ns))
    o = subprocess.run([sys.executable, "-c", READ_IN_A_FRESH_PROCESS, str(g.parent.parent)], capture_output=True, text=True).stdout
    assert o.startswith(f"refused: {g}: checksum mismatch"), o          # named, not "array must not contain infs or NaNs"


@pytest.mark.slow
def test_only_report_never_trains_a_damaged_or_missing_run(diverged_study, tmp_path, capsys):
    import shutil
    from conftest import folder_state
    sd = tmp_path / "copy"; shutil.copytree(diverged_study, sd)
    f = sorted((sd / "runs").glob("*/embeddings/step_000002.mean.npy"))[0]; _flip(f)
    before = folder_state(sd / "runs")
    with pytest.raises(SystemExit) as e: main(["report", "--profile", "smoke", "--only-report", "--out", str(sd)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "Traceback" not in err
    assert "1 damaged or missing run(s); --only-report trains nothing, so the report was not rendered" in err
    assert f"runs/{f.parent.parent.name}: {f}: checksum mismatch" in err
    assert folder_state(sd / "runs") == before and not (sd / "damaged").exists()     # nothing moved aside, nothing trained
    _flip(f); gone = sorted(p for p in (sd / "runs").iterdir() if p.is_dir() and not p.name.startswith("."))[0]; shutil.rmtree(gone)
    with pytest.raises(SystemExit) as e: main(["report", "--profile", "smoke", "--only-report", "--out", str(sd)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"runs/{gone.name}: missing: the manifest of lr_sweep lists it as done" in err
    assert not gone.exists()


def test_a_notebook_of_only_report_refuses_to_train(tmp_path):
    "embvar report executes its notebooks with train=False: with runs missing, the notebook's call refuses and writes nothing."
    from embvar_study.report import experiment_runs
    from embvar_study.study_folder import NotComputed
    with pytest.raises((NotComputed, FileNotFoundError)):
        experiment_runs("smoke", "lr_sweep", tmp_path / "s", train=False)
    assert not (tmp_path / "s").exists()


def test_runs_from_checks_its_folders_before_any_work_and_counts_per_folder(tmp_path, capsys):
    out = tmp_path / "new"
    _refused(capsys, ["report", "--profile", "smoke", "--runs-from", str(tmp_path), "rep/doesnotexist", "--out", str(out)],
             "embvar report: error: --runs-from: rep/doesnotexist is not there; expected a study folder or a folder of run folders")
    assert not out.exists()


ONE_STEP = ["--model", "tiny-distilbert", "--dataset", "bundled", "--n-train", "16", "--n-eval", "8", "--n-probes", "8",
            "--max-length", "16", "--probe-max-length", "16", "--max-steps", "1", "--track-every", "1", "--no-progress"]


def test_train_refuses_a_bad_alarm_before_any_work_and_leaves_nothing(tmp_path, capsys, monkeypatch):
    import embvar_study.train as T
    loaded = []
    monkeypatch.setattr(T, "prepare_data", lambda *a, **k: loaded.append(1) or (_ for _ in ()).throw(AssertionError("data loaded")))
    out = tmp_path / "run"
    _refused(capsys, ["train", *ONE_STEP, "--alarm", '{"threshold":0.1,"layer":99}', "--out", str(out)],
             "embvar train: error: --alarm layer: expected an int in [-3, 2] (tiny-distilbert has 2 layers: 3 saved hidden states), got 99")
    _refused(capsys, ["train", *ONE_STEP, "--alarm", '{"threshold":0.1,"signal":"loss"}', "--out", str(out)],
             "embvar train: error: --alarm signal: expected one of ('drift', 'drift_velocity'), got 'loss'")
    _refused(capsys, ["train", *ONE_STEP, "--alarm", str(tmp_path / "nope.json"), "--out", str(out)],
             "embvar train: error: --alarm: cannot read a rule from")
    assert loaded == [] and not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == []


def test_train_takes_an_alarm_rule_file_and_the_corrected_command_is_not_blocked(tmp_path, capsys):
    out = tmp_path / "run"
    with pytest.raises(SystemExit): main(["train", *ONE_STEP, "--alarm", '{"threshold":0.1,"layer":99}', "--out", str(out)])
    rule = tmp_path / "rule.json"; rule.write_text(json.dumps({"threshold": 0.5, "layer": -1}))
    main(["train", *ONE_STEP, "--alarm", str(rule), "--out", str(out)])        # not "refusing to overwrite"
    m = json.loads((out / "COMPLETE").read_text())
    assert m["alarm"]["rule"]["threshold"] == 0.5 and m["status"] in ("completed", "stopped_by_alarm")


def test_a_set_up_refusal_removes_the_folder_it_created(tmp_path):
    from embvar_study.train import train_run
    from embvar_study.config import TrainConfig
    cfg = TrainConfig(model="tiny-distilbert", dataset="bundled", n_train=16, n_eval=8, n_probes=8, max_length=10_000, max_steps=1)
    with pytest.raises(ValueError, match="max_length: expected at most 256"): train_run(cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_errors_name_the_flag_and_value_not_a_hub_model_or_a_bare_n(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mdl").mkdir(); (tmp_path / "mdl" / "config.json").write_text("{}")
    _refused(capsys, ["train", "--model", "mdl/config.json", "--dataset", "bundled", "--out", "run"],
             "embvar train: error: --model: 'mdl/config.json' is a file; expected a model folder (the folder that holds config.json")
    (tmp_path / "p3.csv").write_text("text\none probe\ntwo probe\nthree probe\n")
    _refused(capsys, ["train", *ONE_STEP[:-7], "--probes", "p3.csv", "--n-probes", "10", "--out", "run"],
             "embvar train: error: --n-probes: expected at most 3 probes (all that are available), got 10 in probes='p3.csv'")
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == ["mdl", "p3.csv"]   # no partial run folder (the lock file stays, by design)


def test_a_message_never_holds_a_model_repr(tmp_path):
    import torch
    from embvar_study.data import load_texts, load_probes
    model = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(20)])        # its repr: ~900 characters, 22 lines
    for f in (load_texts, load_probes):
        with pytest.raises(ValueError) as e: f(model)
        msg = str(e.value)
        assert "\n" not in msg and len(msg) < 200 and msg.endswith("got a torch.nn.modules.container.Sequential object"), msg


def test_a_runs_report_never_pools_lora_with_full_fine_tuning(tmp_path):
    from embvar_study.study import study_from_runs
    for name, lr, extra in (("a", "5e-4", ["--seed", "0"]), ("b", "5e-4", ["--seed", "1"]), ("lora4", "5e-4", ["--lora-r", "4"]),
                            ("lrhuge", "1e-2", [])):
        main(["train", *ONE_STEP, "--lr", lr, *extra, "--out", str(tmp_path / "runs" / name)])
    st = study_from_runs([tmp_path / "runs"])
    groups = {f: sorted(r.path.name for r in st.runs("runs", f).runs) for f in sorted(set(st.manifests["runs"]["factor"]))}
    assert groups == {"0.01 · full fine-tuning": ["lrhuge"], "5e-4 · LoRA r=4": ["lora4"], "5e-4 · full fine-tuning": ["a", "b"]}
    assert st.spec["group_by"] == "lr and LoRA r" and st.runs("runs").table["lora_r"].tolist().count(4) == 1
    labels = dict(zip([r.path.name for r in st.runs("runs").runs], st.runs("runs").labels()))
    assert labels["lora4"].startswith("LoRA r=4") and labels["a"].startswith("full fine-tuning")
