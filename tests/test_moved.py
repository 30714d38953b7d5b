"""Names that moved between modules import from their old place (issue 41, item 4): each entry of `moved.MOVED` imports
from its old module with a DeprecationWarning that names the new home, as the very object the new home holds; names that
never lived there still fail; `CHANGELOG.md` lists every move."""
import importlib
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from embvar_study.moved import MOVED

ROOT = Path(__file__).resolve().parent.parent
ENTRIES = sorted((old, name, home) for old, names in MOVED.items() for name, home in names.items())


@pytest.mark.parametrize("old,name,home", ENTRIES)
def test_a_moved_name_imports_from_its_old_place(old, name, home):
    new = getattr(importlib.import_module(f"embvar_study.{home}"), name)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ns: dict = {}
        exec(f"from embvar_study.{old} import {name}", ns)   # the user's statement, as written
    assert ns[name] is new, f"embvar_study.{old}.{name} is not embvar_study.{home}.{name}"
    dep = [w for w in caught if issubclass(w.category, DeprecationWarning)]
    assert len(dep) == 1 and f"embvar_study.{home}.{name}" in str(dep[0].message), [str(w.message) for w in caught]
    assert dep[0].filename == "<string>", f"the warning points at {dep[0].filename}, not at the importing line"


def test_the_issue_names_are_in_the_table():
    "The three names the issue found raising ImportError (public in metrics two releases ago)."
    assert {n: MOVED["metrics"][n] for n in ("linear_cka", "rsa", "knn_overlap")} == \
        {"linear_cka": "similarity", "rsa": "rsa", "knn_overlap": "similarity"}


def test_a_name_that_never_lived_there_still_fails():
    with pytest.raises(ImportError, match="no_such_name"):
        exec("from embvar_study.metrics import no_such_name", {})
    assert not hasattr(importlib.import_module("embvar_study.stats"), "linear_cka")   # moved, but not from stats
    assert not hasattr(importlib.import_module("embvar_study.tracking"), "no_such_name")


def test_importing_an_old_module_imports_no_new_home():
    "The new home is imported when the old path is used, not when the old module is imported (no edge, no cycle)."
    code = ("import sys, embvar_study.metrics as m; assert 'embvar_study.spectra' not in sys.modules, 'imported early'; "
            "m.effective_rank; assert 'embvar_study.spectra' in sys.modules")
    r = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_the_changelog_lists_every_move():
    "CHANGELOG.md has a line `- from `old` to `home`: `name`, ...` for every move in the table."
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    lines = {m.group(1, 2): set(re.findall(r"`(\w+)`", m.group(3)))
             for m in re.finditer(r"^- from `(\w+)` to `(\w+)`: (.*)$", text, flags=re.M)}
    missing = [f"{old}.{name} -> {home}" for old, name, home in ENTRIES if name not in lines.get((old, home), set())]
    assert not missing, f"CHANGELOG.md does not list: {missing}"
