"""The CI end-to-end check: `run_report("smoke")` runs every experiment notebook and the report through papermill,
writes a self-contained report.html whose numbers are the analysis tables of the runs on disk, and a second call
recomputes nothing. The smoke study is run once for the module (about 1-3 minutes on CPU)."""
import html as html_lib
import re
from pathlib import Path

import nbformat
import pytest

from embvar_study import analysis
from embvar_study.cli import EXPERIMENTS, run_report
from embvar_study.runs import load_run
from embvar_study.sweep import experiment_grid, get_profile, load_manifest

REQUIRED = ("lr_sweep", "seed_sweep", "perturbation")


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("smoke_report")
    dest = run_report("smoke", out=out, progress=False)
    return {"out": out, "html_path": dest, "html": Path(dest).read_text(encoding="utf-8")}


def notebook_outputs(path):
    "(output_type, stream name or None, text) of every output of every code cell of an executed notebook."
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type != "code": continue
        for o in cell.get("outputs", []):
            if o.output_type == "stream": text = o.get("text", "")
            elif o.output_type == "error": text = "\n".join(o.get("traceback", [])) + o.get("evalue", "")
            else: text = "\n".join(str(v) for k, v in o.get("data", {}).items() if k.startswith("text/"))
            yield o.output_type, o.get("name"), text


def reference_rows_in_html(page: str) -> list[dict]:
    "The rows of the first table after the 'Against the reference result' heading, as {column: cell text}."
    start = page.index("Against the reference result")
    table = page[page.index("<table", start):page.index("</table>", start)]
    strip = lambda s: html_lib.unescape(re.sub(r"<[^>]+>", "", s)).strip()
    head = [strip(h) for h in re.findall(r"<th[^>]*>(.*?)</th>", table.split("</thead>")[0], flags=re.S)]
    rows = []
    for tr in re.findall(r"<tr[^>]*>(.*?)</tr>", table.split("</thead>")[1], flags=re.S):
        cells = [strip(c) for c in re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", tr, flags=re.S)]
        rows.append(dict(zip(head, cells)))
    return rows


def assert_shown(text: str, value: float, what: str):
    "`text` is `value` rounded to the digits it shows (fixed or scientific notation)."
    m = re.fullmatch(r"(-?\d+)(?:\.(\d+))?(?:e([+-]\d+))?", text)
    assert m, f"{what}: {text!r} is not a number"
    half_ulp = 0.5 * 10.0 ** (int(m.group(3) or 0) - len(m.group(2) or ""))
    assert abs(float(text) - value) <= half_ulp * (1 + 1e-6) + 1e-15, f"{what}: shown {text}, computed {value!r}"


def test_report_html_exists_and_is_self_contained(smoke):
    page = smoke["html"]
    assert Path(smoke["html_path"]) == smoke["out"] / "report.html"
    assert page.count("data:image/png") >= 6                       # figures are embedded, not linked
    assert not re.search(r"<img[^>]+src=[\"'](?!data:)", page)      # no image file or URL
    assert not re.search(r"<link[^>]+href=[\"']https?://", page)     # styles are inline
    # the only external scripts are nbconvert's own loaders (require.js, MathJax)
    for src in re.findall(r"<script[^>]+src=[\"']([^\"']+)", page):
        assert re.match(r"https://(cdnjs\.cloudflare\.com/ajax/libs/(require\.js|mathjax)/|cdn\.jsdelivr\.net/npm/mathjax)", src), src
    assert not list(smoke["out"].glob("report_files")) and not list(smoke["out"].glob("*.png"))


def test_report_has_the_headline_sections_and_no_errors(smoke):
    page = smoke["html"]
    for text in ("Drift over training", "Against the reference result", "<th>drift_first</th>", "<th>drift_last</th>"):
        assert text in page, text
    assert "Traceback" not in page
    assert not re.search(r"\w+Error: ", page)


def test_executed_notebooks_have_no_errors(smoke):
    names = list(dict.fromkeys([*REQUIRED, *EXPERIMENTS, "report"]))
    for name in names:
        path = smoke["out"] / "notebooks" / f"{name}.ipynb"
        assert path.is_file(), name
        nb = nbformat.read(path, as_version=4)
        assert not nb.metadata["papermill"].get("exception"), name
        assert nb.metadata["papermill"]["parameters"]["profile"] == "smoke"
        code = [c for c in nb.cells if c.cell_type == "code"]
        assert all(c.get("execution_count") for c in code), f"{name}: a cell was not executed"
        for kind, stream, text in notebook_outputs(path):
            assert kind != "error", f"{name}: {text[-1500:]}"
            assert "Traceback" not in text, f"{name}: {text[-1500:]}"
            assert not re.search(r"\w+Error: ", text), f"{name}: {text[-1500:]}"


def test_manifests_list_every_run_as_done(smoke):
    out, prof = smoke["out"], get_profile("smoke")
    for name in EXPERIMENTS:
        m = load_manifest(out, name)
        assert len(m) == len(experiment_grid(prof, name)), name
        assert set(m["status"]) <= {"completed", "skipped"}, (name, m[["run_id", "status", "error"]])
        assert (m["error"] == "").all()
        for p in m["path"].unique():
            assert load_run(out / p).status == "completed"


def test_report_numbers_are_the_analysis_tables(smoke):
    runs = analysis.sweep_runs(smoke["out"], "lr_sweep")
    ref = analysis.reference_table(runs)                              # the report's defaults: last layer, mean pooling
    assert len(ref) == len(get_profile("smoke")["lrs"])
    page = smoke["html"]
    shown = reference_rows_in_html(page)
    assert len(shown) == len(ref)
    for (_, r), row in zip(ref.iterrows(), shown):
        line = (f"lr {r['lr']:g}: drift {r['drift_first']:.3f} (step {r['first_step']}) → {r['drift_last']:.3f} "
                f"(step {r['last_step']})")
        assert line in page, line
        assert f"Training loss {r['loss_first']:.3f} → {r['loss_last']:.3f}" in page
        # the table shows the same values, rounded
        for col in ("lr", "drift_first", "drift_last", "loss_first", "loss_last"):
            assert_shown(row[col], r[col], col)
        assert int(row["last_step"]) == r["last_step"] and int(row["n_seeds"]) == r["n_seeds"]


def test_rerun_recomputes_nothing_and_renders_again(smoke):
    # last in this file: it re-executes every notebook in the same folder
    out = smoke["out"]
    run_dirs = sorted(p.parent for p in (out / "runs").glob("*/COMPLETE"))
    before = {p: (p / "COMPLETE").stat().st_mtime_ns for p in run_dirs}
    html_before = (out / "report.html").stat().st_mtime_ns
    dest = run_report("smoke", out=out, progress=False)
    assert Path(dest) == out / "report.html" and dest.stat().st_mtime_ns > html_before
    for name in EXPERIMENTS:
        m = load_manifest(out, name)
        assert set(m["status"]) == {"skipped"}, (name, list(m["status"]))
    assert sorted(p.parent for p in (out / "runs").glob("*/COMPLETE")) == run_dirs   # no new run
    assert {p: (p / "COMPLETE").stat().st_mtime_ns for p in run_dirs} == before
    page = dest.read_text(encoding="utf-8")
    assert page.count("data:image/png") >= 6 and "Against the reference result" in page
    ref = analysis.reference_table(analysis.sweep_runs(out, "lr_sweep"))
    for _, r in ref.iterrows():
        assert f"drift {r['drift_first']:.3f} (step {r['first_step']}) → {r['drift_last']:.3f}" in page
