"""The documents a newcomer reads are checked against the files they describe: tests/README.md maps every test file to
the modules it tests (and its notebooks), and the documentation site (`nbs/_build_docs.py`, `make docs`) has a page for
every module notebook and guide, with every README link resolving. Fast: no notebook is executed."""
import re
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
            assert re.search(rf"\b{m}\b", src, flags=re.I), f"tests/README.md: {f} names {m}, which the file never names"


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
