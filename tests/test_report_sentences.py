"""Every sentence of the Conclusions is computed: a study whose effect is reversed or absent says the opposite or 'Not shown';
the README quotes the committed reports' computed findings (compared, not hard-coded)."""
import html, json, re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from embvar_study import display as D, findings as F, sections as S, words as W
from embvar_study.run_writer import RunWriter
from embvar_study.study import load_study
from embvar_study.study_folder import NotComputed, write_manifest, write_study_spec
from embvar_study.storage import config_hash
from embvar_study.synthetic import _synthetic_config, _synthetic_path, _synthetic_design

ROOT = Path(__file__).resolve().parent.parent


def _study(tmp: Path, path_lr: dict, path_schedule: dict | None = None, steps: int = 6, n: int = 12) -> Path:
    """lr_sweep and schedule runs whose configs say (lr, schedule) but whose embeddings move as (path_lr[lr], path_schedule[schedule]) would:
    the effect in the data is chosen by the test, the labels stay those of a real study."""
    rng = np.random.default_rng(0); base = rng.normal(size=(2, n, 6)) + 3.0
    probes = pd.DataFrame({"text": [f"p{i}" for i in range(n)], "sentiment": [0, 1] * (n // 2)})
    design = {e: v for e, v in _synthetic_design((5e-5, 5e-4), (0, 1, 2), 3).items() if e in ("lr_sweep", "schedule")}
    done = {}
    for e, points in design.items():
        rows = []
        for factor, c in points:
            key = json.dumps(c, sort_keys=True)
            if key not in done:
                moved = {**c, "lr": path_lr[c["lr"]], "schedule": (path_schedule or {}).get(c["schedule"], c["schedule"])}
                lrs, cum, emb = _synthetic_path(moved, base, steps)
                with RunWriter(tmp / "runs" / config_hash(c), c, probes) as w:
                    for s in range(steps + 1):
                        if s % 3 == 0 or s == steps: w.save_embeddings(s, {"mean": emb(s), "cls": emb(s)})
                        w.log(step=s, flush=False, lr=float(lrs[s - 1]) if s else 0.0, train_loss=0.69 - 10 * cum[s] if s else None)
                    w.finish(derived={"n_probes": n})
                done[key] = w.config_hash
            rows.append({"factor": factor, **{k: c[k] for k in ("lr", "schedule", "seed", "init_seed", "data_seed", "replicate")},
                         "run_id": done[key], "path": f"runs/{done[key]}", "status": "completed", "error": "", "seconds": 0.0, "node": ""})
        write_manifest(tmp, e, rows)
    write_study_spec(tmp, {"profile": "synthetic", "overrides": {}, "experiments": list(design),
                           "resolved": {"base": _synthetic_config(5e-5, 0, 3), "lrs": [5e-5, 5e-4], "seeds": [0, 1, 2], "ref_lr": 5e-5,
                                        "schedules": ["linear", "constant"]}})
    return tmp


def _kf(study_dir):
    return {f["key"]: f for f in F.key_findings(load_study(study_dir), n_resamples=50)}


def test_lr_effect_as_measured(tmp_path):
    up = _kf(_study(tmp_path / "up", {5e-5: 5e-5, 5e-4: 5e-4}))
    down = _kf(_study(tmp_path / "down", {5e-5: 5e-4, 5e-4: 5e-5}))      # the high rate's runs move as the low rate's did
    flat = _kf(_study(tmp_path / "flat", {5e-5: 2e-4, 5e-4: 2e-4}))      # both move alike: no effect
    assert up["lr_effect"]["verdict"] == "larger" and up["lr_effect"]["text"].startswith("A higher learning rate moves the embeddings further")
    assert down["lr_effect"]["verdict"] == "smaller" and "moves the embeddings less here" in down["lr_effect"]["text"]
    assert "further" not in down["lr_effect"]["text"]
    assert flat["lr_effect"]["verdict"] == "overlap" and flat["lr_effect"]["text"].startswith("Not shown that the learning rate changes final drift")
    # each rate's own number is the one measured, whatever the direction
    assert up["drift_lr_5e-4"]["value"] > up["drift_lr_5e-5"]["value"] and down["drift_lr_5e-4"]["value"] < down["drift_lr_5e-5"]["value"]


def test_schedule_effect_as_measured(tmp_path):
    more = _kf(_study(tmp_path / "more", {5e-5: 5e-5, 5e-4: 5e-4}))
    less = _kf(_study(tmp_path / "less", {5e-5: 5e-5, 5e-4: 5e-4}, {"constant": "linear", "linear": "constant"}))
    none = _kf(_study(tmp_path / "none", {5e-5: 5e-5, 5e-4: 5e-4}, {"constant": "linear"}))
    k = "schedule_constant_5e-4"
    assert more[k]["verdict"] == "larger" and "ends with more drift than the linear one" in more[k]["text"]
    assert less[k]["verdict"] == "smaller" and "ends with less drift than the linear one" in less[k]["text"]
    assert none[k]["verdict"] == "overlap" and none[k]["text"].startswith("Not shown that the schedule changes drift at lr 5e-4")


def test_conclusions_follow_the_findings(tmp_path):
    down = load_study(_study(tmp_path / "down", {5e-5: 5e-4, 5e-4: 5e-5}))
    text = F.findings(down, n_resamples=50)
    bullets = [b for b in text.split("\n") if b.startswith("- ")]
    assert 1 <= len(bullets) <= 5
    assert "moves the embeddings less here" in bullets[0] and "At lr 5e-4 the probes' drift" in bullets[0]   # the rates' drifts with the effect
    assert all(f["text"] in text for f in F.key_findings(down, n_resamples=50))                             # every finding said, none invented


def _visible(html_text: str) -> str:
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", html_text))).strip()


def _readme_quotes() -> dict[str, list[str]]:
    """The bullets of the README's 'What the studies show', grouped by the committed report they quote: a block of bullets
    belongs to the last `reports/NAME/report.html` the text names before it."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    sec = re.search(r"^## What the studies show\n(.*?)(?=^## )", readme, flags=re.S | re.M)
    assert sec, "README.md has no 'What the studies show' section"
    quotes, name, in_bullet = {}, None, False
    for line in sec.group(1).splitlines():
        if line.startswith("- "):
            assert name, f"a README bullet names no report before it: {line[:80]}"
            quotes.setdefault(name, []).append(re.sub(r"\s+", " ", line[2:]).strip()); in_bullet = True
        elif in_bullet and line.startswith("  ") and line.strip():       # a bullet's wrapped continuation line
            quotes[name][-1] += " " + re.sub(r"\s+", " ", line).strip()
        else:
            in_bullet = False
            if named := re.findall(r"reports/(\w+)/report\.html", line): name = named[-1]
    return quotes


def _conclusions(report: Path) -> list[str]:
    page = report.read_text(encoding="utf-8")
    concl = re.search(r'<h2 id="Conclusions">(.*?)(?:<details|<h2 )', page, flags=re.S)
    assert concl, f"{report} has no Conclusions section"
    return [_visible(li) for li in re.findall(r"<li>(.*?)</li>", concl.group(1), flags=re.S)]


def test_arms_in_words():
    "Arms are named by the LoRA rank their runs record (the typed field), never by parsing the arm's name."
    from embvar_study.study import _design_words, arm_label, arm_names
    t = pd.DataFrame({"factor": ["base", "base", "small", "small"], "lora_r": [None, None, 8, 8], "lr": [5e-5, 5e-5, 5e-4, 5e-4], "seed": [0, 1, 0, 1]})
    assert _design_words("lora", t, t) == "2 arms: full fine-tuning at lr 5e-5 (2 seeds); LoRA r=8 at lr 5e-4 (2 seeds)"
    assert arm_names(t) == {"base": "full fine-tuning", "small": "LoRA r=8"}
    named = t.assign(factor=["full", "full", "lora_r64", "lora_r64"])   # an arm's name saying another rank than its runs record: the field wins
    assert arm_names(named) == {"full": "full fine-tuning", "lora_r64": "LoRA r=8"}
    runs = t.assign(factor=["1e-4", "1e-4", "3e-4", "3e-4"]).drop(columns="lora_r")   # a runs report's grouping is not an arm
    assert _design_words("runs", runs, runs).startswith("2 learning rates") and arm_names(runs) == {"1e-4": "1e-4", "3e-4": "3e-4"}
    assert [arm_label(v) for v in (None, float("nan"), 64, 64.0)] == ["full fine-tuning", "full fine-tuning", "LoRA r=64", "LoRA r=64"]


def _lora_study(tmp: Path, steps: int = 6, n: int = 12) -> Path:
    "A lora experiment of two arms x 2 seeds whose LoRA arm is called 'adapter': only its runs' configs say rank 8."
    rng = np.random.default_rng(0); base = rng.normal(size=(2, n, 6)) + 3.0
    probes = pd.DataFrame({"text": [f"p{i}" for i in range(n)], "sentiment": [0, 1] * (n // 2)})
    rows = []
    for factor, lr, extra in (("full", 5e-5, {}), ("adapter", 5e-4, {"lora_r": 8})):
        for seed in (0, 1):
            c = {**_synthetic_config(lr, seed, 3), **extra}
            lrs, cum, emb = _synthetic_path(c, base, steps)
            with RunWriter(tmp / "runs" / config_hash(c), c, probes) as w:
                for s in range(steps + 1):
                    if s % 3 == 0 or s == steps: w.save_embeddings(s, {"mean": emb(s), "cls": emb(s)})
                    w.log(step=s, flush=False, lr=float(lrs[s - 1]) if s else 0.0, train_loss=0.69 - 10 * cum[s] if s else None,
                          **({"eval_loss": 0.5, "eval_acc": 0.8 + 0.01 * seed} if s == steps else {}))
                w.finish(derived={"n_probes": n})
            rows.append({"factor": factor, "lr": lr, "seed": seed, "lora_r": extra.get("lora_r", ""), "run_id": w.config_hash,
                         "path": f"runs/{w.config_hash}", "status": "completed", "error": "", "seconds": 0.0, "node": ""})
    write_manifest(tmp, "lora", rows)
    write_study_spec(tmp, {"profile": "synthetic", "overrides": {}, "experiments": ["lora"],
                           "resolved": {"base": _synthetic_config(5e-5, 0, 3), "lrs": [5e-5, 5e-4], "seeds": [0, 1], "ref_lr": 5e-5}})
    return tmp


def test_lora_arms_are_labelled_from_the_rank_their_runs_record(tmp_path):
    "The LoRA arm is called 'adapter': the design table carries each run's lora_r as an int, and every label in the report comes from it."
    from embvar_study import experiment_sections as X
    from embvar_study.study import arm_names
    study = load_study(_lora_study(tmp_path))
    t = study.runs("lora").table
    assert [(f, r) for f, r in zip(t["factor"], t["lora_r"])] == [("full", None)] * 2 + [("adapter", 8)] * 2   # typed, not the manifest's text
    assert type(t["lora_r"].iloc[-1]) is int and arm_names(t) == {"adapter": "LoRA r=8", "full": "full fine-tuning"}
    assert study.design("lora") == "2 arms: LoRA r=8 at lr 5e-4 (2 seeds); full fine-tuning at lr 5e-5 (2 seeds)"
    _answer, arms, cmp_, layers = X.section_lora(study, n_resamples=50)[:4]
    assert sorted(arms.df["arm"]) == ["LoRA r=8", "full fine-tuning"] and cmp_.df["arm"].tolist() == ["LoRA r=8"]
    assert "lora_r" not in cmp_.df and [c for c in layers.df.columns if c != "layer"] == ["drift, LoRA r=8", "drift, full fine-tuning"]
    table = S.section_drift(study, "lora", by="factor", n_resamples=50)[1].df
    assert sorted(table["group"]) == ["LoRA r=8", "full fine-tuning"]
    runs = X.section_experiment(study, "lora")[1].df["run"].tolist()
    assert all(r.startswith(("LoRA r=8", "full fine-tuning")) for r in runs) and not any("adapter" in r for r in runs)


def test_seed_dispersion_caption_names_each_group_once_with_its_computed_values(tmp_path):
    "The caption leads with the group that ends most dispersed, then the others, each once, with the table's numbers."
    study = load_study(_study(tmp_path, {5e-5: 5e-5, 5e-4: 5e-4}))
    fig, table = S.section_seed_variance(study)
    last = table.df.set_index("runs")
    big = last["raw_dispersion"].idxmax()
    assert fig.alt.count("all seeds, lr") == len(last) == 2
    assert f"largest at the end: {big}, raw {W.format_value(last.loc[big, 'raw_dispersion'])}" in fig.alt
    for runs, row in last.iterrows():
        assert f"aligned {W.format_value(row['aligned_dispersion'])}" in fig.alt


_NUMBER = r"(?<![\w.])[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?(?![\w.])"


def _readme_tables(heading: str) -> dict[str, list[str]]:
    "Table rows of the README section starting at `heading` (up to the next `## `), grouped by the report named last before them."
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    sec = re.search(r"^(" + re.escape(heading) + r".*?)(?=^## )", readme, flags=re.S | re.M)
    assert sec, f"README.md has no section {heading!r}"
    rows, name = {}, None
    for line in sec.group(1).splitlines():
        if line.startswith("|") and not re.match(r"^\|[-| :]+\|$", line):
            if name: rows.setdefault(name, []).append(line)
        elif named := re.findall(r"reports/(\w+)/report\.html", line):
            name = named[-1]
        elif re.search(r"`(tests|benchmarks)/\w+\.py`", line):
            name = None                       # numbers from a test or benchmark follow, not a report's
    return rows


def test_mitigation_caption_names_the_lowest_measured_row_and_the_seed_identity(tmp_path):
    """The caption's 'lowest' is the measured (checkpoint-average) row with the smallest relative dispersion, with its own
    size; the seed-average rows are the exact 1/s identity and are said to be one."""
    study = load_study(_study(tmp_path, {5e-5: 5e-5, 5e-4: 5e-4}))
    fig, table = S.section_mitigation(study)
    t = table.df; meas = t[t["how"] == "measured"]; seeds = t[t["method"] == "seed average"]
    best = meas.loc[meas["relative"].idxmin()]
    assert f"lowest: {best['method']} of {best['size']} leaves" in fig.alt and "not a measurement" in fig.alt
    assert meas["size"].nunique() > 1 and len(t) != best["size"]     # a row's size, not the table's length
    np.testing.assert_allclose(seeds["relative"], 1 / seeds["size"], rtol=1e-12)
    assert f"s = 1 to {len(study.runs('lr_sweep').where(lr=5e-5)) // 2} here" in fig.alt       # the study's own seed count


def test_seed_variance_names_the_experiments_it_needs(tmp_path):
    "A study without a learning-rate or seed sweep is told which experiments the section reads, not that its seeds are missing."
    study = load_study(_study(tmp_path, {5e-5: 5e-5, 5e-4: 5e-4}))
    study.has = lambda experiment: False                      # as a study that ran neither (the stability profile)
    with pytest.raises(NotComputed, match="neither the seed_sweep nor the lr_sweep experiment was run"):
        S.section_seed_variance(study)


def test_perturbations_and_components_are_named_in_words(shared_study):
    "Perturbation kinds and variance components reach the reader as words, in tables, captions and figure legends."
    from embvar_study.words import value_label
    from embvar_study.config import PERTURB_KINDS
    study = shared_study
    fig, table = S.section_perturbation(study)
    raw = [k for k in PERTURB_KINDS if "_" in k]
    shown = [fig.alt, " ".join(map(str, table.df.iloc[:, 0])),
             " ".join(t.get_text() for ax in fig.fig.axes if ax.get_legend() for t in ax.get_legend().get_texts())]
    for text in shown:
        assert not any(k in text for k in raw), text
    assert value_label("mc_dropout") in shown[0] or value_label("token_dropout") in shown[0]
    sentence, a, b = S.section_components(study)
    for text in (sentence, " ".join(a.df["component"]), " ".join(b.df["component"])):
        assert "init_seed" not in text and "data_seed" not in text, text
    assert "head seed × data seed" in " ".join(a.df["component"])
    assert a.df.attrs.get("ci_method") or D.method_line(a.df)        # the interval method still travels with the table


def test_the_drift_ratio_compares_groups_at_one_step():
    "One group tracked to step 96, another stopped at step 2: the caption's ratio is at a step both tracked, never 96 against 2."
    import matplotlib.pyplot as plt
    s = pd.DataFrame({"lr": [5e-4] * 4 + [5e-5] * 2, "step": [0, 2, 48, 96, 0, 2], "drift": [0.0, 0.02, 0.4, 0.8, 0.0, 0.01]})
    fig, _ = plt.subplots(); cap = S._drift_caption(s, "lr", fig); plt.close(fig)
    assert "moves the probes 2.0x as far as" in cap and "at step 2;" in cap, cap            # 0.02 / 0.01 at step 2, not 0.8 / 0.01
    disjoint = s.assign(step=[0, 4, 48, 96, 0, 2])                                        # no step after 0 tracked by both
    fig, _ = plt.subplots(); cap = S._drift_caption(disjoint, "lr", fig); plt.close(fig)
    assert "80.0x as far as" in cap and "(step 96 against step 2: no step tracked by every group)" in cap, cap
