# Each target sets itself up: a fresh clone needs only `make demo` or `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3

.PHONY: setup test test-unit demo bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# The CPU build first: an unpinned torch would pull the multi-GB CUDA build.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

setup: $(VENV)/.installed

test: setup
	$(PY) -m pytest -q -ra

test-unit: setup
	$(PY) -m pytest -q -m 'not integration'

demo: setup
	$(VENV)/bin/rayprof demo

bench: setup
	$(PY) -m benchmarks

clean:
	rm -rf $(VENV) rayprof-demo
