# One entry point per task. Each target creates or reuses .venv and installs what it needs.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The test environment adds what the suite also exercises: the `ray` extra (`make train` does without it).
TEST_STAMP := $(VENV)/.installed-test
# The tested torch. On these CPU machines torch==2.13.0 resolves to a local CPU wheel; GPU users
# see the README ("Choosing your torch build").
TORCH_SPEC ?= torch==2.13.0

.PHONY: setup train test lint format bench bench-quick gpu-check clean

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

$(TEST_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e ".[dev,ray]"
	touch $(TEST_STAMP)

setup: $(STAMP) $(TEST_STAMP)

train: $(STAMP)
	$(PY) -m project fit --config configs/digits.yaml

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

format: $(STAMP)
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format .

test: lint $(TEST_STAMP) slurm
	$(PY) -m pytest

# A real one-node SLURM for tests/test_slurm.py (skipped without it): Debian's packages (about 20 s), installed
# only by root where apt-get exists; never fails the target.
.PHONY: slurm
slurm:
	@command -v slurmctld >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	  slurmctld slurmd slurm-client munge) >/dev/null 2>&1; } || \
	  echo "note: SLURM is not installed (needs root and apt-get): tests/test_slurm.py will be skipped"

bench: $(STAMP)
	$(PY) -m bench

bench-quick: $(STAMP)
	$(PY) -m bench --quick

gpu-check: $(STAMP)
	$(PY) -m bench.gpu_check

clean:
	rm -rf logs bench/results/tmp .pytest_cache
