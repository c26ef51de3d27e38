# The two commands in the README: `make demo` and `make test`. Both create .venv themselves.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: install system-deps test test-faults demo bench clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -c constraints-dev.txt torch==2.13.0
	$(PY) -m pip install -q -c constraints-dev.txt -e '.[torch,dev,report,hf,lightning,s3]'
	touch $(STAMP)

# Debian packages of the real Slurm/Prometheus tests, only when missing; never fails (they skip).
system-deps:
	@bash .ci/system-deps

test: install system-deps
	$(PY) -m pytest -q -ra --durations=15 -m "not long" tests

# The long variants, wherever they are: the chaos soak, repeated seeds and every save mode of the
# resume and DDP tests. One marker selects them (tests/test_markers.py checks that none escapes it).
test-faults: install
	$(PY) -m pytest -q -ra --durations=15 -m long tests

demo: install
	$(PY) examples/demo.py

bench: install
	$(PY) bench/run_all.py

clean:
	rm -rf $(VENV) runs .pytest_cache
