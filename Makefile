# Everything sets itself up: a virtual environment in .venv with the CPU build of torch (constraints/cpu.txt).
#   make demo   measure the example transformer with and without activation checkpointing (CPU)
#   make test   run the test suite
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv demo test lint clean

$(STAMP): pyproject.toml constraints/cpu.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints/cpu.txt -e '.[dev]'
	touch $@

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/autotune measure examples/gpt.py --batch-size 16 --plan none --budget 2GiB
	$(BIN)/autotune measure examples/gpt.py --batch-size 16 --plan all --budget 2GiB

# pytest exits 5 when it collects no test (a `-k` that matches nothing, say): say so rather than fail.
test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests"; rc=0; fi; exit $$rc

lint: $(STAMP)
	$(BIN)/ruff check autotune storage tests examples bench
	$(BIN)/mypy

clean:
	rm -rf $(VENV) build *.egg-info
