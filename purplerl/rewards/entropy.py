"""Response entropy as a reward term: the defense rewards its negative, the adaptive attack a capped bonus."""

from __future__ import annotations

from typing import TYPE_CHECKING

from purplerl.errors import ExperimentError
from purplerl.types import Completion

if TYPE_CHECKING:
    import torch


def mean_entropy(completions: list[Completion]) -> torch.Tensor:
    """Mean per-token entropy of each completion [N], from the sampling pass (no extra forward)."""
    import torch  # when scoring, not when the term registry is read (--help)

    if any(bool(torch.isnan(c.entropies_C).any()) for c in completions):
        # NaN marks entropies the engine cannot report (the Tinker API returns none)
        raise ExperimentError("the entropy reward needs per-token entropies, which this engine does not report "
                              "(use an engine that samples in this process)")
    return torch.stack([c.entropies_C.mean() if len(c.entropies_C) else torch.tensor(0.0) for c in completions])
