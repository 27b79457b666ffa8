# Everything sets itself up: a virtual environment in .venv with the CPU build of torch (constraints/cpu.txt).
#   make demo   tune the example transformer under a 1 GiB budget on the CPU, then answer from the database
#   make test   run the test suite
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv demo test test-scale lint clean postgres-server

$(STAMP): pyproject.toml constraints/cpu.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints/cpu.txt -e '.[dev,ort]'
	touch $@

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/autotune run --budget 1GiB --trials 10 examples/gpt.py
	$(BIN)/autotune best --budget 1GiB --json examples/gpt.py

# The storage tests start their own PostgreSQL server on loopback; they need its binaries (Debian's
# postgresql package), installed here when missing and we are root (as on CI), else they are skipped.
postgres-server:
	@if command -v initdb >/dev/null || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null; \
	else echo "no PostgreSQL server binaries: the PostgreSQL tests will be skipped (apt-get install postgresql)"; fi

# Tests on two pytest-xdist workers (TEST_WORKERS=0: in this process), all but the `scale` ones (dozens of
# worker processes for minutes: `make test-scale`, CI's second phase, runs them alone). No test compares
# speeds: those are benchmarks (bench/). PYTEST_ARGS adds pytest options: PYTEST_ARGS='-k resume'. pytest
# exits 5 when it collects no test (a `-k` that matches nothing): we say so and pass.
TEST_WORKERS ?= 2
test: $(STAMP) postgres-server
	$(BIN)/python -m pytest -n $(TEST_WORKERS) -m "not scale" $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests"; rc=0; fi; exit $$rc

test-scale: $(STAMP) postgres-server
	$(BIN)/python -m pytest -m scale $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests"; rc=0; fi; exit $$rc

# ruff (lint and format) and mypy over the package (storage/ included, as autotune/storage).
lint: $(STAMP)
	$(BIN)/ruff check autotune storage tests examples bench
	$(BIN)/ruff format --check autotune storage tests examples bench
	$(BIN)/mypy

clean:
	rm -rf $(VENV) build *.egg-info
