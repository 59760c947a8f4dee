# One front door: CI (.ci/run) calls exactly these targets.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: install test lint typecheck layers pytest demo bench clean

$(BIN)/fabricscope: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

install: $(BIN)/fabricscope

lint: install
	$(BIN)/ruff check src tests benchmarks

typecheck: install
	$(BIN)/mypy

layers: install
	$(BIN)/lint-imports

pytest: install
	$(BIN)/pytest -q

# The test command of the README: lint, types, import layers, tests.
test: lint typecheck layers pytest

demo: install
	$(BIN)/fabricscope demo

bench: install
	for f in benchmarks/bench_*.py; do $(BIN)/python $$f || exit 1; done

clean:
	rm -rf $(VENV) build dist *.egg-info .mypy_cache .ruff_cache .pytest_cache
