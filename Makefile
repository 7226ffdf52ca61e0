# One entry point per task. Each target creates or reuses .venv and installs what it needs.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The tested torch. On these CPU machines torch==2.13.0 resolves to a local CPU wheel; GPU users
# see the README ("Choosing your torch build").
TORCH_SPEC ?= torch==2.13.0

.PHONY: setup train test lint format bench bench-quick clean

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

setup: $(STAMP)

train: $(STAMP)
	$(PY) -m project fit --config configs/digits.yaml

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

format: $(STAMP)
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format .

test: lint
	$(PY) -m pytest

bench: $(STAMP)
	$(PY) -m bench

bench-quick: $(STAMP)
	$(PY) -m bench --quick

clean:
	rm -rf logs bench/results/tmp .pytest_cache
