# One entry point per task. Each target creates or reuses .venv and installs what it needs.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The test environment adds what the suite also exercises: the `ray`, `tracking`, `sweep` and `storage` extras and
# `storage-server` (moto's S3 server for the object-storage tests); `make train` does without them.
TEST_STAMP := $(VENV)/.installed-test
AUDIT_STAMP := $(VENV)/.installed-audit
# The tested torch. On these CPU machines torch==2.13.0 resolves to a local CPU wheel; GPU users
# see the README ("Choosing your torch build"). Split into words on purpose: it may carry pip options
# (TORCH_SPEC="torch==2.13.0 --index-url URL").
TORCH_VERSION := 2.13.0
TORCH_SPEC ?= torch==$(TORCH_VERSION)

# Locked installs: requirements/ holds one lock per install set, generated from pyproject.toml by `make lock`,
# every distribution but torch pinned with == and its sha256 hashes (Linux x86_64, CPython 3.11):
#   lock-pip.txt    pip itself, installed first
#   lock.txt        .[dev]                            make setup, train, lint
#   lock-test.txt   .[dev,ray,tracking,sweep,storage,storage-server]   make test
#   lock-audit.txt  the test set + audit                          make audit (resolved first; the others keep its pins)
# Torch and hash-checking: pip's --require-hashes wants a hash for every package it installs, dependencies included,
# and torch (a local CPU wheel, or a CUDA build from PyTorch's index) has none in a lock. So each lock is installed
# with --require-hashes --no-deps, and lists torch's own dependencies too (filelock, sympy, mpmath, networkx, jinja2,
# markupsafe, fsspec, typing-extensions, setuptools). The lock goes in BEFORE torch: `pip install $(TORCH_SPEC)` then
# finds those dependencies installed and hash-checked, and adds torch alone (and, for a CUDA build, the CUDA
# libraries from PyTorch's index). Torch first would let pip take its dependencies unpinned from the index, and the
# lock would then skip them as already installed without checking their hashes. --only-binary: nothing is built.
# The project goes in editable, without dependencies and without build isolation (setuptools is in the lock), and
# `pip check` proves the whole set complete and consistent.
CHECK_PYTHON := import sys; sys.exit(sys.version_info[:2] != (3, 11) and \
  "$(VENV) is not CPython 3.11, which the locks in requirements/ are for: make PYTHON=python3.11 VENV=<new folder>")
INSTALL_LOCK := $(PY) -m pip install --quiet --require-hashes --no-deps --only-binary :all: -r

.PHONY: strip setup train test test-fast test-slow lint format bench bench-quick gpu-check clean lock audit

$(STAMP): pyproject.toml Makefile requirements/lock-pip.txt requirements/lock.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -c '$(CHECK_PYTHON)'
	$(INSTALL_LOCK) requirements/lock-pip.txt
	$(INSTALL_LOCK) requirements/lock.txt
	$(PY) -m pip install --quiet $(TORCH_SPEC)
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	$(PY) -m pip check
	touch $(STAMP)

$(TEST_STAMP): $(STAMP) requirements/lock-test.txt
	$(INSTALL_LOCK) requirements/lock-test.txt
	$(PY) -m pip check
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

# The everyday suite: every lane but the slow one and conformance (docs/development.md, "The lanes"). `make test-slow`:
# the slow lane, the long multi-process proofs (elastic training, SLURM, object storage, multi-process sweeps, hangs,
# the real-accuracy runs: tests/conftest.py's SLOW_FILES and the tests marked `slow`); CI runs it after `make test`.
# `make test-fast`: tests/unit and the end-to-end checks marked `fast` (a fit, a resume, a plan, bad input, 2
# processes under Lightning's launcher and torchrun): ~1 min.
# Two pytest-xdist workers, a test file each at a time (--dist loadfile: a file's module fixtures, the reference runs
# its tests compare with, run once): one worker's imports, waits and timeouts leave the second core idle otherwise.
# TEST_WORKERS=0 runs in one process. The files whose checks are about time under signals and kills (a stop within
# its grace period, a requeue, a straggler, a timeout) run afterwards on their own: beside another worker's
# processes on 2 cores they missed their deadlines.
TEST_WORKERS ?= 2
PYTEST := $(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile
ALONE := $(addprefix tests/distributed/,test_preemption.py test_resume.py test_rank_failure.py \
  test_timed_checkpoint.py test_slurm.py test_orphans.py test_stop_signals.py) \
  $(wildcard $(addprefix tests/extras/resilience/distributed/,test_stragglers.py test_elastic.py))

# Lint beside the installs: two jobs at once.
test:
	$(MAKE) --no-print-directory -j2 lint $(TEST_STAMP)
	$(PYTEST) -m "not slow" $(addprefix --ignore=,$(ALONE)) --ignore=tests/conformance
	$(PY) -m pytest -m "not slow" $(ALONE)

# The installs beside SLURM's (apt, about 20 s), which only the slow lane's test_slurm.py uses.
test-slow:
	$(MAKE) --no-print-directory -j2 $(TEST_STAMP) slurm
	$(PYTEST) -m slow $(addprefix --ignore=,$(ALONE)) --ignore=tests/conformance
	$(PY) -m pytest -m slow $(ALONE)

test-fast: $(TEST_STAMP)
	$(PYTEST) -m "unit or fast"

# The conformance lane, after `make test` in CI: every documented Lightning feature x layout x check, as a user's
# plain module (tests/conformance); it rewrites docs/conformance.md when every cell was judged.
.PHONY: conformance
conformance: $(TEST_STAMP)
	$(PYTEST) tests/conformance

# A real one-node SLURM for tests/distributed/test_slurm.py (skipped without it): Debian's packages (about 20 s),
# installed only by root where apt-get exists; never fails the target.
.PHONY: slurm
slurm:
	@command -v slurmctld >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	  slurmctld slurmd slurm-client munge) >/dev/null 2>&1; } || \
	  echo "note: SLURM is not installed (needs root and apt-get): tests/distributed/test_slurm.py will be skipped"

bench: $(STAMP)
	$(PY) -m bench

bench-quick: $(STAMP)
	$(PY) -m bench --quick

gpu-check: $(STAMP)
	$(PY) -m bench.gpu_check

# `make strip EXTRAS="sweep tracking"` (or EXTRAS=all): delete optional layers (project/extras/<name>/) with their
# tests, docs, configs and pyproject extra; what remains passes `make test` (README, "Make it yours"). No install.
strip:
	$(PYTHON) scripts/strip.py $(EXTRAS)

clean:
	rm -rf logs bench/results/tmp .pytest_cache

# `make lock`: the locks regenerated from pyproject.toml (after changing a pin there; review the diff and commit it).
# uv resolves for Linux x86_64 and CPython 3.11 against the CPU build torch==$(TORCH_VERSION)+cpu, found in
# TORCH_WHEELS (pip's find-links on these machines): torch's dependencies are locked, torch is not, nor are CUDA's
# libraries. Pins already in the files are kept where still valid; `make lock LOCK_ARGS=--upgrade` takes the newest.
UV_SPEC := uv==0.13.9
TORCH_WHEELS ?= /opt/wheels
LOCK_ARGS ?=
UV_COMPILE = $(VENV)/bin/uv pip compile --quiet --generate-hashes --python-version 3.11 \
  --python-platform x86_64-unknown-linux-gnu --no-emit-package torch --find-links $(TORCH_WHEELS) \
  --custom-compile-command "make lock" $(LOCK_ARGS)
LOCK_NOTE := = uv pip compile ($(UV_SPEC), flags in the Makefile) of pyproject.toml for Linux x86_64, CPython 3.11;
LOCK_NOTE2 := torch is left out: the Makefile installs it from TORCH_SPEC. Install with pip --require-hashes --no-deps.

lock:
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet "$(UV_SPEC)"
	echo "torch==$(TORCH_VERSION)+cpu" | $(UV_COMPILE) pyproject.toml - --extra dev --extra ray --extra tracking \
	  --extra sweep --extra storage --extra storage-server --extra audit -o requirements/lock-audit.txt
	echo "torch==$(TORCH_VERSION)+cpu" | $(UV_COMPILE) pyproject.toml - --extra dev --extra ray --extra tracking \
	  --extra sweep --extra storage --extra storage-server -c requirements/lock-audit.txt -o requirements/lock-test.txt
	echo "torch==$(TORCH_VERSION)+cpu" | $(UV_COMPILE) pyproject.toml - --extra dev \
	  -c requirements/lock-audit.txt -o requirements/lock.txt
	echo pip | $(UV_COMPILE) - -c requirements/lock-audit.txt -o requirements/lock-pip.txt
	sed -i -e '2a #    $(LOCK_NOTE)' -e '2a #    $(LOCK_NOTE2)' requirements/lock-audit.txt requirements/lock-test.txt \
	  requirements/lock.txt requirements/lock-pip.txt

# `make audit`: pip-audit over the installed environment (the audit set: all the locks hold, and torch). The
# advisories listed in requirements/audit-ignore.txt, each with its date and reason, are passed as --ignore-vuln;
# any other finding fails. When the advisory service cannot be reached: one note, exit 0. AUDIT_ARGS go to
# pip-audit (e.g. AUDIT_ARGS="-s osv" for the OSV service instead of PyPI's).
AUDIT_ARGS ?=
$(AUDIT_STAMP): $(STAMP) requirements/lock-audit.txt
	$(INSTALL_LOCK) requirements/lock-audit.txt
	$(PY) -m pip check
	touch $(AUDIT_STAMP)

audit: $(AUDIT_STAMP)
	$(PY) requirements/audit.py $(AUDIT_ARGS)
