# Two entry points a new user needs: `make train` and `make test`. Both create .venv when missing.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# torch and torchvision are pinned to the builds pip finds on this machine's disk; timm needs both.
TORCH_PINS := torch==2.14.1 torchvision==0.29.1

# Every other distribution is pinned to the versions CI tests by constraints.txt (`make constraints` refreshes
# it); `make setup CONSTRAINTS=` installs the newest releases pyproject.toml allows instead.
CONSTRAINTS ?= constraints.txt
EXTRAS := export,dev,tensorboard,docs
INSTALL_ARGS := $(TORCH_PINS) -e ".[$(EXTRAS)]"

.PHONY: setup constraints train eval test lint docs bench device-check clean

$(BIN)/.installed: pyproject.toml $(CONSTRAINTS)
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q $(if $(CONSTRAINTS),-c $(CONSTRAINTS)) $(TORCH_PINS)
	$(BIN)/pip install -q $(if $(CONSTRAINTS),-c $(CONSTRAINTS)) -e ".[$(EXTRAS)]"
	$(if $(CONSTRAINTS),$(BIN)/python .ci/refresh-constraints --check $(CONSTRAINTS) -- $(INSTALL_ARGS))
	touch $@

setup: $(BIN)/.installed

# Re-resolve all dependencies to the newest releases pyproject.toml allows, rewrite constraints.txt, install it.
constraints:
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python .ci/refresh-constraints constraints.txt -- $(INSTALL_ARGS)
	$(MAKE) setup CONSTRAINTS=constraints.txt

train: setup
	$(BIN)/python train.py $(ARGS)

eval: setup
	$(BIN)/python eval.py $(ARGS)

# The tests run in pytest-xdist workers, one per core (at most 4: each holds torch and its tests' models), a
# whole test file to one worker so a module's shared fixture is built once, the files with the most slow tests
# first (tests/conftest.py orders them and gives each worker its share of the cores). TEST_WORKERS=0: in this process
# (pdb, -x on the first failure in order).
TEST_WORKERS ?= auto
test: setup
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --maxprocesses=4 --dist loadfile --no-loadscope-reorder $(ARGS)

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports --no-cache

# The documentation site (mkdocs.yml, docs/) at http://127.0.0.1:8000, rebuilt on every save; CI builds it with
# `mkdocs build --strict`. ARGS passes options through, e.g. ARGS="-a 0.0.0.0:8000".
docs: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve $(ARGS)

bench: setup
	$(BIN)/python -m segattn.bench $(ARGS)

# On a machine with a CUDA device: the CUDA tests and the GPU tables into docs/gpu/ (.ci/device-check), in
# 8 minutes. No `setup` prerequisite: it must run offline in an installed checkout. DRY_RUN=1: every step on
# the CPU at tiny sizes, into bench_results/device-dry-run/ (docs/performance.md, "The device script").
device-check:
	test -x $(BIN)/python || { echo "device-check: no $(BIN)/python; run make setup first"; exit 1; }
	PY=$(BIN)/python .ci/device-check

clean:
	rm -rf outputs multirun .pytest_cache .ruff_cache site test-report.xml test-durations.txt
