"""The work of the GRPO benchmark, defined once, and purplerl's run of it (the `--child purplerl` process).

`Work` holds every knob both systems share. `purplerl_config` turns it into a purplerl Config; grpo_trl.py turns
it into a GRPOConfig. The prompts of step k are `PromptSampler.batch(k - 1)` of that Config for both systems.

A child writes one JSON file: {"system", "settings", "compute_dtype" ('bf16' or 'fp32': its matmuls' dtype),
"peak_rss_mib", "peak_gpu_mib" (null on CPU), "steps": [record]}, one record per step:
step, step_s, sample_s (rollout), score_s (reference pass + reward), train_s (advantages, forward/backward and
optimizer step), toxicity (mean P(toxic) of the step's completions), prompt_lens / completion_lens (non-padding
tokens of each of the B·G sequences, in group-major order), prompt_tokens / completion_tokens (their sums) and
token_source ('metrics' when the run logged its own token counts, else 'counted' here).
"""

from __future__ import annotations

import json
import resource
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from purplerl.config import EMBEDDED_MODEL
from purplerl.data import PromptSampler, load_prompts
from purplerl.engines.loading import load_tokenizer
from purplerl.launch import run_settings
from purplerl.prompting import render_prompt
from purplerl.recipes.attack import ATTACK
from purplerl.types import PromptRecord

# purplerl overrides that change how the work is done, not what it is; any other key makes the comparison unfair
ENGINE_KEYS = ("model.dtype", "model.device", "engine.fast_paths",
               "engine.micro_batch_tokens", "training.old_logprobs")
FINETUNES = ("lora", "full")
DTYPES = ("auto", "bfloat16", "float32")


@dataclass(frozen=True)
class Work:
    """One benchmark run's work: the same for purplerl and TRL."""

    steps: int = 20
    prompts_per_step: int = 8  # B
    group_size: int = 4  # G: completions per prompt, so B·G = 32 sequences per step
    max_new_tokens: int = 48
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: no top-k truncation
    finetune: str = "lora"  # 'lora' (rank-r adapters on a frozen base) or 'full' (every weight)
    lora_rank: int = 16
    lora_alpha: float = 32.0
    lr: float = 5e-4  # AdamW, constant, no warmup, weight decay 0
    max_grad_norm: float = 1.0
    clip: float = 0.2  # PPO clip, both sides
    kl_beta: float = 0.1  # k3 KL to the base model, in the loss
    seed: int = 0
    model: str = EMBEDDED_MODEL
    # how, not what: 'auto' keeps each system's default (purplerl bf16 on bf16-capable hardware, TRL fp32
    # weights); 'bfloat16' loads both in bf16 (TRL then autocasts, as bf16=True on a GPU); 'float32' both fp32
    dtype: str = "auto"
    trl_micro_batch: int = 0  # sequences per TRL forward/backward pass (gradient accumulation); 0: all B·G at once

    def __post_init__(self) -> None:
        if self.finetune not in FINETUNES:
            raise ValueError(f"finetune must be one of {', '.join(FINETUNES)}, got '{self.finetune}'")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got '{self.dtype}'")
        sequences = self.prompts_per_step * self.group_size
        if self.trl_micro_batch < 0 or (self.trl_micro_batch and sequences % self.trl_micro_batch):
            raise ValueError(f"trl_micro_batch {self.trl_micro_batch} does not divide the {sequences} sequences "
                             "of a step")

    @property
    def lora(self) -> bool:
        return self.finetune == "lora"


def purplerl_config(work: Work, output_dir: Path, sets: list[str]) -> Any:
    """The attack config that does `work`, with `sets` (KEY=VALUE, dotted or flat names) applied last."""
    base = {
        # dtype, micro-batching and the sampler copy stay purplerl's defaults: they are the engine under test
        "model": {"name": work.model, "device": "auto", "dtype": work.dtype, "finetune": work.finetune,
                  **({"lora_rank": work.lora_rank, "lora_alpha": work.lora_alpha, "lora_dropout": 0.0,
                      "lora_targets": "all-linear"} if work.lora else {})},
        "sampling": {"group_size": work.group_size, "max_new_tokens": work.max_new_tokens,
                     "temperature": work.temperature, "top_p": work.top_p, "top_k": work.top_k},
        "training": {"steps": work.steps, "batch_size": work.prompts_per_step, "lr": work.lr,
                     "optimizer": {"weight_decay": 0.0}, "max_grad_norm": work.max_grad_norm, "loss": "ppo_clip",
                     "clip_low": work.clip,
                     "clip_high": work.clip, "advantage": "grpo_std", "loss_agg": "token_mean",
                     "ppo_epochs": 1, "mini_batches": 1, "seed": work.seed, "early_stop_repetition": None},
        "attack": {"early_stop_toxicity": None},
        "reward": {"terms": {"toxicity": 1.0, "repetition": 0.0, "refusal": 0.0}, "kl_beta": work.kl_beta,
                   "kl_estimator": "k3", "kl_in": "loss"},
        "logging": {"progress": False},
        # one checkpoint, after the last step (outside every step's timing)
        "run": {"output_dir": str(output_dir), "name": "bench", "save_every": work.steps},
    }
    return run_settings("attack", options=[f"--{kv}" for kv in sets], base=base)


def unfair_sets(sets: list[str]) -> list[str]:
    """The --purplerl-set overrides that change the work itself (not only the engine's numerics)."""
    keys = [s.partition("=")[0].lstrip("-").replace("-", "_") for s in sets]
    return [s for s, key in zip(sets, keys, strict=True) if ATTACK.flat.get(key, key) not in ENGINE_KEYS]


def prompt_batches(config: Any) -> list[list[PromptRecord]]:
    """The prompts of steps 1..steps, in the order purplerl's loop draws them."""
    sampler = PromptSampler(load_prompts(config.data), config.training.batch_size, config.training.seed,
                            shuffle=config.data.shuffle)
    return [sampler.batch(k) for k in range(config.training.steps)]


def rendered_prompts(config: Any, batches: list[list[PromptRecord]]) -> list[list[list[int]]]:
    """Token ids of each step's B·G sequences' prompts (each prompt repeated G times), as purplerl renders them."""
    d, group = config.data, config.sampling.group_size
    tokenizer = load_tokenizer(config.model.name, config.model.revision)
    return [[render_prompt(tokenizer, r, d.template, d.system_prompt, d.max_prompt_tokens)
             for r in batch for _ in range(group)] for batch in batches]


def purplerl_compute_dtype(config: Any) -> str:
    """'bf16' or 'fp32': the dtype purplerl's matmuls run in under `config`."""
    from purplerl.engines.loading import resolve_device, resolve_dtype

    dtype = resolve_dtype(config.model.dtype, resolve_device(config.model.device))
    return "bf16" if dtype == torch.bfloat16 or config.model.dtype == "autocast_bf16" else "fp32"


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def peak_gpu_mib() -> float | None:
    """Peak memory torch allocated on the GPU in this process (None without CUDA)."""
    return torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else None


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _purplerl_step(row: dict[str, Any], samples: list[dict[str, Any]], batch: list[PromptRecord],
                   prompt_ids: list[list[int]], group: int) -> dict[str, Any]:
    step = row["step"]
    expected = [r.uid for r in batch for _ in range(group)]
    if [s["uid"] for s in samples] != expected:
        raise SystemExit(f"purplerl step {step}: samples.jsonl prompts {[s['uid'] for s in samples]} are not the "
                         f"sampler's batch {expected}")
    prompt_lens = [len(ids) for ids in prompt_ids]
    completion_lens = [int(s["num_tokens"]) for s in samples]
    if abs(sum(completion_lens) - row["completion/len_mean"] * len(samples)) > 0.5:
        raise SystemExit(f"purplerl step {step}: samples.jsonl holds {sum(completion_lens)} completion tokens, "
                         f"metrics.jsonl says {row['completion/len_mean']} x {len(samples)}")
    logged = "tokens/prompt" in row and "tokens/completion" in row
    record = {"step": step, "step_s": row["time/step_s"], "sample_s": row["time/sample_s"],
              "score_s": row["time/score_s"], "train_s": row["time/train_s"], "toxicity": row["toxicity/mean"],
              "prompt_lens": prompt_lens, "completion_lens": completion_lens,
              "prompt_tokens": row["tokens/prompt"] if logged else sum(prompt_lens),
              "completion_tokens": row["tokens/completion"] if logged else sum(completion_lens),
              "token_source": "metrics" if logged else "counted"}
    if logged and (record["prompt_tokens"], record["completion_tokens"]) != (sum(prompt_lens), sum(completion_lens)):
        print(f"warning: purplerl step {step} logs {record['prompt_tokens']} prompt + {record['completion_tokens']} "
              f"completion tokens, counted {sum(prompt_lens)} + {sum(completion_lens)}", file=sys.stderr)
    return record


def run_purplerl(work: Work, sets: list[str], out: Path) -> None:
    """Run purplerl's attack recipe (the real CLI code path) on `work` and write the child JSON to `out`."""
    from purplerl.train.runner import run_recipe

    with tempfile.TemporaryDirectory(prefix="bench-grpo-purplerl-") as tmp:
        config = purplerl_config(work, Path(tmp), sets)
        summary = run_recipe(ATTACK, config)
        if summary["last_step"] != work.steps:
            raise SystemExit(f"purplerl stopped after step {summary['last_step']}: {summary['stop_reason']}")
        run_dir = Path(summary["run_dir"])
        metrics, samples = _read_jsonl(run_dir / "metrics.jsonl"), _read_jsonl(run_dir / "samples.jsonl")
    batches = prompt_batches(config)
    prompt_ids = rendered_prompts(config, batches)
    steps = [_purplerl_step(row, [s for s in samples if s["step"] == row["step"]], batches[row["step"] - 1],
                            prompt_ids[row["step"] - 1], work.group_size) for row in metrics]
    settings = {"overrides": sets, "config": config.settings()}
    out.write_text(json.dumps({"system": "purplerl", "settings": settings,
                               "compute_dtype": purplerl_compute_dtype(config), "peak_rss_mib": peak_rss_mib(),
                               "peak_gpu_mib": peak_gpu_mib(), "steps": steps}))
