"""A recipe's reward: registered terms with weights, the way TRL's GRPOTrainer takes `reward_funcs` and
`reward_weights`.

    reward = sum over terms of weight x term value      (then an optional batch z-score: rewards.composite.combine)

Every term is built once, when the Reward is made (a model loads then, before the first step). A weight-0 term is
built and logged, not rewarded: how often the policy still refuses, or how toxic a defense leaves it.

A term is a registered term by its name (its parameters from `params`), or a named use of one (a `TermSpec`:
fn, weight, bound parameters; purplerl.rewards.named), so sentence_length_5 and sentence_length_10 are two terms of
one reward. A TermSpec with `hack_at` is a reward-hacking detector: `is_rh_N` = OR over the detectors of
(value >= hack_at), None when the reward has none; the loop logs its rate (rh/rate) and a routing recipe reads it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from purplerl.errors import ExperimentError, UserError
from purplerl.rewards.composite import RAW_KEY, combine
from purplerl.rewards.named import TermSpec
from purplerl.rewards.registry import READS, Needs, ScoringInput, TermFn, TermOutput, get_term, term_params
from purplerl.types import RewardBreakdown

if TYPE_CHECKING:  # torch loads when a reward is computed; importing the package (the settings, --help) skips it
    import torch

# the ScoringInput field each kind of term reads besides the texts
_FIELD = {"tokens": "completions", "kl": "kl_N", "ground_truth": "ground_truths"}


class Reward:
    """The weighted sum of registered reward terms (see the module docstring)."""

    def __init__(self, weights: Mapping[str, float | TermSpec], params: Mapping[str, Any] | None = None,
                 zscore: bool = False) -> None:
        if not weights:
            raise UserError("a reward needs at least one term")
        params = dict(params or {})
        for name in params:
            get_term(name)  # an unknown name is a UserError listing the known ones
            if name not in weights:
                raise UserError(f"parameters given for reward term '{name}', which has no weight "
                                "(give it weight 0 to log it without rewarding it)")
            if isinstance(weights[name], TermSpec):
                raise UserError(f"parameters given for reward term '{name}', a named use that holds its own")
        # name -> (registered fn, weight, parameters, hack_at)
        uses = {name: (e.fn, e.weight, e.params, e.hack_at) if isinstance(e, TermSpec)
                else (name, float(e), params.get(name), None) for name, e in weights.items()}
        for name, (_, weight, _, _) in uses.items():
            if not math.isfinite(weight):
                raise UserError(f"reward term '{name}' has a non-finite weight {weight}")
        self.terms: dict[str, float] = {name: use[1] for name, use in uses.items()}
        self.zscore = zscore
        self.needs: dict[str, Needs] = {name: get_term(use[0]).needs for name, use in uses.items()}
        self.detectors: dict[str, float] = {name: use[3] for name, use in uses.items() if use[3] is not None}
        self._fns: dict[str, TermFn] = {name: get_term(fn).build(term_params(fn, values))
                                        for name, (fn, _, values, _) in uses.items()}

    def __call__(self, batch: ScoringInput) -> RewardBreakdown:
        import torch

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
        if not self.detectors:
            return rewards
        is_rh_N = torch.zeros(len(batch.texts), dtype=torch.bool)
        for name, hack_at in self.detectors.items():
            is_rh_N |= values[name][1] >= hack_at
        return replace(rewards, is_rh_N=is_rh_N)

    def _check_needs(self, name: str, batch: ScoringInput) -> None:
        need = self.needs[name]
        if need in _FIELD and getattr(batch, _FIELD[need]) is None:
            raise ExperimentError(f"reward term '{name}' reads {READS[need]}, but the batch has no {_FIELD[need]}")


def _checked(what: str, values_N: Any, n: int) -> torch.Tensor:
    """`values_N` as float32 [n]; ExperimentError naming `what` for another shape or a non-finite value."""
    import torch

    if not isinstance(values_N, torch.Tensor):
        raise ExperimentError(f"{what} returned a {type(values_N).__name__}, not a tensor")
    if tuple(values_N.shape) != (n,):
        raise ExperimentError(f"{what} returned shape {tuple(values_N.shape)} for {n} completions")
    bad_N = ~torch.isfinite(values_N)
    if bad_N.any():
        i = int(bad_N.nonzero()[0])
        raise ExperimentError(f"{what} is non-finite ({values_N[i].item()}) at completion {i}")
    return values_N.detach().float()
