"""Response entropy as a reward term: the defense rewards its negative, the adaptive attack a capped bonus."""

from __future__ import annotations

import torch

from purplerl.types import Completion


def mean_entropy(completions: list[Completion]) -> torch.Tensor:
    """Mean per-token entropy of each completion [N], from the sampling pass (no extra forward)."""
    return torch.stack([c.entropies_C.mean() if len(c.entropies_C) else torch.tensor(0.0) for c in completions])
