# Each target sets itself up: a fresh clone needs only `make demo` or `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3

.PHONY: device-wheels docs lint setup browser test test-extended test-unit setup-oldest-ray-deps setup-oldest-ray test-oldest-ray demo bench clean

# Every Ray process imports jsonschema (`import ray`), and jsonschema imports rfc3987-syntax when it is
# there, which builds a grammar at import: 2.2 s of CPU in each of the ~8 processes a Train job starts.
# Only HTA's notebook dependencies (jupyterlab -> jupyter-events -> jsonschema[format-nongpl]) pull it
# in, and no test validates an IRI: removed, `import ray` takes 0.7 s (3.3 s with it) and a job starts
# in half the time (docs/testing.md). pip check still passes.
SLOW_IMPORT := rfc3987-syntax

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# The CPU build first: an unpinned torch would pull the multi-GB CUDA build. Byte-compiled here, not
	# on first import: without it (pip --no-compile) the first jobs' many workers each compiled torch's
	# compiler and FSDP modules at once, and three jobs did not start training in 4 minutes.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	$(PY) -m pip uninstall -q -y $(SLOW_IMPORT)
	touch $@

# The console's browser tests drive Debian's chromium (never a downloaded one).
browser:
	@if [ -x /usr/bin/chromium ]; then :; \
	elif [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; \
	else echo "make: the console tests need /usr/bin/chromium: run 'sudo apt-get install -y chromium'" >&2; exit 1; fi

setup: $(VENV)/.installed

# docs/configuration.md and docs/architecture.md's code map are generated (a test fails when one is stale).
docs: setup
	$(PY) docs/generate.py

lint: setup
	$(PY) -m ruff check .
	# Strict types where processes meet: the models (ProfilingApi among them), the storage layout, the
	# export child's contract, the CUDA allocator seam, the agent side's RPC, the client API's two transports,
	# the controller's gauges and their recorder process.
	$(PY) -m mypy --strict --follow-imports=silent --ignore-missing-imports \
		orchestrator/models/ orchestrator/layout.py actors/export/contract.py actors/agent/cuda_memory.py \
		actors/upstream.py actors/controller/clock.py actors/controller/rpc.py orchestrator/client/routes.py orchestrator/client/ray_backend.py orchestrator/client/http.py \
		actors/controller/monitoring/series.py actors/controller/monitoring/recorder.py orchestrator/analysis/groups.py

test: setup browser lint
	# The unit tests share nothing (no cluster, no fixed port): two processes (pytest-xdist) take a third
	# off their time on two cores (~250 s -> 136-166 s). Then the live ones in one process, their slowest
	# 25 last: where CI's time goes, run by run.
	$(PY) -m pytest -q -ra -n 2 -m 'not extended' tests/unit
	$(PY) -m pytest -q -ra --durations=40 -m 'not extended' tests/live

# The live core path on the oldest Ray rayprof supports (pyproject: ray>=2.43), in a venv of its own:
# ray_compat on that Ray, a hook-only job profiled over HTTP and the Python client to DONE, a job on
# the other Ray Train (v2 there), stacks of live jobs, the console in a browser. CI runs it after
# `make test` (docs/deploy.md, How the range is tested: its time).
OLDEST_RAY_VENV ?= .venv-ray-oldest
OLDEST_RAY_PY := $(OLDEST_RAY_VENV)/bin/python
OLDEST_RAY_TESTS := tests/unit/test_ray_compat.py tests/live/test_http_api.py tests/live/test_client_http.py \
	tests/live/test_train_versions.py tests/live/test_stacks_live.py \
	tests/live/test_telemetry_live.py::test_an_ended_runs_gauge_series_leave_rays_metrics_endpoint \
	tests/live/test_console_browser.py::test_console_is_served_with_a_strict_content_security_policy \
	tests/live/test_console_browser.py::test_form_starts_a_3_step_profile_that_reaches_done_and_shows_its_report

# Its dependencies alone (pyproject's, pinned by the constraints) touch nothing in this tree, so CI
# installs them while `make setup` runs; the editable install of rayprof itself comes after.
$(OLDEST_RAY_VENV)/.deps: pyproject.toml deploy/constraints-ray-oldest.txt
	$(PYTHON) -m venv $(OLDEST_RAY_VENV)
	$(OLDEST_RAY_PY) -m pip install -q --upgrade pip
	$(OLDEST_RAY_PY) -m pip install -q torch==2.13.0
	$(OLDEST_RAY_PY) -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; \
		print("\n".join(p["dependencies"] + p["optional-dependencies"]["dev"]))' > $(OLDEST_RAY_VENV)/requirements.txt
	$(OLDEST_RAY_PY) -m pip install -q -c deploy/constraints-ray-oldest.txt -r $(OLDEST_RAY_VENV)/requirements.txt
	$(OLDEST_RAY_PY) -m pip uninstall -q -y $(SLOW_IMPORT)
	touch $@

$(OLDEST_RAY_VENV)/.installed: $(OLDEST_RAY_VENV)/.deps
	$(OLDEST_RAY_PY) -m pip install -q --no-deps -e .
	touch $@

setup-oldest-ray-deps: $(OLDEST_RAY_VENV)/.deps

setup-oldest-ray: $(OLDEST_RAY_VENV)/.installed

test-oldest-ray: setup-oldest-ray browser
	$(OLDEST_RAY_PY) -m pytest -q -ra --durations=15 $(OLDEST_RAY_TESTS)

# The costliest live tests, left out of `make test` to keep CI under 45 min: 50 windows in a row, jobs of their own
# (a watch on a planted slowdown, two targets at once, `attach` with explicit steps, a job that ends mid-window, a
# killed worker, the Lightning GAN, Accelerate, the GAN + torch.compile + FSDP2 loops), storage that never returns,
# and hosts on a real network (docs/testing.md says their time).
test-extended: setup
	$(PY) -m pytest -q -ra -m extended

test-unit: setup
	$(PY) -m pytest -q -n 2 tests/unit

demo: setup
	$(VENV)/bin/rayprof demo

bench: setup
	$(PY) -m benchmarks

clean:
	rm -rf $(VENV) $(OLDEST_RAY_VENV) rayprof-demo

# The device check (benchmarks/gpu.py) runs where there is torch but no Ray and no internet:
# rayprof's small dependencies travel there as wheels for its Python (3.12 on the H100 machine),
# unpacked onto PYTHONPATH (README, "The GPU path").
DEVICE_PYTHON ?= 3.12
device-wheels: setup
	$(PY) -m pip download -q --only-binary=:all: --python-version $(DEVICE_PYTHON) --implementation cp \
		--platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
		-d .device-wheels pydantic msgspec isal
