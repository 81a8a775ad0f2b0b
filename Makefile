# Each target sets itself up: a fresh clone needs only `make demo` or `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3

.PHONY: setup browser test test-extended test-unit demo bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# The CPU build first: an unpinned torch would pull the multi-GB CUDA build.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

# The console's browser tests drive Debian's chromium (never a downloaded one).
browser:
	@if [ -x /usr/bin/chromium ]; then :; \
	elif [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; \
	else echo "make: the console tests need /usr/bin/chromium: run 'sudo apt-get install -y chromium'" >&2; exit 1; fi

setup: $(VENV)/.installed

test: setup browser
	$(PY) -m pytest -q -ra -m 'not extended'

# The costliest live tests (the demo end to end, 50 windows in a row, four that each
# start a job of their own, and hosts on a real network): ~11 min more than `make test`,
# plus tests/test_netns.py's time (README, Tests).
test-extended: setup
	$(PY) -m pytest -q -ra -m extended

test-unit: setup
	$(PY) -m pytest -q -m 'not integration'

demo: setup
	$(VENV)/bin/rayprof demo

bench: setup
	$(PY) -m benchmarks

clean:
	rm -rf $(VENV) rayprof-demo
