"""Composing reward components into the scalar reward the advantages are computed from.

`combine` is the general form: named terms, each a (weight, values_N) pair, summed and optionally
z-scored over the batch. Each recipe calls it with its own terms (the red team's toxicity, repetition
and KL; the defense's entropy; a judge, keywords).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from purplerl.errors import ExperimentError
from purplerl.types import RewardBreakdown

if TYPE_CHECKING:  # torch loads when a reward is computed; importing the package (the settings, --help) skips it
    import torch

RAW_KEY = "reward_raw"  # components key of the weighted sum before z-scoring


def combine(terms: dict[str, tuple[float, torch.Tensor]], zscore: bool = False,
            eps: float = 1e-6) -> RewardBreakdown:
    """total = sum of weight * values over the terms, then an optional batch z-score.

    `components` holds each term's unweighted values (float32 [N]) under its name, plus `reward_raw`
    (the weighted sum before z-scoring). Raises ExperimentError naming the term when a term is not a
    1-D tensor of the common length N, holds NaN/inf, or has a non-finite weight.
    """
    import torch

    from purplerl.algorithms.advantages import zscore as zscore_batch

    if not terms:
        raise ExperimentError("combine: no reward terms given")
    if RAW_KEY in terms:
        raise ExperimentError(f"combine: '{RAW_KEY}' is reserved for the weighted sum, not a term name")
    length = None
    components: dict[str, torch.Tensor] = {}
    raw_N: torch.Tensor | None = None
    for name, (weight, values_N) in terms.items():
        if not math.isfinite(weight):
            raise ExperimentError(f"reward term '{name}' has a non-finite weight {weight}")
        if values_N.ndim != 1:
            raise ExperimentError(f"reward term '{name}' must have shape [N], got {tuple(values_N.shape)}")
        length = len(values_N) if length is None else length
        if len(values_N) != length:
            raise ExperimentError(f"reward term '{name}' has {len(values_N)} values, expected {length}")
        bad_N = ~torch.isfinite(values_N)
        if bad_N.any():
            i = int(bad_N.nonzero()[0])
            raise ExperimentError(f"reward term '{name}' is non-finite ({values_N[i].item()}) at completion {i}")
        values_N = values_N.detach().float()
        components[name] = values_N
        raw_N = weight * values_N if raw_N is None else raw_N + weight * values_N
    assert raw_N is not None
    if length == 0:
        raise ExperimentError("combine: reward terms are empty (no completions)")
    components[RAW_KEY] = raw_N
    total_N = zscore_batch(raw_N, eps) if zscore else raw_N
    return RewardBreakdown(total_N=total_N, components=components)
