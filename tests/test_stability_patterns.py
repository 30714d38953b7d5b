"""The stability section never breaks (issue 40): for any outcome pattern (2-14 seeds, 1-7 learning rates, every run
failed, none failed, one mixed rate, ...) and any signals (noise, planted, tied, missing at a fraction), every table of
the analysis renders or is refused with a one-line reason. Synthetic signal tables drawn by hypothesis, no training:
the study's run loading is replaced by the drawn table, the rest is the real `stability_tables` and section."""
import re

import pytest
from unittest import mock

import numpy as np
import pandas as pd
import matplotlib.pyplot as plt
from hypothesis import given, settings, HealthCheck, strategies as st

from embvar_study import stability as ST
from embvar_study import experiment_sections as XS
from embvar_study.display import Table, Figure
from embvar_study.early_warning import STABILITY_FRACTIONS
from embvar_study.sweep import STABILITY_FAILURE

# every part of the section: (how its refusal line starts, the caption its Table or Figure starts with)
PARTS = {"answer figure": ("The answer figure (each signal's within-rate AUC)", "Each signal's stratified AUC"),
         "increment": ("Drift's incremental value", "Drift's incremental value"),
         "early stopping": ("Dodge et al.'s early stopping", "Dodge et al.'s early stopping per configuration"),
         "alarm": ("The alarm's cost", "The alarm's cost"),
         "within AUC": ("The stratified AUC table", "Stratified AUC for failure"),
         "pooled AUC": ("The pooled AUC", "Pooled AUC over all runs")}


def _signals(n_seeds: int, fails: list[list[bool]], kind: str, seed: int) -> pd.DataFrame:
    "One row per run and fraction with the columns stability_signals gives; `kind`: noise, planted (drift), tied (constant signals) or gap (a signal missing at one fraction)."
    rng, rows = np.random.default_rng(seed), []
    for i, fail in enumerate(fails):
        for s in range(n_seeds):
            f_ = bool(fail[s])
            for f in STABILITY_FRACTIONS:
                v = {f"drift_{l}": 0.1 * f + rng.normal(0, 0.02) for l in range(3)}
                v.update(velocity=rng.normal(), train_loss=rng.normal(0.69, 0.02), grad_norm=rng.normal(1, 0.1), eval_acc=rng.normal(0.55, 0.03),
                         eval_loss=rng.normal(0.69, 0.01), loss_decay=rng.normal(0.1, 0.02), effective_rank=rng.normal(20, 1))
                if kind == "planted": v["drift_2"] += 0.05 * f_
                if kind == "tied": v.update({k: 1.0 for k in v})
                if kind == "gap" and f == STABILITY_FRACTIONS[0]: v["grad_norm"] = np.nan
                rows.append({"run_id": f"l{i}s{s:02d}", "lr": 1e-4 * (i + 1), "seed": s, "chance": 0.5, "failed": f_, "failure_step": np.nan,
                             "final_acc": 0.5 if f_ else 0.75, "fraction": f, "step": int(f * 40), "total_steps": 40, **v})
    return pd.DataFrame(rows)


@st.composite
def outcome_patterns(draw):
    n_seeds, n_rates = draw(st.integers(2, 14)), draw(st.integers(1, 7))
    shape = draw(st.sampled_from(["any", "all failed", "none failed", "one mixed", "one failed run"]))
    if shape == "all failed": fails = [[True] * n_seeds for _ in range(n_rates)]
    elif shape == "none failed": fails = [[False] * n_seeds for _ in range(n_rates)]
    elif shape == "one mixed": fails = [[k == 0] * n_seeds if r else [s % 2 == 0 for s in range(n_seeds)] for r, k in enumerate(range(n_rates))]
    elif shape == "one failed run": fails = [[r == 0 and s == 0 for s in range(n_seeds)] for r in range(n_rates)]
    else: fails = [draw(st.lists(st.booleans(), min_size=n_seeds, max_size=n_seeds)) for _ in range(n_rates)]
    return n_seeds, fails, draw(st.sampled_from(["noise", "planted", "tied", "gap"])), draw(st.integers(0, 2**16))


class _Study:   # what stability_tables reads of a study, the runs replaced by the drawn signal table
    spec = {"resolved": {"failure": STABILITY_FAILURE}}
    def runs(self, *a, **k): return None


def _render(sig: pd.DataFrame) -> list:
    with mock.patch.object(ST, "tracked_fractions", lambda rs, *a, **k: (STABILITY_FRACTIONS, [])), \
         mock.patch.object(ST, "stability_signals", lambda *a, **k: sig):
        try: return XS.stability_section(_Study())
        finally: plt.close("all")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(outcome_patterns())
def test_every_table_renders_or_is_refused(pattern):
    n_seeds, fails, kind, seed = pattern
    items = _render(_signals(n_seeds, fails, kind, seed))
    text = [i for i in items if isinstance(i, str)]
    caps = [i.caption for i in items if isinstance(i, Table)] + [i.alt for i in items if isinstance(i, Figure)]
    for part, (refusal, caption) in PARTS.items():
        shown = any(c.startswith(caption) for c in caps)
        refused = [t for t in text if t.startswith(f"*{refusal}: not computed, ")]
        assert shown != bool(refused), (part, shown, refused)                       # exactly one of the two
        assert all("\n" not in t and len(t) > len(refusal) + 20 for t in refused)   # one line, with a reason
    assert any(c.startswith("Failed and learned runs per learning rate") for c in caps)
    answer = [t for t in text if t.startswith("**Does drift add anything beyond the learning rate?** ")]
    assert len(answer) == 1
    assert not any(re.search(r"\bnan\b", t, re.I) for t in text), text               # never a silent NaN in a sentence
    mixed = any(any(f) and not all(f) for f in fails)
    assert mixed == any(c.startswith("Stratified AUC for failure") for c in caps)    # refused exactly when no rate has both outcomes


def test_the_reported_crashes_render():
    "The two patterns of the issue (a fold's training seeds hold no failed-learned pair) now give a page with every table."
    for fails in ([[True, False, False]], [[False, True], [True, True]]):
        items = _render(_signals(len(fails[0]), fails, "planted", 0))
        assert sum(isinstance(i, Table) for i in items) >= 3
        ws = ST.within_scores(_signals(len(fails[0]), fails, "planted", 0))
        assert ws["chosen"].str.contains("no pair on the other seeds").any()          # the default, said where it was used


def test_a_section_of_an_experiment_never_run_is_left_out(tmp_path):
    "A page lists only the sections its experiments produce: an experiment the study never ran is NotRun, shown as not applicable (the page drops it), not 'not computed'."
    import nbformat
    from embvar_study.study import load_study
    from embvar_study.study_folder import NotRun, NotComputed
    from embvar_study.synthetic import synthetic_study
    from embvar_study import sections as S, report as R
    study = load_study(synthetic_study(tmp_path / "syn"))
    with pytest.raises(NotRun, match="stability experiment was not run"): study.runs("stability")
    assert [str(i) for i in S.section_items(lambda s: s.runs("stability"), study)] == [S.NOT_APPLICABLE]
    items = S.section_items(lambda s: (_ for _ in ()).throw(NotComputed("too few runs")), study)
    assert isinstance(items[0], S.NotComputedNote) and items[0].reason == "too few runs"      # a real gap is still listed
    out = lambda meta: nbformat.v4.new_output("display_data", {"text/html": "<p></p>"}, metadata={"embvar": meta})
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("## Never run"), nbformat.v4.new_code_cell(outputs=[out({"not_applicable": True})]),
                                         nbformat.v4.new_markdown_cell("## Too few"), nbformat.v4.new_code_cell(outputs=[out({"not_computed": "too few runs"})])])
    assert R.take_not_computed(nb) == [("Too few", "too few runs")] and nb.cells == []
