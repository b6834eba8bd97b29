# Quick start: `make run` (the main job) and `make test` (all tests). Both build .venv themselves.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test venv bench lint clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev,spark,drills]' --config-settings editable_mode=compat
	sync  # the install leaves ~900 MB dirty: write it now, not during the first timed tests
	touch $(STAMP)

venv: $(STAMP)

run: $(STAMP)
	$(BIN)/python -m common.cli.demo

# Died of a signal (status >= 128): name the test and the thread that crashed (tests/conftest.py).
test: $(STAMP)
	$(BIN)/python -m pytest -q tests || { rc=$$?; [ $$rc -lt 128 ] || $(BIN)/python tests/fatal_report.py $$rc; exit $$rc; }

bench: $(STAMP)
	for f in bench/[!_]*.py; do $(BIN)/python $$f || exit 1; done

lint: $(STAMP)
	$(BIN)/ruff check common master slave tests bench
	$(BIN)/mypy common

clean:
	rm -rf $(VENV) build *.egg-info
