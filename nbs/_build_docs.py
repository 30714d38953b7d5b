"""Build the documentation site: every module notebook and guide notebook (nbs/guide_*.ipynb) executed and rendered with
its outputs, and the README (itself generated from nbs/index.ipynb) as the index, into one folder of static HTML pages with a shared contents sidebar and working links (no network, no quarto).

    python nbs/_build_docs.py _docs            (what `make docs` runs)
    python nbs/_build_docs.py --readme         (README.md from nbs/index.ipynb, what `make readme` runs)
    python nbs/_build_docs.py --environment    (print environment.yml, generated from settings.ini)
"""
import configparser, html, re, shlex, sys, time
from pathlib import Path

import mistune, nbformat
from nbclient import NotebookClient
from nbconvert import HTMLExporter

ROOT = Path(__file__).resolve().parent.parent
CSS = """body{margin:0;font:15px/1.55 -apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;color:#1d1d1f}
.layout{display:grid;grid-template-columns:250px minmax(0,1fr);min-height:100vh}
nav{background:#f6f7f9;border-right:1px solid #e3e5e8;padding:18px 16px;font-size:14px;position:sticky;top:0;height:100vh;overflow:auto;box-sizing:border-box}
nav a{display:block;color:#0b57d0;text-decoration:none;padding:2px 0}nav a.here{font-weight:600;color:#1d1d1f}
nav .group{margin:12px 0 2px;font-size:12px;text-transform:uppercase;color:#666;letter-spacing:.04em}
main{padding:12px 36px 60px;max-width:1100px}pre,code{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:13px}
pre{background:#f6f7f9;padding:8px 10px;border-radius:4px;overflow-x:auto;white-space:pre-wrap}
.jp-InputArea,.input_area{background:#f6f7f9;border-radius:4px;margin:8px 0 2px}.output_area pre{background:#fff;border-left:3px solid #d7dbe0}
table{border-collapse:collapse;font-size:13px}td,th{border-bottom:1px solid #e3e5e8;padding:3px 8px;text-align:left}
img{max-width:100%;height:auto}a.anchor-link{display:none}.prompt{display:none}"""

LAYERS = [("numerics", ["00", "01", "02", "03", "04"]), ("material", ["05", "06", "07"]), ("runs", ["08", "09", "10", "11"]),
          ("studies", ["12", "13", "14", "15"]), ("findings", ["16", "17", "18", "19", "20"]), ("interface", ["21", "22"])]


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
    return sorted(p for p in (ROOT / "nbs").glob("[0-9][0-9]_*.ipynb")) + guides()


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


def sidebar(current: str) -> str:
    by_num = {p.name[:2]: p for p in pages()}
    out = [f'<a href="index.html"{" class=here" if current == "index.html" else ""}>Overview (README)</a>']
    out.append('<div class="group">guides</div>')
    for g in guides():
        name = g.stem + ".html"
        out.append(f'<a href="{name}"{" class=here" if current == name else ""}>{html.escape(g.stem[6:])}</a>')
    for layer, nums in LAYERS:
        out.append(f'<div class="group">{layer}</div>')
        for n in nums:
            if n in by_num:
                name = by_num[n].stem + ".html"
                out.append(f'<a href="{name}"{" class=here" if current == name else ""}>{html.escape(by_num[n].stem[3:])}</a>')
    return "<nav>" + "".join(out) + "</nav>"


def page(title: str, body: str, current: str) -> str:
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)} — embvar-study</title>'
            f'<style>{CSS}</style></head><body><div class="layout">{sidebar(current)}<main>{body}</main></div></body></html>')


def readme_html() -> str:
    "The README rendered, its links made to work from _docs/: notebooks to their pages, everything else to the checkout."
    body = mistune.create_markdown(escape=False, plugins=["table"])((ROOT / "README.md").read_text(encoding="utf-8"))
    def fix(m):
        attr, url = m.group(1), m.group(2)
        if re.match(r"^(https?:|#|mailto:)", url): return m.group(0)
        nb = re.match(r"^nbs/(\d\d_[\w]+|guide_\w+)\.ipynb(#.*)?$", url)
        return f'{attr}="{nb.group(1)}.html{nb.group(2) or ""}"' if nb else f'{attr}="../{url}"'
    return re.sub(r'(href|src)="([^"]+)"', fix, body)


def notebook_html(path: Path, execute: bool = True) -> str:
    nb = nbformat.read(path, as_version=4)
    for c in nb.cells:   # slow cells (a Ray cluster, a subprocess) are shown, not run, as nbdev_test does
        if c.cell_type == "code" and re.match(r"^#\|\s*notest", c.source): c.metadata.setdefault("tags", []).append("skip-execution")
    if execute: NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}},
                               extra_arguments=["--IPKernelApp.log_level=ERROR"]).execute()
    body, _ = HTMLExporter(template_name="basic").from_notebook_node(nb)
    return re.sub(r'href="(\d\d_[\w]+|guide_\w+)\.ipynb(#[^"]*)?"', r'href="\1.html\2"', body)


def build(dest: Path, execute: bool = True) -> list[Path]:
    dest.mkdir(parents=True, exist_ok=True)
    written = [dest / "index.html"]
    written[0].write_text(page("Overview", readme_html(), "index.html"), encoding="utf-8")
    for p in pages():
        t = time.perf_counter()
        (dest / f"{p.stem}.html").write_text(page(p.stem, notebook_html(p, execute), f"{p.stem}.html"), encoding="utf-8")
        written.append(dest / f"{p.stem}.html")
        print(f"{p.name}: {time.perf_counter() - t:.1f}s", flush=True)
    return written


if __name__ == "__main__":
    if sys.argv[1:] == ["--environment"]: sys.stdout.write(environment_yml())
    elif sys.argv[1:] == ["--readme"]:
        (ROOT / "README.md").write_text(readme_text(), encoding="utf-8")
        print(f"README.md written from nbs/index.ipynb ({readme_text().count(chr(10))} lines)")
    else:
        out = build(Path(sys.argv[1] if len(sys.argv) > 1 else ROOT / "_docs"), execute="--no-execute" not in sys.argv)
        print(f"docs: {len(out)} pages in {out[0].parent}")
