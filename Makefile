# tock: `make run` starts the whole system locally; `make test` runs the whole suite.
# Both set everything up on a fresh machine (Debian/Ubuntu, Python 3.11+).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
LS_VENV := .localstack-venv
CHECKOV_VENV := .checkov-venv
PYTEST_ARGS ?=
# pytest-xdist workers for `make test`, each with its own Postgres and LocalStack (0: one
# process). The suite mostly waits on processes and servers, so two workers halve it even
# on two cores.
TEST_WORKERS ?= 2

.PHONY: help install run test test-fast check lint typecheck bench bench-full clean system-deps \
	checkov-venv infra-check faults

help:
	@echo "make run        start Postgres, LocalStack SQS, a timer, two consumers, a demo producer"
	@echo "make test       set up and run the whole test suite"
	@echo "make check      ruff + mypy (strict) + the import contract (lint-imports)"
	@echo "make faults     the fault suite at full size; writes docs/faults.md"
	@echo "make bench      quick benchmark profile (see bench/)"
	@echo "make infra-check  deployment checks: cfn-lint, checkov, kubernetes-validate, KEDA, deploy test"

$(BIN)/.installed: requirements-dev.lock pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -r requirements-dev.lock
	$(BIN)/pip install -q --disable-pip-version-check --no-deps -e .
	touch $@

# LocalStack pins clash with a current boto3, so it lives in its own venv.
$(LS_VENV)/.installed: localstack/requirements.txt
	$(PYTHON) -m venv $(LS_VENV)
	$(LS_VENV)/bin/pip install -q --disable-pip-version-check -r localstack/requirements.txt
	touch $@

# checkov pins an old boto3 too: its own venv, from the exact set in infra/.
$(CHECKOV_VENV)/.installed: infra/checkov-requirements.txt
	$(PYTHON) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/pip install -q --disable-pip-version-check -r infra/checkov-requirements.txt
	touch $@

checkov-venv: $(CHECKOV_VENV)/.installed

# Postgres server binaries, and for the tests Chromium (the dashboard's browser tests),
# come from Debian's packages when they are missing.
system-deps:
	@bash devstack/system-deps.sh --browser

install: $(BIN)/.installed $(LS_VENV)/.installed system-deps

run: $(BIN)/.installed $(LS_VENV)/.installed
	@bash devstack/system-deps.sh
	$(BIN)/python -m devstack.run

test: install $(CHECKOV_VENV)/.installed
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist worksteal $(PYTEST_ARGS)

check: $(BIN)/.installed
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache

lint: check

# The deployment checks alone (`make test` runs them too: they are tests/infra).
infra-check: install $(CHECKOV_VENV)/.installed
	$(BIN)/python -m pytest tests/infra -q $(PYTEST_ARGS)

# The fault suite at full size: >= 1,000 jobs per scenario (kill -9, Postgres restart and
# stop, LocalStack restart, a partition, poison messages); writes docs/faults.md.
faults: install
	$(BIN)/python -m tests.faults --profile full --out docs/faults.md

bench: install
	$(BIN)/python -m bench --profile quick

bench-full: install
	$(BIN)/python -m bench --profile full

clean:
	rm -rf $(VENV) $(LS_VENV) $(CHECKOV_VENV) .bench-peers-venv .mypy_cache .ruff_cache .pytest_cache
