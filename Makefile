# Two entry points a new user needs: `make train` and `make test`. Both create .venv when missing.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# torch and torchvision are pinned to the builds pip finds on this machine's disk; timm needs both.
TORCH_PINS := torch==2.14.1 torchvision==0.29.1

# Every other distribution is pinned to the versions CI tests by constraints.txt (`make constraints` refreshes
# it); `make setup CONSTRAINTS=` installs the newest releases pyproject.toml allows instead.
CONSTRAINTS ?= constraints.txt
EXTRAS := export,dev,tensorboard
INSTALL_ARGS := $(TORCH_PINS) -e ".[$(EXTRAS)]"

.PHONY: setup constraints train eval test lint bench clean

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

test: setup
	$(BIN)/python -m pytest -q $(ARGS)

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

bench: setup
	$(BIN)/python -m segattn.bench $(ARGS)

clean:
	rm -rf outputs multirun .pytest_cache .ruff_cache
