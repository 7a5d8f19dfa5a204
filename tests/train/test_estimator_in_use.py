"""The loop uses the advantage estimator it is configured with: on a fixed reward, the advantages it trains on
(the TrainBatch handed to forward_backward), logs (samples' `advantage`) and reports (`adv/adv_abs_mean`) are
that estimator's, computed by hand here.

Rewards by group: [0, 1, 5] and [2, 2, 8] (B = 2 prompts, G = 3 completions). Group means 2 and 4.
- grpo: r - mean = [-2, -1, 3], [-2, -2, 4]; dr_grpo is the same function (an equivalent swap, not tested).
- grpo_std: GRPO divided by the population std sqrt(14/3) and sqrt(8).
- rloo: r minus the mean of the other two = G/(G-1) * (r - mean) = [-3, -1.5, 4.5], [-3, -3, 6].
- reinforce_pp (kl_beta 0): every completion token's return is its row's reward; whitened over all
  completion tokens of the batch (token-weighted mean, the variance with Bessel's correction: veRL's whitening).
Also: REINFORCE++ puts the KL into its token rewards only when the KL belongs in the reward; a Token Noiser
step trains on every response whose advantage is >= 0; the sampling temperature reaches the reference pass
and the loss (at a fresh adapter the KL is 0 and the importance ratio 1 only if both score at the
temperature the tokens were drawn at).
"""

from __future__ import annotations

import math
from functools import partial
from pathlib import Path

import pytest
import torch

from purplerl.config import EngineConfig, LoggingConfig, ModelConfig, RLTrainingConfig, RunConfig, SamplingConfig
from purplerl.data import PromptSampler
from purplerl.engines.local import LocalEngine
from purplerl.prompting import render_prompt
from purplerl.recipes.attack import AttackSettings
from purplerl.recipes.defend import DefendConfig, DefendSettings
from purplerl.recipes.defend.step import defend_update
from purplerl.rewards import combine
from purplerl.train.loop import LoopParts, RecipeHooks, UpdateFn, old_logprobs_mode, rl_step, rl_update
from purplerl.train.runner import engine_settings
from purplerl.types import PromptRecord
from tests.conftest import make_tiny_tokenizer
from tests.tolerances import reduction_atol
from tests.train.test_kl_direction import BaseScorer

RECORDS = [PromptRecord(messages=({"role": "user", "content": text},), uid=f"p{i}")
           for i, text in enumerate(["hello world", "tell me a joke", "roast my friend", "say goodbye"])]
REWARDS = [0.0, 1.0, 5.0, 2.0, 2.0, 8.0]  # row-major: group 0 then group 1
GROUPS = [[-2.0, -1.0, 3.0], [-2.0, -2.0, 4.0]]  # r - group mean
STD = [math.sqrt(14 / 3), math.sqrt(8.0)]  # population std of each group


class RecordingEngine:
    """The engine, plus a record of every TrainBatch it was asked to train on."""

    def __init__(self, engine: LocalEngine) -> None:
        self.engine = engine
        self.batches = []

    def __getattr__(self, name: str):
        return getattr(self.engine, name)

    def forward_backward(self, batch, loss):
        self.batches.append(batch)
        return self.engine.forward_backward(batch, loss)


def _step(model_dir: Path, sampling: dict | None = None, reward: dict | None = None, adapter: Path | None = None,
          rewards: list[float] = REWARDS, update: UpdateFn = rl_update, defend: dict | None = None,
          **training: object):
    sections = dict(model=ModelConfig(name=str(model_dir), device="cpu", lora_rank=4, dtype="float32",
                                      init_adapter=str(adapter) if adapter else None),
                    sampling=SamplingConfig(**{"group_size": 3, "max_new_tokens": 4, **(sampling or {})}),
                    training=RLTrainingConfig(steps=1, batch_size=2, lr=1e-2, **training),
                    engine=EngineConfig(), reward={"kl_beta": 0.0, **(reward or {})},
                    run=RunConfig(save_every=100, keep_last=1), logging=LoggingConfig(progress=False))
    # the defend tree when `defend` sets its Token Noiser fields, else the attack's
    config = DefendSettings(defend=DefendConfig(**defend), **sections) if defend is not None \
        else AttackSettings(**sections)
    engine = RecordingEngine(LocalEngine(config.model, seed=0, settings=engine_settings(config)))
    render = partial(render_prompt, engine.tokenizer, template="chat", system_prompt=None, max_prompt_tokens=64)

    def fixed_reward(prompts, completions, kl_N):
        return combine({"score": (1.0, torch.tensor(rewards)), "kl": (0.0, kl_N)})

    parts = LoopParts(engine, PromptSampler(RECORDS, 2, 0), render, RecipeHooks(reward=fixed_reward, update=update))
    metrics, samples = rl_step(1, config, parts)
    (batch,) = engine.batches
    return metrics, samples, batch


def _check_sequence_level(metrics, samples, batch, expected_N: list[float]) -> None:
    mask = batch.loss_mask_NT
    # the batch carries each row's advantage on its completion tokens and 0 elsewhere
    torch.testing.assert_close(batch.advantages_NT, torch.tensor(expected_N)[:, None] * mask, atol=1e-5, rtol=0)
    assert [s["advantage"] for s in samples] == pytest.approx(expected_N, abs=1e-5)
    assert metrics["adv/adv_abs_mean"] == pytest.approx(sum(map(abs, expected_N)) / len(expected_N), abs=1e-5)


@pytest.mark.parametrize("advantage", ["grpo", "dr_grpo"])
def test_group_mean_baseline(tiny_model_dir: Path, advantage: str) -> None:
    agg = "seq_mean_token_sum_norm" if advantage == "dr_grpo" else "token_mean"
    _check_sequence_level(*_step(tiny_model_dir, advantage=advantage, loss_agg=agg), [a for g in GROUPS for a in g])


def test_grpo_divided_by_the_group_std(tiny_model_dir: Path) -> None:
    expected = [a / s for g, s in zip(GROUPS, STD, strict=True) for a in g]
    assert expected[:3] == pytest.approx([-0.9258201, -0.4629100, 1.3887301])  # worked once by hand
    _check_sequence_level(*_step(tiny_model_dir, advantage="grpo_std"), expected)


def test_rloo_leave_one_out(tiny_model_dir: Path) -> None:
    _check_sequence_level(*_step(tiny_model_dir, advantage="rloo"), [-3.0, -1.5, 4.5, -3.0, -3.0, 6.0])


def _whitened_rewards(mask_NT: torch.Tensor) -> list[float]:
    """REINFORCE++ without a token KL: each completion token's return is its row's reward; whitened over all
    completion tokens (token-weighted mean, the variance with Bessel's correction over the tokens)."""
    lengths = mask_NT.sum(-1).tolist()
    total = sum(lengths)
    mean = sum(n * r for n, r in zip(lengths, REWARDS, strict=True)) / total
    std = math.sqrt(sum(n * (r - mean) ** 2 for n, r in zip(lengths, REWARDS, strict=True)) / (total - 1))
    return [(r - mean) / std for r in REWARDS]


def test_reinforce_pp_whitened_returns(tiny_model_dir: Path) -> None:
    metrics, samples, batch = _step(tiny_model_dir, advantage="reinforce_pp")
    mask = batch.loss_mask_NT
    lengths = mask.sum(-1).tolist()
    total = sum(lengths)
    expected_N = _whitened_rewards(mask)
    # fp32 whitening sums over every completion token twice (the mean, then the variance), against float64 here:
    # that chain's bound, on the size of a reward in std units (each term's) plus an advantage's (tests/tolerances.py)
    std = (REWARDS[2] - REWARDS[0]) / (expected_N[2] - expected_N[0])
    atol = reduction_atol(torch.float32, 2 * int(total) + 4, max(map(abs, REWARDS)) / std + max(map(abs, expected_N)))
    torch.testing.assert_close(batch.advantages_NT, torch.tensor(expected_N)[:, None] * mask, atol=atol, rtol=0)
    assert [s["advantage"] for s in samples] == pytest.approx(expected_N, abs=atol)
    token_abs = sum(n * abs(a) for n, a in zip(lengths, expected_N, strict=True)) / total
    assert metrics["adv/adv_abs_mean"] == pytest.approx(token_abs, abs=atol)


@pytest.mark.parametrize("kl_in", ["reward", "loss"])
def test_reinforce_pp_token_kl_only_when_the_kl_is_in_the_reward(tiny_model_dir: Path, trained_adapter_dir: Path,
                                                                 kl_in: str) -> None:
    # from the trained adapter each token's k1 = logp - ref is about +5, so a token KL changes every return
    beta = 0.5
    _, _, batch = _step(tiny_model_dir, adapter=trained_adapter_dir, advantage="reinforce_pp",
                        reward={"kl_in": kl_in, "kl_beta": beta, "kl_estimator": "k1"})
    mask = batch.loss_mask_NT
    on = mask.bool()
    if kl_in == "loss":  # the KL is the loss's business: the returns are the rewards alone
        expected_NT = torch.tensor(_whitened_rewards(mask))[:, None] * mask
    else:
        base = BaseScorer(tiny_model_dir)
        returns_NT = torch.zeros_like(mask)
        for n in range(mask.shape[0]):
            cols = on[n].nonzero()[:, 0].tolist()
            ids = batch.input_ids_NT[n].tolist()
            kl_C = batch.sampling_logprobs_NT[n, cols] - base(tuple(ids[:cols[0]]), tuple(ids[c] for c in cols))
            token_rewards_C = -beta * kl_C
            token_rewards_C[-1] += REWARDS[n]  # the sequence reward arrives at the last completion token
            returns_NT[n, cols] = token_rewards_C.flip(0).cumsum(0).flip(0)  # G_t = sum of rewards from t on
        values = returns_NT[on]
        expected_NT = torch.where(on, (returns_NT - values.mean()) / values.std(unbiased=True), 0.0)
        assert float(values.std()) > 1.0  # the KL moved the returns far from the six rewards
    torch.testing.assert_close(batch.advantages_NT, expected_NT, atol=1e-4, rtol=0)


def test_noiser_step_trains_on_every_response_with_advantage_at_least_zero(tiny_model_dir: Path) -> None:
    # group 0: advantages [-2, -1, 3] -> one response >= 0; group 1 is flat -> three zeros, all kept
    metrics, samples, batch = _step(tiny_model_dir, rewards=[0.0, 1.0, 5.0, 2.0, 2.0, 2.0], update=defend_update,
                                    defend={"noiser": True, "noiser_warmup": 0, "noiser_every": 1})
    assert metrics["train/noiser_step"] == 1.0 and metrics["train/noiser_sequences"] == 4
    assert [s["advantage"] for s in samples] == pytest.approx([-2.0, -1.0, 3.0, 0.0, 0.0, 0.0])
    # the noiser batch holds exactly those four responses, in order
    tokenizer = make_tiny_tokenizer()
    trained_on = [tokenizer.decode(ids[mask.bool()].tolist(), skip_special_tokens=True)
                  for ids, mask in zip(batch.input_ids_NT, batch.loss_mask_NT, strict=True)]
    assert trained_on == [s["completion"] for s in samples[2:]]


@pytest.mark.parametrize("loss", ["importance_sampling", "ppo_clip"])
def test_temperature_reaches_the_reference_pass_and_the_loss(tiny_model_dir: Path, loss: str) -> None:
    # temperature 0.25 multiplies the tiny model's logits by 4; scoring at temperature 1 instead shifts the
    # logprobs by ~0.1, far above the 1e-4 float noise between the sampler and the scoring pass
    metrics, _, _ = _step(tiny_model_dir, sampling={"temperature": 0.25}, loss=loss, old_logprobs="sampler")
    assert metrics["kl/mean"] == pytest.approx(0.0, abs=1e-4)  # a fresh adapter is the base
    assert metrics["train/ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    assert metrics["train/approx_kl_sampling"] == pytest.approx(0.0, abs=1e-6)


def test_old_logprobs_auto_is_current_only_for_one_update_per_batch() -> None:
    assert old_logprobs_mode(RLTrainingConfig()) == "current"
    assert old_logprobs_mode(RLTrainingConfig(ppo_epochs=2)) == "sampler"
    assert old_logprobs_mode(RLTrainingConfig(mini_batches=2)) == "sampler"
    assert old_logprobs_mode(RLTrainingConfig(old_logprobs="sampler")) == "sampler"
