# The two commands in the README: `make demo` and `make test`. Both create .venv themselves.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: install system-deps test test-faults wheel test-wheel demo bench docs clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -c constraints-dev.txt torch==2.13.0
	$(PY) -m pip install -q -c constraints-dev.txt -e '.[torch,dev,report,hf,lightning,s3,docs,trackers]'
	touch $(STAMP)

# Debian packages of the real Slurm/Prometheus tests, only when missing; never fails (they skip).
system-deps:
	@bash .ci/system-deps

# Parallel (pytest-xdist). Most of a test's time is a real process starting, saving, being killed or
# restarting, so workers outnumber cores: 2 per core, at least 4. On 2 cores the suite is CPU-bound
# in parallel (one run used ~33 CPU-minutes: torch imports, warm standbys), so more workers there only
# add contention and stretch the tests' timing; on more cores the count grows with them.
# `make test WORKERS=0` runs serially in one process. --dist loadgroup keeps each real daemon's tests
# (tests/deploy: Slurm, Prometheus) on the one worker that started it.
WORKERS ?= $(shell $(PYTHON) -c "import os; print(max(4, 2 * len(os.sched_getaffinity(0))))")
XDIST   := -n $(WORKERS) --dist loadgroup

test: install system-deps
	$(PY) -m pytest -q -ra --durations=15 $(XDIST) -m "not long" tests

# The long variants, wherever they are: the chaos soak, repeated seeds and every save mode of the
# resume and DDP tests. One marker selects them (tests/test_markers.py checks that none escapes it).
test-faults: install system-deps
	$(PY) -m pytest -q -ra --durations=15 $(XDIST) -m long tests

# The sdist and wheel in dist/ (an isolated build: only pyproject.toml's build requirements), then
# check-wheel-contents on the wheel (its settings: [tool.check-wheel-contents] in pyproject.toml).
DIST := dist

wheel: install
	rm -rf $(DIST)
	$(PY) -m build -q --outdir $(DIST) .
	$(VENV)/bin/check-wheel-contents $(DIST)/*.whl

# The wheel as a user installs it: a fresh venv (torch pinned as above, then the wheel, not editable,
# with [hf]), driven from outside the checkout: --version, a raw loop SIGKILLed once and resumed
# bit-exact, a zero-code HF Trainer job auto-attached and checkpointed (tests/wheel/smoke.py).
test-wheel: wheel
	$(PYTHON) tests/wheel/smoke.py --wheel $(DIST)/*.whl --constraints constraints-dev.txt

demo: install
	$(PY) examples/demo.py

bench: install
	$(PY) bench/run_all.py

# The docs site into site/ (mkdocs-material); --strict: a broken link or an unknown generated table fails.
docs: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

clean:
	rm -rf $(VENV) runs .pytest_cache site $(DIST) build
