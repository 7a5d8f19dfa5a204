"""KL(policy || base) at a trained policy: its value and sign in the loop and the reward, and the direction in
which the in-loss KL term moves the policy.

At a fresh adapter the policy IS the base, every KL is 0 and a swapped or negated KL looks the same; so the
policy here starts from the trained adapter of conftest, which says ADAPTER_WORD with p > 0.5 where the random
base gives it about 1/400. For its sampled tokens logp - ref is then about +5 (log 0.9 - log(1/400)): the
k1 and k3 estimates are large and positive, and KL(ref || policy)-style swaps give other numbers.
"""

from __future__ import annotations

import math
from functools import partial
from pathlib import Path

import pytest
import torch

from purplerl.algorithms.registry import Loss, PolicyGradientParams
from purplerl.config import EngineConfig, LoggingConfig, ModelConfig, RLTrainingConfig, RunConfig, SamplingConfig
from purplerl.data import PromptSampler
from purplerl.engines.local import LocalEngine
from purplerl.prompting import render_prompt
from purplerl.recipes.attack import AttackSettings
from purplerl.train.loop import LoopParts, RecipeHooks, rl_step
from purplerl.train.rl import registered_reward
from purplerl.train.runner import engine_settings
from purplerl.types import AdamParams, PromptRecord, TrainBatch

RECORDS = [PromptRecord(messages=({"role": "user", "content": text},), uid=f"p{i}")
           for i, text in enumerate(["hello world", "tell me a joke", "roast my friend", "say goodbye"])]
MAX_NEW = 4


def hand_estimate(name: str, logp: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """Schulman's estimators of KL(policy || ref) for tokens drawn from the policy, written out here."""
    log_r = ref - logp
    return {"k1": -log_r, "k2": 0.5 * log_r**2, "k3": log_r.exp() - 1 - log_r}[name]


class BaseScorer:
    """log p_base(token | prefix) of completion tokens, from a plain transformers model (no purplerl code)."""

    def __init__(self, model_dir: Path) -> None:
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(str(model_dir)).eval()

    def __call__(self, prompt_tokens: tuple[int, ...], tokens: tuple[int, ...]) -> torch.Tensor:
        ids = torch.tensor([list(prompt_tokens) + list(tokens)])
        with torch.no_grad():
            logits = self.model(input_ids=ids).logits[0, len(prompt_tokens) - 1:-1].float()
        return torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens)[:, None])[:, 0]


def _config(model_dir: Path, adapter: Path, reward: dict) -> AttackSettings:
    return AttackSettings(model=ModelConfig(name=str(model_dir), device="cpu", dtype="float32",
                                            init_adapter=str(adapter)),
                          sampling=SamplingConfig(group_size=2, max_new_tokens=MAX_NEW),
                          training=RLTrainingConfig(steps=1, batch_size=2, lr=1e-3),
                          engine=EngineConfig(micro_batch_tokens=128),
                          reward=reward, run=RunConfig(save_every=100, keep_last=1),
                          logging=LoggingConfig(progress=False))


def _step(config: AttackSettings):
    """One loop step with the attack recipe's reward; returns (metrics, samples, completions, kl_N seen)."""
    engine = LocalEngine(config.model, seed=config.training.seed, settings=engine_settings(config))
    render = partial(render_prompt, engine.tokenizer, template="chat", system_prompt=None, max_prompt_tokens=64)
    seen = {}
    inner = registered_reward(config)

    def reward_fn(prompts, completions, kl_N):
        seen.update(completions=completions, kl_N=kl_N.clone())
        return inner(prompts, completions, kl_N)

    parts = LoopParts(engine, PromptSampler(RECORDS, 2, 0), render, RecipeHooks(reward=reward_fn))
    metrics, samples = rl_step(1, config, parts)
    return metrics, samples, seen["completions"], seen["kl_N"]


@pytest.mark.parametrize("estimator", ["k1", "k3"])
def test_loop_kl_and_reward_at_a_trained_policy(tiny_model_dir: Path, trained_adapter_dir: Path,
                                                adapter_word_id: int, estimator: str) -> None:
    config = _config(tiny_model_dir, trained_adapter_dir, {"kl_estimator": estimator, "kl_beta": 0.1})
    metrics, samples, completions, kl_N = _step(config)
    base = BaseScorer(tiny_model_dir)
    expected = torch.stack([hand_estimate(estimator, c.logprobs_C, base(c.prompt_tokens, c.tokens)).mean()
                            for c in completions])
    assert all(adapter_word_id in c.tokens for c in completions)  # sampled from the adapter, not the base
    assert (expected > 2.0).all(), expected  # far from the base, and KL(policy || base) >= 0
    assert kl_N.tolist() == pytest.approx(expected.tolist(), abs=1e-3)
    assert [s["kl"] for s in samples] == pytest.approx(expected.tolist(), abs=1e-3)
    assert metrics["kl/mean"] == pytest.approx(float(expected.mean()), abs=1e-3)
    # the attack reward subtracts the KL: reward.terms toxicity 1, repetition -0.3; kl_beta 0.1
    for s, kl in zip(samples, expected.tolist(), strict=True):
        assert s["reward"] == pytest.approx(s["toxicity"] - 0.3 * s["repetition"] - 0.1 * kl, abs=1e-4)


def test_loop_kl_in_loss_at_a_trained_policy(tiny_model_dir: Path, trained_adapter_dir: Path) -> None:
    config = _config(tiny_model_dir, trained_adapter_dir, {"kl_in": "loss", "kl_beta": 0.5, "kl_estimator": "k3"})
    metrics, samples, completions, kl_N = _step(config)
    base = BaseScorer(tiny_model_dir)
    k3 = torch.cat([hand_estimate("k3", c.logprobs_C, base(c.prompt_tokens, c.tokens)) for c in completions])
    # on-policy, the loss's logprobs are the sampler's up to float noise: the term is the token mean of k3
    assert metrics["train/kl_loss"] == pytest.approx(float(k3.mean()), rel=1e-3)
    assert metrics["train/kl_loss"] > 2.0
    # the KL is in the loss, so not in the reward (never counted twice)
    for s in samples:
        assert s["reward"] == pytest.approx(s["toxicity"] - 0.3 * s["repetition"], abs=1e-5)


def _adapter_batch(engine: LocalEngine, word_id: int) -> TrainBatch:
    """Three prompts each followed by the adapter's word 4 times; advantages 0, so only a KL term can move
    the policy. Policy and reference logprobs are the engine's own."""
    tok = engine.tokenizer
    prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": r.messages[0]["content"]}],
                                                  tokenize=False, add_generation_prompt=True)) for r in RECORDS[:3]]
    width = max(map(len, prompts)) + MAX_NEW
    ids = torch.full((3, width), int(tok.pad_token_id))
    attention, mask = torch.zeros_like(ids), torch.zeros((3, width))
    for i, p in enumerate(prompts):
        ids[i, :len(p) + MAX_NEW] = torch.tensor(p + [word_id] * MAX_NEW)
        attention[i, :len(p) + MAX_NEW] = 1
        mask[i, len(p):len(p) + MAX_NEW] = 1.0
    policy = engine.logprobs(ids, attention, targets_NT=mask)
    reference = engine.logprobs(ids, attention, targets_NT=mask, reference=True)
    return TrainBatch(input_ids_NT=ids, attention_mask_NT=attention, loss_mask_NT=mask, sampling_logprobs_NT=policy,
                      advantages_NT=torch.zeros_like(mask), ref_logprobs_NT=reference)


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_in_loss_kl_pulls_a_trained_policy_back_toward_the_base(tiny_model_dir: Path, trained_adapter_dir: Path,
                                                                adapter_word_id: int, estimator: str) -> None:
    engine = LocalEngine(ModelConfig(name=str(tiny_model_dir), device="cpu", dtype="float32",
                                     init_adapter=str(trained_adapter_dir)))
    batch = _adapter_batch(engine, adapter_word_id)
    on = batch.loss_mask_NT.bool()
    before, ref = batch.sampling_logprobs_NT[on], batch.ref_logprobs_NT[on]
    assert (before - ref > 3.0).all(), before - ref  # the policy over-rates the word compared with the base

    params = PolicyGradientParams(kl_beta=1.0, kl_estimator=estimator, old_logprobs="current")
    metrics = engine.forward_backward(batch, Loss("importance_sampling", params))
    assert metrics["kl_loss"] == pytest.approx(float(hand_estimate(estimator, before, ref).mean()), rel=1e-4)
    assert metrics["kl_loss"] > 0
    engine.optim_step(AdamParams(lr=1e-2))
    after = engine.logprobs(batch.input_ids_NT, batch.attention_mask_NT, targets_NT=batch.loss_mask_NT)[on]
    # Descending any of the three estimators lowers logp where logp > ref (each one's derivative in logp is
    # positive there), i.e. moves the policy back toward the base; a negated term would raise it instead.
    # (Measured: the 12 logprobs sum to -0.011 before and -0.17 after the step; -0.001 with the sign flipped.)
    assert float(after.sum()) < float(before.sum()) - 0.05, (before, after)
    assert float(hand_estimate(estimator, after, ref).mean()) < metrics["kl_loss"]
    assert math.isfinite(metrics["loss"])
