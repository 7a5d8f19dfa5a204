"""The tinker engine's pure helpers and its refusals, without the SDK or a server (part of `make test`)."""

from __future__ import annotations

import sys

import pytest
import torch

from purplerl.algorithms.registry import LOSS_REGISTRY, Loss, PolicyGradientParams
from purplerl.config import EngineConfig, ModelConfig
from purplerl.engines import make_engine
from purplerl.engines.tinker_data import aggregation_coefficients, reduction_scale, row_lengths, scatter_targets
from purplerl.errors import ExperimentError, UserError

MASK_NT = torch.tensor([[0.0, 1.0, 1.0, 0.0], [0.0, 1.0, 0.0, 0.0]])  # 2 loss tokens, then 1


def test_aggregation_coefficients_are_each_modes_token_weights() -> None:
    token_mean = aggregation_coefficients(Loss("cross_entropy"), MASK_NT)
    torch.testing.assert_close(token_mean, MASK_NT / 3)
    per_sequence = aggregation_coefficients(Loss("cross_entropy", aggregation="seq_mean_token_mean"), MASK_NT)
    torch.testing.assert_close(per_sequence, torch.tensor([[0.0, 0.25, 0.25, 0.0], [0.0, 0.5, 0.0, 0.0]]))
    constant = aggregation_coefficients(Loss("cross_entropy", aggregation="seq_mean_token_sum_norm",
                                             length_norm=4.0), MASK_NT)
    torch.testing.assert_close(constant, MASK_NT / 8)


def test_reduction_scale_undoes_a_per_sequence_mean() -> None:
    on_NT = MASK_NT != 0
    torch.testing.assert_close(reduction_scale(on_NT, "sum"), torch.ones(2, 1))
    # row 0: 2 loss tokens x 2 datums; row 1: 1 x 2
    torch.testing.assert_close(reduction_scale(on_NT, "sequence_mean"), torch.tensor([[4.0], [2.0]]))


def test_datum_values_land_on_their_targets() -> None:
    out = scatter_targets([[-1.0, -2.0, -3.0], [-4.0]], [4, 2], 5)
    torch.testing.assert_close(out, torch.tensor([[0.0, -1.0, -2.0, -3.0, 0.0], [0.0, -4.0, 0.0, 0.0, 0.0]]))
    keep = torch.tensor([[0, 0, 1, 1, 0], [0, 1, 0, 0, 0]])
    torch.testing.assert_close(scatter_targets([[-1.0, -2.0, -3.0], [-4.0]], [4, 2], 5, keep),
                               torch.tensor([[0.0, 0.0, -2.0, -3.0, 0.0], [0.0, -4.0, 0.0, 0.0, 0.0]]))
    with pytest.raises(ExperimentError, match="returned 2 logprobs for sequence 0 of 4 tokens"):
        scatter_targets([[-1.0, -2.0]], [4], 5)
    with pytest.raises(ExperimentError, match="sequence 1 has 1 tokens"):
        row_lengths(torch.tensor([[1, 1, 0], [1, 0, 0]]))


def test_losses_name_the_tinker_builtin_only_where_it_is_the_same_loss() -> None:
    ppo = LOSS_REGISTRY["ppo_clip"].tinker
    name, config = ppo(PolicyGradientParams(clip_low=0.1, clip_high=0.3))
    assert name == "ppo" and config == pytest.approx({"clip_low_threshold": 0.9, "clip_high_threshold": 1.3})
    assert ppo(PolicyGradientParams(kl_beta=0.1)) is None  # Tinker's ppo has no KL term
    assert ppo(PolicyGradientParams(old_logprobs="current")) is None  # nor a detached current policy
    assert LOSS_REGISTRY["importance_sampling"].tinker(PolicyGradientParams()) == ("importance_sampling", {})
    assert LOSS_REGISTRY["token_noiser"].tinker is None and LOSS_REGISTRY["dpo"].tinker is None


def test_without_the_sdk_the_tinker_engine_names_the_install(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "tinker", None)  # what `import tinker` meets where it is not installed
    with pytest.raises(UserError, match="needs the Tinker SDK, which is not installed: pip install tinker"):
        make_engine(ModelConfig(name="unused"), engine=EngineConfig(kind="tinker"))


@pytest.mark.parametrize(("field", "value", "message"), [
    ("finetune", "full", "LoRA adapters only"), ("lora_targets", "q_proj", "must be 'all-linear'"),
    ("lora_dropout", 0.1, "no LoRA dropout"), ("init_adapter", "some/dir", "cannot start from a local PEFT")])
def test_what_the_service_cannot_train_is_refused_before_connecting(field, value, message) -> None:
    with pytest.raises(UserError, match=message):
        make_engine(ModelConfig(name="unused", **{field: value}), engine="tinker")
