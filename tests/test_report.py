"""The report as a reader gets it: `embvar report --profile smoke` runs every experiment and renders one HTML page with a
real title, a table of contents, a provenance header, tables formatted for reading (no index column, lr as 5e-5), no
remote resource; its numbers are the analysis tables'; a second call trains nothing. The templates hold parameters,
narrative and display calls only. A study without the seed sweep still renders (the early warning falls back)."""
import ast, html as html_lib, json, re
from pathlib import Path

import nbformat
import pandas as pd
import pytest

from conftest import TINY_SIZES, set_args
from embvar_study import analysis
from embvar_study.cli import main
from embvar_study.report import execute_notebooks, render_html, template_dir, template_for
from embvar_study.words import format_value
from embvar_study.study import load_study
from embvar_study.synthetic import synthetic_study
from embvar_study.study_folder import write_study_spec
from embvar_study.sweep import EXPERIMENT_NAMES

SMOKE = set_args(TINY_SIZES)   # the smoke profile at the tiny run's size (conftest.py)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("smoke_report") / "study"
    main(["report", "--profile", "smoke", "--out", str(out), *SMOKE])
    return {"out": out, "html": (out / "report.html").read_text(encoding="utf-8")}


def tables(page: str) -> list[tuple[list[str], list[list[str]]]]:
    "(headers, rows of cell texts) of every table of the page."
    strip = lambda s: html_lib.unescape(re.sub(r"<[^>]+>", "", s)).strip()
    out = []
    for t in re.findall(r"<table.*?</table>", page, flags=re.S):
        head = [strip(h) for h in re.findall(r"<th[^>]*>(.*?)</th>", t, flags=re.S)]
        body = t.split("</thead>")[-1]
        rows = [[strip(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", tr, flags=re.S)] for tr in re.findall(r"<tr[^>]*>(.*?)</tr>", body, flags=re.S)]
        out.append((head, [r for r in rows if r]))
    return out


@pytest.mark.slow
def test_a_real_title_contents_and_header(smoke):
    page = smoke["html"]
    title = re.search(r"<title>(.*?)</title>", page).group(1)
    assert title != "Notebook" and "Embedding variance" in title and "smoke" in title
    toc = re.search(r'<nav class="toc".*?</nav>', page, flags=re.S).group(0)
    links = re.findall(r'href="#([^"]+)"', toc)
    assert len(links) >= 15 and all(f'id="{l}"' in page for l in links)          # every entry points somewhere
    meta = re.search(r'<dl class="report-meta">.*?</dl>', page, flags=re.S).group(0)
    for key in ("rendered", "rendered by", "runs made by", "profile", "model", "data", "runs"): assert f"<dt>{key}</dt>" in meta
    assert "sha256" in meta and "commit" in meta
    about = re.search(r'<details class="about"><summary>(.*?)</summary>', page).group(1)
    assert re.fullmatch(r"About this report: rendered by commit [0-9a-f]{10}; runs made by commit [0-9a-f]{10}", about), about


@pytest.mark.slow
def test_no_remote_resource(smoke):
    page = smoke["html"]
    assert not re.search(r"<script", page)                                          # no script at all
    assert not re.search(r"""(src|href)\s*=\s*["'](https?:)?//""", page)           # nothing fetched
    assert not re.search(r"@import|url\(\s*['\"]?https?:", page)
    assert page.count('src="data:image/png;base64,') >= 8


@pytest.mark.slow
def test_tables_are_formatted_for_reading(smoke):
    page = smoke["html"]
    assert "5.0000e-05" not in page
    ts = tables(page)
    assert len(ts) >= 20
    for head, rows in ts:
        assert all(h for h in head), head                                          # no empty (index) header
        assert head[0].lower() not in ("index", "unnamed: 0"), head                      # no index column under any name
        if "lr" in head:
            for r in rows: assert re.fullmatch(r"\d(\.\d+)?e-\d|0\.\d+|—", r[head.index("lr")]), r
        if "step" in head:
            for r in rows: assert re.fullmatch(r"\d+|—", r[head.index("step")]), r
    text = re.sub(r"<[^>]+>", " ", page)
    assert not re.search(r"\d\.\d{4}e-0\d", text)                                  # no 5.0000e-05 style numbers


@pytest.mark.slow
def test_every_figure_has_alt_text_and_is_2x(smoke):
    page = smoke["html"]
    imgs = re.findall(r"<img [^>]*>", page)
    assert len(imgs) >= 8
    for img in imgs:
        alt = re.search(r'alt="([^"]*)"', img).group(1)
        assert len(alt) > 40 and "No description" not in alt
        assert re.search(r'width="\d+"', img)
    assert (smoke["out"] / "figures" / "drift_and_loss.png").is_file()


@pytest.mark.slow
def test_the_executed_notebooks_have_no_errors_and_the_cell_log_is_a_file(smoke):
    from embvar_study.sweep import PROFILES
    for name in [*PROFILES["smoke"]["experiments"], "report"]:   # the experiments the smoke study ran
        nb = nbformat.read(smoke["out"] / "notebooks" / f"{name}.ipynb", as_version=4)
        for cell in nb.cells:
            for o in cell.get("outputs", []):
                assert o.output_type != "error", (name, o.get("ename"), o.get("evalue"))
                assert not (o.output_type == "stream" and o.name == "stderr"), (name, o.get("text", "")[:300])
        assert (smoke["out"] / "logs" / f"{name}.log").stat().st_size > 0
    assert "Traceback" not in smoke["html"] and "Not computed" not in smoke["html"]


RAW = ("raw_msd", "cka_debiased", "pvalue holm", "pvalue_holm", "intra inter ratio", "intra_inter_ratio", "gap cum lr", "gap_cum_lr",
       "<1e-12", "->", "Run it with", "The report does the statistics", "embvar report", "to run", "distinct runs:")


def page_text(page: str) -> str:
    "The words a reader sees: no style, no embedded images, no tags."
    page = re.sub(r"<style>.*?</style>", "", re.sub(r'src="data:[^"]*"', "", page), flags=re.S)
    return html_lib.unescape(re.sub(r"<[^>]+>", " ", page))


@pytest.mark.slow
def test_a_document_to_read_first(smoke):
    page = smoke["html"]
    text = page_text(page)
    assert [w for w in RAW if w in text] == []                                          # no raw identifiers, operator text or progress lines
    h2 = re.findall(r'<h2 id="([^"]+)"', page)
    assert h2[:2] == ["Conclusions", "Limitations"] and "Appendix" in h2
    main = page[:page.index('<h2 id="Appendix"')]
    assert main.index("<img") < main.index('<h2 id="Limitations"')                     # the headline figure sits under the conclusions
    concl = main[main.index('<h2 id="Conclusions"'):main.index('<details class="about"')]
    assert 3 <= concl.count("<li>") <= 5 and concl.count("[") >= 3                     # 3-5 conclusions, with their intervals
    for key in ("Model", "Training", "Seeds", "Truncation", "Reference"): assert f"<strong>{key}</strong>" in main
    for head, _ in tables(page): assert not [h for h in head if "_" in h], head          # every header in words
    study = load_study(smoke["out"])
    from embvar_study.findings import key_findings
    for f in key_findings(study, n_resamples=2000)[:3]: assert html_lib.escape(f["text"], quote=False).split(":")[0] in main


@pytest.mark.slow
def test_the_report_numbers_are_the_analysis_tables(smoke):
    study = load_study(smoke["out"])
    ref = analysis.reference_table(study.runs("lr_sweep"), n_resamples=2000)
    head, rows = next((h, r) for h, r in tables(smoke["html"]) if "95% CI at first checkpoint" in h)
    mine = [dict(zip(head, r)) for r in rows if r[0] == "this study"]
    ours = ref[ref["source"] == "this study"].reset_index(drop=True)
    assert len(mine) == len(ours) == 2
    for shown, (_, r) in zip(mine, ours.iterrows()):
        assert shown["drift at last step"] == format_value(r["drift_last"]) and shown["95% CI at last step"] == format_value(r["drift_last_ci"])
        assert shown["drift at first checkpoint"] == format_value(r["drift_first"])


@pytest.mark.slow
def test_a_second_report_trains_nothing(smoke, capsys):
    before = {p.name: (p / "COMPLETE").stat().st_mtime_ns for p in (smoke["out"] / "runs").iterdir() if not p.name.startswith(".")}
    main(["report", "--profile", "smoke", "--out", str(smoke["out"]), *SMOKE])
    out = capsys.readouterr().out
    assert f"{len(before)} complete, 0 to run" in out
    after = {p.name: (p / "COMPLETE").stat().st_mtime_ns for p in (smoke["out"] / "runs").iterdir() if not p.name.startswith(".")}
    assert after == before
    assert len(out.strip().splitlines()) <= 12                                    # one line per notebook, no cell log


def test_templates_hold_parameters_narrative_and_display_calls_only():
    banned = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.For, ast.While, ast.Lambda, ast.ListComp,
              ast.DictComp, ast.SetComp, ast.GeneratorExp, ast.If, ast.Try, ast.With)
    names = sorted(p.stem for p in template_dir().glob("*.ipynb"))
    assert {template_for(n).stem for n in (*EXPERIMENT_NAMES, "report", "runs_report")} == set(names)   # every template is used
    for name in names:
        nb = nbformat.read(template_dir() / f"{name}.ipynb", as_version=4)
        params = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
        assert len(params) == 1, name
        for c in nb.cells:
            if c.cell_type != "code": continue
            tree = ast.parse(c.source)
            bad = [type(n).__name__ for n in ast.walk(tree) if isinstance(n, banned)]
            assert not bad, (name, bad, c.source[:200])
            assert "warnings" not in c.source and "Path(" not in c.source and " / " not in c.source, (name, c.source[:200])


def test_templates_document_their_parameters():
    import papermill as pm
    for name in (*EXPERIMENT_NAMES, "report"):
        params = pm.inspect_notebook(str(template_for(name)))
        for p, info in params.items():
            assert info["inferred_type_name"] not in ("None", "Unknown type"), (name, p)
            assert info["help"], (name, p)


@pytest.mark.slow
def test_a_study_with_lr_extended_but_no_seed_sweep_renders(tmp_path):
    sd = synthetic_study(tmp_path / "syn")
    (sd / "sweeps" / "seed_sweep.csv").unlink()
    spec = json.loads((sd / "study.json").read_text()); spec["experiments"].remove("seed_sweep")
    write_study_spec(sd, spec)                                   # a new plan, hashed (an edit by hand is refused on read)
    nb = execute_notebooks(["report"], sd, {"profile": "synthetic", "study_dir": str(sd), "n_resamples": 200}, say=None)[0]
    page = render_html(sd, nb).read_text()
    assert "Traceback" not in page
    assert "was not run in this study" not in page          # an experiment never run: its sections are left off, not listed (issue 40)
    if '<h2 id="Not-computed"' in page:                                                  # what is listed comes before the Appendix, one line each
        assert page.index('<h2 id="Not-computed"') < page.index('<h2 id="Appendix"')
    assert 'class="not-computed"' not in page                                            # no box
    start = page.index('<h2 id="Drift-as-an-early-warning"'); ew = page[start:page.index("<h2", start + 5)]
    assert "Threshold" in ew and "fallback" in ew and "Not computed" not in ew.split("AUC")[0]


@pytest.mark.slow
def test_the_reviews_profile_on_a_review_file(tmp_path):
    # any CSV of the IMDb layout (text, label); probes are rows of it set aside; the tiny model keeps it fast
    words = ["good", "great", "fine", "lovely", "bad", "poor", "dull", "awful"]
    rows = [f'"review {i}: the film was {words[i % 8]}, the cast {words[(3 * i) % 8]} and the ending {words[(5 * i) % 8]}",{int(i % 8 < 4)}'
            for i in range(120)]
    data = tmp_path / "reviews.csv"; data.write_text("text,label\n" + "\n".join(rows) + "\n")
    out = tmp_path / "study"
    main(["report", "--profile", "reviews", "--set", f"dataset={data}", "--set", "model=tiny-distilbert", "--set", "max_length=32",
          "--set", "probe_max_length=32", "--set", "n_probes=16", "--set", "n_train=48", "--set", "n_eval=16", "--out", str(out)])
    study = load_study(out)
    assert study.profile == "reviews" and study.experiments == ["lr_sweep", "schedule", "seed_sources"]
    probes = study.runs("lr_sweep").runs[0].probes
    assert len(probes) == 16 and probes["text"].str.startswith("review ").all()     # held-out rows of the file
    for run in study.all_runs().runs:
        assert set(run.probes["text"]) == set(probes["text"])   # every run embeds the same probes
    page = (out / "report.html").read_text()
    assert "Traceback" not in page and "Do the curves of every rate and schedule fall onto one curve" in page
    assert "How much do seeds move the embeddings, and from where" in page                # the seed-sources section (issue 38)
    text = html_lib.unescape(re.sub(r"<[^>]+>", " ", page))
    assert not [r for r in rows if r.split(",")[0].strip('"')[:25] in text]              # no review text in the report


@pytest.mark.slow
def test_a_runs_report_over_runs_with_different_poolings(tmp_path):
    # an `embvar train` run stores mean/cls/max; a plain-loop tracker run at another lr only mean: the layer section
    # draws what each group has and says what is missing; the header and title read as a runs report
    import torch
    from embvar_study.models import load_model_and_tokenizer
    from embvar_study.tracking import EmbeddingTracker
    a, b = tmp_path / "runs" / "a", tmp_path / "runs" / "b"
    main(["train", "--model", "tiny-distilbert", "--dataset", "bundled", "--n-train", "32", "--n-eval", "16", "--max-length", "32",
          "--probe-max-length", "32", "--n-probes", "16", "--track-every", "2", "--lr", "5e-4", "--out", str(a), "--no-progress"])
    model, tok = load_model_and_tokenizer("tiny-distilbert", num_labels=2, init_seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch = tok(["a good film", "a bad film", "great acting", "dull plot"], padding=True, return_tensors="pt")
    with EmbeddingTracker(model, tok, ["the movie was wonderful", "the plot made no sense", "fine work", "poor script"], b,
                          every=2, config={"lr": 1e-3}, max_length=32) as tracker:
        tracker.step(0)
        for step in (1, 2, 3):
            loss = model(**batch, labels=torch.tensor([1, 0, 1, 0])).loss
            loss.backward(); opt.step(); opt.zero_grad()
            tracker.step(step); tracker.log(step, train_loss=loss.item())
        tracker.step(3, force=True)
    main(["report", "--runs", str(a), str(b), "--group-by", "lr", "--out", str(tmp_path / "rr")])
    page = (tmp_path / "rr" / "report.html").read_text(encoding="utf-8")
    assert "Traceback" not in page
    assert re.search(r"<title>[^<]*: runs grouped by lr</title>", page) and "profile</title>" not in page
    meta = re.search(r'<dl class="report-meta">.*?</dl>', page, flags=re.S).group(0)
    assert "?" not in meta and "2 runs in 2 groups" in meta and "<dt>profile</dt>" not in meta
    text = html_lib.unescape(re.sub(r"<[^>]+>", " ", page))
    assert re.search(r"cls pooling is not stored by every run of 1e-3", text)
    assert "`" not in re.sub(r"<code>.*?</code>", "", " ".join(re.findall(r'<p class="not-computed">.*?</p>', page, flags=re.S)))
    assert (tmp_path / "rr" / "figures" / "layer_drift.png").is_file()


def test_a_failing_notebook_leaves_its_traceback_in_the_log(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("x = 1  # a number", metadata={"tags": ["parameters"]}),
                nbformat.v4.new_code_cell("def f(v):\n    return v / 0\nf(x)")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    (tmp_path / "t").mkdir(); nbformat.write(nb, tmp_path / "t" / "bad.ipynb")
    with pytest.raises(Exception, match=r"notebook bad failed in cell \d+: ZeroDivisionError: division by zero \(log: .*bad\.log\)"):
        execute_notebooks(["bad"], tmp_path / "s", {"x": 2}, templates=tmp_path / "t", say=None)
    log = (tmp_path / "s" / "logs" / "bad.log").read_text()
    assert "ZeroDivisionError" in log and "return v / 0" in log and "\x1b[" not in log


_MEASURE = """<script>
window.addEventListener('load', () => {
  const top = e => e ? e.getBoundingClientRect().top + window.scrollY : -1;
  const out = {height: document.body.scrollHeight, conclusions: top(document.getElementById('Conclusions')),
               figure: top(document.querySelector('main img')), about: top(document.querySelector('details.about'))};
  const pre = document.createElement('pre'); pre.id = 'measured'; pre.textContent = JSON.stringify(out); document.body.appendChild(pre);
});
</script>"""


def laid_out(page: str, tmp: Path, width: int = 1280, height: int = 800) -> dict | None:
    "Where a headless Chromium window of width x height lays out the conclusions, the first figure and the folded header (px from the top), and the body's height; None without Chromium."
    import shutil, subprocess
    exe = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if not exe: return None
    f = tmp / "measured.html"; f.write_text(page.replace("</body>", _MEASURE + "</body>"), encoding="utf-8")
    r = subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", f"--window-size={width},{height}", "--virtual-time-budget=10000",
                        "--dump-dom", f.as_uri()], capture_output=True, text=True, timeout=300)
    m = re.search(r'<pre id="measured">(.*?)</pre>', r.stdout)
    assert m, r.stderr[-500:]
    return json.loads(html_lib.unescape(m.group(1)))


def _visible_length(fragment: str) -> int:
    return len(re.sub(r"\s+", " ", page_text(fragment)).strip())


@pytest.mark.slow
def test_the_first_screen_shows_the_answer(tmp_path):
    "The conclusions and the headline figure come before the folded header and contents, within the first 20% of the page's text."
    sd = synthetic_study(tmp_path / "syn")
    nb = execute_notebooks(["report"], sd, {"profile": "synthetic", "study_dir": str(sd), "n_resamples": 200}, say=None)[0]
    page = render_html(sd, nb).read_text()
    body = page[page.index("<body>"):]
    at = {k: body.index(k) for k in ('<h2 id="Conclusions"', "<img", '<details class="about">', '<details class="contents">', '<h2 id="Limitations"')}
    assert list(at) == sorted(at, key=at.get), at                                     # answer, figure, then who/what and contents, folded
    assert re.search(r'<details class="about"><summary>About this report: rendered by [^<]*; runs made by [^<]*</summary><dl class="report-meta">', body)
    assert "<details open" not in body                                                  # folded: one line each
    before_figure = body[:at["<img"]]
    assert _visible_length(before_figure) <= 0.2 * _visible_length(body), (_visible_length(before_figure), _visible_length(body))
    concl = body[at['<h2 id="Conclusions"']:at["<img"]]
    said = concl.index("the reference result (distilbert-base-uncased fine-tuned on IMDb") if "reference" in concl else None
    assert said is None or said < concl.index("ends at about")                         # what the reference is, before it is quoted
    assert not re.search(r"\d(\.\d+)?x as", page_text(concl))                         # a ratio in its own words, not '39.2x as large (...)'
    at = laid_out(page, tmp_path)                                                       # measured where Chromium is installed
    if at is not None:
        assert 0 < at["conclusions"] < at["figure"] < at["about"], at
        assert at["conclusions"] < 800 and at["figure"] < 0.2 * at["height"], at           # the answer on the first screen of 1280 x 800


@pytest.mark.slow
def test_a_custom_study_keeps_its_description_and_the_reference_rate_it_ran(tmp_path):
    sd = synthetic_study(tmp_path / "syn", lrs=(1e-4, 5e-4), seeds=(0, 1))
    spec = json.loads((sd / "study.json").read_text())
    spec["overrides"] = {"lrs": [1e-4, 5e-4], "seeds": [0, 1]}; spec["resolved"]["ref_lr"] = 5e-5   # a profile's ref_lr the overrides left out
    write_study_spec(sd, spec)
    nb = execute_notebooks(["report"], sd, {"profile": "synthetic", "study_dir": str(sd), "n_resamples": 200}, say=None)[0]
    page = render_html(sd, nb, profile="synthetic").read_text()
    title = re.search(r"<title>(.*?)</title>", page).group(1)
    assert title.endswith("synthetic profile with lrs = 1e-4, 5e-4 and seeds = 0, 1"), title
    assert "Not-computed" not in page                                                   # mitigations at lr 1e-4, the rate the study ran
    assert "distinct runs at lr 1e-4" in page


@pytest.mark.slow
def test_a_notebook_whose_inputs_are_unchanged_is_reused_and_any_change_executes_it_again(tmp_path):
    "The second execution on the same runs, code and parameters executes nothing; a changed parameter or run record does."
    sd = synthetic_study(tmp_path / "syn", n_probes=6, dim=4, steps=6)
    params = {"profile": "synthetic", "study_dir": str(sd), "train": False}
    said = []
    out = execute_notebooks(["lr_sweep"], sd, params, say=said.append)[0]
    assert re.fullmatch(r"\[1/1\] notebook lr_sweep: done in [\d.]+s", said[-1]), said
    first = out.read_bytes()
    execute_notebooks(["lr_sweep"], sd, params, say=said.append)
    assert said[-1] == "[1/1] notebook lr_sweep: inputs unchanged (template, parameters, code, runs): reused"
    assert out.read_bytes() == first                                              # not touched
    execute_notebooks(["lr_sweep"], sd, params, say=said.append, reuse=False)     # --reexecute
    assert "done in" in said[-1]
    spec = json.loads((sd / "study.json").read_text()); spec["resolved"]["note"] = "changed"
    write_study_spec(sd, spec)                                                    # the plan changed: its content is an input
    execute_notebooks(["lr_sweep"], sd, params, say=said.append)
    assert "done in" in said[-1]
    execute_notebooks(["lr_sweep"], sd, {**params, "jobs": 2}, say=said.append)   # another parameter's value: executed again
    assert "done in" in said[-1]
    nb = json.loads(out.read_text())
    assert nb["metadata"]["embvar"]["inputs"] and nb["metadata"]["papermill"]["parameters"]["experiment"] == "lr_sweep"


@pytest.mark.slow
def test_with_train_false_a_notebook_only_verifies_and_names_a_damaged_run(tmp_path):
    "What `embvar report` executes never trains: a damaged run fails the notebook with one line naming it; nothing is retrained."
    from embvar_study.report import NotebookFailed
    sd = synthetic_study(tmp_path / "syn", n_probes=6, dim=4, steps=6)
    run = sd / pd.read_csv(sd / "sweeps" / "lr_sweep.csv")["path"].iloc[0]
    victim = sorted(run.rglob("*.npy"))[0]; victim.write_bytes(b"damaged")
    before = sorted(p.name for p in (sd / "runs").iterdir())
    with pytest.raises(NotebookFailed, match=r"1 of its \d+ runs .* are not complete and verified"):
        execute_notebooks(["lr_sweep"], sd, {"profile": "synthetic", "study_dir": str(sd), "train": False}, say=None)
    assert sorted(p.name for p in (sd / "runs").iterdir()) == before and victim.read_bytes() == b"damaged"   # nothing moved or retrained
