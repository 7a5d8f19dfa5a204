"""A recipe's reward: registered terms with weights, the way TRL's GRPOTrainer takes `reward_funcs` and
`reward_weights`.

    reward = sum over terms of weight x term value      (then an optional batch z-score: rewards.composite.combine)

Every term is built once, when the Reward is made (a model loads then, before the first step). A weight-0 term is
built and logged, not rewarded: how often the policy still refuses, or how toxic a defense leaves it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from purplerl.errors import ExperimentError, UserError
from purplerl.rewards.composite import RAW_KEY, combine
from purplerl.rewards.registry import READS, Needs, ScoringInput, TermFn, TermOutput, get_term, term_params
from purplerl.types import RewardBreakdown

# the ScoringInput field each kind of term reads besides the texts
_FIELD = {"tokens": "completions", "kl": "kl_N"}


class Reward:
    """The weighted sum of registered reward terms (see the module docstring)."""

    def __init__(self, weights: Mapping[str, float], params: Mapping[str, Any] | None = None,
                 zscore: bool = False) -> None:
        if not weights:
            raise UserError("a reward needs at least one term")
        params = dict(params or {})
        for name in params:
            get_term(name)  # an unknown name is a UserError listing the known ones
            if name not in weights:
                raise UserError(f"parameters given for reward term '{name}', which has no weight "
                                "(give it weight 0 to log it without rewarding it)")
        for name, weight in weights.items():
            if not math.isfinite(weight):
                raise UserError(f"reward term '{name}' has a non-finite weight {weight}")
        self.terms: dict[str, float] = dict(weights)
        self.zscore = zscore
        self.needs: dict[str, Needs] = {name: get_term(name).needs for name in weights}
        self._fns: dict[str, TermFn] = {
            name: get_term(name).build(term_params(name, params.get(name))) for name in weights}

    def __call__(self, batch: ScoringInput) -> RewardBreakdown:
        values: dict[str, tuple[float, torch.Tensor]] = {}
        logged: dict[str, torch.Tensor] = {}
        for name, fn in self._fns.items():
            self._check_needs(name, batch)
            out = fn(batch)
            if isinstance(out, TermOutput):
                for key, extra_N in out.logged.items():
                    logged[key] = _checked(f"{name}'s logged component '{key}'", extra_N, len(batch.texts))
                out = out.values_N
            values[name] = (self.terms[name], _checked(f"reward term '{name}'", out, len(batch.texts)))
        rewards = combine(values, zscore=self.zscore)
        clash = sorted(set(logged) & (set(values) | {RAW_KEY}))
        if clash:
            raise ExperimentError(f"a reward term logs component '{clash[0]}', the name of a term or the raw sum")
        rewards.components.update(logged)
        return rewards

    def _check_needs(self, name: str, batch: ScoringInput) -> None:
        need = self.needs[name]
        if need in _FIELD and getattr(batch, _FIELD[need]) is None:
            raise ExperimentError(f"reward term '{name}' reads {READS[need]}, but the batch has no {_FIELD[need]}")


def _checked(what: str, values_N: Any, n: int) -> torch.Tensor:
    """`values_N` as float32 [n]; ExperimentError naming `what` for another shape or a non-finite value."""
    if not isinstance(values_N, torch.Tensor):
        raise ExperimentError(f"{what} returned a {type(values_N).__name__}, not a tensor")
    if tuple(values_N.shape) != (n,):
        raise ExperimentError(f"{what} returned shape {tuple(values_N.shape)} for {n} completions")
    bad_N = ~torch.isfinite(values_N)
    if bad_N.any():
        i = int(bad_N.nonzero()[0])
        raise ExperimentError(f"{what} is non-finite ({values_N[i].item()}) at completion {i}")
    return values_N.detach().float()
