"""Worker of tests/engines/test_data_parallel.py: `torchrun ... ddp_worker.py MODEL_DIR OUT_FILE`.

Every rank samples the same fixed global batch (one seed, all prompts), keeps its share of the rows, and takes
two optimizer steps through DataParallelEngine; rank 0 saves the resulting fp32 adapter weights and the metrics
of each loss aggregation. `train(...)` with the single-process World gives the reference to compare against.
"""

from __future__ import annotations

import sys

import torch

from purplerl.algorithms.registry import Loss
from purplerl.config import ModelConfig
from purplerl.engines.data_parallel import DataParallelEngine
from purplerl.engines.distributed import World, join_world
from purplerl.engines.local import LocalEngine
from purplerl.train.batch import sequence_tensors
from purplerl.types import AdamParams, SamplingParams, TrainBatch

PROMPTS = ["Tell me a joke about cats", "hello world", "I hate Monday mornings and slow internet",
           "Roast my friend"]
GROUP = 2  # 4 prompts x 2 = 8 sequences; rows are split in halves, so the ranks hold different token counts
AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")
STEPS = 2


def fixed_batch(engine: LocalEngine) -> TrainBatch:
    """The same batch on every rank: sampled with one seed from the untrained policy, with set advantages."""
    ids = [engine.tokenizer.encode(p) for p in PROMPTS]
    groups = engine.sample(ids, GROUP, SamplingParams(max_new_tokens=12, temperature=1.0, seed=3))
    tensors = sequence_tensors([c for g in groups for c in g], int(engine.tokenizer.pad_token_id))
    # the untrained model never stops: cut the loss masks to different lengths, fewer tokens on rank 0's rows
    mask_NT = tensors["loss_mask_NT"]
    n = mask_NT.shape[0]
    for row in range(n // 2):
        kept = mask_NT[row].nonzero().squeeze(-1)
        mask_NT[row, kept[len(kept) // (row + 2):]] = 0.0
    advantages_N = torch.linspace(-1.0, 1.5, n)
    return TrainBatch(advantages_NT=advantages_N[:, None] * mask_NT, **tensors)


def train(model_dir: str, world: World, aggregation: str):
    """Two steps of ppo_clip on this rank's rows of the fixed batch: the adapter's flat fp32 weights after them,
    and each step's global gradient and metrics."""
    local = LocalEngine(ModelConfig(name=model_dir, device="cpu", lora_rank=4, dtype="float32"), seed=0)
    batch = fixed_batch(local)
    engine = local if world.size == 1 else DataParallelEngine(local, world)
    rows = torch.tensor(world.shard(range(batch.num_sequences)))
    loss = Loss("ppo_clip", aggregation=aggregation, length_norm=12.0)
    metrics, grads = [], []
    for _ in range(STEPS):
        fb = engine.forward_backward(batch.select(rows), loss)
        grads.append(torch.cat([m.grad.reshape(-1) for m in local.master]).clone())
        metrics.append({**fb, **engine.optim_step(AdamParams(lr=0.05, max_grad_norm=0.5))})
    return torch.cat([m.detach().reshape(-1) for m in local.master]), grads, metrics


def main(model_dir: str, out: str) -> None:
    torch.set_num_threads(1)
    world = join_world(2, torch.device("cpu"))
    results = {agg: train(model_dir, world, agg) for agg in AGGREGATIONS}
    if world.is_writer:
        torch.save(results, out)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
