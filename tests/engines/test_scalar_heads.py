"""Scalar heads on named adapters (the local engine): values at every position, a "values" loss's gradient, heads
saved and loaded with their adapters (for training, and for scoring without an optimizer); the engines without
heads refuse in one line."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from purplerl.algorithms.pairwise import BradleyTerryParams
from purplerl.algorithms.registry import Loss
from purplerl.algorithms.reward_model import bradley_terry_loss, last_token_values
from purplerl.config import ModelConfig
from purplerl.engines.adapters import HEAD_FILE
from purplerl.engines.local import LocalEngine
from purplerl.errors import UserError
from purplerl.types import AdamParams, TrainBatch
from tests.tolerances import decoder_reductions, gradient_atol, reduction_atol

# three pairs of right-padded rows of different lengths: (chosen, rejected) = (0, 1), (3, 2), (4, 5)
LENGTHS = [7, 4, 9, 3, 6, 8]
PAIRS_P2 = torch.tensor([[0, 1], [3, 2], [4, 5]])


def _engine(model_dir: Path, **settings) -> LocalEngine:
    engine = LocalEngine(ModelConfig(name=str(model_dir), device="cpu", lora_rank=4, dtype="float32"), seed=0)
    engine.settings = dataclasses.replace(engine.settings, merged_sampler=False, **settings)
    return engine


def _batch(margins: bool = False) -> TrainBatch:
    generator = torch.Generator().manual_seed(0)
    width = max(LENGTHS)
    ids = torch.randint(3, 300, (len(LENGTHS), width), generator=generator)
    attn = (torch.arange(width)[None] < torch.tensor(LENGTHS)[:, None]).long()
    ids = ids * attn + 2 * (1 - attn)
    mask = attn.float()
    mask[:, :2] = 0.0  # two prompt tokens, then the answer to the end
    return TrainBatch(ids, attn, mask, pairs_P2=PAIRS_P2,
                      margins_P=torch.tensor([0.5, -1.0, 2.0]) if margins else None)


def _hidden(engine: LocalEngine, batch: TrainBatch) -> torch.Tensor:
    return engine.model.get_decoder()(input_ids=batch.input_ids_NT, attention_mask=batch.attention_mask_NT
                                      ).last_hidden_state


def test_values_are_the_head_on_the_final_hidden_state_of_the_active_adapter(tiny_model_dir: Path) -> None:
    engine = _engine(tiny_model_dir)
    engine.create_adapter("critic", head=True)
    assert engine.heads == ["critic"] and engine.active_adapter == "default"
    with pytest.raises(UserError, match="adapter 'default' has no scalar head") as err:
        engine.values(_batch().input_ids_NT, _batch().attention_mask_NT)
    assert "\n" not in str(err.value)
    engine.use_adapter("critic")
    batch = _batch()
    values = engine.values(batch.input_ids_NT, batch.attention_mask_NT)
    head = engine.trainer._adapters.get("critic").head
    with torch.no_grad():
        hidden = _hidden(engine, batch)
        want = (hidden @ head.weight[0] + head.bias[0]) * batch.attention_mask_NT
        terms = float((hidden.abs() @ head.weight[0].abs() + head.bias[0].abs()).max())
    assert values.shape == batch.input_ids_NT.shape
    # the engine's decoder (eager attention) and a plain call of it, then the head's sum: two fp32 paths
    config = engine.model.config
    atol = reduction_atol(torch.float32, decoder_reductions(config, batch.input_ids_NT.shape[1]) + config.hidden_size,
                          terms)
    torch.testing.assert_close(values, want, rtol=0, atol=atol)
    assert float(values[batch.attention_mask_NT == 0].abs().max()) == 0.0  # padding reads 0
    # the head and its LoRA are the adapter's own weights: the optimizer of 'critic' holds them
    assert head.weight is engine.trainable[-2] and head.bias is engine.trainable[-1]


def test_bradley_terry_gradient_through_micro_batches_equals_autograd(tiny_model_dir: Path) -> None:
    engine = _engine(tiny_model_dir, micro_batch_size=2)  # three micro-batches, rows reordered by length
    engine.create_adapter("rm", head=True)
    engine.use_adapter("rm")
    torch.manual_seed(1)
    with torch.no_grad():  # move the LoRA B matrices off zero, so the LoRA weights get gradients of their own
        for p in engine.trainable:
            p.add_(0.1 * torch.randn_like(p))
    batch = _batch(margins=True)
    loss = Loss("bradley_terry", BradleyTerryParams(margin=True, center_coef=0.3))
    metrics = engine.forward_backward(batch, loss)
    linearized = torch.cat([p.grad.flatten() for p in engine.master])
    engine.optimizer.zero_grad(set_to_none=True)

    engine.model.train()
    head = engine.trainer._adapters.get("rm").head
    scores_N = last_token_values(head(_hidden(engine, batch))[..., 0], batch.attention_mask_NT)
    want, _ = bradley_terry_loss(scores_N[PAIRS_P2[:, 0]], scores_N[PAIRS_P2[:, 1]], batch.margins_P, 0.3)
    want.backward()
    autograd = torch.cat([p.grad.flatten() for p in engine.master])
    assert metrics["loss"] == pytest.approx(float(want.detach()), rel=1e-5)
    scale = float(autograd.abs().max())
    # the linearized pass and one autograd pass: two fp32 paths to one gradient, within its chain's bound
    atol = gradient_atol(torch.float32, engine.model.config, batch.input_ids_NT.shape[1],
                         int(batch.attention_mask_NT.sum()), scale)
    assert scale > 0 and float((linearized - autograd).abs().max()) <= atol
    assert {"accuracy", "margin", "chosen", "rejected", "center_loss"} <= set(metrics)


def test_a_values_loss_needs_the_margins_it_reads_and_a_head(tiny_model_dir: Path) -> None:
    from purplerl.errors import ExperimentError

    engine = _engine(tiny_model_dir)
    with pytest.raises(ExperimentError, match="needs margins_P"):
        engine.forward_backward(_batch(), Loss("bradley_terry", BradleyTerryParams(margin=True)))
    with pytest.raises(UserError, match="has no scalar head"):
        engine.forward_backward(_batch(), Loss("bradley_terry"))


def test_heads_are_saved_and_loaded_with_their_adapters(tiny_model_dir: Path, tmp_path: Path) -> None:
    engine = _engine(tiny_model_dir)
    for name in ("member0", "member1"):
        engine.create_adapter(name, head=True)
        engine.use_adapter(name)
        engine.forward_backward(_batch(), Loss("bradley_terry"))
        engine.optim_step(AdamParams(lr=0.05))
    batch = _batch()
    scores = {}
    for name in ("member0", "member1"):
        engine.use_adapter(name)
        scores[name] = engine.values(batch.input_ids_NT, batch.attention_mask_NT)
    assert not torch.equal(scores["member0"], scores["member1"])  # members differ by their own init
    engine.save(tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "member1" / HEAD_FILE).is_file() and not (tmp_path / "ckpt" / HEAD_FILE).exists()

    resumed = _engine(tiny_model_dir)  # a training engine: its adapters, heads and optimizer states come back
    resumed.load(tmp_path / "ckpt")
    assert resumed.heads == ["member0", "member1"] and resumed.active_adapter == "member1"
    state = resumed.trainer._adapters.get("member0").optimizer.state
    assert len(state) == len(resumed.trainer._adapters.get("member0").params)  # the head's moments too
    scorer = _engine(tiny_model_dir)  # scoring only: each member from its PEFT dir, no optimizer state read
    for name in ("member0", "member1"):
        scorer.create_adapter(name, init=tmp_path / "ckpt" / name, head=True)
    for engine_ in (resumed, scorer):
        for name in ("member0", "member1"):
            engine_.use_adapter(name)
            torch.testing.assert_close(engine_.values(batch.input_ids_NT, batch.attention_mask_NT), scores[name],
                                       rtol=0, atol=0)

    headless = _engine(tiny_model_dir)
    headless.create_adapter("member0")
    with pytest.raises(UserError, match="holds a scalar head, but this engine's adapter 'member0' has none"):
        headless.load(tmp_path / "ckpt")


def test_a_saved_head_of_another_model_is_refused(tiny_model_dir: Path, tmp_path: Path) -> None:
    from safetensors.torch import save_file

    engine = _engine(tiny_model_dir)
    engine.create_adapter("rm", head=True)
    engine.save(tmp_path / "ckpt")
    save_file({"weight": torch.zeros(1, 7), "bias": torch.zeros(1)}, str(tmp_path / "ckpt" / "rm" / HEAD_FILE))
    with pytest.raises(UserError, match="does not match the model") as err:
        _engine(tiny_model_dir).create_adapter("rm", init=tmp_path / "ckpt" / "rm", head=True)
    assert "\n" not in str(err.value)
