# The two commands a newcomer needs: `make demo` and `make test`. Each does its own set-up.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.air-installed

.PHONY: demo test test-quick check lint typecheck doctest browser-deps sandbox-deps clean

#: the code `ruff` checks and formats
LINT_PATHS := air_sdk magics tests benchmarks
#: modules whose docstring examples run as doctests: the pure ones (no server, no torch,
#: no widgets). Examples that need a running gateway are marked `+SKIP` and say so.
DOCTEST_PATHS := air_sdk/schema air_sdk/scheduler air_sdk/bundle air_sdk/client \
	air_sdk/manifests air_sdk/store air_sdk/errors.py air_sdk/redact.py air_sdk/config.py \
	air_sdk/gateway_config.py air_sdk/gateway/options.py air_sdk/runner/policy.py \
	air_sdk/runner/accounting.py air_sdk/runner/machine.py air_sdk/runner/devices.py \
	air_sdk/runner/node/activity.py air_sdk/runner/outputs.py air_sdk/runtime/_outputs.py \
	air_sdk/runner/backends/ray_rules.py air_sdk/gateway/outputs.py air_sdk/notebook/snapshot_html.py \
	air_sdk/notebook/job_views.py air_sdk/notebook/figures.py air_sdk/notebook/monitor_view.py air_sdk/notebook/submit.py \
	air_sdk/notebook/function.py air_sdk/notebook/capture.py air_sdk/cli/_common.py \
	air_sdk/cli/job_flags.py air_sdk/planner air_sdk/runner/node/sandbox.py \
	air_sdk/cli/terminal_views.py air_sdk/cli/bundle_progress.py air_sdk/cli/script_args.py air_sdk/text.py \
	air_sdk/procs.py air_sdk/runner/node/_procs.py air_sdk/runner/node/plan.py \
	air_sdk/runner/node/launch.py air_sdk/runner/node/limits.py air_sdk/runner/retention.py air_sdk/runner/job_files.py \
	air_sdk/export/service.py \
	air_sdk/cli/slo.py air_sdk/gateway/metrics.py \
	air_sdk/runtime/data/_index.py air_sdk/runtime/data/_order.py \
	air_sdk/runner/node_probe.py air_sdk/runner/failure_saves.py air_sdk/runner/job_paths.py \
	air_sdk/gateway/server.py air_sdk/runtime/checkpoint/hf_export.py \
	air_sdk/gateway/services/report_body.py air_sdk/runtime/_fork_gc.py

$(STAMP): pyproject.toml
	@echo "==> setting up $(VENV) (the first time takes about 2 minutes; later runs skip this)"
	$(PYTHON) -m venv $(VENV)
	@echo "==> [1/3] upgrading pip"
	$(PY) -m pip install -q --upgrade pip
	# torch first and pinned, so the CPU wheel on this machine's disk is used and no
	# multi-GB CUDA build is pulled by the range in pyproject.toml.
	@echo "==> [2/3] installing torch 2.13.0 (the CPU build)"
	$(PY) -m pip install -q torch==2.13.0
	@echo "==> [3/3] installing AIR and its dependencies (FastAPI, Ray, JupyterLab, test tools)"
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)
	@echo "==> $(VENV) is ready"

## Start an embedded gateway and train a small model on 2 virtual nodes, live.
demo: $(STAMP)
	@echo "==> air demo: a gateway on this machine and a 2-node DDP job, followed live"
	$(VENV)/bin/air demo

## The whole suite: lint, types and doctests first (fast), then unit + integration with
## real gloo workers, notebooks under nbval, JupyterLab driven by a real chromium.
test: $(STAMP) browser-deps sandbox-deps check
	$(PY) -m pytest -q

## What a reviewer runs before anything else: ruff, mypy and the docstring examples.
check: lint typecheck doctest

## Debian's bubblewrap, the sandbox of local ranks (tests/integration/test_sandbox.py needs
## it on Linux). A no-op when bwrap is there or off Linux; sudo only when not root.
sandbox-deps:
	@if [ "$$(uname -s)" = Linux ] && ! command -v bwrap >/dev/null; then \
		SUDO=$$( [ "$$(id -u)" -eq 0 ] || echo sudo ); \
		echo "installing Debian's bubblewrap for the sandbox tests (tests/integration/test_sandbox.py)"; \
		$$SUDO apt-get update -q && \
		$$SUDO env DEBIAN_FRONTEND=noninteractive \
			apt-get install -y -q --no-install-recommends bubblewrap && \
		command -v bwrap >/dev/null; \
	fi

## Debian's chromium for the browser tests (Playwright drives it; never `playwright install`).
## A no-op when /usr/bin/chromium is there; sudo only when not root.
browser-deps:
	@if [ ! -x /usr/bin/chromium ]; then \
		SUDO=$$( [ "$$(id -u)" -eq 0 ] || echo sudo ); \
		echo "installing Debian's chromium for the browser tests (tests/e2e)"; \
		$$SUDO apt-get update -q && \
		$$SUDO env DEBIAN_FRONTEND=noninteractive \
			apt-get install -y -q --no-install-recommends chromium && \
		test -x /usr/bin/chromium; \
	fi

## The fast subset for development: lint, doctests and the tests without multi-process
## jobs (`make typecheck` for mypy; its cache makes a second run quick).
test-quick: $(STAMP) lint doctest
	$(PY) -m pytest -q -m "not slow"

lint: $(STAMP)
	$(VENV)/bin/ruff check $(LINT_PATHS)
	$(VENV)/bin/ruff format --check $(LINT_PATHS)

## mypy on air_sdk and magics; strict on schema, scheduler and client (pyproject.toml).
typecheck: $(STAMP)
	$(VENV)/bin/mypy air_sdk magics

doctest: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider --doctest-modules $(DOCTEST_PATHS)

clean:
	rm -rf $(VENV) .pytest_cache
