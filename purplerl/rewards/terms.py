"""The built-in reward terms (the model judges register in purplerl.rewards.judges).

- toxicity: P(toxic) from the embedded alt-profanity-check, an HF classifier, or the reward server; its
  parameters are `purplerl.config.ToxicityConfig`.
- repetition: the repeated-n-gram ratio (the red team's penalty on keyword spam).
- refusal: the keyword refusal judge (1.0 = refused); the attack on an aligned model rewards its negative.
- kl: the loop's KL(policy || base) of each completion.
- response_entropy: mean token entropy of the response (Token Buncher's defense rewards its negative).
- entropy_bonus: min(mean token entropy, cap) (Token Buncher's adaptive attack).
"""

from __future__ import annotations

from pydantic import Field

from purplerl.config import ToxicityConfig
from purplerl.config.base import Section
from purplerl.rewards.base import Scorer, checked_scores
from purplerl.rewards.entropy import mean_entropy
from purplerl.rewards.refusal import RefusalJudge
from purplerl.rewards.registry import RewardTerm, ScoringInput, TermFn, TermOutput, register_term, text_term
from purplerl.rewards.repetition import RepetitionScorer
from purplerl.rewards.toxicity import make_toxicity_scorer

TRUNCATED = "toxicity_truncated"  # logged component: 1 where the reward server cut the text before scoring it


def toxicity_fn(cfg: ToxicityConfig) -> TermFn:
    """The toxicity term. Over HTTP, the server's model and label are written into `cfg` at once (before the run
    saves its config.yaml, so the run says which model gave its rewards; a resumed run refuses another model),
    and the texts the server cut are logged as `toxicity_truncated`."""
    scorer = make_toxicity_scorer(cfg)
    if cfg.url is None:
        return lambda batch: checked_scores(scorer, batch.texts, batch.prompts)
    from purplerl.rewards.client import HTTPScorer, record_server  # httpx only for runs that score over HTTP

    assert isinstance(scorer, HTTPScorer)  # what make_toxicity_scorer gives for a url
    record_server(cfg, scorer.info())

    def score(batch: ScoringInput) -> TermOutput:
        import torch  # when scoring, not when the term registry is read (--help)

        values_N = checked_scores(scorer, batch.texts, batch.prompts)
        cut_N = torch.zeros(len(batch.texts))
        cut_N[scorer.last_truncated] = 1.0
        return TermOutput(values_N, {TRUNCATED: cut_N})

    return score


def toxicity_scorer(cfg: ToxicityConfig) -> Scorer:
    return make_toxicity_scorer(cfg)


class RepetitionParams(Section):
    ngram: int = Field(3, ge=1, le=16, description="n of the word n-grams counted by the repetition ratio")


class EntropyBonusParams(Section):
    cap: float = Field(3.0, ge=0.0, description="the bonus is min(mean token entropy, cap) (Token Buncher uses 3.0)")


register_term(RewardTerm(
    "toxicity", "P(toxic) of the response: embedded alt-profanity-check, an HF classifier, or the reward server",
    "text", ToxicityConfig, toxicity_fn, toxicity_scorer))
register_term(text_term(
    "repetition", "share of the response's word n-grams that repeat an earlier one (degeneracy)",
    RepetitionParams, lambda p: RepetitionScorer(p.ngram)))
register_term(text_term(
    "refusal", "1.0 when the response holds a refusal phrase (keyword judge), else 0.0",
    None, lambda _: RefusalJudge()))
register_term(RewardTerm(
    "kl", "KL(policy || base) of each completion, as the loop estimates it (KL_N)",
    "kl", None, lambda _: lambda batch: batch.kl_N))
register_term(RewardTerm(
    "response_entropy", "mean per-token entropy of the response (the defense rewards its negative)",
    "tokens", None, lambda _: lambda batch: mean_entropy(batch.completions)))
register_term(RewardTerm(
    "entropy_bonus", "min(mean per-token entropy, cap): the adaptive attack's entropy bonus",
    "tokens", EntropyBonusParams, lambda p: lambda batch: mean_entropy(batch.completions).clamp(max=p.cap)))
