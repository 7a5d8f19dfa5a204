"""The critic's update (purplerl.recipes.ppo.step) through a recording engine: the policy's loss on the policy's
adapter, then the value loss on the critic's, on the same mini-batches, with the critic's own learning rate and the
critic section's clip range and coefficient; the policy is active again after, however the update ends."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from purplerl.algorithms.critic import ValueLossParams
from purplerl.config import load_command_config
from purplerl.recipes import RECIPES
from purplerl.recipes.ppo.step import CRITIC, POLICY, policy_and_critic_update
from purplerl.types import AdamParams, TrainBatch


class RecordingEngine:
    def __init__(self, fail_on: str | None = None) -> None:
        self.active, self.calls, self.fail_on = POLICY, [], fail_on

    def use_adapter(self, name: str) -> None:
        self.active = name

    def forward_backward(self, batch: TrainBatch, loss: Any) -> dict[str, float]:
        if loss.name == self.fail_on:
            raise RuntimeError("boom")
        self.calls.append((self.active, loss.name, loss.params, batch.input_ids_NT[:, 0].tolist()))
        extra = {"value_loss": 0.5, "value_clip_frac": 0.25, "value_mean": 1.5} if loss.name == "ppo_value" else {}
        return {"loss": 1.0, **extra}

    def optim_step(self, adam: AdamParams) -> dict[str, float]:
        self.calls.append((self.active, "step", adam.lr))
        return {"grad_norm": 2.0 if self.active == CRITIC else 3.0, "lr": adam.lr}


def _config(*args: str) -> Any:
    return load_command_config(RECIPES["ppo"].command(), None, ["--model", str(Path("/nonexistent")), "--lr", "0.01",
                                                                 "--training.ppo_epochs", "2",
                                                                 "--training.mini_batches", "2", *args])


def _batch() -> TrainBatch:
    ids = torch.arange(6)[:, None].repeat(1, 3)  # row n starts with token n: the calls record which rows trained
    mask = torch.tensor([[0.0, 1.0, 1.0]]).repeat(6, 1)
    zeros = torch.zeros(6, 3)
    return TrainBatch(ids, torch.ones(6, 3, dtype=torch.long), mask, sampling_logprobs_NT=zeros, advantages_NT=zeros,
                      old_values_NT=zeros, returns_NT=zeros)


@pytest.mark.parametrize("critic_lr, want_lr", [(None, 0.01), ("0.5", 0.5)])
def test_policy_then_critic_on_the_same_minibatches(critic_lr: str | None, want_lr: float) -> None:
    config = _config("--critic.cliprange_value", "0.3", "--critic.vf_coef", "0.7",
                     *(["--critic.lr", critic_lr] if critic_lr else []))
    engine = RecordingEngine()
    metrics = policy_and_critic_update(engine, _batch(), config, step=3)
    fb = [c for c in engine.calls if c[1] != "step"]
    steps = [c for c in engine.calls if c[1] == "step"]
    assert [(a, name) for a, name, *_ in fb] == [(POLICY, "ppo_clip")] * 4 + [(CRITIC, "ppo_value")] * 4
    assert [c[3] for c in fb[:4]] == [c[3] for c in fb[4:]]  # the same rows, in the same order
    assert sorted(r for c in fb[:2] for r in c[3]) == list(range(6))  # each epoch covers every row once
    assert fb[4][2] == ValueLossParams(clip_range=0.3, coef=0.7)
    assert [s[2] for s in steps] == [0.01] * 4 + [want_lr] * 4
    assert engine.active == POLICY
    assert metrics["value_loss"] == 0.5 and metrics["value_clip_frac"] == 0.25 and metrics["value_mean"] == 1.5
    assert metrics["critic_grad_norm"] == 2.0 and metrics["grad_norm"] == 3.0  # the policy's stays the loop's


def test_the_policy_is_active_again_when_the_critic_update_fails() -> None:
    engine = RecordingEngine(fail_on="ppo_value")
    with pytest.raises(RuntimeError, match="boom"):
        policy_and_critic_update(engine, _batch(), _config(), step=1)
    assert engine.active == POLICY
