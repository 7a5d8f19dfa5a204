"""The ground_truth term (veRL's gsm8k rule) by hand, and its one-line refusal of rows without a ground truth."""

from __future__ import annotations

import pytest
import torch

from purplerl.errors import UserError
from purplerl.rewards.compose import Reward
from purplerl.rewards.ground_truth import GroundTruthParams, extract_answer, ground_truth_value
from purplerl.rewards.named import TermSpec, catalogue, expand
from purplerl.rewards.registry import ScoringInput


@pytest.mark.parametrize(("response", "method", "answer"), [
    ("3 + 4 = 7\n#### 7", "strict", "7"),
    ("#### 5 then corrected: #### 1,234", "strict", "1234"),  # the last one, thousands separator removed
    ("#### -3", "strict", "-3"),
    ("####7", "strict", None),  # strict needs the space veRL's pattern has
    ("the answer is 7", "strict", None),
    ("the answer is 7", "flexible", "7"),
    ("the answer is 7.", "flexible", "7."),  # the number pattern takes the trailing dot, as veRL's does
    ("1,234 apples", "flexible", "1,234"),  # flexible keeps the commas
    ("no number here.", "flexible", None),  # a bare '.' is no answer
    ("#### 9" + " filler" * 60, "strict", None),  # only the last 300 characters are searched
])
def test_extract_answer_by_hand(response: str, method: str, answer: str | None) -> None:
    assert extract_answer(response, method) == answer


def test_values_score_format_score_and_nothing() -> None:
    params = GroundTruthParams(format_score=0.1, score=2.0)
    assert ground_truth_value("#### 7", "7", params) == 2.0
    assert ground_truth_value("#### 8", "7", params) == 0.1
    assert ground_truth_value("seven", "7", params) == 0.0


def test_the_term_in_a_reward_reads_each_rows_ground_truth() -> None:
    terms = expand("gsm8k", catalogue())
    assert terms["gsm8k"]["params"] == {"method": "strict", "format_score": 0.0, "score": 1.0}
    reward = Reward({"gsm8k": TermSpec.model_validate(terms["gsm8k"])})
    batch = ScoringInput(texts=["#### 72", "#### 72", "72"], prompts=["q1", "q2", "q1"],
                         ground_truths=["72", "10", "72"])
    assert reward(batch).total_N.tolist() == [1.0, 0.0, 0.0]
    flexible = Reward({"ground_truth": TermSpec(fn="ground_truth", params={"method": "flexible"})})
    assert torch.equal(flexible(batch).total_N, torch.tensor([1.0, 0.0, 1.0]))


def test_rows_without_a_ground_truth_are_refused_in_one_line() -> None:
    reward = Reward({"ground_truth": 1.0})
    with pytest.raises(UserError) as err:
        reward(ScoringInput(texts=["#### 1", "#### 2"], prompts=["how many?", "why?"], ground_truths=["1", None]))
    assert str(err.value) == ("reward term 'ground_truth' reads each data row's ground_truth (a ground_truth column, "
                              "or veRL's reward_model.ground_truth), and the row of prompt 'why?' has none")
    with pytest.raises(Exception, match="the batch has no ground_truths"):
        reward(ScoringInput(texts=["#### 1"], prompts=["q"]))
