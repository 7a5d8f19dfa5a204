"""The bookkeeping of adversarial dialogues (purplerl.recipes.adversarial.dialogue) by hand-worked numbers: per-turn
returns (summed and discounted), advantages per turn position and of the openings, the n-gram novelty and diversity,
the update schedule, the left cut of a long dialogue (earliest turns first, the attacker's request kept) on the tiny
tokenizer, and the judge's values checked per episode and turn."""

from __future__ import annotations

import pytest
import torch

from purplerl.data.attacker import attacker_messages
from purplerl.errors import ExperimentError
from purplerl.prompting import render_prompt
from purplerl.recipes.adversarial.dialogue import (
    ATTACKER,
    DEFENDER,
    Prompter,
    distinct_ngrams,
    diversity,
    fit_dialogue,
    judge_dialogues,
    ngram_overlap,
    novelty,
    opening_advantages,
    position_advantages,
    turn_returns,
)
from purplerl.recipes.adversarial.step import parse_schedule, trained_side
from purplerl.types import PromptRecord

REWARDS_EK = torch.tensor([[1.0, 0.0, 2.0], [0.0, 1.0, 1.0]])


def test_summed_returns_run_to_the_end_of_the_episode() -> None:
    # e0: 3 = 1 + 0 + 2, 2 = 0 + 2, 2; e1: 2 = 0 + 1 + 1, 2, 1
    assert turn_returns(REWARDS_EK, 1.0).tolist() == [[3.0, 2.0, 2.0], [2.0, 2.0, 1.0]]


def test_discounted_returns() -> None:
    # gamma 0.5, e0: 1 + 0.5 x 0 + 0.25 x 2 = 1.5, 0 + 0.5 x 2 = 1, 2; e1: 0 + 0.5 + 0.25 = 0.75, 1 + 0.5 = 1.5, 1
    assert turn_returns(REWARDS_EK, 0.5).tolist() == [[1.5, 1.0, 2.0], [0.75, 1.5, 1.0]]
    assert turn_returns(REWARDS_EK, 0.0).tolist() == REWARDS_EK.tolist()  # each turn its own reward


def test_advantages_per_turn_position_across_each_group() -> None:
    # two groups of G = 2 episodes, two turn positions
    returns_EK = torch.tensor([[3.0, 2.0], [1.0, 0.0], [2.0, 2.0], [2.0, 4.0]])
    advantages_EK, metrics = position_advantages(returns_EK, 2, "grpo")
    # turn 1: (3, 1) - 2 = (1, -1), (2, 2) - 2 = (0, 0); turn 2: (2, 0) - 1 = (1, -1), (2, 4) - 3 = (-1, 1)
    assert advantages_EK.tolist() == [[1.0, 1.0], [-1.0, -1.0], [0.0, -1.0], [0.0, 1.0]]
    assert metrics["frac_zero_variance_groups"] == pytest.approx(0.25)  # (1/2 + 0/2) / 2 positions
    rloo_EK, _ = position_advantages(returns_EK, 2, "rloo")
    assert rloo_EK.tolist() == [[2.0, 2.0], [-2.0, -2.0], [0.0, -2.0], [0.0, 2.0]]  # G / (G - 1) x GRPO's
    with pytest.raises(ExperimentError, match="do not split into groups of 3"):
        position_advantages(returns_EK, 3, "grpo")


def test_an_opening_is_valued_by_the_mean_return_of_its_episodes() -> None:
    # one goal, A = 2 openings x G = 2 episodes: values (3 + 1) / 2 = 2 and (0 + 2) / 2 = 1, mean 1.5
    advantages, _ = opening_advantages(torch.tensor([3.0, 1.0, 0.0, 2.0]), 2, 2, "grpo")
    assert advantages.tolist() == [0.5, -0.5]


def test_novelty_is_one_minus_the_ngram_overlap_with_the_window_and_the_others() -> None:
    attacks, window = ["Tell me how!", "tell me a story"], ["how are you"]
    # "tell me how" against {how are you, tell me a story}: 1-grams 3/3, 2-grams (tell me) 1/2, 3-grams 0/1
    assert ngram_overlap(attacks[0], [window[0], attacks[1]]) == pytest.approx((1 + 1 / 2 + 0) / 3)
    # "tell me a story" against {how are you, tell me how}: 2/4, 1/3, 0/2 -> 5/18
    assert novelty(attacks, window) == pytest.approx([0.5, 13 / 18])
    # each against the other alone: (2/3 + 1/2 + 0) / 3 = 7/18 and 5/18; diversity 1 - 1/3
    assert diversity(attacks) == pytest.approx(2 / 3)
    assert novelty(["anything at all"], []) == [1.0]  # nothing to repeat
    assert novelty(["", "a b"], []) == [0.0, 1.0]  # an attack without words is not novel
    assert diversity(["same words", "same words"]) == 0.0
    assert distinct_ngrams(["a b a b"], 2) == pytest.approx(2 / 3)


def test_the_schedule_alternates_n_attacker_steps_and_m_defender_steps() -> None:
    assert parse_schedule("2:1") == (2, 1)
    assert [trained_side(step, "2:1") for step in range(1, 7)] == [ATTACKER, ATTACKER, DEFENDER] * 2
    assert {trained_side(step, "attacker") for step in range(1, 5)} == {ATTACKER}
    assert {trained_side(step, "defender") for step in range(1, 5)} == {DEFENDER}
    for bad in ("both", "3", "0:1", "1:0", "a:b", ""):
        with pytest.raises(ValueError, match="unknown schedule"):
            parse_schedule(bad)


def _chars(messages: list[dict[str, str]]) -> int:
    return sum(len(m["content"]) for m in messages)


def test_fit_drops_the_earliest_pairs_and_keeps_what_must_stay() -> None:
    defender = [{"role": "user", "content": "aaaa"}, {"role": "assistant", "content": "bbbb"},
                {"role": "user", "content": "cc"}, {"role": "assistant", "content": "dd"},
                {"role": "user", "content": "e"}]
    assert fit_dialogue(defender, _chars, 13, keep_first=False) == (defender, 0)
    assert fit_dialogue(defender, _chars, 6, keep_first=False) == (defender[2:], 1)
    assert fit_dialogue(defender, _chars, 0, keep_first=False) == (defender[4:], 2)  # the attack answered stays
    attacker = [{"role": "user", "content": "rr"}, {"role": "assistant", "content": "xxxx"},
                {"role": "user", "content": "yyyy"}, {"role": "assistant", "content": "z"},
                {"role": "user", "content": "w"}]
    # the request, which names the goal, stays: the exchanges go first
    assert fit_dialogue(attacker, _chars, 5, keep_first=True) == ([attacker[0], *attacker[3:]], 1)
    assert fit_dialogue(attacker, _chars, 0, keep_first=True) == (attacker[:1], 2)


def test_a_long_dialogue_is_cut_from_the_left_with_one_warning(tiny_tokenizer, capsys) -> None:
    turns = ["first attack " * 3, "first reply " * 3, "second attack", "second reply", "third attack"]
    dialogue = [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(turns)]

    def whole(messages: list[dict[str, str]]) -> list[int]:
        return render_prompt(tiny_tokenizer, PromptRecord(messages=tuple(messages)), "chat", None, 10**6)

    fits = Prompter(tiny_tokenizer, "chat", None, max_prompt_tokens=len(whole(dialogue)))
    assert fits.defender(dialogue) == whole(dialogue) and fits.take_cuts() == {ATTACKER: 0, DEFENDER: 0}
    prompter = Prompter(tiny_tokenizer, "chat", None, max_prompt_tokens=len(whole(dialogue[2:])))
    assert prompter.defender(dialogue) == whole(dialogue[2:])  # the first exchange dropped, nothing more
    assert prompter.defender(dialogue) == whole(dialogue[2:])
    assert prompter.take_cuts() == {ATTACKER: 0, DEFENDER: 2}
    # the attacker's view of the first two exchanges, cut to its request and the second exchange
    shorter = whole(attacker_messages("the goal", dialogue[2:4]))
    prompter.max_prompt_tokens = len(shorter)
    assert prompter.attacker("the goal", dialogue[:4]) == shorter
    text = tiny_tokenizer.decode(shorter)
    assert "the goal" in text and "second reply" in text and "first reply" not in text
    prompter.max_prompt_tokens = len(whole(attacker_messages("the goal", [])))
    assert prompter.attacker("the goal", dialogue[:4]) == whole(attacker_messages("the goal", []))
    assert prompter.take_cuts() == {ATTACKER: 2, DEFENDER: 0}
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning")]
    assert len(warnings) == 1 and "data.max_prompt_tokens" in warnings[0]


class _Fixed:
    name = "fixed"

    def __init__(self, values: list[float]) -> None:
        self.values, self.seen = values, []

    def score_conversations(self, conversations: list[list[dict[str, str]]]) -> list[float]:
        self.seen.extend(conversations)
        return self.values


def test_every_defender_turn_is_judged_in_the_dialogue_before_it() -> None:
    dialogues = [[{"role": "user", "content": f"a{e}{t}"} if i % 2 == 0 else {"role": "assistant",
                  "content": f"r{e}{t}"} for t in (1, 2) for i in (0, 1)] for e in range(2)]
    judge = _Fixed([0.1, 0.2, 0.3, 0.4])  # turn-major: (e0, t1), (e1, t1), (e0, t2), (e1, t2)
    assert torch.allclose(judge_dialogues(judge, dialogues, 2), torch.tensor([[0.1, 0.3], [0.2, 0.4]]))
    assert [len(c) for c in judge.seen] == [2, 2, 4, 4]
    assert judge.seen[3][-1]["content"] == "r12" and judge.seen[1][-1]["content"] == "r11"
    for bad in (float("nan"), 1.5, -0.1, None):
        with pytest.raises(ExperimentError, match=r"judge 'fixed' gave P\(unsafe\) .* for episode 1, turn 2"):
            judge_dialogues(_Fixed([0.1, 0.2, 0.3, bad]), dialogues, 2)
    with pytest.raises(ExperimentError, match="returned 3 scores for 4 dialogues"):
        judge_dialogues(_Fixed([0.1, 0.2, 0.3]), dialogues, 2)
    # with goals, each answer is judged as the reply to its episode's goal alone
    judge = _Fixed([0.1, 0.2, 0.3, 0.4])
    assert torch.allclose(judge_dialogues(judge, dialogues, 2, goals=["g0", "g1"]), torch.tensor([[0.1, 0.3],
                                                                                                [0.2, 0.4]]))
    assert judge.seen == [[{"role": "user", "content": f"g{e}"}, {"role": "assistant", "content": f"r{e}{t}"}]
                          for t in (1, 2) for e in (0, 1)]
