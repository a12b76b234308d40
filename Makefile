# Two commands from a fresh clone: `make test` and `make demo`. Each does its own set-up.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
TORCH   := torch==2.13.0
STAMP   := $(VENV)/.installed
export OMP_NUM_THREADS ?= 2
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: venv test test-fast test-unit test-integration lint demo bench clean

venv: $(STAMP)

# torch first, pinned, so nothing later resolves an unpinned torch to the CUDA build.
$(STAMP): pyproject.toml requirements.lock
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip setuptools wheel
	$(BIN)/pip install --quiet $(TORCH)
	$(BIN)/pip install --quiet -r requirements.lock
	$(BIN)/pip install --quiet --no-deps -e .
	touch $(STAMP)

test: venv
	$(BIN)/pytest tests

test-fast: venv
	$(BIN)/pytest tests -m "not heavy and not e2e"

test-unit: venv
	$(BIN)/pytest tests/unit

test-integration: venv
	$(BIN)/pytest tests/integration

lint: venv
	$(BIN)/ruff check .

demo: venv
	$(BIN)/mgrpo demo

bench: venv
	$(BIN)/python bench/engine.py
	$(BIN)/python bench/sandbox.py
	$(BIN)/python bench/round.py

clean:
	rm -rf runs .pytest_cache
