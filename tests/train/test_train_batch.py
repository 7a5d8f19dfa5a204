"""sequence_tensors / build_train_batch on hand-built completions, with every expected tensor written out."""

from __future__ import annotations

import pytest
import torch

from purplerl.errors import ExperimentError
from purplerl.train.batch import build_train_batch, sequence_tensors
from purplerl.types import Completion, TrainBatch

PAD = 0


def _completion(prompt: tuple[int, ...], tokens: tuple[int, ...], logprobs: list[float]) -> Completion:
    return Completion(prompt_tokens=prompt, tokens=tokens, logprobs_C=torch.tensor(logprobs),
                      entropies_C=torch.ones(len(tokens)), text="", finish_reason="length")


# prompt 3 + completion 2 = 5 tokens (the longest, T = 5); prompt 1 + completion 3 = 4 tokens
COMPLETIONS = [
    _completion((5, 6, 7), (8, 9), [-0.5, -1.0]),
    _completion((5,), (10, 11, 12), [-0.1, -0.2, -0.3]),
]


def test_sequence_tensors_by_hand() -> None:
    t = sequence_tensors(COMPLETIONS, PAD)
    assert set(t) == {"input_ids_NT", "attention_mask_NT", "loss_mask_NT", "sampling_logprobs_NT"}
    assert torch.equal(t["input_ids_NT"], torch.tensor([[5, 6, 7, 8, 9], [5, 10, 11, 12, PAD]]))
    assert torch.equal(t["attention_mask_NT"], torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]))
    # targets: the completion tokens only (never a prompt token, never padding)
    assert torch.equal(t["loss_mask_NT"], torch.tensor([[0.0, 0, 0, 1, 1], [0, 1, 1, 1, 0]]))
    assert torch.equal(t["sampling_logprobs_NT"], torch.tensor([[0.0, 0, 0, -0.5, -1.0], [0, -0.1, -0.2, -0.3, 0]]))
    assert t["input_ids_NT"].dtype == torch.long and t["attention_mask_NT"].dtype == torch.long
    assert t["loss_mask_NT"].dtype == torch.float32 and t["sampling_logprobs_NT"].dtype == torch.float32


def test_build_train_batch_broadcasts_advantages_on_completion_tokens_only() -> None:
    tensors = sequence_tensors(COMPLETIONS, PAD)
    batch = build_train_batch(tensors, torch.tensor([2.0, -1.0]))
    assert isinstance(batch, TrainBatch)
    assert torch.equal(batch.advantages_NT, torch.tensor([[0.0, 0, 0, 2, 2], [0, -1, -1, -1, 0]]))
    assert batch.advantages_NT.dtype == torch.float32
    assert batch.ref_logprobs_NT is None
    assert batch.num_sequences == 2 and batch.num_loss_tokens == 5
    assert torch.equal(batch.input_ids_NT, tensors["input_ids_NT"])

    ref = torch.full((2, 5), -3.0)
    assert build_train_batch(tensors, torch.tensor([1, 0]), ref_logprobs_NT=ref).ref_logprobs_NT is ref
    # integer advantages become float
    assert build_train_batch(tensors, torch.tensor([1, 0])).advantages_NT.dtype == torch.float32


def test_bad_inputs_raise() -> None:
    with pytest.raises(ExperimentError, match="no completions"):
        sequence_tensors([], PAD)
    with pytest.raises(ExperimentError, match="completion 1 has no tokens"):
        sequence_tensors([COMPLETIONS[0], _completion((5,), (), [])], PAD)
    tensors = sequence_tensors(COMPLETIONS, PAD)
    with pytest.raises(ExperimentError, match=r"advantages have shape \(3,\), expected \(2,\)"):
        build_train_batch(tensors, torch.zeros(3))
    with pytest.raises(ExperimentError, match="advantages have shape"):
        build_train_batch(tensors, torch.zeros(2, 1))
    with pytest.raises(ValueError, match="ref_logprobs_NT"):
        build_train_batch(tensors, torch.zeros(2), ref_logprobs_NT=torch.zeros(2, 4))
