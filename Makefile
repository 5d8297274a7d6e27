# Two entry points a new user needs: `make train` and `make test`. Both create .venv when missing.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# torch and torchvision are pinned to the builds pip finds on this machine's disk; timm needs both.
TORCH_PINS := torch==2.14.1 torchvision==0.29.1

.PHONY: setup train test lint bench clean

$(BIN)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q $(TORCH_PINS)
	$(BIN)/pip install -q -e ".[export,dev]"
	touch $@

setup: $(BIN)/.installed

train: setup
	$(BIN)/python train.py $(ARGS)

test: setup
	$(BIN)/python -m pytest -q $(ARGS)

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

bench: setup
	$(BIN)/python -m segattn.bench $(ARGS)

clean:
	rm -rf outputs multirun .pytest_cache .ruff_cache
