"""The documents a newcomer reads are checked against the files they describe: tests/README.md maps every test file to
the modules it tests (and its notebooks), and the documentation site (`nbs/_build_docs.py`, `make docs`) has a page for
every module notebook and guide, with every README link resolving. Fast: no notebook is executed."""
import importlib.util, inspect, re
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent
TESTS, NBS, PKG = ROOT / "tests", ROOT / "nbs", ROOT / "embvar_study"
MODULES = {p.stem for p in PKG.glob("*.py")} - {"__init__", "_modidx"}


def _map_rows() -> dict[str, list[str]]:
    "{test file: [module names]} from the table of tests/README.md (a module cell in parentheses names no module)."
    rows = {}
    for line in (TESTS / "README.md").read_text(encoding="utf-8").splitlines():
        m = re.match(r"^\| \[(test_\w+\.py)\]\(([^)]+)\) \|[^|]*\| (.*) \|$", line)
        if not m: continue
        assert m.group(1) == m.group(2), f"tests/README.md: the row of {m.group(1)} links {m.group(2)}"
        cell = m.group(3)
        rows[m.group(1)] = [] if cell.startswith("(") else re.findall(r"\[(\w+)\]\(\.\./nbs/[\w.]+\)", cell)
    return rows


def test_every_test_file_has_a_row_in_the_map():
    rows = _map_rows()
    files = {p.name for p in TESTS.glob("test_*.py")}
    assert not files - set(rows), f"tests/README.md has no row for {sorted(files - set(rows))}"
    assert not set(rows) - files, f"tests/README.md has rows for files that do not exist: {sorted(set(rows) - files)}"


def test_every_module_of_the_map_exists_and_is_named_in_its_file():
    for f, mods in _map_rows().items():
        src = (TESTS / f).read_text(encoding="utf-8")
        for m in mods:
            assert m in MODULES, f"tests/README.md: {f} names {m}, which is not a module of embvar_study"
            assert re.search(rf"\b{m}\b", src, flags=re.I), f"tests/README.md: {f} names {m}, which it never names"


def test_the_map_links_each_module_to_its_own_notebook_and_lists_the_rest():
    text = (TESTS / "README.md").read_text(encoding="utf-8")
    exp = {m.group(1): p.name for p in NBS.glob("*.ipynb")
           if (m := re.search(r"#\|\s*default_exp\s+(\w+)", p.read_text(encoding="utf-8")))}
    for mod, nb in re.findall(r"\[(\w+)\]\(\.\./nbs/([\w.]+)\)", text):
        assert exp.get(mod) == nb, f"tests/README.md links {mod} to nbs/{nb}; its notebook is {exp.get(mod)}"
    in_rows = {m for mods in _map_rows().values() for m in mods}
    line = next(l for l in text.splitlines() if l.startswith("Modules without a row above"))
    listed = set(re.findall(r"\[(\w+)\]", line))
    assert listed == set(exp) - in_rows, f"the list of modules without a row should be {sorted(set(exp) - in_rows)}"


# --- the documentation site (nbs/_build_docs.py) ----------------------------------------------------------------------

def _build_docs():
    spec = importlib.util.spec_from_file_location("_build_docs", NBS / "_build_docs.py")
    mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
    return mod


def test_every_module_notebook_and_guide_has_a_page_in_the_contents():
    bd = _build_docs()
    built = [p.name for p in bd.pages()]
    wanted = sorted(p.name for p in NBS.glob("*.ipynb") if p.name != "index.ipynb")
    assert sorted(built) == wanted and len(built) == len(set(built))
    exported = {p.name for p in NBS.glob("*.ipynb") if re.search(r"#\|\s*default_exp", p.read_text(encoding="utf-8"))}
    assert exported <= set(built) and len(exported) == len(MODULES)      # one notebook a module, every one with a page
    nav = bd.sidebar("index.html")
    assert sorted(re.findall(r'href="([^"]+)\.html"', nav)) == sorted(["index"] + [Path(b).stem for b in built])


def test_every_readme_link_resolves_in_the_site():
    "The README as the site's index: a notebook link goes to its page, another relative link to a file of the checkout."
    bd = _build_docs()
    names = {p.stem + ".html" for p in bd.pages()}
    links = re.findall(r'(?:href|src)="([^"#]+)(?:#[^"]*)?"', bd.readme_html())
    local = [u for u in links if not re.match(r"^(https?|mailto):", u)]
    assert any(u in names for u in local), "the README links no page"
    for u in local:
        if u.endswith(".ipynb"): assert not (ROOT / u.removeprefix("../")).parent == NBS, f"{u} has a page: link it"
        assert u in names or (u.startswith("../") and (ROOT / u[3:]).exists()), f"README link {u} resolves to nothing"


def test_notebook_links_go_to_their_pages_lettered_or_not():
    bd = _build_docs()
    out = bd.readme_html("[a](nbs/02a_similarity.ipynb) [b](nbs/18a_stability.ipynb#x) [c](nbs/03_align.ipynb) "
                         "[d](nbs/guide_runs.ipynb) [e](settings.ini) [f](https://example.org/a.ipynb)")
    assert re.findall(r'href="([^"]+)"', out) == ["02a_similarity.html", "18a_stability.html#x", "03_align.html",
                                                   "guide_runs.html", "../settings.ini", "https://example.org/a.ipynb"]


def _cell(src: str, kind: str = "code"):
    import nbformat
    return nbformat.v4.new_code_cell(src) if kind == "code" else nbformat.v4.new_markdown_cell(src)


def test_a_page_leaves_out_directives_and_hidden_cells_and_documents_each_export():
    import nbformat
    from embvar_study import stats
    bd = _build_docs()
    nb = nbformat.v4.new_notebook(cells=[
        _cell("#| default_exp stats"), _cell("# stats\n> what it does", "markdown"),
        _cell("#| hide\nimport numpy as np"),
        _cell("#| export\nCONST = 1\ndef bootstrap_ci(x): pass\ndef _helper(): pass\nclass CI: pass"),
        _cell("#| exporti\ndef _inner(): pass"), _cell("#| notest\nprint(1)\n#| echo: false")])
    cells = bd.doc_cells(nb)
    assert [c.cell_type for c in cells] == ["markdown", "markdown", "code"]
    assert cells[2].source == "print(1)"
    docs = cells[1].source
    assert re.findall(r"^### (\w+)$", docs, flags=re.M) == ["bootstrap_ci", "CI"]     # public definitions, in order
    sig = inspect.signature(stats.bootstrap_ci)
    shown = re.search(r"```python\nbootstrap_ci\((.*?)\)( -> \w+)?\n```", docs, flags=re.S).group(1)
    assert re.findall(r"^\s*(\w+):", shown, flags=re.M) == list(sig.parameters)        # the signature, in order
    table = [l for l in docs.split('<div class="doc">')[1].splitlines() if l.startswith("|")]
    assert [re.match(r"^\| `(\w+)`", l).group(1) for l in table[2:-1]] == list(sig.parameters)
    assert table[-1].startswith("| **returns** |")
    assert len({len(re.findall(r"(?<!\\)\|", l)) for l in table}) == 1               # every row has the columns


def test_a_rendered_page_has_no_directive_and_typesets_its_maths():
    import html
    bd = _build_docs()
    from embvar_study import align
    page = bd.page("03_align", bd.notebook_html(NBS / "03_align.ipynb", execute=False), "03_align.html")
    blocks = re.findall(r'<div class="highlight[^"]*"><pre>(.*?)</pre>', page, flags=re.S)
    code = [html.unescape(re.sub(r"<[^>]+>", "", c)) for c in blocks]
    assert code and not [c for c in code if re.search(r"^#\|", c, flags=re.M)]
    exported = {n for n in align.__all__ if callable(getattr(align, n))}
    assert exported <= set(re.findall(r'<h3 id="(\w+)"', page)), exported - set(re.findall(r'<h3 id="(\w+)"', page))
    assert "$0/0$" in re.sub(r"<[^>]+>", "", page)                                      # left for MathJax to typeset
    assert re.search(r'<head>.*<script async src="[^"]*mathjax[^"]*">.*</head>', page, flags=re.I | re.S)
