# Two commands for a fresh machine (Python >= 3.11): `make demo` and `make test`.
# Both create/reuse the local virtualenv .venv and install what they need.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
# pytest workers of `make test` (pytest-xdist; one torch thread each): CI's two cores
TEST_WORKERS ?= 2

.PHONY: demo test test-full bench lint browser lmertest postgres clean-venv

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

## The test suite CI runs (ruff + pytest, including the few slow tests, the browser tests, the lme4 comparisons and
## the human study app on a live PostgreSQL server; of the paper-spec end-to-end runs a representative subset),
## then the 15 slowest tests. Two pytest workers, a test file per worker at a time (TEST_WORKERS=0: one process, two torch threads).
test: $(STAMP) browser lmertest postgres
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=15

## `make test` plus the tests marked `exhaustive` (every paper spec end to end on stand-ins).
test-full: $(STAMP) browser lmertest postgres
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=15 --exhaustive

## Benchmarks: replaces each script's section of benchmarks/RESULTS.md (hand-written sections are kept).
bench: $(STAMP) lmertest
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

# R's lme4 + lmerTest for tests/stats/test_lme4.py and benchmarks/bench_lmm_scale.py (Debian
# package r-cran-lmertest; without it those tests skip and the benchmark's R columns read n/a).
lmertest:
	@Rscript -e 'quit(status = !requireNamespace("lmerTest", quietly = TRUE))' >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq r-cran-lmertest >/dev/null) || echo "warning: could not install r-cran-lmertest; the lme4 comparison tests will be skipped"; \
	  else echo "warning: R's lmerTest not installed (sudo apt-get install r-cran-lmertest); the lme4 comparison tests will be skipped"; fi; }

# PostgreSQL for tests/human/test_postgres.py (Debian package; the test starts a private server in a
# temporary folder). Without it that test is skipped.
postgres:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null) || echo "warning: could not install postgresql; the PostgreSQL test will be skipped"; \
	  else echo "warning: PostgreSQL not installed (sudo apt-get install postgresql); the PostgreSQL test will be skipped"; fi; }
