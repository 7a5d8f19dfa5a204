"""A step's per-rank results joined into the global batch's, so metrics and samples describe the whole batch.

Under data parallel each rank samples, scores and computes advantages for its own prompts (whole groups); the
metrics of a step are then computed once more from every rank's completions and rewards, in rank order, which
is exactly what one process holding the global batch would compute (a mean of per-rank stds or top shares
would not be). With one process these functions return their input unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from purplerl.engines.distributed import World
from purplerl.types import Completion, PromptRecord, RewardBreakdown


@dataclass
class StepShard:
    """What one rank's step produced, per completion (N of this rank) unless noted."""

    prompts: list[PromptRecord]
    completions: list[Completion]
    rewards: RewardBreakdown
    kl_N: torch.Tensor
    mask_NT: torch.Tensor  # loss mask [N, T]; T differs between ranks
    adv_metrics: dict[str, float]  # means over this rank's groups (every rank holds as many groups)
    advantages_N: torch.Tensor


def _cat_masks(masks: list[torch.Tensor]) -> torch.Tensor:
    width = max(m.shape[1] for m in masks)
    return torch.cat([F.pad(m, (0, width - m.shape[1])) for m in masks])


def merge_shards(world: World, shard: StepShard) -> StepShard:
    """The global batch's StepShard, on every rank."""
    if world.size == 1:
        return shard
    parts = world.gather(shard)
    names = parts[0].rewards.components.keys()
    is_rh = [p.rewards.is_rh_N for p in parts]
    rewards = RewardBreakdown(total_N=torch.cat([p.rewards.total_N for p in parts]),
                              components={k: torch.cat([p.rewards.components[k] for p in parts]) for k in names},
                              is_rh_N=None if is_rh[0] is None else torch.cat(is_rh))
    # equal group counts per rank: the mean of the per-rank means is the mean over all groups
    adv_keys = parts[0].adv_metrics.keys()
    adv_metrics = {k: sum(float(p.adv_metrics[k]) for p in parts) / len(parts) for k in adv_keys}
    return StepShard(prompts=[x for p in parts for x in p.prompts],
                     completions=[c for p in parts for c in p.completions], rewards=rewards,
                     kl_N=torch.cat([p.kl_N for p in parts]), mask_NT=_cat_masks([p.mask_NT for p in parts]),
                     adv_metrics=adv_metrics, advantages_N=torch.cat([p.advantages_N for p in parts]))
