"""The package's import graph, read from the source with `ast`: no import cycle between its modules, and no module taking a
private name (`_x`) from another (`from .m import _x`, `from embvar_study.m import _x`, or `m._x` on an imported module).
Each module imports only modules of its own layer or lower ones, by the README's layer table (read from nbs/index.ipynb,
its one source), and every module is in one row. Each failure lists what it found. No module is over 500 lines; the
largest module's line count is printed (`pytest -s`)."""
import ast
import json
import re
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "embvar_study"
GENERATED = {"__init__", "_modidx"}

# Cross-module private imports that other helpers of this step remove (align/metrics/compare/_batching, config/tracking,
# stats): removed at merge. The lead deletes each entry when its owner's branch lands; a new entry is a regression.
REMOVED_AT_MERGE: set = set()   # empty (issue 32): a new entry is a regression

# Found by this test in modules no one has changed yet: named here; the list may only shrink.
UNASSIGNED_AT_MERGE: set = set()   # empty (issue 32): a new entry is a regression

# Imports that close a cycle: none left (config no longer imports tracking).
CYCLE_EDGES_REMOVED_AT_MERGE: set = set()


def modules() -> dict[str, Path]:
    return {p.stem: p for p in sorted(PKG.glob("*.py")) if p.stem not in GENERATED}


def _target(node: ast.ImportFrom, here: str, names: set[str]) -> list[tuple[str, str | None]]:
    "(module, name) pairs of one `from ... import ...`: `from .m import x` -> (m, x); `from embvar_study import m` -> (m, None)."
    mod = node.module or ""
    if node.level: base = mod
    elif mod == "embvar_study": base = ""
    elif mod.startswith("embvar_study."): base = mod.split(".", 1)[1]
    else: return []
    base = base.split(".")[0]
    if base: return [(base, a.name) for a in node.names]
    return [(a.name, None) for a in node.names if a.name in names]


def imports(path: Path, names: set[str]) -> tuple[set[str], list[tuple[str, str]]]:
    "The package modules `path` imports (anywhere in it, function bodies included) and the private names it takes from them."
    here, tree = path.stem, ast.parse(path.read_text(encoding="utf-8"))
    deps, private, aliases = set(), [], {}
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom):
            for mod, name in _target(n, here, names):
                if mod not in names or mod == here: continue
                deps.add(mod)
                if name is None:
                    a = next(x for x in n.names if x.name == mod); aliases[a.asname or mod] = mod
                elif name.startswith("_") and not name.startswith("__"): private.append((mod, name))
        elif isinstance(n, ast.Import):
            for a in n.names:
                if a.name.startswith("embvar_study."):
                    mod = a.name.split(".")[1]
                    if mod in names and mod != here: deps.add(mod); aliases[a.asname or a.name] = mod
    for n in ast.walk(tree):   # m._x on an imported module
        if isinstance(n, ast.Attribute) and n.attr.startswith("_") and not n.attr.startswith("__"):
            v = n.value
            key = v.id if isinstance(v, ast.Name) else ast.unparse(v) if isinstance(v, ast.Attribute) else None
            if key in aliases: private.append((aliases[key], n.attr))
    return deps, private


def graph() -> tuple[dict[str, set[str]], dict[str, list[tuple[str, str]]]]:
    mods = modules(); g, priv = {}, {}
    for name, p in mods.items(): g[name], priv[name] = imports(p, set(mods))
    return g, priv


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    "The strongly connected components of more than one module (Tarjan), each as a sorted list: every import cycle lies in one."
    index, low, stack, on, out, k = {}, {}, [], set(), [], [0]
    def visit(v):
        index[v] = low[v] = k[0]; k[0] += 1; stack.append(v); on.add(v)
        for w in sorted(g.get(v, ())):
            if w not in index: visit(w); low[v] = min(low[v], low[w])
            elif w in on: low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop(); on.discard(w); comp.append(w)
                if w == v: break
            if len(comp) > 1: out.append(sorted(comp))
    for v in sorted(g):
        if v not in index: visit(v)
    return out


def test_the_graph_reader_finds_what_it_should(tmp_path):
    "The reader itself, on a planted package: a cycle a -> b -> a, a private from-import, a private attribute of an imported module."
    (tmp_path / "a.py").write_text("from .b import thing, _hidden\n")
    (tmp_path / "b.py").write_text("def f():\n    from embvar_study import a as A\n    return A._secret\n")
    (tmp_path / "c.py").write_text("import numpy as np\nx = np._NoValue\n")
    names = {"a", "b", "c"}
    (da, pa), (db, pb), (dc, pc) = (imports(tmp_path / f"{m}.py", names) for m in ("a", "b", "c"))
    assert (da, pa, db, pb, dc, pc) == ({"b"}, [("b", "_hidden")], {"a"}, [("a", "_secret")], set(), [])
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def without(g: dict[str, set[str]], edges: set[tuple[str, str]]) -> dict[str, set[str]]:
    return {m: {t for t in ts if (m, t) not in edges} for m, ts in g.items()}


def test_no_import_cycle():
    g, _ = graph()
    found = cycles(without(g, CYCLE_EDGES_REMOVED_AT_MERGE))
    assert not found, "import cycles between modules: " + "; ".join(" <-> ".join(c) for c in found)


def test_no_private_name_imported_across_modules():
    _, priv = graph()
    found = sorted({(m, t, n) for m, ps in priv.items() for t, n in ps} - REMOVED_AT_MERGE - UNASSIGNED_AT_MERGE)
    assert not found, f"{len(found)} private name(s) imported across modules: " + "; ".join(f"{m} takes {t}.{n}" for m, t, n in found)


def test_the_allow_lists_hold_only_what_is_still_there():
    "An entry of an allow-list that the code no longer has is deleted, so that the lists only shrink."
    g, priv = graph()
    now = {(m, t, n) for m, ps in priv.items() for t, n in ps}
    stale = sorted((REMOVED_AT_MERGE | UNASSIGNED_AT_MERGE) - now)
    stale_cycles = [e for e in CYCLE_EDGES_REMOVED_AT_MERGE if e[1] not in g.get(e[0], ())]
    assert not stale and not stale_cycles, f"allow-list entries no longer in the code (delete them): {stale} {stale_cycles}"


INDEX = PKG.parent / "nbs" / "index.ipynb"   # the README's Architecture table comes from here (one source)


def layer_table(markdown: str, nbs: Path) -> list[tuple[str, list[str]]]:
    """The layers of the table in `markdown` (`| layer | notebooks | job |` rows, lowest first) as (layer, modules): each
    backticked numbered notebook (`02_metrics`) named by the module its `#| default_exp` exports."""
    rows = [r for r in markdown.splitlines() if r.startswith("| ") and not r.startswith(("| layer ", "|---"))]
    out = []
    for r in rows:
        layer, notebooks = (c.strip() for c in r.strip().strip("|").split("|")[:2])
        mods = []
        for nb in re.findall(r"`(\d\d[a-z]?_\w+)`", notebooks):
            m = re.search(r"#\|\s*default_exp\s+(\w+)", (nbs / f"{nb}.ipynb").read_text(encoding="utf-8"))
            assert m, f"{nb}.ipynb (in the layer table) exports no module"
            mods.append(m.group(1))
        out.append((layer, mods))
    return out


def layers() -> list[tuple[str, list[str]]]:
    "The README's layer table, read from nbs/index.ipynb's Architecture cell."
    cells = json.loads(INDEX.read_text(encoding="utf-8"))["cells"]
    md = next("".join(c["source"]) for c in cells if c["cell_type"] == "markdown" and "| layer |" in "".join(c["source"]))
    return layer_table(md, INDEX.parent)


def upward(g: dict[str, set[str]], table: list[tuple[str, list[str]]]) -> list[tuple[str, str, str, str]]:
    "Imports from a module to one of a higher layer: (module, its layer, the module imported, that one's layer)."
    rank = {m: i for i, (_, ms) in enumerate(table) for m in ms}
    return sorted((m, table[rank[m]][0], d, table[rank[d]][0]) for m, ds in g.items() for d in ds
                  if m in rank and d in rank and rank[d] > rank[m])


def test_the_layer_reader_finds_what_it_should(tmp_path):
    "The table reader and the rule, on planted notebooks: a low module importing a high one is found, the reverse is not."
    for nb, mod in (("00_low", "low"), ("01a_mid", "mid"), ("02_high", "high")):
        (tmp_path / f"{nb}.ipynb").write_text(json.dumps({"cells": [{"source": [f"#| default_exp {mod}"]}]}))
    md = ("| layer | notebooks | job |\n|---|---|---|\n| base | `00_low`, `01a_mid` | x |\n"
          "| top | `02_high`; templates in `nbs/experiments/` | y |\n")
    table = layer_table(md, tmp_path)
    assert table == [("base", ["low", "mid"]), ("top", ["high"])]
    assert upward({"low": {"mid", "high"}, "high": {"low"}, "mid": set()}, table) == [("low", "base", "high", "top")]


def test_every_module_is_in_one_layer():
    "Every module of the package is in exactly one row of the README's layer table, and every module named there exists."
    named = [m for _, ms in layers() for m in ms]
    mods = set(modules())
    twice = sorted({m for m in named if named.count(m) > 1})
    assert not twice and set(named) == mods, (f"in two rows: {twice}; in no row of nbs/index.ipynb's layer table: "
                                              f"{sorted(mods - set(named))}; named but gone: {sorted(set(named) - mods)}")


def test_imports_go_to_the_same_layer_or_below():
    "Data flows one way: a module imports only modules of its own layer or of a lower one (the README's table)."
    g, _ = graph()
    found = upward(g, layers())
    assert not found, f"{len(found)} import(s) up the layer table: " + "; ".join(
        f"{m} ({lm}) imports {d} ({ld})" for m, lm, d, ld in found)


MAX_LINES = 500   # issue 32: no module over ~500 lines (the generated _modidx excepted)


def test_no_module_over_the_line_budget(capsys):
    "Every module holds at most MAX_LINES lines; the largest is printed (`pytest -s`)."
    sizes = {m: len(p.read_text(encoding="utf-8").splitlines()) for m, p in modules().items()}
    big = max(sizes, key=sizes.get)
    with capsys.disabled(): print(f"\nlargest module: {big}.py, {sizes[big]} lines")
    over = {m: n for m, n in sorted(sizes.items(), key=lambda x: -x[1]) if n > MAX_LINES}
    assert not over, f"modules over {MAX_LINES} lines (split them by job): " + ", ".join(f"{m} ({n})" for m, n in over.items())
