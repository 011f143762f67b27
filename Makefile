# Every target does all set-up on a fresh machine: `make demo`, `make test`, `make reproduce`.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
export DS_ACCELERATOR ?= cpu
# TORCH_EXTENSIONS_DIR (DeepSpeed's compiled ops) is left to launcher/deepspeed_env/ops_cache.py: one directory per
# Python environment under ~/.cache/roformer-ds/torch_extensions, so two venvs never rebuild each other's op.
export PIP_CACHE_DIR ?= $(HOME)/.cache/roformer-ds/pip
export HF_DATASETS_OFFLINE := 1
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: setup demo recipe-tokens test test-fast reproduce gpu-check clean

setup:
	bash scripts/setup.sh

demo: setup
	bash scripts/demo.sh

# The ModernBERT-style token schedule in small (batch warmup 8 -> 32 over 200K tokens, LR scaled to the batch):
# 2 CPU ranks, then its report (docs/token_schedules.md). Data from the set-up cache, as `make demo`'s.
recipe-tokens: setup
	bash scripts/recipe_tokens.sh

# The whole suite; tests/cluster and tests/unit run beside the rest (scripts/run_tests.sh says why).
test: setup
	PY=$(PY) bash scripts/run_tests.sh $(PYTEST_ARGS)

# The fast loop: tests/unit starts no multi-rank DeepSpeed job (folders and markers: tests/conftest.py).
test-fast: setup
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

# The paper's claims at small scale (docs/reproduction/README.md). Re-running resumes; one part alone:
# make reproduce REPRODUCE_ARGS="--parts encodings"; the harness check: REPRODUCE_ARGS=--quick.
reproduce: setup
	$(PY) -m launcher.cli reproduce --out runs/reproduce $(REPRODUCE_ARGS)

# On a CUDA machine: numerics, fp16 pretraining + resume + export, speed and memory (docs/gpu.md). DeepSpeed
# must find CUDA there, so the DS_ACCELERATOR=cpu exported above for the CPU targets is dropped.
gpu-check: setup
	env -u DS_ACCELERATOR $(PY) -m launcher.cli gpu-check $(GPU_CHECK_ARGS)

clean:
	rm -rf runs build *.egg-info
