# Two entry points for a fresh machine (see README):
#   make quickstart   -- set up .venv and run the quickstart scenario on a shipped real trace
#   make test         -- set up .venv (with the test, calibration and ray extras) and run the test suite
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
TEST_EXTRAS := test,calibration,ray

.PHONY: quickstart test setup bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# One stamp per set of extras, named after exactly what was installed.
$(VENV)/.installed-%: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[$*]'
	touch $@

setup: $(VENV)/.installed-$(TEST_EXTRAS)

quickstart: $(VENV)/.installed-test
	$(BIN)/kvsim run scenarios/quickstart.yaml --out results/quickstart

test: $(VENV)/.installed-$(TEST_EXTRAS)
	$(BIN)/python -m pytest -q

bench: $(VENV)/.installed-test
	$(BIN)/python bench/run_bench.py

# Removes only what kvsim wrote in results/quickstart (files of yours there stay; docs/outputs.md).
clean:
	if [ -x $(BIN)/python ]; then $(BIN)/python -c "from kvsim.outdir import remove_output; remove_output('results/quickstart')"; fi
	rm -rf $(VENV)
