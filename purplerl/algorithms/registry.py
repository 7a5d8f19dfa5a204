"""The loss registry: each loss declares what it consumes, which batch inputs it needs, and its parameters.

An engine runs any registered loss without knowing its name (Tinker's `forward_backward(data, loss_fn)`):
- `consumes="logprobs"`: the engine computes the target tokens' logprobs [N, T] (with gradient) micro-batch by
  micro-batch and the loss returns a per-token loss [N, T]; the engine aggregates it with `Loss.aggregation`.
- `consumes="logits"`: the loss needs the full next-token distribution (the Token Noiser), so the engine hands
  it the micro-batch's logits [N, T, V] (aligned to targets) and a generator seeded with `Loss.seed`.
- `consumes="sequences"`: the loss couples sequences (a preference pair's two answers), so it sees the whole
  batch's logprobs at once and returns the scalar loss. The engine runs it as Tinker runs
  `forward_backward_custom`: logprobs without gradient, the loss and its gradient with respect to them,
  then one backward pass per micro-batch of sum(dloss/dlogprobs * logprobs), which is exact and keeps
  memory at one micro-batch. A user-supplied callable (`CustomLoss`) runs the same way.
- `consumes="values"`: the loss reads the active adapter's scalar head (a reward model, a critic): the values
  [N, T] at every position of the whole batch, and returns the scalar loss; the engine runs it as "sequences",
  with the values in place of the logprobs. Only an engine with scalar heads (local) runs it.

Adding a loss = one function + one `register_loss(...)` line + its hand-worked test.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any, Literal

import torch

from purplerl.algorithms.kl import KL_ESTIMATORS
from purplerl.algorithms.logprobs import masked_mean
from purplerl.algorithms.losses import LOSS_AGGREGATIONS, importance_sampling_loss, kl_penalty_loss, ppo_clip_loss
from purplerl.algorithms.names import POLICY_GRADIENT_LOSS_NAMES, check_names
from purplerl.algorithms.noiser import noise_term_weight, token_noiser_loss
from purplerl.errors import UserError
from purplerl.types import TrainBatch

Consumes = Literal["logprobs", "logits", "sequences", "values"]
Metrics = dict[str, float]
# the inputs a loss may read from a TrainBatch (its fields of the same names)
BATCH_INPUTS = ("sampling_logprobs_NT", "advantages_NT", "ref_logprobs_NT", "pairs_P2", "kto_labels_N",
                "margins_P", "old_values_NT", "returns_NT", "step_labels_NT")


@dataclass(frozen=True)
class LossDef:
    """A registered loss."""

    name: str
    fn: Callable[..., tuple[torch.Tensor, Metrics]]  # see the module docstring for its signature per `consumes`
    consumes: Consumes
    params: type  # frozen dataclass of the loss's own parameters, every one with a default
    inputs: tuple[str, ...] = ()  # batch inputs it always reads (BATCH_INPUTS)
    doc: str = ""
    # The Tinker API's built-in loss_fn that equals this loss for the given parameters, with its loss_fn_config;
    # None (or a None result): a Tinker engine computes it through forward_backward_custom instead.
    tinker: Callable[[Any], tuple[str, dict[str, float]] | None] | None = None

    def required_inputs(self, params: Any) -> tuple[str, ...]:
        """Inputs this configuration reads: the declared ones, plus any its parameters ask for."""
        extra = getattr(params, "extra_inputs", lambda: ())()
        return self.inputs + tuple(extra)


LOSS_REGISTRY: dict[str, LossDef] = {}


def register_loss(definition: LossDef) -> LossDef:
    unknown = [i for i in definition.inputs if i not in BATCH_INPUTS]
    if unknown:
        raise ValueError(f"loss '{definition.name}' reads unknown batch inputs {unknown}")
    LOSS_REGISTRY[definition.name] = definition
    return definition


def get_loss_def(name: str) -> LossDef:
    if name not in LOSS_REGISTRY:
        raise UserError(f"unknown loss '{name}' (known: {', '.join(sorted(LOSS_REGISTRY))})")
    return LOSS_REGISTRY[name]


def loss_params(name: str, **values: Any) -> Any:
    """The parameters of loss `name`: its defaults, overridden by `values` (unknown names refused)."""
    definition = get_loss_def(name)
    known = {f.name for f in fields(definition.params)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise UserError(f"loss '{name}' has no parameter {unknown[0]!r} (it has: {', '.join(sorted(known))})")
    return definition.params(**values)


@dataclass(frozen=True)
class Loss:
    """What `Engine.forward_backward` computes: a registered loss with its parameters, and how the
    per-token loss becomes one number."""

    name: str
    params: Any = None  # an instance of the loss's params dataclass; None: its defaults
    temperature: float = 1.0  # logits are divided by this: the distribution the batch was sampled from
    aggregation: str = "token_mean"  # key in algorithms.losses.LOSS_AGGREGATIONS (per-token losses)
    length_norm: float | None = None  # constant divisor of seq_mean_token_sum_norm (Dr. GRPO): max_new_tokens
    seed: int = 0  # for losses that draw random numbers (the Token Noiser's noise)
    # the aggregated loss is multiplied by this: a part of a batch trained on its own (gradient routing trains the
    # rows of each label in their own passes) weighs its share of the batch, `normalizer_count(part) / (the
    # batch's)`, so the parts' gradients sum to the whole batch's
    scale: float = 1.0

    def __post_init__(self) -> None:
        definition = get_loss_def(self.name)
        if self.params is None:
            object.__setattr__(self, "params", definition.params())
        elif not isinstance(self.params, definition.params):
            raise UserError(f"loss '{self.name}' takes {definition.params.__name__}, got {type(self.params).__name__}")
        if self.aggregation not in LOSS_AGGREGATIONS:
            raise UserError(f"unknown loss aggregation '{self.aggregation}' "
                            f"(known: {', '.join(sorted(LOSS_AGGREGATIONS))})")
        if not (math.isfinite(self.temperature) and self.temperature > 0):
            raise UserError(f"loss temperature must be > 0, got {self.temperature}")
        if not (math.isfinite(self.scale) and self.scale > 0):
            raise UserError(f"loss scale must be a finite number > 0, got {self.scale}")

    @property
    def definition(self) -> LossDef:
        return get_loss_def(self.name)


def normalizer_count(batch: TrainBatch, loss: Loss | None) -> int:
    """The count the loss divides its sum by: loss tokens for token_mean, else sequences (a custom loss (None) and
    the losses of whole sequences are means over the batch's sequences)."""
    whole_batch = loss is not None and loss.definition.consumes in ("sequences", "values")
    if loss is not None and not whole_batch and loss.aggregation == "token_mean":
        return batch.num_loss_tokens
    return batch.num_sequences


@dataclass(frozen=True)
class CustomLoss:
    """A user-supplied loss (Tinker's `forward_backward_custom`): fn(logprobs_NT, inputs) -> (scalar, metrics) or
    just the scalar,
    where logprobs_NT [N, T] carry the gradient (0 off the loss mask) and `inputs` maps each name of
    `BATCH_INPUTS` present in the batch, plus "loss_mask_NT", to its tensor."""

    fn: Callable[[torch.Tensor, Mapping[str, torch.Tensor]], tuple[torch.Tensor, Metrics]]
    temperature: float = 1.0
    name: str = "custom"


# ----- policy gradient ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class PolicyGradientParams:
    clip_low: float = 0.2  # PPO ratio clip below 1 (1 - clip_low); unused by importance_sampling
    clip_high: float = 0.2  # PPO ratio clip above 1 (1 + clip_high); > clip_low is DAPO's clip-higher
    kl_beta: float = 0.0  # weight of a per-token KL(policy || reference) term added to the loss
    kl_estimator: str = "k3"  # estimator of that term (algorithms.kl)
    # behaviour-policy logprobs of the ratio: "sampler" (the batch's sampling_logprobs_NT) or "current" (the
    # policy's own, detached: exact on-policy when the batch gets one update, whatever the sampler's numerics)
    old_logprobs: Literal["sampler", "current"] = "sampler"

    def __post_init__(self) -> None:
        if self.kl_estimator not in KL_ESTIMATORS:
            raise UserError(f"unknown KL estimator '{self.kl_estimator}' (known: {', '.join(KL_ESTIMATORS)})")
        if self.old_logprobs not in ("sampler", "current"):
            raise UserError(f"old_logprobs must be 'sampler' or 'current', got {self.old_logprobs!r}")

    def extra_inputs(self) -> tuple[str, ...]:
        return ("ref_logprobs_NT",) if self.kl_beta > 0 else ()


def _policy_gradient(surrogate: Callable[..., tuple[torch.Tensor, Metrics]]):
    def fn(logprobs_NT: torch.Tensor, inputs: Mapping[str, torch.Tensor],
           params: PolicyGradientParams) -> tuple[torch.Tensor, Metrics]:
        mask_NT = inputs["loss_mask_NT"]
        old_NT = logprobs_NT.detach() if params.old_logprobs == "current" else inputs["sampling_logprobs_NT"]
        loss_NT, metrics = surrogate(logprobs_NT, old_NT, inputs["advantages_NT"], mask_NT,
                                     clip_low=params.clip_low, clip_high=params.clip_high)
        if params.kl_beta > 0:
            kl_NT = kl_penalty_loss(logprobs_NT, inputs["ref_logprobs_NT"], params.kl_estimator)
            loss_NT = loss_NT + params.kl_beta * kl_NT
            metrics = {**metrics, "kl_loss": float(masked_mean(kl_NT.detach(), mask_NT))}
        return loss_NT, metrics

    return fn


def _tinker_policy_gradient(name: str, clipped: bool):
    """Tinker's built-in has neither a KL term nor a detached current policy as the ratio's denominator."""
    def builtin(params: PolicyGradientParams) -> tuple[str, dict[str, float]] | None:
        if params.kl_beta > 0 or params.old_logprobs != "sampler":
            return None
        bounds = {"clip_low_threshold": 1.0 - params.clip_low, "clip_high_threshold": 1.0 + params.clip_high}
        return name, bounds if clipped else {}

    return builtin


register_loss(LossDef(
    "importance_sampling", _policy_gradient(importance_sampling_loss), "logprobs", PolicyGradientParams,
    inputs=("sampling_logprobs_NT", "advantages_NT"),
    doc="-exp(logp - logp_sampling) * A per token (Tinker's importance_sampling; REINFORCE on-policy)",
    tinker=_tinker_policy_gradient("importance_sampling", clipped=False)))
register_loss(LossDef(
    "ppo_clip", _policy_gradient(ppo_clip_loss), "logprobs", PolicyGradientParams,
    inputs=("sampling_logprobs_NT", "advantages_NT"),
    doc="PPO's clipped surrogate with separate low/high bounds (arXiv 1707.06347, 2503.14476)",
    tinker=_tinker_policy_gradient("ppo", clipped=True)))


check_names("policy-gradient losses", [name for name, d in LOSS_REGISTRY.items() if d.params is PolicyGradientParams],
            POLICY_GRADIENT_LOSS_NAMES)


# ----- supervised --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CrossEntropyParams:
    pass


def cross_entropy(logprobs_NT: torch.Tensor, inputs: Mapping[str, torch.Tensor],
                  params: CrossEntropyParams) -> tuple[torch.Tensor, Metrics]:
    """-logp(target) * weight per token (Tinker's cross_entropy): SFT, with the loss mask as the weights."""
    mask_NT = inputs["loss_mask_NT"]
    loss_NT = torch.where(mask_NT != 0, -logprobs_NT * mask_NT, 0.0)
    return loss_NT, {"nll": float(masked_mean(-logprobs_NT.detach(), mask_NT))}


register_loss(LossDef("cross_entropy", cross_entropy, "logprobs", CrossEntropyParams,
                      doc="negative log-likelihood of the target tokens (SFT)",
                      tinker=lambda _params: ("cross_entropy", {})))


@dataclass(frozen=True)
class TokenNoiserParams:
    epsilon: float = 0.1  # Token Buncher's epsilon: the NLL is weighted 1 - epsilon
    # weight of the random-noise cross-entropy: "reference" epsilon^2 (the released code), "paper" epsilon
    noise_weight: str = "reference"

    def __post_init__(self) -> None:
        if not (math.isfinite(self.epsilon) and 0.0 <= self.epsilon <= 1.0):
            raise UserError(f"token_noiser epsilon must be in [0, 1], got {self.epsilon}")
        noise_term_weight(self.epsilon, self.noise_weight)  # refuses an unknown choice with one line


def _token_noiser(logits_NTV: torch.Tensor, inputs: Mapping[str, torch.Tensor], params: TokenNoiserParams, *,
                  targets_NT: torch.Tensor, temperature: float,
                  generator: torch.Generator) -> tuple[torch.Tensor, Metrics]:
    return token_noiser_loss(logits_NTV, targets_NT, inputs["loss_mask_NT"], epsilon=params.epsilon,
                             generator=generator, temperature=temperature, noise_weight=params.noise_weight)


register_loss(LossDef("token_noiser", _token_noiser, "logits", TokenNoiserParams,
                      doc="Token Buncher's Token Noiser: NLL plus cross-entropy to random noise (arXiv 2508.20697)"))

# The losses written beside their math (the pairwise losses, the critic's value loss, the process reward model's step
# loss) register themselves: importing the registry imports them, so that every loss is registered wherever it is
# looked up.
from purplerl.algorithms import critic, pairwise, process_reward  # noqa: E402,F401
