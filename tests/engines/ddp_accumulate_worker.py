"""Worker of tests/engines/test_data_parallel.py: `torchrun ... ddp_accumulate_worker.py MODEL_DIR OUT_FILE`.

Each rank builds its own batches: its two rows of each global batch below, trimmed to its own width, with other
token counts than the other rank's (rank 0 holds few loss tokens of batch A and many of batch B, rank 1 the
reverse). Every rank then runs the same calls through DataParallelEngine: ppo_clip (token_mean) on A, ppo_clip on
B, one optimizer step over the gradient both accumulated; then a custom loss, a mean over sequences, on A and a
second step. Rank 0 saves the gradients after each call, the weights after each step and the metrics.
`run(...)` with the single-process World and the full global batches is the reference.
"""

from __future__ import annotations

import sys

import torch

from purplerl.algorithms.registry import CustomLoss, Loss
from purplerl.config import ModelConfig
from purplerl.engines.data_parallel import DataParallelEngine
from purplerl.engines.distributed import World, join_world
from purplerl.engines.local import LocalEngine
from purplerl.types import AdamParams, TrainBatch

PROMPT_TOKENS = 4
# completion tokens per row of each global batch; rank r holds rows 2r and 2r + 1
COMPLETIONS = {"A": (2, 3, 9, 11), "B": (10, 8, 2, 1)}
ADVANTAGES = (-1.0, 0.5, 1.5, -0.5)
ADAM = AdamParams(lr=0.05, max_grad_norm=0.5)


def global_batch(engine: LocalEngine, name: str, seed: int) -> TrainBatch:
    """Four rows of random tokens (prompt, then completion), right-padded, with advantages and sampling logprobs
    0.3 nats off the current policy's (alternating sign), so the PPO ratio clips on some tokens."""
    generator = torch.Generator().manual_seed(seed)
    pad, vocab = int(engine.tokenizer.pad_token_id), len(engine.tokenizer)
    lengths = [PROMPT_TOKENS + c for c in COMPLETIONS[name]]
    ids_NT = torch.full((len(lengths), max(lengths)), pad, dtype=torch.long)
    attention_NT, mask_NT = torch.zeros_like(ids_NT), torch.zeros(ids_NT.shape)
    for row, length in enumerate(lengths):
        ids_NT[row, :length] = torch.randint(3, vocab, (length,), generator=generator)
        attention_NT[row, :length] = 1
        mask_NT[row, PROMPT_TOKENS:length] = 1.0
    current_NT = engine.logprobs(ids_NT, attention_NT, targets_NT=mask_NT.long())
    sign_NT = torch.tensor([1.0, -1.0]).repeat(max(lengths))[: max(lengths)]
    return TrainBatch(ids_NT, attention_NT, mask_NT, sampling_logprobs_NT=(current_NT + 0.3 * sign_NT) * mask_NT,
                      advantages_NT=torch.tensor(ADVANTAGES)[:, None] * mask_NT)


def shard(batch: TrainBatch, world: World) -> TrainBatch:
    """This rank's rows of the global batch, trimmed to their own width (the whole batch in one process)."""
    rows = torch.tensor(world.shard(range(batch.num_sequences)))
    own = batch.select(rows)
    width = int(own.attention_mask_NT.sum(-1).max())
    return TrainBatch(*(t[:, :width] for t in (own.input_ids_NT, own.attention_mask_NT, own.loss_mask_NT,
                                                own.sampling_logprobs_NT, own.advantages_NT)))


def sequence_mean_loss(logprobs_NT: torch.Tensor, inputs) -> torch.Tensor:
    """A custom loss of whole sequences: the mean over sequences of -sum_t advantage * logprob."""
    return -(logprobs_NT * inputs["advantages_NT"]).sum(-1).mean()


def _grads(engine: LocalEngine) -> torch.Tensor:
    return torch.cat([torch.zeros(m.numel()) if m.grad is None else m.grad.reshape(-1) for m in engine.master]).clone()


def _weights(engine: LocalEngine) -> torch.Tensor:
    return torch.cat([m.detach().reshape(-1) for m in engine.master]).clone()


def run(model_dir: str, world: World) -> dict:
    """The calls of the module docstring on this rank's shards: gradients after each call, weights after each
    step, metrics of each call."""
    local = LocalEngine(ModelConfig(name=model_dir, device="cpu", lora_rank=4, dtype="float32"), seed=0)
    a, b = global_batch(local, "A", seed=1), global_batch(local, "B", seed=2)
    engine = local if world.size == 1 else DataParallelEngine(local, world)
    ppo = Loss("ppo_clip", aggregation="token_mean")
    out: dict = {"grads": [], "weights": [], "metrics": [], "tokens": (shard(a, world).num_loss_tokens,
                                                                       shard(b, world).num_loss_tokens)}
    out["metrics"].append(engine.forward_backward(shard(a, world), ppo))
    out["grads"].append(_grads(local))
    out["metrics"].append(engine.forward_backward(shard(b, world), ppo))
    out["grads"].append(_grads(local))
    out["metrics"].append(engine.optim_step(ADAM))
    out["weights"].append(_weights(local))
    out["metrics"].append(engine.forward_backward_custom(shard(a, world), CustomLoss(sequence_mean_loss)))
    out["grads"].append(_grads(local))
    out["metrics"].append(engine.optim_step(ADAM))
    out["weights"].append(_weights(local))
    return out


def main(model_dir: str, out: str) -> None:
    torch.set_num_threads(1)
    world = join_world(2, torch.device("cpu"))
    result = run(model_dir, world)
    shared = world.gather((result["tokens"], result["weights"][-1]))
    if world.is_writer:
        torch.save({**result, "rank_tokens": [t for t, _ in shared], "rank_weights": [w for _, w in shared]}, out)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
