# tock: `make run` starts the whole system locally; `make test` runs the whole suite.
# Both set everything up on a fresh machine (Debian/Ubuntu, Python 3.11+).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
LS_VENV := .localstack-venv
PYTEST_ARGS ?=

.PHONY: help install run test test-fast check lint typecheck bench bench-full clean system-deps

help:
	@echo "make run        start Postgres, LocalStack SQS, a timer, two consumers, a demo producer"
	@echo "make test       set up and run the whole test suite"
	@echo "make check      ruff + mypy (strict)"
	@echo "make bench      quick benchmark profile (see bench/)"

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

# Postgres server binaries and Chromium (for the dashboard's browser tests) come from
# Debian's packages when they are missing.
system-deps:
	@bash devstack/system-deps.sh

install: $(BIN)/.installed $(LS_VENV)/.installed system-deps

run: install
	$(BIN)/python -m devstack.run

test: install
	$(BIN)/python -m pytest $(PYTEST_ARGS)

check: $(BIN)/.installed
	$(BIN)/ruff check .
	$(BIN)/mypy

lint: check

bench: install
	$(BIN)/python -m bench --profile quick

bench-full: install
	$(BIN)/python -m bench --profile full

clean:
	rm -rf $(VENV) $(LS_VENV) .mypy_cache .ruff_cache .pytest_cache
