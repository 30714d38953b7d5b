"""Build the documentation site as nbdev renders one, without quarto: a page for every module notebook (nbs/NN_*.ipynb
and the lettered nbs/NNa_*.ipynb) and guide (nbs/guide_*.ipynb), executed and rendered with its outputs, and the README
(itself generated from nbs/index.ipynb) as the index, into one folder of static HTML pages with a shared contents
sidebar and working links. As nbdev's pages: `#|` directive lines are left out, and so are `#| hide` and `#| exporti`
cells; an `#| export` cell is shown as its public definitions, each by nbdev's `show_doc` (a heading, the signature,
the docstring, and fastcore's parameter table); maths ($...$) is typeset by MathJax, loaded in each page's head.

    python nbs/_build_docs.py _docs            (what `make docs` runs)
    python nbs/_build_docs.py _docs --no-execute [--mathjax URL]   (the committed outputs; MathJax from URL)
    python nbs/_build_docs.py --readme         (README.md from nbs/index.ipynb, what `make readme` runs)
    python nbs/_build_docs.py --environment    (print environment.yml, generated from settings.ini)
"""
import ast, configparser, html, importlib, inspect, re, shlex, sys, time
from pathlib import Path

import mistune, nbformat
from nbclient import NotebookClient
from nbconvert import HTMLExporter

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path: sys.path.insert(0, str(ROOT))   # show_doc documents this checkout's package
MATHJAX = "https://cdn.jsdelivr.net/npm/mathjax@3/es5/tex-chtml.js"
CSS = """body{margin:0;font:15px/1.55 -apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;color:#1d1d1f}
.layout{display:grid;grid-template-columns:250px minmax(0,1fr);min-height:100vh}
nav{background:#f6f7f9;border-right:1px solid #e3e5e8;padding:18px 16px;font-size:14px;position:sticky;top:0;height:100vh;overflow:auto;box-sizing:border-box}
nav a{display:block;color:#0b57d0;text-decoration:none;padding:2px 0}nav a.here{font-weight:600;color:#1d1d1f}
nav .group{margin:12px 0 2px;font-size:12px;text-transform:uppercase;color:#666;letter-spacing:.04em}
main{padding:12px 36px 60px;max-width:1100px}pre,code{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:13px}
pre{background:#f6f7f9;padding:8px 10px;border-radius:4px;overflow-x:auto;white-space:pre-wrap}
.jp-InputArea,.input_area{background:#f6f7f9;border-radius:4px;margin:8px 0 2px}.output_area pre{background:#fff;border-left:3px solid #d7dbe0}
table{border-collapse:collapse;font-size:13px}td,th{border-bottom:1px solid #e3e5e8;padding:3px 8px;text-align:left}
img{max-width:100%;height:auto}a.anchor-link{display:none}.prompt{display:none}
.doc{border-top:1px solid #d7dbe0;margin-top:22px}
.doc h3{font-family:ui-monospace,Menlo,Consolas,monospace;margin:10px 0 4px}.doc table{margin:6px 0 10px}
.doc td:first-child{font-family:ui-monospace,Menlo,Consolas,monospace}"""

LAYERS = [("numerics", ["00", "01", "02", "03", "04"]), ("material", ["05", "06", "07"]),
          ("runs", ["08", "09", "10", "11"]), ("studies", ["12", "13", "14", "15"]),
          ("findings", ["16", "17", "18", "19", "20"]), ("interface", ["21", "22", "23"])]


def settings() -> configparser.SectionProxy:
    cfg = configparser.ConfigParser(delimiters=["="]); cfg.read(ROOT / "settings.ini", encoding="utf-8")
    return cfg["DEFAULT"]


def environment_yml() -> str:
    "environment.yml from settings.ini: torch pinned first, then the runtime and dev requirements, then the package."
    s = settings()
    reqs = shlex.split(s["requirements"]); dev = shlex.split(s["dev_requirements"])
    torch = [r for r in reqs if r.startswith("torch")]
    lines = ["# Generated from settings.ini by `make environment.yml` (tests/test_packaging.py checks that they agree).",
             "# conda env create -f environment.yml && conda activate embvar-study",
             "# torch is pinned to the version CI uses; for a GPU, install the CUDA build of torch first (see README).",
             "name: embvar-study", "channels:", "  - conda-forge", "dependencies:", f"  - python={s['min_python']}", "  - pip", "  - pip:",
             "      - torch==2.13.0"]
    lines += [f"      - {r}" for r in reqs if r not in torch] + [f"      - {r}" for r in dev] + ['      - -e ".[dev,offline]"']
    return "\n".join(lines) + "\n"


def pages() -> list[Path]:
    "The notebooks that get a page: every module notebook (numbered, lettered or not) in order, then the guides."
    return sorted(p for p in (ROOT / "nbs").glob("[0-9][0-9]*_*.ipynb")) + guides()


def guides() -> list[Path]:
    "The documentation notebooks (no module of their own), in the order the README lists them."
    found = {p.stem: p for p in (ROOT / "nbs").glob("guide_*.ipynb")}
    return [found.pop(n) for n in GUIDE_ORDER if n in found] + sorted(found.values())


GUIDE_ORDER = ["guide_tracking", "guide_compare", "guide_stability", "guide_models", "guide_runs", "guide_scaling",
               "guide_measurements"]
README_NOTE = "<!-- Generated from nbs/index.ipynb by `python nbs/_build_docs.py --readme` (make readme): edit the notebook, not this file. -->"


def _text(v) -> str: return v if isinstance(v, str) else "".join(v)


def readme_text(index: Path | None = None) -> str:
    """README.md from `index` (default nbs/index.ipynb), as nbdev's readme makes it: markdown cells as they are, code cells
    as ```python blocks (nbdev's `#|` directive lines dropped; `#| hide` cells left out), each followed by its committed
    text outputs (stdout and plain-text results) as a plain block. Deterministic: the same notebook gives the same bytes."""
    nb = nbformat.read(index or ROOT / "nbs" / "index.ipynb", as_version=4)
    parts = [README_NOTE]
    for c in nb.cells:
        src = _text(c.source).strip("\n")
        if c.cell_type == "markdown":
            if src: parts.append(src)
            continue
        if c.cell_type != "code" or re.search(r"^#\|\s*hide\b", src, flags=re.M): continue
        code = "\n".join(l for l in src.splitlines() if not re.match(r"^#\|", l)).strip("\n")
        if code: parts.append(f"```python\n{code}\n```")
        out = []
        for o in c.get("outputs", []):
            if o.get("output_type") == "stream" and o.get("name") == "stdout": out.append(_text(o["text"]))
            elif o.get("output_type") == "execute_result" and "text/plain" in o.get("data", {}):
                out.append(_text(o["data"]["text/plain"]) + "\n")
        text = "".join(out).strip("\n")
        if text: parts.append(f"```\n{text}\n```")
    return "\n\n".join(parts) + "\n"


def _link(name: str, text: str, current: str) -> str:
    return f'<a href="{name}"{" class=here" if current == name else ""}>{html.escape(text)}</a>'


def sidebar(current: str) -> str:
    "The contents: the README, the guides, then every module notebook under its layer (any other under 'other')."
    out = [_link("index.html", "Overview (README)", current), '<div class="group">guides</div>']
    out += [_link(g.stem + ".html", g.stem[6:], current) for g in guides()]
    modules = [p for p in pages() if p.name[:2].isdigit()]
    groups = LAYERS + [("other", sorted({p.name[:2] for p in modules} - {n for _, ns in LAYERS for n in ns}))]
    for layer, nums in groups:
        mine = [p for p in modules if p.name[:2] in nums]
        if mine:
            out += [f'<div class="group">{layer}</div>'] + [_link(p.stem + ".html", p.stem.split("_", 1)[1], current)
                                                          for p in mine]
    return "<nav>" + "".join(out) + "</nav>"


def page(title: str, body: str, current: str, mathjax: str = MATHJAX) -> str:
    "One HTML page: the contents sidebar, `body`, and MathJax (at `mathjax`) typesetting $...$ and \\(...\\)."
    math = ("<script>window.MathJax={tex:{inlineMath:[['$','$'],['\\\\(','\\\\)']]}};</script>"   # MathJax 3
            '<script type="text/x-mathjax-config">MathJax.Hub.Config({tex2jax:{inlineMath:'
            '[["$","$"],["\\\\(","\\\\)"]],processEscapes:true}});</script>'                      # MathJax 2
            f'<script async src="{html.escape(mathjax)}"></script>')
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            f'<title>{html.escape(title)} — embvar-study</title><style>{CSS}</style>{math}</head><body>'
            f'<div class="layout">{sidebar(current)}<main>{body}</main></div></body></html>')


def readme_html(markdown: str | None = None) -> str:
    """The README (or `markdown` written as the README is, from the checkout's root) rendered, its links made to work
    from _docs/: notebooks to their pages, everything else to the checkout."""
    text = (ROOT / "README.md").read_text(encoding="utf-8") if markdown is None else markdown
    body = mistune.create_markdown(escape=False, plugins=["table"])(text)
    def fix(m):
        attr, url = m.group(1), m.group(2)
        if re.match(r"^(https?:|#|mailto:)", url): return m.group(0)
        nb = re.match(r"^nbs/(\d\d[a-z]?_\w+|guide_\w+)\.ipynb(#.*)?$", url)
        return f'{attr}="{nb.group(1)}.html{nb.group(2) or ""}"' if nb else f'{attr}="../{url}"'
    return re.sub(r'(href|src)="([^"]+)"', fix, body)


DIRECTIVE = re.compile(r"^#\|\s*([\w-]+)", flags=re.M)


def _directives(src: str) -> set[str]: return set(DIRECTIVE.findall(src))


def _without_directives(src: str) -> str:
    return "\n".join(l for l in src.splitlines() if not DIRECTIVE.match(l)).strip("\n")


def _anno(a) -> str: return a.strip("'") if isinstance(a, str) else inspect.formatannotation(a)


def _default(d) -> str: return d.__name__ if inspect.isroutine(d) or inspect.isclass(d) else repr(d)


def _param(p: inspect.Parameter) -> str:
    "A parameter as the source writes it: annotations as written, functions and classes by name (no object ids)."
    out = {p.VAR_POSITIONAL: "*", p.VAR_KEYWORD: "**"}.get(p.kind, "") + p.name
    if p.annotation is not p.empty: out += ": " + _anno(p.annotation)
    return out + (f" = {_default(p.default)}" if p.default is not p.empty else "")


def signature_line(obj, name: str) -> str:
    "`name(params) -> return` on one line, or one parameter a line when that is over 100 characters."
    try: sig = inspect.signature(obj)
    except (ValueError, TypeError): return name
    ps = [_param(p) for p in sig.parameters.values() if p.name != "self"]
    ret = "" if sig.return_annotation is sig.empty or inspect.isclass(obj) else " -> " + _anno(sig.return_annotation)
    one = f"{name}({', '.join(ps)}){ret}"
    return one if len(one) <= 100 else f"{name}(\n" + "".join(f"    {p},\n" for p in ps) + f"){ret}"


def param_table(obj) -> str:
    """The parameter table nbdev shows under a signature (fastcore's `docments`: each parameter's type, default and
    comment, then what it returns), as markdown; columns that no row fills are left out, `|` in a cell escaped."""
    from fastcore.docments import docments
    try: dm = docments(obj, full=True)
    except (ValueError, TypeError, OSError, NameError): return ""
    dm.pop("self", None)
    if inspect.isclass(obj): dm.pop("return", None)
    try: params = inspect.signature(obj).parameters   # the annotations as written (docments infers NoneType from None)
    except (ValueError, TypeError): params = {}
    for k, d in dm.items():
        if k in params: d["anno"] = params[k].annotation
    cols = [("anno", "Type", _anno), ("default", "Default", _default), ("docment", "Details", str)]
    empty = inspect.Parameter.empty
    filled = lambda d, c: c in d and d[c] is not empty and (d[c] is not None or c == "default")   # None: a default
    cols = [col for col in cols if any(filled(d, col[0]) for d in dm.values())]
    if not any(filled(d, "docment") for d in dm.values()): return ""
    cell = lambda d, c, f: f(d[c]).replace("|", "\\|").replace("\n", " ") if filled(d, c) else ""
    rows = [[f"`{k}`" if k != "return" else "**returns**"] + [cell(d, c, f) for c, _, f in cols] for k, d in dm.items()]
    head = ["parameter"] + [t for _, t, _ in cols]
    return "\n".join("| " + " | ".join(r) + " |" for r in [head, ["--"] * len(head)] + rows)


def doc_markdown(obj, name: str) -> str:
    """One definition as nbdev shows it (`nbdev.showdoc.show_doc`): its name as a heading, its signature, its docstring,
    and its parameter table (`param_table`)."""
    from nbdev.showdoc import show_doc
    try: r = show_doc(obj, name=name, title_level=3)
    except NameError: r = None   # an annotation only a type checker resolves ("torch.Tensor"): the docstring as it is
    out = [f"### {name}", f"```python\n{signature_line(obj, name)}\n```"]
    own = getattr(obj, "__doc__", None)   # show_doc falls back on the type's docstring ("Call self as a function.")
    docs = (r.docs if r is not None else inspect.cleandoc(own)) if own else None
    if docs: out.append(docs)
    if table := param_table(obj): out.append(table)
    return "\n\n".join(out)


def public_definitions(src: str, module) -> list[str]:
    "The functions and classes a cell defines at its top level that `module` exports (its `__all__`), in order."
    names = [n.name for n in ast.parse(_without_directives(src)).body
             if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    public = getattr(module, "__all__", None)
    return [n for n in names if (n in public if public is not None else not n.startswith("_")) and hasattr(module, n)]


def doc_cells(nb) -> list:
    """The cells of an (executed) notebook as its page shows them, nbdev's way: `#| hide` and `#| exporti` cells left
    out; an `#| export` cell replaced by a markdown cell of its public definitions (`doc_markdown`; `#| exports` keeps
    the source above it); every other cell without its `#|` lines, and left out when nothing remains."""
    exp = next((m.group(1) for c in nb.cells if c.cell_type == "code"
                for m in [re.search(r"^#\|\s*default_exp\s+(\w+)", c.source, flags=re.M)] if m), None)
    module = importlib.import_module(f"embvar_study.{exp}") if exp else None
    out = []
    for c in nb.cells:
        if c.cell_type != "code": out.append(c); continue
        d = _directives(c.source)
        if d & {"hide", "exporti"}: continue
        if d & {"export", "exports"} and module is not None:
            if "exports" in d: out.append(nbformat.v4.new_code_cell(_without_directives(c.source)))
            docs = [doc_markdown(getattr(module, n), n) for n in public_definitions(c.source, module)]
            blocks = [f'<div class="doc">\n\n{m}\n\n</div>' for m in docs]
            if blocks: out.append(nbformat.v4.new_markdown_cell("\n\n".join(blocks)))
            continue
        c.source = _without_directives(c.source)
        if c.source or c.get("outputs"): out.append(c)
    return out


def notebook_html(path: Path, execute: bool = True) -> str:
    "A notebook's page body: executed (or with its committed outputs), its cells as `doc_cells` shows them."
    nb = nbformat.read(path, as_version=4)
    for c in nb.cells:   # slow cells (a Ray cluster, a subprocess) are shown, not run, as nbdev_test does
        if c.cell_type == "code" and re.match(r"^#\|\s*notest", c.source): c.metadata.setdefault("tags", []).append("skip-execution")
    if execute: NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}},
                               extra_arguments=["--IPKernelApp.log_level=ERROR"]).execute()
    nb.cells = doc_cells(nb)
    body, _ = HTMLExporter(template_name="basic").from_notebook_node(nb)
    return re.sub(r'href="(\d\d[a-z]?_\w+|guide_\w+)\.ipynb(#[^"]*)?"', r'href="\1.html\2"', body)


def notebook_title(path: Path) -> str:
    "A page's title as nbdev takes it: the notebook's first `# heading`, else its file name."
    for c in nbformat.read(path, as_version=4).cells:
        if c.cell_type == "markdown" and (m := re.match(r"^#\s+(.+)$", c.source.strip(), flags=re.M)): return m.group(1)
    return path.stem


def build(dest: Path, execute: bool = True, mathjax: str = MATHJAX) -> list[Path]:
    dest.mkdir(parents=True, exist_ok=True)
    written = [dest / "index.html"]
    written[0].write_text(page("Overview", readme_html(), "index.html", mathjax), encoding="utf-8")
    for p in pages():
        t = time.perf_counter()
        body = notebook_html(p, execute)
        (dest / f"{p.stem}.html").write_text(page(notebook_title(p), body, f"{p.stem}.html", mathjax), encoding="utf-8")
        written.append(dest / f"{p.stem}.html")
        print(f"{p.name}: {time.perf_counter() - t:.1f}s", flush=True)
    return written


if __name__ == "__main__":
    if sys.argv[1:] == ["--environment"]: sys.stdout.write(environment_yml())
    elif sys.argv[1:] == ["--readme"]:
        (ROOT / "README.md").write_text(readme_text(), encoding="utf-8")
        print(f"README.md written from nbs/index.ipynb ({readme_text().count(chr(10))} lines)")
    else:
        args = sys.argv[1:]
        if "--mathjax" in args and (args.index("--mathjax") + 1 == len(args) or args[args.index("--mathjax") + 1][:2] == "--"):
            print("_build_docs.py: --mathjax: expected the URL of MathJax's script after it", file=sys.stderr); sys.exit(2)
        mathjax = args[args.index("--mathjax") + 1] if "--mathjax" in args else MATHJAX
        folder = next((a for a in args if not a.startswith("--") and a != mathjax), str(ROOT / "_docs"))
        out = build(Path(folder), execute="--no-execute" not in args, mathjax=mathjax)
        print(f"docs: {len(out)} pages in {out[0].parent}")
