"""A recipe's reward: registered terms with weights, the way TRL's GRPOTrainer takes `reward_funcs` and
`reward_weights`.

    reward = sum over terms of weight x term value      (then an optional batch z-score: rewards.composite.combine)

Every term is built once, when the Reward is made (a model loads then, before the first step). A weight-0 term is
built and logged, not rewarded: how often the policy still refuses, or how toxic a defense leaves it.

Each term is a named use of a registered term (a `TermSpec`: fn, weight, its own parameters, hack_at;
purplerl.rewards.named), so sentence_length_5 and sentence_length_10 are two terms of one reward; a bare weight
stands for the registered term of that name at its default parameters, and a mapping {fn, weight, params, hack_at}
for the TermSpec it validates into. This class is the one composition: every recipe, the adversarial judge, eval's
re-scoring and the veRL reward hook build their reward with it. A TermSpec with `hack_at` is a reward-hacking
detector: `is_rh_N` = OR over the detectors of (value >= hack_at), None when the reward has none; the loop logs its
rate (rh/rate) and a routing recipe reads it.

What a term finds when it is built (the toxicity server's model, from its /info) is written back into its
TermSpec's parameters, so the run's config records it and a resume checks it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from purplerl.errors import ExperimentError, UserError
from purplerl.rewards.composite import RAW_KEY, combine
from purplerl.rewards.named import TermSpec, validated_spec
from purplerl.rewards.registry import READS, Needs, ScoringInput, TermFn, TermOutput, get_term, term_params
from purplerl.types import RewardBreakdown

if TYPE_CHECKING:  # torch loads when a reward is computed; importing the package (the settings, --help) skips it
    import torch

# the ScoringInput field each kind of term reads besides the texts
_FIELD = {"tokens": "completions", "kl": "kl_N", "ground_truth": "ground_truths"}


class Reward:
    """The weighted sum of registered reward terms (see the module docstring)."""

    def __init__(self, terms: Mapping[str, float | TermSpec | Mapping[str, Any]], zscore: bool = False) -> None:
        if not terms:
            raise UserError("a reward needs at least one term")
        specs = {name: term_use(name, entry) for name, entry in terms.items()}
        self.terms: dict[str, float] = {name: spec.weight for name, spec in specs.items()}
        self.zscore = zscore
        self.needs: dict[str, Needs] = {name: get_term(spec.fn).needs for name, spec in specs.items()}
        self.detectors: dict[str, float] = {name: spec.hack_at for name, spec in specs.items()
                                            if spec.hack_at is not None}
        self._fns: dict[str, TermFn] = {name: _built(spec) for name, spec in specs.items()}

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


def term_use(name: str, entry: Any) -> TermSpec:
    """Term `name`'s use: a TermSpec as it is, its data {fn, weight, params, hack_at} validated, or a bare weight of
    the registered term `name` at its default parameters (filled in when it is built). UserError in one line naming
    the term, for a non-finite weight too."""
    if isinstance(entry, TermSpec):
        spec = entry
    elif isinstance(entry, Mapping):
        try:
            spec = validated_spec(entry)
        except ValueError as err:
            raise UserError(f"reward term '{name}': {err}") from None
    else:
        get_term(name)  # an unknown name is a UserError listing the known ones
        if isinstance(entry, bool) or not isinstance(entry, int | float):
            raise UserError(f"reward term '{name}' needs a number as its weight, got {entry!r}")
        # constructed, not validated: the `kl` term, which a recipe's reward.terms refuses (its weight is
        # reward.kl_beta), is a term of the composition
        spec = TermSpec.model_construct(fn=name, weight=float(entry), params={}, hack_at=None)
    if not math.isfinite(spec.weight):
        raise UserError(f"reward term '{name}' has a non-finite weight {spec.weight}")
    return spec


def _built(spec: TermSpec) -> TermFn:
    """The term of `spec`, built from its parameters; what building recorded in them is written back."""
    values = term_params(spec.fn, spec.params or None)
    fn = get_term(spec.fn).build(values)
    if values is not None:
        spec.params.update(values.settings())
    return fn


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
