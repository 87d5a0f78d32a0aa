# Two entry points for a fresh machine (see README):
#   make quickstart   -- set up .venv and run the quickstart scenario on a shipped real trace
#   make test         -- set up .venv (with test + calibration extras) and run the whole test suite
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
EXTRAS ?= test,calibration,ray

.PHONY: quickstart test setup bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(VENV)/.installed-$(EXTRAS): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[$(EXTRAS)]'
	touch $@

setup: $(VENV)/.installed-$(EXTRAS)

quickstart: EXTRAS = test
quickstart: setup
	$(BIN)/kvsim run scenarios/quickstart.yaml --out results/quickstart

test: setup
	$(BIN)/python -m pytest -q

bench: setup
	$(BIN)/python bench/run_bench.py

clean:
	rm -rf $(VENV) results/quickstart
