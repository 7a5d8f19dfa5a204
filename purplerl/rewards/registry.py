"""The one registry of reward terms: training rewards, eval judges, `serve-reward` and the veRL export all build a
term from here, by name.

A term declares what it reads (`needs`), its parameters (a config Section, every field with a default) and how
to build it from them. A "text" term reads only the responses (and their prompts), so it also offers a Scorer:
`serve-reward` can host it, veRL's reward hook can call it and eval can judge with it. A "tokens" term reads the
sampled completions' per-token entropies, and the "kl" term the loop's KL_N; neither exists outside the loop.

Adding a term = its file + one `register_term(...)` call (`text_term(...)` for a Scorer) + its test. The
built-in terms register when `purplerl.rewards` is imported (purplerl.rewards.terms and .judges); building one
loads its model, importing it loads nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, get_args

from pydantic import ValidationError

from purplerl.config.base import Section
from purplerl.errors import ExperimentError, UserError
from purplerl.rewards.base import Scorer, checked_scores
from purplerl.types import Completion

if TYPE_CHECKING:  # the settings read this registry's terms without loading torch
    import torch

# text: the response text (and its prompt) only, usable in veRL, eval and serve-reward; tokens: the sampled
# completions' per-token entropies; kl: the loop's KL_N; ground_truth: the response text and its data row's
# reference answer (veRL's reward_model.ground_truth), usable in training, veRL and re-scoring, not serve-reward
Needs = Literal["text", "tokens", "kl", "ground_truth"]
# what a term of each kind reads, in words (for the errors of those who cannot give it)
READS: dict[str, str] = {"text": "the response text and its prompt",
                         "tokens": "the policy's per-token entropies of the sampled completions",
                         "kl": "the training loop's KL(policy || base)",
                         "ground_truth": "each data row's ground_truth (a ground_truth column, or veRL's "
                                         "reward_model.ground_truth)"}


@dataclass(frozen=True)
class ScoringInput:
    """What the terms of one reward read, for N completions."""

    texts: list[str]  # N responses
    # N prompt texts (the last user message); None where the caller has none (veRL's hook without the question): a
    # term that reads the prompt then refuses, instead of judging an answer against an empty request
    prompts: list[str] | None
    completions: list[Completion] | None = None  # N sampled completions, for "tokens" terms
    kl_N: torch.Tensor | None = None  # float [N], KL(policy || base) of each completion, for the "kl" term
    # N reference answers of the completions' data rows (None where a row has none), for "ground_truth" terms
    ground_truths: list[str | None] | None = None

    def __post_init__(self) -> None:
        n = len(self.texts)
        if self.ground_truths is not None and len(self.ground_truths) != n:
            raise ExperimentError(f"reward input has {len(self.ground_truths)} ground truths for {n} texts")
        if self.prompts is not None and len(self.prompts) != n:
            raise ExperimentError(f"reward input has {len(self.prompts)} prompts for {n} texts")
        if self.completions is not None and len(self.completions) != n:
            raise ExperimentError(f"reward input has {len(self.completions)} completions for {n} texts")
        if self.kl_N is not None and tuple(self.kl_N.shape) != (n,):
            raise ExperimentError(f"reward input kl_N has shape {tuple(self.kl_N.shape)}, expected ({n},)")


@dataclass(frozen=True)
class TermOutput:
    """A term's values plus components it logs without being rewarded by them (e.g. `toxicity_truncated`)."""

    values_N: torch.Tensor  # float [N]
    logged: Mapping[str, torch.Tensor] = field(default_factory=dict)  # component name -> float [N]


TermFn = Callable[[ScoringInput], "torch.Tensor | TermOutput"]


@dataclass(frozen=True)
class RewardTerm:
    """A registered reward term."""

    name: str
    description: str  # one line
    needs: Needs
    params: type[Section] | None  # its parameters, every field with a default; None: it has none
    build: Callable[[Any], TermFn]  # params instance (or None) -> the term's function of a batch
    scorer: Callable[[Any], Scorer] | None = None  # "text" terms: params -> a Scorer (serve-reward, veRL, eval)

    def __post_init__(self) -> None:
        if not self.name.isidentifier():
            raise ValueError(f"reward term name must be an identifier, got {self.name!r}")
        if not self.description.strip() or "\n" in self.description:
            raise ValueError(f"reward term '{self.name}' needs a one-line description")
        if self.needs not in get_args(Needs):
            raise ValueError(f"reward term '{self.name}' needs {self.needs!r}, not one of {get_args(Needs)}")
        if (self.scorer is not None) != (self.needs == "text"):
            raise ValueError(f"reward term '{self.name}': a scorer goes with needs='text', and only there")


REWARD_TERMS: dict[str, RewardTerm] = {}


def register_term(term: RewardTerm) -> RewardTerm:
    if term.name in REWARD_TERMS:
        raise ValueError(f"reward term '{term.name}' is registered twice")
    REWARD_TERMS[term.name] = term
    return term


def text_term(name: str, description: str, params: type[Section] | None,
              scorer: Callable[[Any], Scorer]) -> RewardTerm:
    """A "text" term whose values are its Scorer's scores of the responses (given their prompts)."""
    def build(values: Any) -> TermFn:
        built = scorer(values)
        return lambda batch: checked_scores(built, batch.texts, batch.prompts)

    return RewardTerm(name, description, "text", params, build, scorer)


def text_terms() -> tuple[str, ...]:
    """The terms that read only the response text (and its prompt): what serve-reward and veRL can compute."""
    return tuple(name for name, term in REWARD_TERMS.items() if term.needs == "text")


def get_term(name: str) -> RewardTerm:
    if name not in REWARD_TERMS:
        raise UserError(f"unknown reward term '{name}' (known: {', '.join(sorted(REWARD_TERMS))})")
    return REWARD_TERMS[name]


def term_params(name: str, values: Mapping[str, Any] | Section | None) -> Any:
    """The validated parameters of term `name`: its defaults (None), `values` itself when it is already its
    params class (kept as is: the toxicity term records its server's model in the run's config), or a mapping
    validated against it. UserError naming the term and the field."""
    term = get_term(name)
    if term.params is None:
        if values:
            raise UserError(f"reward term '{name}' takes no parameters, got {_shown(values)}")
        return None
    if values is None:
        return term.params()
    if isinstance(values, term.params):
        return values
    if not isinstance(values, Mapping):
        raise UserError(f"reward term '{name}' takes {term.params.__name__} or a mapping of its fields, "
                        f"got {type(values).__name__}")
    try:
        return term.params.model_validate(dict(values))
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        msg = first["msg"].removeprefix("Value error, ")
        raise UserError(f"reward term '{name}' {f'parameter {where}' if where else 'parameters'}: {msg}") from None


def _shown(values: Any) -> str:
    return ", ".join(map(str, values)) if isinstance(values, Mapping) else repr(values)
