# Two commands for a fresh machine (Python >= 3.11): `make demo` and `make test`.
# Both create/reuse the local virtualenv .venv and install what they need.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test bench lint browser clean-venv

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "error: Python >= 3.11 required (found %s); set PYTHON=python3.11" % sys.version.split()[0])'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	$(BIN)/pip check
	touch $(STAMP)

## The main job on the embedded default (the toy demo).
demo: $(STAMP)
	$(BIN)/pcpo-eval demo

## The whole test suite (ruff + pytest, including the few slow tests and the browser test).
test: $(STAMP) browser
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q

## Benchmarks: rewrites benchmarks/RESULTS.md.
bench: $(STAMP)
	$(BIN)/python benchmarks/run_all.py

lint: $(STAMP)
	$(BIN)/ruff check .

# Headless Chromium for the report's browser test (Debian package; never a test tool's download).
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then (apt-get update -qq && apt-get install -y -qq chromium >/dev/null) || echo "warning: could not install chromium; the browser test will be skipped"; \
	  else echo "warning: chromium not installed (sudo apt-get install chromium); the browser test will be skipped"; fi; }

clean-venv:
	rm -rf $(VENV)
