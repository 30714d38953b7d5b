"""README.md is generated from nbs/index.ipynb and fits in 250 lines; its ```python snippets run as pasted (in a fresh folder,
printing what the README shows after them); every guide notebook is linked and built; and every quote of a committed
report's Conclusions and every table that follows a committed report's name, in the README and in the guides' markdown,
says what that report says (compared with the report's page, not hard-coded)."""
import html, importlib.util, json, os, re, subprocess, sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
GUIDES = sorted((ROOT / "nbs").glob("guide_*.ipynb"))
NOT_RUN = "# not run here:"          # the first line of a README snippet that needs what a test cannot have (your script, a study)


def _build_docs():
    spec = importlib.util.spec_from_file_location("_build_docs", ROOT / "nbs" / "_build_docs.py")
    mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
    return mod


def _readme() -> str: return README.read_text(encoding="utf-8")


def _markdown_cells(nb: Path) -> list[str]:
    cells = json.loads(nb.read_text(encoding="utf-8"))["cells"]
    return ["".join(c["source"]) if isinstance(c["source"], list) else c["source"] for c in cells if c["cell_type"] == "markdown"]


# --- the README is the index notebook's -------------------------------------------------------------------------------

def test_readme_is_generated_from_index():
    assert _readme() == _build_docs().readme_text(), "README.md is not what nbs/index.ipynb gives: run python nbs/_build_docs.py --readme"


def test_readme_fits_in_250_lines():
    n = len(_readme().splitlines())
    assert n <= 250, f"README.md has {n} lines (at most 250): move detail to a guide notebook"


def test_converter_writes_markdown_code_and_text_outputs(tmp_path):
    "A small notebook converts to exactly the text written out here by hand (directives dropped, hidden cells left out)."
    import nbformat
    from nbformat.v4 import new_notebook, new_markdown_cell, new_code_cell, new_output
    nb = new_notebook(cells=[new_markdown_cell("# Title\n\nSome *text*."),
                             new_code_cell("#| hide\nimport secret"),
                             new_code_cell("#| eval: false\nx = 1\nprint(x)", outputs=[new_output("stream", name="stdout", text="1\n"),
                                                                                        new_output("stream", name="stderr", text="noise\n")]),
                             new_code_cell("x + 1", outputs=[new_output("execute_result", data={"text/plain": "2", "image/png": "AAAA"})]),
                             new_markdown_cell("The end.")])
    path = tmp_path / "index.ipynb"; nbformat.write(nb, path)
    bd = _build_docs()
    assert bd.readme_text(path) == (bd.README_NOTE + "\n\n# Title\n\nSome *text*.\n\n```python\nx = 1\nprint(x)\n```\n\n```\n1\n```\n\n"
                                    "```python\nx + 1\n```\n\n```\n2\n```\n\nThe end.\n")
    assert bd.readme_text(path) == bd.readme_text(path)


# --- the README's snippets run ------------------------------------------------------------------------------------------

def _fenced(text: str) -> list[tuple[str, str]]:
    "(language, body) of every fenced block, in order."
    out, lang, body = [], None, []
    for line in text.splitlines():
        if lang is None and line.startswith("```"): lang, body = line[3:].strip(), []
        elif lang is not None and line.startswith("```"): out.append((lang, "\n".join(body))); lang = None
        elif lang is not None: body.append(line)
    return out


def _snippets() -> list[tuple[str, str | None]]:
    "Every ```python block of the README with the plain block right after it (its printed output), if any."
    blocks = _fenced(_readme())
    return [(body, blocks[i + 1][1] if i + 1 < len(blocks) and blocks[i + 1][0] == "" else None)
            for i, (lang, body) in enumerate(blocks) if lang == "python"]


RUNNABLE = [(code, out) for code, out in _snippets() if not code.startswith(NOT_RUN)]


def test_every_snippet_runs_or_says_why_not():
    snippets = _snippets()
    assert RUNNABLE, "the README has no snippet that runs as pasted"
    assert any("load_model_and_tokenizer(\"minilm-offline\"" in c and "EmbeddingTracker" in c for c, _ in RUNNABLE), \
        "the README's drift-in-your-loop snippet (offline model included) is not among the snippets run"
    for code, _ in snippets:
        if code.startswith(NOT_RUN):
            assert len(code.splitlines()[0]) > len(NOT_RUN) + 10, f"a snippet not run says no reason: {code.splitlines()[0]!r}"


_NUM = re.compile(r"[-+]?\d+\.\d*|[-+]?\d+")


def _same_output(got: str, want: str, tol: float = 0.01) -> bool:
    "Same lines, same words; numbers equal within `tol` (the last float bits differ between CPU kernels)."
    g, w = got.strip().splitlines(), want.strip().splitlines()
    if len(g) != len(w): return False
    for a, b in zip(g, w):
        if _NUM.sub("#", a).split() != _NUM.sub("#", b).split(): return False
        na, nb = [float(x) for x in _NUM.findall(a)], [float(x) for x in _NUM.findall(b)]
        if len(na) != len(nb) or any(abs(x - y) > tol for x, y in zip(na, nb)): return False
    return True


@pytest.mark.parametrize("i", range(len(RUNNABLE)), ids=[f"readme-snippet-{i}" for i in range(len(RUNNABLE))])
def test_readme_snippet_runs_as_pasted(i, tmp_path):
    "Each runnable snippet, alone, in an empty folder, offline; it prints what the README shows after it."
    code, shown = RUNNABLE[i]
    (tmp_path / "snippet.py").write_text(code + "\n", encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "MPLBACKEND": "Agg"}
    done = subprocess.run([sys.executable, "snippet.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"README snippet {i} failed:\n{done.stderr[-3000:]}"
    if shown is not None:
        assert _same_output(done.stdout, shown), f"README snippet {i} printed\n{done.stdout}\nbut the README shows\n{shown}"


def test_same_output_compares_numbers_and_words():
    assert _same_output("drift: [0.    0.235 0.341]\n", "drift: [0.    0.236 0.341]")
    assert not _same_output("drift: [0.    0.235 0.341]", "drift: [0.    0.335 0.341]")
    assert not _same_output("drift: [0. 0.2]", "live: [0. 0.2]")
    assert not _same_output("a 1\nb 2", "a 1")


# --- the guides are linked and built ------------------------------------------------------------------------------------

def test_every_guide_is_linked_from_the_readme_and_built_by_make_docs():
    assert len(GUIDES) >= 6
    text, pages = _readme(), [p.name for p in _build_docs().pages()]
    for g in GUIDES:
        assert f"(nbs/{g.name})" in text, f"README.md does not link {g.name}"
        assert g.name in pages, f"nbs/_build_docs.py does not build {g.name}"
        src = json.loads(g.read_text(encoding="utf-8"))["cells"]
        assert not any("default_exp" in "".join(c["source"]) for c in src), f"{g.name} is documentation: no #| default_exp"


def test_links_point_at_files_that_exist():
    "Every relative link of the README (from the checkout's root) and of the guides (from nbs/) names a file that is there."
    docs = [(README, [_readme()])] + [(g, _markdown_cells(g)) for g in GUIDES]
    for path, blocks in docs:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", "\n".join(blocks)):
            if not re.match(r"^(https?|mailto):", target):
                assert (path.parent / target).exists(), f"{path.relative_to(ROOT)} links {target}, which does not exist"


# --- quotes and tables of the committed reports -------------------------------------------------------------------------

def _visible(html_text: str) -> str:
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", html_text))).strip()


def _documents() -> dict[str, list[str]]:
    "The README and every guide's markdown, as lists of blocks (a notebook's cells); a report named in one block is not carried to the next."
    return {"README.md": [_readme()], **{f"nbs/{g.name}": _markdown_cells(g) for g in GUIDES}}


_REPORT = re.compile(r"reports/(\w+)/report\.html")
_NOT_A_REPORT = re.compile(r"`(tests|benchmarks)/\w+\.py")


def _scan(blocks: list[str]) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """(quotes, table rows), each grouped by the committed report they belong to. A report is the last `reports/NAME/report.html`
    named before, within the block and the section (a heading starts afresh); for a table, a line naming a test or benchmark
    script since then says its numbers are not the report's. A quote is a bullet or a blockquote right after a paragraph that mentions the
    report's Conclusions."""
    quotes, rows = {}, {}
    for block in blocks:
        name, tname, para, lead, current = None, None, [], "", None
        for line in block.splitlines() + [""]:
            bullet, quote = line.startswith("- "), line.startswith("> ")
            if not line.strip():
                if para: lead, para = " ".join(para), []
                current = None
                continue
            if line.startswith("#"):
                name = tname = (_REPORT.findall(line) or [None])[-1]
                lead, para, current = "", [], None
                continue
            if line.startswith("|"):
                if tname and not re.match(r"^\|[-| :]+\|$", line): rows.setdefault(tname, []).append(line)
                continue
            if (bullet or quote) and "Conclusions" in lead and not para:
                assert name, f"a quote of Conclusions names no committed report before it: {line[:80]}"
                if bullet or current is None:
                    quotes.setdefault(name, []).append(line[2:].strip()); current = quotes[name]
                else: current[-1] += " " + line[2:].strip()
                continue
            if current is not None and (line.startswith("  ") or line.startswith(">")):
                current[-1] += " " + line.lstrip("> ").strip(); continue
            current = None
            para.append(line)
            if _NOT_A_REPORT.search(line): tname = None
            if named := _REPORT.findall(line): name = tname = named[-1]
    return quotes, rows


def _conclusions(report: Path) -> list[str]:
    page = report.read_text(encoding="utf-8")
    concl = re.search(r'<h2 id="Conclusions">(.*?)<h2 ', page, flags=re.S)
    assert concl, f"{report} has no Conclusions section"
    return [_visible(li) for li in re.findall(r"<li>(.*?)</li>", concl.group(1), flags=re.S)] + \
           [_visible(p) for p in re.findall(r"<p>(.*?)</p>", concl.group(1), flags=re.S)]


DOCS = _documents()
SCANNED = {doc: _scan(blocks) for doc, blocks in DOCS.items()}


def test_the_documents_quote_and_tabulate_the_reports():
    "The checks below are not empty: the README quotes the quick and reviews reports, the guides the stability and quick ones."
    assert {"quick", "reviews"} <= set(SCANNED["README.md"][0]), SCANNED["README.md"][0].keys()
    assert "reviews" in SCANNED["README.md"][1]
    assert "stability" in SCANNED["nbs/guide_stability.ipynb"][0] and "stability" in SCANNED["nbs/guide_stability.ipynb"][1]
    assert "quick" in SCANNED["nbs/guide_models.ipynb"][1]


@pytest.mark.parametrize("doc", list(DOCS))
def test_quotes_are_the_reports_conclusions(doc):
    for name, said in SCANNED[doc][0].items():
        report = ROOT / "reports" / name / "report.html"
        assert report.is_file(), f"{doc} quotes reports/{name}/report.html, which is not committed"
        concl = _conclusions(report)
        missing = [q for q in said if not any(_visible(q.replace("**", "")) in s for s in concl)]
        assert not missing, f"{doc} quotes findings that reports/{name}/report.html's Conclusions do not say: {missing}"


_NUMBER = r"(?<![\w.])[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?(?![\w.])"


@pytest.mark.parametrize("doc", list(DOCS))
def test_tables_show_the_reports_numbers(doc):
    "Every number in a table that follows a committed report's name is a number that report shows (or its rounding)."
    for name, rows in SCANNED[doc][1].items():
        report = ROOT / "reports" / name / "report.html"
        assert report.is_file(), f"{doc} names reports/{name}/report.html, which is not committed"
        shown = set(re.findall(_NUMBER, _visible(re.sub(r'src="data:[^"]+"', "", report.read_text(encoding="utf-8")))))
        rounded = {d: {f"{float(x):.{d}f}" for x in shown} for d in range(1, 5)}   # a table may round a shown number
        def is_shown(n: str) -> bool:
            d = len(n.split(".")[1]) if "." in n and "e" not in n else 0
            return n in shown or (0 < d < 5 and n in rounded[d])
        missing = [(row[:60], n) for row in rows for n in re.findall(_NUMBER, row) if not is_shown(n)]
        assert not missing, f"{doc}: numbers that reports/{name}/report.html does not show: {missing[:10]}"


def test_scan_finds_quotes_and_tables_by_the_report_named_before_them():
    blocks = ["## A\n\nIts Conclusions (`reports/quick/report.html`):\n\n- one\n  two\n- three\n\n| a | 1 |\n|---|---|\n| b | 2 |\n\n"
              "Numbers from `benchmarks/x.py`:\n\n| c | 3 |\n\n## B\n\n- not a quote\n\n| d | 4 |",
              "The main Conclusions (`reports/stability/report.html`) say:\n\n> first line\n> second line\n\nplain"]
    quotes, rows = _scan(blocks)
    assert quotes == {"quick": ["one two", "three"], "stability": ["first line second line"]}
    assert rows == {"quick": ["| a | 1 |", "| b | 2 |"]}


def test_the_profile_table_states_each_profiles_grid_and_sizes(tmp_path):
    "Each row of the README's profile table names the profile's learning rates, seeds per rate and train / held-out sizes as PROFILES defines them."
    from embvar_study.sweep import PROFILES, get_profile, plan_study
    from embvar_study.study import format_lr
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `(\w+)` \|.*$", _readme(), flags=re.M)}
    assert set(PROFILES) <= set(rows), sorted(set(PROFILES) - set(rows))
    for name, prof in PROFILES.items():
        cells = [c.strip() for c in rows[name].strip("|").split("|")]
        grid, data = cells[3], cells[2]
        lrs, seeds = re.search(r"lr ([^×]+?) × (\d+) seeds", grid).groups()
        assert [x.strip() for x in lrs.split(",")] == [format_lr(x) for x in prof["lrs"]], (name, lrs)
        assert int(seeds) == len(prof["seeds"]), (name, seeds)
        sizes = re.search(r"([\d,]+) / ([\d,]+)", data).groups()
        assert [int(x.replace(",", "")) for x in sizes] == [prof["base"]["n_train"], prof["base"]["n_eval"]], (name, sizes)
        data = tmp_path / "reviews.csv"; data.write_text("text,label\n" + "".join(f"review {i},{i % 2}\n" for i in range(400)))
        sets = {"dataset": str(data)} if prof["base"].get("dataset") is None else {}    # a profile that asks for a review file
        planned = plan_study(get_profile(name, sets))["run_id"].nunique()
        assert int(cells[4]) == planned, (name, cells[4], planned)                      # the runs column: distinct runs planned
