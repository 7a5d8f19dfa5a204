"""GRPO in one file: RL-train a chat model to answer red-team prompts toxically, through purplerl's public seams.

The whole algorithm on one page, as nanochat's `chat_rl.py` and tinker-cookbook's `rl_loop.py` show theirs:

    for each step:
        sample G completions for each of B prompts         engine.sample
        score them with registered reward terms            purplerl.rewards.Reward
        group-relative advantages                          A = (r - mean of its group) / (std of its group + eps)
        a token-level batch                                purplerl.types.TrainBatch
        a clipped policy-gradient step, KL to the base     engine.forward_backward(Loss("ppo_clip")), optim_step

GRPO is Shao et al. 2024 (DeepSeekMath, arXiv 2402.03300). This file reads only the engine protocol
(purplerl.engines), the reward and loss registries and the shared types: nothing of purplerl.train. `purplerl
attack` runs the same algorithm with checkpoints, logs, resume, early stops and every engine setting.

    python examples/minimal_grpo.py --steps 20 --batch 4 --group 4
"""

from __future__ import annotations

import argparse
import math
import random

import torch

from purplerl.algorithms.registry import Loss, PolicyGradientParams
from purplerl.config import EMBEDDED_MODEL, DataConfig, ModelConfig
from purplerl.data import load_prompts
from purplerl.engines import Engine, make_engine
from purplerl.errors import ExperimentError
from purplerl.prompting import render_prompt
from purplerl.rewards import Reward, ScoringInput
from purplerl.types import AdamParams, Completion, SamplingParams, TrainBatch

# the attack's reward (purplerl.recipes.attack): P(toxic), less a share of repeated n-grams so that keyword spam
# ("STUPID STUPID ...") does not pay
REWARD_TERMS = {"toxicity": 1.0, "repetition": -0.3}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=EMBEDDED_MODEL, help="policy: an embedded model, an HF id or a local path")
    p.add_argument("--steps", type=int, default=10, help="optimizer steps")
    p.add_argument("--batch", type=int, default=4, help="prompts per step (B)")
    p.add_argument("--group", type=int, default=4, help="completions per prompt (G), >= 2")
    p.add_argument("--lr", type=float, default=1e-4, help="AdamW learning rate of the LoRA adapter")
    p.add_argument("--kl-beta", type=float, default=0.04, help="weight of KL(policy || base) in the loss")
    p.add_argument("--max-new-tokens", type=int, default=32, help="tokens per completion")
    p.add_argument("--seed", type=int, default=0, help="seeds the adapter's init, the prompts and the sampling")
    args = p.parse_args(argv)
    if args.group < 2:
        p.error("--group must be >= 2: a group of one has no baseline to compare it with")
    return args


def group_advantages(rewards_BG: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """GRPO's advantage: each reward against the others of its group, (r - mean) / (std + eps).

    Written out rather than looked up, because it is the heart of the algorithm; it equals the registered
    estimator `grpo` with scale_by_std=True (purplerl.algorithms.advantages), and tests/test_minimal_grpo.py checks
    it. A group of equal rewards teaches nothing: exact zeros, not float noise divided by eps."""
    mean_B1, std_B1 = rewards_BG.mean(1, keepdim=True), rewards_BG.std(1, unbiased=False, keepdim=True)
    advantages_BG = (rewards_BG - mean_B1) / (std_B1 + eps)
    flat_B1 = rewards_BG.amax(1, keepdim=True) == rewards_BG.amin(1, keepdim=True)
    return torch.where(flat_B1, 0.0, advantages_BG)


def pad(completions: list[Completion], pad_id: int) -> tuple[torch.Tensor, ...]:
    """Right-padded prompt + completion ids [N, T], their attention mask, the loss mask on the completion tokens
    and the sampling logprobs there (per-token tensors are aligned to targets: see purplerl.types)."""
    T = max(len(c.prompt_tokens) + len(c.tokens) for c in completions)
    ids_NT = torch.full((len(completions), T), pad_id, dtype=torch.long)
    attention_NT, mask_NT = torch.zeros_like(ids_NT), torch.zeros(ids_NT.shape)
    sampled_NT = torch.zeros(ids_NT.shape)
    for i, c in enumerate(completions):
        P, C = len(c.prompt_tokens), len(c.tokens)
        ids_NT[i, :P + C] = torch.tensor(c.prompt_tokens + c.tokens)
        attention_NT[i, :P + C] = 1
        mask_NT[i, P:P + C] = 1.0
        sampled_NT[i, P:P + C] = c.logprobs_C
    return ids_NT, attention_NT, mask_NT, sampled_NT


def main(argv: list[str] | None = None) -> Engine:
    """Train and print one line per step; return the trained engine (a caller may save or inspect it)."""
    args = parse_args(argv)
    B, G = args.batch, args.group
    prompts = load_prompts(DataConfig(source="builtin:redteam"))  # the project's own red-team prompts
    engine = make_engine(ModelConfig(name=args.model, finetune="lora"), engine="local", seed=args.seed)
    reward = Reward(REWARD_TERMS)  # builds each registered term (loads its scorer) once, before the first step
    # GRPO's objective: PPO's clipped ratio, a k3 KL to the frozen base inside the loss, and each completion's
    # token mean averaged over the completions (seq_mean_token_mean)
    loss = Loss("ppo_clip", PolicyGradientParams(kl_beta=args.kl_beta, kl_estimator="k3"),
                aggregation="seq_mean_token_mean")
    rng = random.Random(args.seed)
    for step in range(1, args.steps + 1):
        records = rng.sample(prompts, B)
        groups = engine.sample([render_prompt(engine.tokenizer, r, "chat", None, 256) for r in records], G,
                               SamplingParams(max_new_tokens=args.max_new_tokens, seed=args.seed * 100_003 + step))
        completions = [c for group in groups for c in group]  # group-major: row b*G + g answers prompt b

        scored = reward(ScoringInput(texts=[c.text for c in completions],
                                     prompts=[r.messages[-1]["content"] for r in records for _ in range(G)]))
        advantages_N = group_advantages(scored.total_N.view(B, G)).flatten()

        ids_NT, attention_NT, mask_NT, sampled_NT = pad(completions, int(engine.tokenizer.pad_token_id))
        # the frozen base's logprobs (every adapter off): the KL's reference, no second copy of the weights
        ref_NT = engine.logprobs(ids_NT, attention_NT, reference=True, targets_NT=mask_NT) if args.kl_beta else None
        batch = TrainBatch(ids_NT, attention_NT, mask_NT, sampling_logprobs_NT=sampled_NT,
                           advantages_NT=advantages_N[:, None] * mask_NT, ref_logprobs_NT=ref_NT)

        metrics = engine.forward_backward(batch, loss)  # accumulates the gradient into the LoRA adapter
        metrics |= engine.optim_step(AdamParams(lr=args.lr))
        if not all(math.isfinite(metrics[k]) for k in ("loss", "grad_norm")):
            raise ExperimentError(f"step {step}: non-finite loss {metrics['loss']} or grad norm "
                                  f"{metrics['grad_norm']}: lower --lr")
        toxicity = float(scored.components["toxicity"].mean())
        print(f"step {step:>3}  reward {float(scored.total_N.mean()):.4f}  toxicity {toxicity:.4f}  "
              f"loss {metrics['loss']:+.5f}  kl {metrics.get('kl_loss', 0.0):.5f}", flush=True)
    return engine


if __name__ == "__main__":
    main()
