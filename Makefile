# The README's two commands: `make demo` and `make test`. Both set up .venv.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# System packages the tests need on Linux (the lab: sshd, namespaces, nftables;
# OpenBLAS for a usable mlx CPU build; graphviz for topology pictures; chromium
# to render the HTML report headless in tests/test_report_browser.py; zsh, a
# Mac's login shell, which the lab hosts run remote commands through; fish, a
# login shell no launcher's command line parses, for doctor's login-shell check).
SYSTEM_PACKAGES := openssh-server iproute2 nftables libopenblas0-pthread graphviz chromium rsync zsh fish

.PHONY: venv system-deps demo test test-quick test-busy test-launches test-shuffled test-each-alone test-durations lint clean

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install -q --disable-pip-version-check -e '.[dev,plot]'
	@touch $@

# Idempotent and quiet; only on Linux as root (elsewhere the lab tests skip,
# or fail under CI=true, with the reason).
system-deps:
	@if [ "$$(uname -s)" = Linux ] && [ "$$(id -u)" = 0 ] && command -v dpkg >/dev/null; then \
	  missing=""; \
	  for p in $(SYSTEM_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	  if [ -n "$$missing" ]; then \
	    echo "installing system packages:$$missing"; \
	    apt-get update -qq >/dev/null && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  fi; \
	fi

demo: venv system-deps
	@$(PY) -m mlxcluster demo

# Parallel workers (pytest-xdist): most of the lab tests' time is waiting
# (ssh, timeouts, process start-up), so more workers than cores pays; each
# worker starts its own labs. Whole files go to a worker (a file's fixtures
# are made once), longest first as tests/durations.json measured them
# (tests/conftest.py). docs/testing.md has the layout and the measurements.
TEST_WORKERS ?= 4
PYTEST_ARGS ?=
PARALLEL := -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder
test: venv system-deps
	@$(PY) -m pytest $(PARALLEL) --durations=30 $(PYTEST_ARGS)

# The edit-run loop: every test that needs no lab and starts no multi-rank launch
# (tests/launches.json says which do), under 3 minutes (docs/testing.md).
test-quick: venv
	@$(PY) -m pytest $(PARALLEL) --quick --durations=10 $(PYTEST_ARGS)

# The whole suite beside BUSY processes that keep the cores busy: it must pass.
BUSY ?= 2
test-busy: venv system-deps
	@$(PY) -m tests.busy --procs $(BUSY) -- $(PY) -m pytest $(PARALLEL) --durations=30 $(PYTEST_ARGS)

# Measure again which tests start a launcher or ranks (the quick lane leaves them out).
test-launches: venv system-deps
	@$(PY) -m pytest $(PARALLEL) --record-launches tests/launches.json $(PYTEST_ARGS)

# The same suite in an order shuffled by SEED (a new one each run unless given).
SEED ?= $(shell date +%s)
test-shuffled: venv system-deps
	@MLXCLUSTER_TEST_SHUFFLE=$(SEED) $(PY) -m pytest $(PARALLEL) --durations=30 $(PYTEST_ARGS)

# Every test file alone, in a pytest process of its own (TEST_WORKERS at a time).
test-each-alone: venv system-deps
	@$(PY) -m tests.each_alone --jobs $(TEST_WORKERS)

# Measure again how long each test file takes (the order make test runs them in).
test-durations: venv system-deps
	@$(PY) -m pytest $(PARALLEL) --record-durations tests/durations.json $(PYTEST_ARGS)

lint: venv
	@$(VENV)/bin/ruff check mlxcluster reference_train tests bench

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache runs
