"""The rule-based reward on a data row's ground truth (verifiable-reward RL on prepared data, e.g. GSM8K).

Scored as veRL's `gsm8k` scorer (verl/utils/reward_score/gsm8k.py) scores: only the last 300 characters of the
response are searched (a long response's final answer is at its end, and the regex stays fast), the final answer
is extracted, and

    value = score          if the answer equals the ground truth (as text)
          = format_score   if an answer was found but differs
          = 0              if no answer was found

- strict: the last "#### NUMBER" (a number of digits, '.', ',' and a leading '-'), with ',' and '$' removed:
  the format GSM8K's solutions end with, so the term also rewards the format.
- flexible: the last number anywhere (commas kept, as veRL keeps them), skipping a bare '.'.

The ground truth is the row's `ground_truth` column or veRL's `reward_model.ground_truth` (purplerl.data carries it
on PromptRecord.ground_truth; `purplerl data prepare gsm8k` writes GSM8K's final number there). A batch whose rows
lack one is refused in one line: a rule-based reward without its answer key would score everything 0.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Literal

from pydantic import Field

from purplerl.config.base import Section
from purplerl.errors import UserError
from purplerl.rewards.registry import READS, RewardTerm, ScoringInput, TermFn, register_term

if TYPE_CHECKING:
    import torch

CLIP_CHARS = 300  # veRL's _SOLUTION_CLIP_CHARS
_STRICT = re.compile(r"#### (-?[0-9.,]+)")
_NUMBER = re.compile(r"-?[0-9.,]+")


class GroundTruthParams(Section):
    method: Literal["strict", "flexible"] = Field("strict", description=(
        "strict: the last '#### NUMBER'; flexible: the last number anywhere (veRL's gsm8k methods)"))
    format_score: float = Field(0.0, description="the value of an answer that was found but is wrong")
    score: float = Field(1.0, description="the value of a correct answer")


def extract_answer(response: str, method: str = "strict") -> str | None:
    """The final answer of `response` by veRL's gsm8k rule (see the module docstring), or None.

    Worked examples: strict "so 3 + 4 = 7\\n#### 7" -> "7"; strict "#### 1,234" -> "1234"; strict "the answer is
    7" -> None; flexible "the answer is 7." -> "7." (the regex takes the trailing dot, as veRL's does)."""
    tail = response[-CLIP_CHARS:]
    if method == "strict":
        found = _STRICT.findall(tail)
        return found[-1].replace(",", "").replace("$", "") if found else None
    return next((n for n in reversed(_NUMBER.findall(tail)) if n not in ("", ".")), None)


def ground_truth_value(response: str, ground_truth: str, params: GroundTruthParams) -> float:
    answer = extract_answer(response, params.method)
    if answer is None:
        return 0.0
    return params.score if answer == ground_truth else params.format_score


def ground_truth_fn(params: GroundTruthParams) -> TermFn:
    def score(batch: ScoringInput) -> torch.Tensor:
        import torch  # when scoring, not when the term registry is read (--help)

        truths = batch.ground_truths
        if truths is None:
            raise UserError(f"reward term 'ground_truth' reads {READS['ground_truth']}, and none was given")
        missing = next((i for i, t in enumerate(truths) if t is None), None)
        if missing is not None:
            row = f"of prompt {batch.prompts[missing][:60]!r}" if batch.prompts is not None else f"{missing}"
            raise UserError(f"reward term 'ground_truth' reads {READS['ground_truth']}, and the row {row} has none")
        return torch.tensor([ground_truth_value(text, str(truth), params)
                             for text, truth in zip(batch.texts, truths, strict=True)], dtype=torch.float32)

    return score


register_term(RewardTerm(
    "ground_truth", "1 where the response's final answer equals its row's ground_truth (veRL's gsm8k rule), "
    "format_score where an answer is found but wrong, else 0", "ground_truth", GroundTruthParams, ground_truth_fn))
