"""What a reward server serves: the classifier its settings name (`purplerl serve-reward --model`), or any
registered "text" reward term (a judge, the refusal keywords, the repetition ratio) built through the registry.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from purplerl.errors import UserError
from purplerl.rewards.base import Scorer
from purplerl.rewards.registry import READS, get_term, term_params, text_terms
from purplerl.rewards.toxicity import make_classifier

if TYPE_CHECKING:
    from purplerl.config import RewardServerConfig
    from purplerl.config.base import Section


@dataclass(frozen=True)
class Served:
    """A loaded scorer and what the server reports for it in /info and in every answer."""

    scorer: Scorer
    model: str  # the classifier, or the term with its non-default parameters: "repetition(ngram=4)"
    label: str | None  # the output scored, where the scorer has one


def load_scorer(settings: RewardServerConfig) -> Served:
    """The classifier `settings` name (model, label, device, batch_size, max_length)."""
    if settings.model == "embedded" and settings.label is not None:
        raise UserError(f"--label {settings.label} is for HF classifiers: the embedded scorer has one output")
    scorer = make_classifier(settings)
    return Served(scorer, settings.model, _label(scorer))


def make_server_scorer(term_name: str, params: Mapping[str, Any] | Section | None = None) -> Served:
    """Registered text term `term_name` built with `params` (None: its defaults), loaded now, so a bad model fails
    before the port opens. A term that needs more than the response text is refused."""
    term = get_term(term_name)
    if term.scorer is None:
        raise UserError(f"reward term '{term_name}' reads {READS[term.needs]}, which a reward server never "
                        f"receives (text terms: {', '.join(text_terms())})")
    built = term_params(term_name, params)
    scorer = term.scorer(built)
    changed = {} if built is None else built.model_dump(mode="json", exclude_defaults=True)
    shown = ", ".join(f"{key}={value}" for key, value in changed.items())
    return Served(scorer, f"{term_name}({shown})" if shown else term_name, _label(scorer))


def _label(scorer: Scorer) -> str | None:
    label = getattr(scorer, "label_name", None)
    return None if label is None else str(label)
