# The two commands a newcomer needs: `make demo` and `make test`. Each does its own set-up.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.air-installed

.PHONY: demo test test-quick browser-deps lint clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first and pinned, so the CPU wheel on this machine's disk is used and no
	# multi-GB CUDA build is pulled by the range in pyproject.toml.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

## Start an embedded gateway and train a small model on 2 virtual nodes, live.
demo: $(STAMP)
	$(VENV)/bin/air demo

## The whole suite (unit + integration with real gloo workers, notebooks under nbval,
## JupyterLab driven by a real chromium).
test: $(STAMP) browser-deps
	$(PY) -m pytest -q

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

## The fast subset for development: no multi-process jobs.
test-quick: $(STAMP)
	$(PY) -m pytest -q -m "not slow"

lint: $(STAMP)
	$(VENV)/bin/ruff check air_sdk magics tests benchmarks
	$(VENV)/bin/ruff format --check air_sdk magics tests benchmarks

clean:
	rm -rf $(VENV) .pytest_cache
