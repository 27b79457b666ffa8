# Everything sets itself up: a virtual environment in .venv with the CPU build of torch (constraints/cpu.txt).
#   make demo   tune the example transformer under a 1 GiB budget on the CPU, answer, and draw it (demo-report.html)
#   make test   run the test suite
#   make test-compat   the model-compatibility suite (Hugging Face, torchvision, Lightning models; CI's phase)
#   make docs   build the documentation site (docs/, mkdocs.yml) into build/site
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu

.PHONY: venv demo test test-scale test-ranks deepspeed-extra test-deepspeed ray-extra test-ray test-compat lint docs clean postgres-server browser

# The test extra (transformers, torchvision, Lightning) is part of the development environment. PyPI's
# torchvision is built against CUDA torch: tests/compat/site lets it import beside the CPU wheel (see there).
$(STAMP): pyproject.toml constraints/cpu.txt tests/compat/site/autotune_test_torchvision.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	@# The CPU build of torch: a local wheel where pip finds one (this project's machines and CI), else
	@# PyTorch's CPU-only index: on PyPI, torch for Linux x86_64 is the CUDA build (several GB more).
	if ! $(BIN)/python -m pip install --quiet --dry-run --no-index --no-deps -c constraints/cpu.txt torch \
		>/dev/null 2>&1; then \
		$(BIN)/python -m pip install --quiet -c constraints/cpu.txt --index-url $(TORCH_CPU_INDEX) \
			torch torchvision; \
	fi
	$(BIN)/python -m pip install --quiet -c constraints/cpu.txt -e '.[dev,ort,test]'
	cp tests/compat/site/autotune_test_torchvision.py tests/compat/site/autotune_test_torchvision.pth \
		"$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
	touch $@

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/autotune run --budget 1GiB --trials 10 examples/gpt.py
	$(BIN)/autotune best --budget 1GiB --json examples/gpt.py
	$(BIN)/autotune report --output demo-report.html --png

# The storage tests start their own PostgreSQL server on loopback; they need its binaries (Debian's
# postgresql package), installed here when missing and we are root (as on CI), else they are skipped.
postgres-server:
	@if command -v initdb >/dev/null || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "installing Debian's postgresql package with apt-get (the storage tests start their own server on loopback; without it they are skipped)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null; \
	else echo "no PostgreSQL server binaries: the PostgreSQL tests will be skipped (apt-get install postgresql)"; fi

# The report test opens `autotune report`'s HTML in a headless Chromium (Debian's package), installed here
# when missing and we are root (as on CI), else that test is skipped with the reason.
browser:
	@if command -v chromium >/dev/null || command -v chromium-browser >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "installing Debian's chromium package with apt-get (the report's browser test opens its HTML; without it that test is skipped)"; \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } \
		|| echo "could not install Chromium: the report's browser test will be skipped"; \
	else echo "no Chromium: the report's browser test will be skipped (apt-get install chromium)"; fi

# Tests on pytest-xdist workers (CORE_WORKERS=0: in this process), all but the `scale` ones (dozens of
# worker processes for minutes: `make test-scale` runs them alone) and the `compat` ones (real Hugging
# Face, torchvision and Lightning models, and the longest compile and ORT runs, for minutes: `make
# test-compat`); CI runs each phase. No test compares
# speeds: those are benchmarks (bench/). PYTEST_ARGS adds pytest options: PYTEST_ARGS='-k resume'. pytest
# exits 5 when it collects no test (a `-k` that matches nothing): we say so and pass.
# The core suite runs on four workers where the others run on two: many of its tests wait on trials whose
# steps sleep (a verification's twelve 0.25 s steps, a worker's heartbeat grace), and two workers left the
# two cores idle for 30% of the run (9:56 here; 8:19 on three; on three it grew to 9:07 and CI's 9:50, the
# cores busy 92% of it on four: 8:27, bench/results/ci-phases-cpu.txt). Their torch processes run one
# thread each (OMP_NUM_THREADS=1, as the other phases): four workers' trials each spinning two OpenMP threads
# on two cores made the finder's tests 5x slower than alone (88 s against 16), and the suite grew to 11:15
# here, CI's to 11:30; one thread each: 8:33 (with the probe-width test probing once: ~30 s of it).
TEST_WORKERS ?= 2
CORE_WORKERS ?= 4
test: $(STAMP) postgres-server browser
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -n $(CORE_WORKERS) -m "not scale and not compat and not ranks and not ray" $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests"; rc=0; fi; exit $$rc

# DeepSpeed for the ZeRO-plan tests (pyproject's `deepspeed` extra: tests only), installed apart as Ray is.
# `make test-deepspeed` runs them (tests/ranks/test_zero_plans.py: real 2-rank DeepSpeed jobs, ~3 minutes
# here) after building DeepSpeed's shared-memory collectives (ninja, ~1 minute on two cores, once: torch's
# extension cache) outside any trial. Not a CI phase yet: beside the compatibility phase they took CI past
# its 40 minutes (43:07 and 40+ at a819830); `make test-ranks` skips them where DeepSpeed is not installed.
deepspeed-extra: $(STAMP)
	$(BIN)/python -m pip install --quiet -c constraints/cpu.txt deepspeed

test-deepspeed: deepspeed-extra
	$(BIN)/python -c "from deepspeed.comm.torch import build_shm_op; build_shm_op()" >/dev/null
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -n $(TEST_WORKERS) -m ranks tests/ranks/test_zero_plans.py $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests"; rc=0; fi; exit $$rc

# One torch thread per process, as in the compatibility phase beside it: two ranks of two threads each on
# two cores spin in OpenMP's barriers.
test-ranks: $(STAMP)
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -n $(TEST_WORKERS) -m ranks $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests"; rc=0; fi; exit $$rc

# One torch thread per process: two workers' real models on two cores, each with torch's default of two
# threads, oversubscribe the cores (a 25 s test took 176 s beside the compile test on CI's machine).
test-compat: $(STAMP)
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -n $(TEST_WORKERS) -m compat $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests"; rc=0; fi; exit $$rc

# Trials placed on a real local Ray cluster (several raylets on this host; tests/cluster). Ray is the cluster
# extra (pyproject's `ray`): `ray-extra` installs it (constraints/cpu.txt pins the version tested), and
# touches nothing else in the environment, so other phases can run beside this one; `make test` never needs
# it. One test at a time: each starts its own cluster.
ray-extra: $(STAMP)
	$(BIN)/python -m pip install --quiet -c constraints/cpu.txt ray

test-ray: ray-extra
	$(BIN)/python -m pytest -p no:xdist -m ray $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests"; rc=0; fi; exit $$rc

test-scale: $(STAMP) postgres-server
	$(BIN)/python -m pytest -m scale $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests"; rc=0; fi; exit $$rc

# ruff (lint and format) and mypy over the package (storage/ included, as autotune/storage).
# The documentation site (mkdocs.yml) into build/site: --strict, so a broken link or anchor fails. The
# commands and code in the pages are checked by the core suite (tests/test_docs.py).
docs: $(STAMP)
	$(BIN)/python -m pip install --quiet -c constraints/cpu.txt -e '.[docs]'
	$(BIN)/mkdocs build --strict --quiet

lint: $(STAMP)
	$(BIN)/ruff check autotune storage tests examples bench
	$(BIN)/ruff format --check autotune storage tests examples bench
	$(BIN)/mypy

clean:
	rm -rf $(VENV) build *.egg-info
