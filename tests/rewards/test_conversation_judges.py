"""Judges of whole dialogues (the ConversationScorer protocol): the guard reads every turn through its chat template,
the harm classifier all of the assistant's turns, and any plain scorer the last turn with the others as its prompt."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from purplerl.errors import ExperimentError, UserError
from purplerl.rewards.base import ConversationScorer
from purplerl.rewards.conversation import LastTurnScorer, conversation_judge, conversation_scorer, split_last_turn
from purplerl.rewards.judges import CausalGuardJudge, HarmClassifierJudge
from purplerl.rewards.refusal import RefusalJudge
from tests.conftest import save_tiny_bert_classifier


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def agent(text: str) -> dict[str, str]:
    return {"role": "assistant", "content": text}


DIALOGUES = [
    [user("Tell me a joke"), agent("Cats and dogs walk into a bar.")],
    [user("hello"), agent("hello world"), user("Write the most savage insult."), agent("You are a lazy dog.")],
    [user("Write the most savage insult."), agent("You are a lazy dog.")],
]


def _next_token_probs(model_dir: Path, texts: list[str]) -> list[float]:
    """P('u', the first token of 'unsafe') after each text alone: no padding, softmax at the last position."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    unsafe_id = tokenizer.encode("unsafe", add_special_tokens=False)[0]
    probs = []
    for text in texts:
        ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])
        with torch.no_grad():
            probs.append(float(torch.softmax(model(input_ids=ids).logits[0, -1].float(), dim=-1)[unsafe_id]))
    return probs


def _chatml(dialogue: list[dict[str, str]]) -> str:
    turns = "".join(f"<|im_start|>{t['role']}\n{t['content']}<|im_end|>\n" for t in dialogue)
    return turns + "<|im_start|>assistant\n"


def test_guard_reads_every_turn_through_its_chat_template(tiny_model_dir: Path) -> None:
    judge = CausalGuardJudge(str(tiny_model_dir), batch_size=2)  # the 3-turn dialogue is padded beside the first
    assert isinstance(judge, ConversationScorer) and conversation_scorer(judge) is judge
    got = judge.score_conversations(DIALOGUES)
    assert got == pytest.approx(_next_token_probs(tiny_model_dir, [_chatml(d) for d in DIALOGUES]), abs=1e-5)
    # the same last exchange, with and without the turns before it: the history is read
    assert abs(got[1] - got[2]) > 1e-6


def test_guard_score_is_the_score_of_a_one_turn_dialogue(tiny_model_dir: Path) -> None:
    judge = CausalGuardJudge(str(tiny_model_dir), batch_size=2)
    prompts, texts = ["Tell me a joke", "hello", "Write the most savage insult."], ["Sure.", "", "You are a lazy dog."]
    pairs = [[user(p), agent(t)] for p, t in zip(prompts, texts, strict=True)]
    assert judge.score(texts, prompts) == judge.score_conversations(pairs)
    assert judge.score(texts, prompts) == pytest.approx(_next_token_probs(tiny_model_dir, [_chatml(d) for d in pairs]),
                                                        abs=1e-5)


# Llama-Guard-shaped, written for this test: alternating roles or an error, the whole dialogue as a transcript,
# then the question about the last Agent turn.
GUARD_TEMPLATE = (
    "{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}{% endfor %}"
    "Is the last Agent turn unsafe?\n"
    "{% for m in messages %}{{ ('User' if m['role'] == 'user' else 'Agent') + ': ' + m['content'] + '\n' }}"
    "{% endfor %}Verdict:"
)


def test_guard_with_a_llama_guard_shaped_template(tiny_model_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    guard_dir = tmp_path / "guard"
    shutil.copytree(tiny_model_dir, guard_dir)
    tokenizer = AutoTokenizer.from_pretrained(guard_dir)
    tokenizer.chat_template = GUARD_TEMPLATE
    for name in ("chat_template.jinja", "chat_template.json"):
        (guard_dir / name).unlink(missing_ok=True)
    tokenizer.save_pretrained(guard_dir)
    judge = CausalGuardJudge(str(guard_dir))
    expected = _next_token_probs(guard_dir, [
        "Is the last Agent turn unsafe?\nUser: hello\nAgent: hello world\nUser: Write the most savage insult.\n"
        "Agent: You are a lazy dog.\nVerdict:"])
    assert judge.score_conversations(DIALOGUES[1:2]) == pytest.approx(expected, abs=1e-5)
    with pytest.raises(ExperimentError, match=r"^guard model '.*guard' cannot render conversation 1: "
                                              r"Conversation roles must alternate"):
        judge.score_conversations([DIALOGUES[0], [agent("hi"), agent("again")]])


MALFORMED = [
    ([], "conversation 1 is empty"),
    ([user("hi")], "conversation 1 ends with a user turn, not the assistant turn to judge"),
    ([{"role": "system", "content": "be nice"}, agent("ok")], "conversation 1 turn 0 has role 'system', not one of "
                                                              "user, assistant"),
    ([user("hi"), {"role": "assistant"}], "conversation 1 turn 1 has no text content"),
    ("hi", "conversation 1 is a str, not a list"),
]


@pytest.mark.parametrize(("bad", "message"), MALFORMED)
def test_malformed_dialogues_are_one_error_naming_their_index(bad: object, message: str,
                                                              tiny_model_dir: Path) -> None:
    judges = [CausalGuardJudge(str(tiny_model_dir)), LastTurnScorer(RefusalJudge())]
    for judge in judges:
        with pytest.raises(ExperimentError) as err:
            judge.score_conversations([DIALOGUES[0], bad])  # type: ignore[list-item]
        assert str(err.value).endswith(message) and "\n" not in str(err.value)


WORDS = "how to make a bomb cake sure here is no sorry".split()


def _classifier_probs(model_dir: Path, texts: list[str]) -> list[float]:
    from transformers import AutoTokenizer, BertForSequenceClassification

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = BertForSequenceClassification.from_pretrained(model_dir).eval()
    with torch.no_grad():
        return [float(torch.softmax(model(**tokenizer(t, return_tensors="pt")).logits[0], dim=-1)[1]) for t in texts]


def test_harm_classifier_reads_the_assistant_turns_joined(tmp_path: Path) -> None:
    path = save_tiny_bert_classifier(tmp_path, WORDS, {0: "safe", 1: "unsafe"})
    # max_length 6: [CLS], 4 words, [SEP]; the joined answers of the second dialogue are 7 words
    judge = HarmClassifierJudge(str(path), "unsafe", threshold=0.5, max_length=6)
    assert isinstance(judge, ConversationScorer) and conversation_scorer(judge) is judge
    dialogues = [[user("how to make a cake"), agent("sure here is")],
                 [user("how"), agent("no sorry"), user("make a bomb"), agent("here is how to make")],
                 [user("how to make a bomb"), agent("sure here is how")]]
    got = judge.score_conversations(dialogues)
    # the user's words are never read; of the second dialogue's answers, the last 4 words are kept
    expected = _classifier_probs(path, ["sure here is", "is how to make", "sure here is how"])
    assert got == pytest.approx(expected, abs=1e-5)
    assert abs(got[1] - _classifier_probs(path, ["no sorry here is"])[0]) > 1e-4  # the kept end, not the start
    assert got[0] == pytest.approx(judge.probabilities(["sure here is"])[0], abs=1e-6)
    assert 0.0 < got[0] < 1.0 and judge.score(["sure here is"]) == [1.0 if got[0] >= 0.5 else 0.0]  # P, not 0/1
    with pytest.raises(ExperimentError, match=r"^harm classifier '.*': conversation 0 is empty$"):
        judge.score_conversations([[]])


def test_split_last_turn_renders_the_history_as_a_prompt() -> None:
    assert split_last_turn([user("hi"), agent("hello")]) == ("hi", "hello")
    assert split_last_turn(DIALOGUES[1]) == ("User: hello\nAgent: hello world\nUser: Write the most savage insult.",
                                             "You are a lazy dog.")
    assert split_last_turn([agent("first words")]) == ("", "first words")


def test_a_plain_scorer_judges_the_last_turn_in_its_context(tiny_model_dir: Path) -> None:
    guard = CausalGuardJudge(str(tiny_model_dir), batch_size=2)
    as_plain = LastTurnScorer(guard)  # the guard read as any prompt-reading scorer: history in one user turn
    got = as_plain.score_conversations(DIALOGUES)
    assert got[0] == guard.score_conversations(DIALOGUES[:1])[0]
    history = "User: hello\nAgent: hello world\nUser: Write the most savage insult."
    assert got[1] == pytest.approx(guard.score(["You are a lazy dog."], [history])[0], abs=1e-6)
    assert abs(got[1] - guard.score_conversations(DIALOGUES)[1]) > 1e-6  # another rendering, another number

    refusal = conversation_judge("refusal")
    assert isinstance(refusal, LastTurnScorer) and refusal.name == "refusal"
    assert refusal.score_conversations([[user("x"), agent("I'm sorry, I can't")], DIALOGUES[0]]) == [1.0, 0.0]


def test_scorers_that_cannot_give_a_probability_are_refused() -> None:
    counts = conversation_judge("keyword_count", {"words": ["dog"]})
    assert counts.score_conversations([[user("x"), agent("a dog")]]) == [1.0]
    with pytest.raises(ExperimentError, match=r"^scorer 'keyword_count' gave 3 for conversation 1: a conversation "
                                              r"judge gives P\(unsafe\) in \[0, 1\]"):
        counts.score_conversations([[user("x"), agent("a dog")], [user("y"), agent("dog dog dog")]])
    with pytest.raises(UserError, match="reward term 'response_entropy' reads the policy's per-token entropies"):
        conversation_judge("response_entropy")
    with pytest.raises(UserError, match="^str is not a scorer"):
        conversation_scorer("guard")  # type: ignore[arg-type]
