"""The package's import graph, read from the source with `ast`: no import cycle between its modules, and no module taking a
private name (`_x`) from another (`from .m import _x`, `from embvar_study.m import _x`, or `m._x` on an imported module).
Each failure lists what it found. No module is over 500 lines; the largest module's line count is printed (`pytest -s`)."""
import ast
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


REPORT_LAYER = {"display", "findings", "sections", "experiment_sections", "report"}   # the README's report layer
INTERFACE = {"cli", "cli_args", "cli_report", "compare"}                             # above it


def test_nothing_below_the_report_layer_imports_it():
    "Data flows one way: no module of the numerics ... findings layers imports a report-layer module (the README's Architecture)."
    g, _ = graph()
    assert REPORT_LAYER | INTERFACE <= set(g), f"layer lists name modules that are gone: {sorted((REPORT_LAYER | INTERFACE) - set(g))}"
    found = {m: sorted(d & REPORT_LAYER) for m, d in g.items() if m not in REPORT_LAYER | INTERFACE and d & REPORT_LAYER}
    assert not found, "modules below the report layer importing it: " + "; ".join(f"{m} imports {', '.join(d)}" for m, d in found.items())


MAX_LINES = 500   # issue 32: no module over ~500 lines (the generated _modidx excepted)


def test_no_module_over_the_line_budget(capsys):
    "Every module holds at most MAX_LINES lines; the largest is printed (`pytest -s`)."
    sizes = {m: len(p.read_text(encoding="utf-8").splitlines()) for m, p in modules().items()}
    big = max(sizes, key=sizes.get)
    with capsys.disabled(): print(f"\nlargest module: {big}.py, {sizes[big]} lines")
    over = {m: n for m, n in sorted(sizes.items(), key=lambda x: -x[1]) if n > MAX_LINES}
    assert not over, f"modules over {MAX_LINES} lines (split them by job): " + ", ".join(f"{m} ({n})" for m, n in over.items())
