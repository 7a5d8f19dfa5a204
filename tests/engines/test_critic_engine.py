"""A critic beside the policy on one base (the local engine): the critic's loss trains only the critic's adapter and
head, the policy's only the policy's adapter; the value loss's gradient through the engine's micro-batches equals
autograd's; the critic's rollout values are its head read one position before each completion token."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from purplerl.algorithms.critic import ValueLossParams, clipped_value_loss, state_values
from purplerl.algorithms.registry import Loss, PolicyGradientParams
from purplerl.config import ModelConfig
from purplerl.engines.local import LocalEngine
from purplerl.errors import ExperimentError
from purplerl.recipes.ppo.step import CRITIC, POLICY, critic_values
from purplerl.types import AdamParams, TrainBatch
from tests.tolerances import gradient_atol

LENGTHS = [7, 4, 9, 3, 6, 8]
PROMPT = 2  # two prompt tokens, then the completion to the end of each row


def _engine(model_dir: Path, **settings) -> LocalEngine:
    engine = LocalEngine(ModelConfig(name=str(model_dir), device="cpu", lora_rank=4, dtype="float32"), seed=0)
    engine.settings = dataclasses.replace(engine.settings, merged_sampler=False, **settings)
    engine.create_adapter(CRITIC, head=True)
    return engine


def _batch() -> TrainBatch:
    g = torch.Generator().manual_seed(0)
    width = max(LENGTHS)
    attn = (torch.arange(width)[None] < torch.tensor(LENGTHS)[:, None]).long()
    ids = torch.randint(3, 300, (len(LENGTHS), width), generator=g) * attn + 2 * (1 - attn)
    mask = attn.float()
    mask[:, :PROMPT] = 0.0
    noise = [torch.randn(mask.shape, generator=g) * mask for _ in range(4)]
    return TrainBatch(ids, attn, mask, sampling_logprobs_NT=noise[0] - 5.0 * mask, advantages_NT=noise[1],
                      old_values_NT=noise[2], returns_NT=noise[3])


def _grads(engine: LocalEngine, name: str) -> list[torch.Tensor | None]:
    return [m.grad for m in engine.trainer._adapters.get(name).master]


def _weights(engine: LocalEngine, name: str) -> list[torch.Tensor]:
    return [m.detach().clone() for m in engine.trainer._adapters.get(name).master]


def test_each_loss_trains_only_its_own_adapter(tiny_model_dir: Path) -> None:
    engine, batch = _engine(tiny_model_dir), _batch()
    policy_before, critic_before = _weights(engine, POLICY), _weights(engine, CRITIC)
    assert engine.active_adapter == POLICY

    engine.forward_backward(batch, Loss("ppo_clip", PolicyGradientParams()))
    assert any(g is not None and float(g.abs().max()) > 0 for g in _grads(engine, POLICY))
    assert all(g is None for g in _grads(engine, CRITIC))
    engine.optim_step(AdamParams(lr=0.05))
    assert all(torch.equal(a, b) for a, b in zip(_weights(engine, CRITIC), critic_before, strict=True))
    policy_after = _weights(engine, POLICY)
    assert any(not torch.equal(a, b) for a, b in zip(policy_after, policy_before, strict=True))

    engine.use_adapter(CRITIC)
    engine.forward_backward(batch, Loss("ppo_value", ValueLossParams(clip_range=0.2, coef=0.5)))
    critic_grads = _grads(engine, CRITIC)
    head = engine.trainer._adapters.get(CRITIC).head
    assert head.weight is engine.trainable[-2] and float(critic_grads[-2].abs().max()) > 0  # the head learns
    assert float(critic_grads[-1].abs().max()) > 0  # its bias too
    assert any(float(g.abs().max()) > 0 for g in critic_grads[:-2] if g is not None)  # and the critic's LoRA
    assert all(g is None for g in _grads(engine, POLICY))
    engine.optim_step(AdamParams(lr=0.05))
    assert all(torch.equal(a, b) for a, b in zip(_weights(engine, POLICY), policy_after, strict=True))
    assert any(not torch.equal(a, b) for a, b in zip(_weights(engine, CRITIC), critic_before, strict=True))


def test_value_loss_gradient_through_micro_batches_equals_autograd(tiny_model_dir: Path) -> None:
    engine, batch = _engine(tiny_model_dir, micro_batch_size=2), _batch()  # three micro-batches, by length
    engine.use_adapter(CRITIC)
    torch.manual_seed(1)
    with torch.no_grad():  # LoRA B off zero, so every critic weight has a gradient of its own
        for p in engine.trainable:
            p.add_(0.1 * torch.randn_like(p))
    params = ValueLossParams(clip_range=0.05, coef=0.3)  # a small clip range: some tokens are clipped
    metrics = engine.forward_backward(batch, Loss("ppo_value", params))
    linearized = torch.cat([p.grad.flatten() for p in engine.master])
    engine.optimizer.zero_grad(set_to_none=True)

    engine.model.train()
    head = engine.trainer._adapters.get(CRITIC).head
    hidden = engine.model.get_decoder()(input_ids=batch.input_ids_NT,
                                        attention_mask=batch.attention_mask_NT).last_hidden_state
    values_NT = state_values(head(hidden)[..., 0], batch.loss_mask_NT)
    want, want_metrics = clipped_value_loss(values_NT, batch.old_values_NT, batch.returns_NT, batch.loss_mask_NT,
                                            clip_range=0.05)
    (0.3 * want).backward()
    autograd = torch.cat([p.grad.flatten() for p in engine.master])
    assert metrics["loss"] == pytest.approx(0.3 * float(want.detach()), rel=1e-5)
    assert metrics["value_loss"] == pytest.approx(want_metrics["value_loss"], rel=1e-5)
    assert 0 < metrics["value_clip_frac"] < 1
    scale = float(autograd.abs().max())
    # micro-batches and one whole-batch forward: two fp32 paths to one gradient, within its chain's bound
    atol = gradient_atol(torch.float32, engine.model.config, batch.input_ids_NT.shape[1],
                         int(batch.attention_mask_NT.sum()), scale)
    assert scale > 0 and float((linearized - autograd).abs().max()) <= atol


def test_critic_values_are_the_head_one_position_before_each_token(tiny_model_dir: Path) -> None:
    engine, batch = _engine(tiny_model_dir), _batch()
    tensors = {"input_ids_NT": batch.input_ids_NT, "attention_mask_NT": batch.attention_mask_NT,
               "loss_mask_NT": batch.loss_mask_NT}
    values_NT = critic_values(engine, tensors)
    assert engine.active_adapter == POLICY  # the policy samples next
    engine.use_adapter(CRITIC)
    raw_NT = engine.values(batch.input_ids_NT, batch.attention_mask_NT)
    torch.testing.assert_close(values_NT[:, PROMPT:], (raw_NT[:, PROMPT - 1:-1] * batch.loss_mask_NT[:, PROMPT:]))
    assert float(values_NT[batch.loss_mask_NT == 0].abs().max()) == 0.0


def test_a_batch_split_into_minibatches_keeps_the_critic_targets_and_the_loss_needs_them(tiny_model_dir: Path
                                                                                          ) -> None:
    batch = _batch()
    rows = torch.tensor([4, 1])
    part = batch.select(rows)
    torch.testing.assert_close(part.old_values_NT, batch.old_values_NT[rows])
    torch.testing.assert_close(part.returns_NT, batch.returns_NT[rows])
    assert set(part.inputs()) >= {"old_values_NT", "returns_NT"}
    engine = _engine(tiny_model_dir)
    engine.use_adapter(CRITIC)
    with pytest.raises(ExperimentError, match="needs returns_NT"):
        engine.forward_backward(dataclasses.replace(batch, returns_NT=None), Loss("ppo_value"))
