"""Notebooks are committed with their outputs (as fastcore and nbdev commit theirs): this runs them and checks them.

    python nbs/_outputs.py --write [NB ...]   execute each notebook as nbdev_test does and store its outputs
                                              (then cleaned as nbdev_clean cleans: no execution counts, no metadata)
    python nbs/_outputs.py --check [NB ...]   execute each notebook and fail unless the outputs it produces are the ones
                                              committed (what `make test` runs; it replaces nbdev_test: same cells run)
    python nbs/_outputs.py --share [NB ...]   print, per notebook, the share of non-export code cells that carry outputs

Notebooks: nbs/index.ipynb, the module notebooks nbs/NN_*.ipynb and the guides nbs/guide_*.ipynb (the papermill
templates in nbs/experiments/ are parameterised and committed without outputs). Cells run as nbdev_test runs them:
`#| eval: false` cells and cells flagged with settings.ini's `tst_flags` are skipped (their committed outputs are kept).

Volatile fields are not compared: stderr (progress bars, warnings), sha256 digests, timestamps, pids, memory
addresses, temporary paths, durations, and image bytes (a figure is compared
by its presence and kind: PNG bytes change with matplotlib's version). Floats are compared to 4 significant digits, and
those below 1e-9 in size as 0 (the last bits of a float sum differ between CPU kernels). A cell tagged `volatile` is run but its outputs are not
compared (a benchmark that prints a time).
"""
from __future__ import annotations
import argparse, json, os, re, sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NBS = ROOT / "nbs"


def notebooks() -> list[Path]:
    "The notebooks committed with outputs, in order."
    found = [NBS / "index.ipynb"] if (NBS / "index.ipynb").exists() else []
    return found + sorted(NBS.glob("[0-9][0-9]*_*.ipynb")) + sorted(NBS.glob("guide_*.ipynb"))


def _skip_flags() -> set[str]:
    from nbdev.config import get_config
    return set(str(get_config().get("tst_flags", "")).split("|")) - {""}


def _is_export(source: str) -> bool:
    return bool(re.search(r"^#\|\s*(export|exports|exporti|default_exp)\b", source, flags=re.M))


def execute(path: Path) -> tuple[list | None, str | None]:
    """Run `path` as nbdev_test does; return (outputs per cell, None) or (None, the error).
    A cell that was skipped gets None (its committed outputs are kept)."""
    os.environ.setdefault("MPLBACKEND", "Agg")
    os.environ["IN_TEST"] = "1"
    from execnb.shell import CaptureShell
    from fastcore.xtras import working_directory
    from nbdev.process import NBProcessor
    from nbdev.frontmatter import FrontmatterProc
    flags = _skip_flags()
    nb = NBProcessor(path, procs=FrontmatterProc, process=True).nb
    ran = []

    def no_eval(cell):
        if cell.cell_type != "code": return True
        if "nbdev_export" + "(" in cell.source: return True
        direc = getattr(cell, "directives_", {}) or {}
        if direc.get("eval:", [""])[0].lower() == "false" or flags & direc.keys(): return True
        ran.append(cell.idx_); return False

    shell = CaptureShell(path)
    try:
        with working_directory(path.parent):
            shell.run_all(nb, exc_stop=True, preproc=no_eval)
    except Exception:
        return None, shell.prettytb(fname=path)
    return [c.get("outputs", []) if c.idx_ in ran else None for c in nb.cells], None


def _clean_outputs(outputs: list) -> list:
    "Outputs as nbdev_clean leaves them: no execution counts, no metadata; text as one string per output."
    out = []
    for o in outputs:
        o = {k: v for k, v in dict(o).items() if k not in ("execution_count", "metadata")}
        if o.get("output_type") in ("execute_result", "display_data"): o["metadata"] = {}
        if o.get("output_type") == "execute_result": o["execution_count"] = None
        out.append(json.loads(json.dumps(o, default=str)))
    return out


_VOLATILE = [(re.compile(r"\b[0-9a-f]{64}\b"), "<sha256>"),
             (re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?([+-]\d\d:\d\d|Z)?"), "<when>"),
             (re.compile(r"\bpid \d+"), "pid <n>"),
             (re.compile(r"0x[0-9a-fA-F]{6,}"), "0x…"),
             (re.compile(r"(/tmp|/var/folders|/private/var)/[^\s'\")]+"), "<tmp>"),
             (re.compile(r"\b\d+(\.\d+)?\s?(s|ms|µs|us|ns|sec|seconds)\b"), "<time>"),
             (re.compile(r"\b\d+m\d+(\.\d+)?s\b"), "<time>")]
_FLOAT = re.compile(r"(?<![\w.])[-+]?\d+\.\d+(?:[eE][-+]?\d+)?(?![\w.])|(?<![\w.])[-+]?\d+[eE][-+]?\d+(?![\w.])")


def _digits(m) -> str:
    "A float to 4 significant digits; below 1e-9 in size, 0 (a zero's rounding noise, e.g. 4.8e-31 on one CPU and 2.3e-31 on another)."
    x = float(m.group())
    return "0" if abs(x) < 1e-9 else f"{x:.4g}"


def _text(v) -> str: return v if isinstance(v, str) else "".join(v)


def normalise(outputs: list | None) -> list:
    "What is compared of a cell's outputs: kinds, text with volatile fields masked and floats to 4 digits, figure kinds."
    res = []
    for o in outputs or []:
        kind = o.get("output_type")
        if kind == "stream" and o.get("name") == "stderr": continue      # progress bars and warnings: volatile
        if kind == "stream": items = {"text/plain": _text(o.get("text", ""))}
        elif kind == "error": items = {"error": o.get("ename", "")}
        else: items = {k: (_text(v) if k.startswith("text/") else "<bytes>") for k, v in (o.get("data") or {}).items()}
        for k, v in items.items():
            if k.startswith("text/"):
                for pat, rep in _VOLATILE: v = pat.sub(rep, v)
                v = _FLOAT.sub(_digits, v)
                items[k] = v.rstrip()
        res.append((kind, o.get("name", ""), sorted(items.items())))
    # consecutive stream chunks of one stream are one output, however the kernel split them
    merged = []
    for r in res:
        if merged and r[0] == "stream" and merged[-1][0] == "stream" and merged[-1][1] == r[1]:
            merged[-1] = ("stream", r[1], [("text/plain", merged[-1][2][0][1] + "\n" + r[2][0][1])])
        else: merged.append(r)
    return merged


def _tags(cell) -> list: return (cell.get("metadata") or {}).get("tags", [])


def write(path: Path) -> str:
    outs, err = execute(path)
    if err: return f"{path.relative_to(ROOT)}: failed\n{err}"
    nb = json.loads(path.read_text(encoding="utf-8"))
    for cell, o in zip(nb["cells"], outs):
        if cell["cell_type"] == "code" and o is not None:
            cell["outputs"] = _clean_outputs(o); cell["execution_count"] = None
    path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    from nbdev.clean import nbdev_clean
    nbdev_clean(fname=str(path))
    return f"{path.relative_to(ROOT)}: outputs written"


def check(path: Path) -> str | None:
    "None if `path` runs and produces its committed outputs; else what differs."
    outs, err = execute(path)
    rel = path.relative_to(ROOT)
    if err: return f"{rel}: failed to execute\n{err}"
    nb = json.loads(path.read_text(encoding="utf-8"))
    diffs = []
    for i, (cell, o) in enumerate(zip(nb["cells"], outs)):
        if cell["cell_type"] != "code" or o is None or "volatile" in _tags(cell): continue
        want, got = normalise(cell.get("outputs", [])), normalise(_clean_outputs(o))
        if want != got:
            first = _text(cell["source"]).splitlines()[:1]
            diffs.append(f"  cell {i} ({first[0][:60] if first else ''!s}):\n    committed {str(want)[:300]}\n    produced  {str(got)[:300]}")
    if diffs:
        return (f"{rel}: {len(diffs)} cell(s) produce outputs other than those committed "
                f"(run `python nbs/_outputs.py --write {rel}` and commit, if the change is meant):\n" + "\n".join(diffs))
    return None


def share(path: Path) -> tuple[int, int]:
    "(non-export code cells with outputs, non-export code cells)"
    nb = json.loads(path.read_text(encoding="utf-8"))
    cells = [c for c in nb["cells"] if c["cell_type"] == "code" and _text(c["source"]).strip() and not _is_export(_text(c["source"]))]
    return sum(bool(c.get("outputs")) for c in cells), len(cells)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true"); mode.add_argument("--check", action="store_true")
    mode.add_argument("--share", action="store_true")
    ap.add_argument("notebooks", nargs="*", type=Path)
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args(argv)
    paths = [p.resolve() for p in a.notebooks] or notebooks()
    missing = [str(p) for p in paths if not p.is_file()]
    if missing: print(f"notebooks: no such file {missing[0]}", file=sys.stderr); return 2
    if a.share:
        for p in paths:
            k, n = share(p); print(f"{p.relative_to(ROOT)}: {k} of {n} non-export code cells carry outputs ({k / max(n, 1):.0%})")
        return 0
    sys.path.insert(0, str(NBS)); import _outputs as me          # spawned workers import the functions by module name
    job = me.write if a.write else me.check
    if a.workers <= 1: results = [job(p) for p in paths]
    else:
        import multiprocessing
        # a fresh process per notebook: nothing (open figures, caches) carries over from one notebook to the next
        with ProcessPoolExecutor(max_workers=a.workers, mp_context=multiprocessing.get_context("spawn"), max_tasks_per_child=1) as pool:
            results = list(pool.map(job, paths))
    bad = [r for r in results if r and (a.check or "failed" in r.split("\n")[0])]
    for r in results:
        if r and a.write: print(r.split("\n")[0])
    for r in bad: print(r, file=sys.stderr)
    print(f"{len(paths) - len(bad)} passed, {len(bad)} failed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
