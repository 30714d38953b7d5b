"""Every interval table of a rendered report section says how its intervals were made (or why they were refused): the line
under it comes from the analysis (`attrs['ci_method']`), never 'the method was not recorded'."""
import html, re, tempfile
from pathlib import Path

import pytest

from embvar_study import display as D, sections as S
from embvar_study.study import load_study
from embvar_study.synthetic import synthetic_study

# each section that holds interval tables, and how many it shows on the synthetic study (so the check cannot pass on none)
SECTIONS = {S.section_drift: 1, S.section_reference: 1, S.section_schedule: 2, S.section_effects: 1, S.section_components: 2,
            S.section_early_warning: 1, S.section_agreement: 1}


@pytest.fixture(scope="module")
def study():
    return load_study(synthetic_study(Path(tempfile.mkdtemp()) / "syn", steps=6))


def interval_tables(page: str) -> list[tuple[str, list[str], str | None]]:
    "(caption, headers, method line or None) of every table of the page whose headers hold an interval (a 'CI' column)."
    out = []
    for m in re.finditer(r'<table class="embvar">(.*?)</table>(?:<p class="method">(.*?)</p>)?', page, flags=re.S):
        heads = [html.unescape(h) for h in re.findall(r"<th>(.*?)</th>", m.group(1))]
        cap = re.search(r"<caption>(.*?)</caption>", m.group(1), flags=re.S)
        if any(re.search(r"\bCI\b", h) for h in heads):
            out.append((html.unescape(cap.group(1)) if cap else "", heads, html.unescape(m.group(2)) if m.group(2) else None))
    return out


@pytest.mark.parametrize("section", SECTIONS, ids=lambda s: s.__name__)
def test_every_interval_table_states_its_method(study, section):
    page = "\n".join(D.to_html(i) for i in S.section_items(section, study, n_resamples=50))
    found = interval_tables(page)
    assert len(found) == SECTIONS[section], f"{section.__name__}: {len(found)} interval tables ({[c for c, _, _ in found]})"
    for cap, heads, method in found:
        assert method is not None, f"{section.__name__}: no method line under {cap!r} ({heads})"
        assert method.startswith("Intervals: ") and "not recorded" not in method, f"{section.__name__}: {cap!r}: {method!r}"


def test_the_check_sees_a_table_without_a_method():
    import pandas as pd
    bare = D.table_html(pd.DataFrame({"drift": [0.1], "ci_low": [0.0], "ci_high": [0.2]}), "x")
    test = interval_tables(bare)
    assert len(test) == 1 and "not recorded" in test[0][2]
    told = pd.DataFrame({"drift": [0.1], "ci_low": [0.0], "ci_high": [0.2]}); told.attrs["ci_method"] = "95% t interval over 3 seeds (2 df)"
    assert interval_tables(D.table_html(told))[0][2] == "Intervals: 95% t interval over 3 seeds (2 df)"
