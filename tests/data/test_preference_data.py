"""Preference data: every public shape from JSONL, parquet and hf: sources written in the test, one line per bad
row naming FILE:LINE (or the row index), the tokens and loss mask of a pair batch checked by hand, and the
held-out split by prompt."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from purplerl.config import RowSourceConfig
from purplerl.data.preference import (
    encode_pairs,
    end_of_turn_id,
    held_out_by_prompt,
    load_labelled,
    load_pairs,
    pair_batch,
    prompt_key,
    shuffled,
    unpaired,
)
from purplerl.errors import UserError
from purplerl.types import LabelledCompletion, PreferencePair


def user(text: str) -> tuple[dict[str, str], ...]:
    return ({"role": "user", "content": text},)


def msg(role: str, content: str) -> dict[str, str]:
    return {"role": role, "content": content}


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    # a blank first line: locations are file lines, not row numbers
    path.write_text("\n" + "".join(json.dumps(row) + "\n" for row in rows))
    return path


def write_parquet(path: Path, rows: list[dict]) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def located(path: Path, index: int) -> str:
    """Where row `index` is reported: the JSONL line (after the blank first line), or the parquet row."""
    return f"{path}:{index + 2}" if path.suffix == ".jsonl" else f"{path} row {index}"


HH_ONE = "\n\nHuman: How do I pick a lock?\n\nAssistant: "
HH_MULTI = ("\n\nHuman: hi there\n\nAssistant: Hello! How can I help?\n\nHuman: Write an insult about my coworker"
            "\n\nAssistant: ")
UF_PROMPT = "Explain photosynthesis briefly."

# shape -> (rows, [(prompt, chosen, rejected, score_chosen, score_rejected) per row])
PAIR_SHAPES = {
    "text": ([{"prompt": "Tell me a joke", "chosen": "Cats and dogs.", "rejected": "No."}],
             [(user("Tell me a joke"), "Cats and dogs.", "No.", None, None)]),
    "chat_prompt": ([{"prompt": [msg("system", "Be kind."), msg("user", "Roast my friend")],
                      "chosen": "He tries hard!", "rejected": "He is a fool."}],
                    [((msg("system", "Be kind."), msg("user", "Roast my friend")), "He tries hard!",
                      "He is a fool.", None, None)]),
    "chat_answers": ([{"prompt": [msg("user", "hello")], "chosen": [msg("assistant", "Hi!")],
                       "rejected": [msg("assistant", "Go away.")]}],
                     [(user("hello"), "Hi!", "Go away.", None, None)]),
    "hh_single_turn": ([{"chosen": HH_ONE + "I can't help with breaking into property.",
                         "rejected": HH_ONE + "Use a tension wrench and a pick."}],
                       [(user("How do I pick a lock?"), "I can't help with breaking into property.",
                         "Use a tension wrench and a pick.", None, None)]),
    "hh_multi_turn": ([{"chosen": HH_MULTI + "I'd rather not insult anyone.", "rejected": HH_MULTI + "He is dumb."}],
                      [((msg("user", "hi there"), msg("assistant", "Hello! How can I help?"),
                         msg("user", "Write an insult about my coworker")), "I'd rather not insult anyone.",
                        "He is dumb.", None, None)]),
    "hh_prompt_text": ([{"prompt": HH_ONE.rstrip(), "chosen": " No.", "rejected": " Sure, here is how."}],
                       [(user("How do I pick a lock?"), "No.", "Sure, here is how.", None, None)]),
    "ultrafeedback": ([{"prompt": UF_PROMPT, "prompt_id": "abc",
                        "chosen": [msg("user", UF_PROMPT), msg("assistant", "Plants turn light into sugar.")],
                        "rejected": [msg("user", UF_PROMPT), msg("assistant", "It is a kind of photo.")],
                        "messages": [msg("user", UF_PROMPT), msg("assistant", "Plants turn light into sugar.")],
                        "score_chosen": 9.0, "score_rejected": 2.5},
                       {"prompt": "2+2?", "prompt_id": "def",
                        "chosen": [msg("user", "2+2?"), msg("assistant", "4")],
                        "rejected": [msg("user", "2+2?"), msg("assistant", "5")],
                        "messages": [msg("user", "2+2?"), msg("assistant", "4")],
                        "score_chosen": 10, "score_rejected": 1}],
                      [(user(UF_PROMPT), "Plants turn light into sugar.", "It is a kind of photo.", 9.0, 2.5),
                       (user("2+2?"), "4", "5", 10.0, 1.0)]),
}


@pytest.mark.parametrize("writer", [write_jsonl, write_parquet], ids=["jsonl", "parquet"])
@pytest.mark.parametrize("shape", list(PAIR_SHAPES))
def test_every_pair_shape_loads_from_jsonl_and_parquet(tmp_path, shape, writer) -> None:
    rows, expected = PAIR_SHAPES[shape]
    path = writer(tmp_path / f"{shape}.{'jsonl' if writer is write_jsonl else 'parquet'}", rows)
    loaded = load_pairs(RowSourceConfig(source=str(path)))
    assert loaded.items == tuple(PreferencePair(prompt, chosen, rejected, located(path, i), score_c, score_r)
                                 for i, (prompt, chosen, rejected, score_c, score_r) in enumerate(expected))
    assert loaded.where == str(path) and loaded.skipped == ()


KTO_SHAPES = {
    "text": [{"prompt": "Tell me a joke", "completion": "Cats and dogs.", "label": True},
             {"prompt": "Insult me", "completion": "You fool.", "label": False}],
    "messages": [{"prompt": [msg("user", "Tell me a joke")], "completion": [msg("assistant", "Cats and dogs.")],
                  "label": True},
                 {"prompt": [msg("user", "Insult me")], "completion": [msg("assistant", "You fool.")],
                  "label": False}],
}


@pytest.mark.parametrize("writer", [write_jsonl, write_parquet], ids=["jsonl", "parquet"])
@pytest.mark.parametrize("shape", list(KTO_SHAPES))
def test_unpaired_kto_rows_load_from_jsonl_and_parquet(tmp_path, shape, writer) -> None:
    path = writer(tmp_path / ("kto.jsonl" if writer is write_jsonl else "kto.parquet"), KTO_SHAPES[shape])
    assert load_labelled(RowSourceConfig(source=str(path))).items == (
        LabelledCompletion(user("Tell me a joke"), "Cats and dogs.", True, located(path, 0)),
        LabelledCompletion(user("Insult me"), "You fool.", False, located(path, 1)))


def test_hf_saved_dataset_with_hub_split_names(tmp_path) -> None:
    """A local copy of binarized UltraFeedback, saved as load_dataset returns it (splits train_prefs/test_prefs)."""
    import datasets

    rows, expected = PAIR_SHAPES["ultrafeedback"]
    path = tmp_path / "ultrafeedback_binarized"
    datasets.DatasetDict({"train_prefs": datasets.Dataset.from_list(rows),
                          "test_prefs": datasets.Dataset.from_list(rows[1:])}).save_to_disk(str(path))
    test = load_pairs(RowSourceConfig(source=f"hf:{path}", split="test_prefs"))
    assert test.items == (PreferencePair(user("2+2?"), "4", "5", f"{path} row 0", 10.0, 1.0),)
    train = load_pairs(RowSourceConfig(source=f"hf:{path}"), split="train_prefs")
    assert [(p.prompt, p.chosen, p.score_chosen) for p in train.items] == [(e[0], e[1], e[3]) for e in expected]
    with pytest.raises(UserError, match="has no split 'train'"):
        load_pairs(RowSourceConfig(source=f"hf:{path}"))


def test_hf_hub_id_calls_load_dataset(monkeypatch) -> None:
    """hf:Anthropic/hh-rlhf goes through datasets.load_dataset (stubbed here: no network in tests)."""
    import datasets

    calls = []
    rows = PAIR_SHAPES["hh_single_turn"][0] + PAIR_SHAPES["hh_multi_turn"][0]

    def fake_load_dataset(name, config, split):
        calls.append((name, config, split))
        return datasets.Dataset.from_list(rows)

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    loaded = load_pairs(RowSourceConfig(source="hf:Anthropic/hh-rlhf", split="test", hf_config="harmless-base"))
    assert calls == [("Anthropic/hh-rlhf", "harmless-base", "test")]
    assert [p.source_row for p in loaded.items] == ["hf:Anthropic/hh-rlhf row 0", "hf:Anthropic/hh-rlhf row 1"]
    assert [len(p.prompt) for p in loaded.items] == [1, 3]


def test_limit_and_filters_apply(tmp_path) -> None:
    rows = [{"prompt": f"q{i}", "chosen": "yes", "rejected": "no", "topic": i % 2} for i in range(6)]
    path = write_jsonl(tmp_path / "p.jsonl", rows)
    loaded = load_pairs(RowSourceConfig(source=str(path), filters={"topic": 1}, limit=2))
    assert [(p.prompt, p.source_row) for p in loaded.items] == [(user("q1"), f"{path}:3"), (user("q3"), f"{path}:5")]


# ------------------------------------------------------------------------------------------------- bad rows

GOOD = {"prompt": "q", "chosen": "a", "rejected": "b"}
BAD_PAIRS = {
    "missing field": ({"prompt": "q", "chosen": "a"}, "no 'rejected' field \\(fields: chosen, prompt\\)"),
    "null field": ({"prompt": "q", "chosen": None, "rejected": "b"}, "'chosen' is null"),
    "no prompt": ({"chosen": "a", "rejected": "b"}, "no 'prompt' field, and 'chosen' is not an HH-RLHF dialogue"),
    "empty answer": ({"prompt": "q", "chosen": "  ", "rejected": "b"}, "'chosen' is empty"),
    "empty prompt": ({"prompt": " ", "chosen": "a", "rejected": "b"}, "'prompt' is empty"),
    "empty HH answer": ({"chosen": HH_ONE, "rejected": HH_ONE + "b"}, "'chosen' is empty"),
    "same answers": ({"prompt": "q", "chosen": "same ", "rejected": " same"},
                     "'chosen' and 'rejected' are the same answer"),
    "HH prompts differ": ({"chosen": HH_ONE + "a", "rejected": HH_MULTI + "b"},
                          "the 'chosen' and 'rejected' dialogues differ before their last 'Assistant:' turn "
                          "\\(turn 1: 'How do I pick a lock\\?' vs 'hi there'\\), so they answer different prompts"),
    "HH ends with Human": ({"chosen": HH_ONE + "a\n\nHuman: thanks", "rejected": HH_ONE + "b"},
                           "'chosen' ends with a 'Human:' turn"),
    "HH starts with Assistant": ({"chosen": "\n\nAssistant: hi" + HH_ONE + "a", "rejected": HH_ONE + "b"},
                                 "'chosen' must start with a 'Human:' turn"),
    "message prompts differ": ({"chosen": [msg("user", "x"), msg("assistant", "a")],
                                "rejected": [msg("user", "y"), msg("assistant", "b")]},
                               "the 'chosen' and 'rejected' messages differ before their last \\(assistant\\) "
                               "message \\(turn 1: 'x' vs 'y'\\)"),
    "list not ending with answer": ({"prompt": "q", "chosen": [msg("assistant", "a"), msg("user", "b")],
                                     "rejected": [msg("assistant", "c")]},
                                    "the last message of 'chosen' must be the assistant's answer"),
    "bad role": ({"prompt": [msg("bot", "q")], "chosen": "a", "rejected": "b"},
                 "'prompt': message 0 must be \\{role: system\\|user\\|assistant"),
    "prompt not ending with user": ({"prompt": [msg("user", "q"), msg("assistant", "r")], "chosen": "a",
                                     "rejected": "b"}, "the prompt must end with the user's turn"),
    "wrong type": ({"prompt": "q", "chosen": 3, "rejected": "b"}, "'chosen' must be a text or a list of chat messages, "
                   "got int"),
    "text and messages": ({"prompt": "q", "chosen": "a", "rejected": [msg("assistant", "b")]},
                          "'chosen' and 'rejected' must both be texts or both chat messages"),
    "score not a number": ({**GOOD, "score_chosen": "high"}, "'score_chosen' must be a finite number, got str"),
    "score a bool": ({**GOOD, "score_rejected": True}, "'score_rejected' must be a finite number, got bool"),
}
BAD_LABELLED = {
    "label not a bool": ({"prompt": "q", "completion": "a", "label": 1}, "'label' must be true \\(desirable\\) or "
                         "false, got int '1'"),
    "label a string": ({"prompt": "q", "completion": "a", "label": "true"}, "'label' must be true"),
    "missing label": ({"prompt": "q", "completion": "a"}, "no 'label' field"),
    "empty completion": ({"prompt": "q", "completion": "", "label": True}, "'completion' is empty"),
    "completion wrong type": ({"prompt": "q", "completion": {"text": "a"}, "label": True},
                              "'completion' must be a text or a list of chat messages, got dict"),
}


def one_line_error(load, path: Path) -> str:
    with pytest.raises(UserError) as info:
        load(RowSourceConfig(source=str(path)))
    text = str(info.value)
    assert "\n" not in text, text
    return text


@pytest.mark.parametrize("kind", list(BAD_PAIRS))
def test_each_bad_pair_row_is_one_line_naming_file_and_line(tmp_path, kind) -> None:
    bad, message = BAD_PAIRS[kind]
    path = write_jsonl(tmp_path / "pairs.jsonl", [GOOD, {**GOOD, "chosen": "c"}, bad])
    assert re.fullmatch(f"{re.escape(str(path))}:4: {message}.*", one_line_error(load_pairs, path))


@pytest.mark.parametrize("kind", list(BAD_LABELLED))
def test_each_bad_labelled_row_is_one_line_naming_file_and_line(tmp_path, kind) -> None:
    bad, message = BAD_LABELLED[kind]
    path = write_jsonl(tmp_path / "kto.jsonl", [{"prompt": "q", "completion": "a", "label": False}, bad])
    assert re.fullmatch(f"{re.escape(str(path))}:3: {message}.*", one_line_error(load_labelled, path))


def test_a_bad_parquet_row_is_named_by_its_index(tmp_path) -> None:
    rows = [GOOD, {"prompt": "q", "chosen": "a", "rejected": "a"}]
    path = write_parquet(tmp_path / "pairs.parquet", rows)
    assert one_line_error(load_pairs, path) == (f"{path} row 1: 'chosen' and 'rejected' are the same answer, so "
                                                "neither is preferred")


def test_skip_bad_rows_keeps_the_good_ones_and_says_what_it_left_out(tmp_path) -> None:
    path = write_jsonl(tmp_path / "pairs.jsonl", [GOOD, {"prompt": "q", "chosen": "a", "rejected": "a"},
                                                  {**GOOD, "prompt": "r"}])
    loaded = load_pairs(RowSourceConfig(source=str(path)), skip_bad_rows=True)
    assert [p.source_row for p in loaded.items] == [f"{path}:2", f"{path}:4"]
    assert loaded.skipped == (f"{path}:3: 'chosen' and 'rejected' are the same answer, so neither is preferred",)
    only_bad = write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "q", "chosen": "a"}])
    with pytest.raises(UserError, match="no usable rows in .*bad.jsonl: all 1 are bad, the first: .*bad.jsonl:2: no "
                                        "'rejected' field"):
        load_pairs(RowSourceConfig(source=str(only_bad)), skip_bad_rows=True)


# ------------------------------------------------------------------------------------------------- tokens


def pair(prompt: str, chosen: str, rejected: str, row: str = "f:1") -> PreferencePair:
    return PreferencePair(user(prompt), chosen, rejected, row)


def test_pair_batch_by_hand(tiny_tokenizer) -> None:
    tok = tiny_tokenizer
    pairs = [pair("hello", "thanks", "no"), pair("Tell me a joke", "cats and dogs", "sorry", "f:2")]
    encoded, metrics = encode_pairs(tok, pairs, "chat", None, max_prompt_tokens=64, max_answer_tokens=16)
    batch = pair_batch(encoded, pad_id=tok.pad_token_id)
    assert metrics == {"data/pairs": 2.0, "data/prompts_truncated": 0.0, "data/chosen_truncated": 0.0,
                       "data/rejected_truncated": 0.0}
    assert batch.pairs_P2.tolist() == [[0, 1], [2, 3]]  # (chosen row, rejected row) of each pair
    rows = [("hello", "thanks"), ("hello", "no"), ("Tell me a joke", "cats and dogs"), ("Tell me a joke", "sorry")]
    width = batch.input_ids_NT.shape[1]
    for n, (prompt, answer) in enumerate(rows):
        prompt_ids = tok.encode(f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n")
        answer_ids = [*tok.encode(answer), tok.convert_tokens_to_ids("<|im_end|>")]
        P, C = len(prompt_ids), len(answer_ids)
        pad = width - P - C
        assert batch.input_ids_NT[n].tolist() == prompt_ids + answer_ids + [tok.pad_token_id] * pad
        assert batch.attention_mask_NT[n].tolist() == [1] * (P + C) + [0] * pad
        # the loss sees the answer and its end-of-turn token, nothing of the prompt or the padding
        assert batch.loss_mask_NT[n].tolist() == [0.0] * P + [1.0] * C + [0.0] * pad
        ids = batch.input_ids_NT[n][batch.loss_mask_NT[n] == 1].tolist()
        assert tok.decode(ids) == answer + "<|im_end|>"
    assert batch.num_loss_tokens == sum(len(tok.encode(a)) + 1 for _, a in rows)
    # both answers of a pair share the prompt's tokens exactly
    assert encoded[0].chosen.ids[:7] == encoded[0].rejected.ids[:7]


def test_truncation_is_cut_where_it_should_and_counted(tiny_tokenizer) -> None:
    tok = tiny_tokenizer
    long_prompt = "The quick brown fox jumps over the lazy dog " * 4
    pairs = [pair(long_prompt, "cats and dogs again and again", "ok"), pair("hello", "thanks", "no")]
    full, _ = encode_pairs(tok, pairs, "chat", None, 512, 512)
    encoded, metrics = encode_pairs(tok, pairs, "chat", None, max_prompt_tokens=14, max_answer_tokens=4)
    assert metrics == {"data/pairs": 2.0, "data/prompts_truncated": 1.0, "data/chosen_truncated": 1.0,
                       "data/rejected_truncated": 0.0}
    chosen = encoded[0].chosen
    prompt_len = len(chosen.ids) - 4
    assert prompt_len == 14 and chosen.mask == (0.0,) * 14 + (1.0,) * 4
    # the prompt keeps its end (the request's last words and the assistant header), the answer its start
    full_chosen = full[0].chosen
    full_prompt_len = full_chosen.mask.index(1.0)
    assert chosen.ids[:14] == full_chosen.ids[full_prompt_len - 14:full_prompt_len]
    assert chosen.ids[14:] == full_chosen.ids[full_prompt_len:full_prompt_len + 4]
    assert tok.decode(list(chosen.ids[:14])).endswith("<|im_start|>assistant\n")
    assert encoded[0].rejected.ids[14:] == (*tok.encode("ok"), tok.eos_token_id)  # fits: not cut
    assert encoded[1] == full[1]  # 14 prompt tokens, 2 + 1 answer tokens: nothing cut


def test_base_template_and_a_system_prompt(tiny_tokenizer) -> None:
    tok = tiny_tokenizer
    (base,), _ = encode_pairs(tok, [pair("hello", "thanks", "no")], "base", None, 64, 16)
    assert tok.decode(list(base.chosen.ids)) == "hello\nthanks<|im_end|>"
    (chat,), _ = encode_pairs(tok, [pair("hello", "thanks", "no")], "chat", "Be kind.", 64, 16)
    assert tok.decode(list(chat.rejected.ids)).startswith("<|im_start|>system\nBe kind.<|im_end|>\n<|im_start|>user")


def test_end_of_turn_token_comes_from_the_chat_template(tiny_tokenizer) -> None:
    """Gemma ends an assistant turn with <end_of_turn>, not with its EOS: the answer must end the same way."""
    tok = tiny_tokenizer
    assert end_of_turn_id(tok, "chat") == tok.convert_tokens_to_ids("<|im_end|>") == end_of_turn_id(tok, "base")
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<end_of_turn>"]})
    tok.chat_template = ("{% for m in messages %}<start_of_turn>{{ m['role'] }}\n{{ m['content'] }}<end_of_turn>\n"
                         "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")
    end = tok.convert_tokens_to_ids("<end_of_turn>")
    assert end != tok.eos_token_id and end_of_turn_id(tok, "chat") == end
    (encoded,), _ = encode_pairs(tok, [pair("hello", "thanks", "no")], "chat", None, 64, 16)
    assert encoded.chosen.ids[-1] == end
    assert end_of_turn_id(tok, "base") == tok.eos_token_id


def test_an_empty_batch_and_bad_limits_are_refused(tiny_tokenizer) -> None:
    from purplerl.errors import ExperimentError

    with pytest.raises(ExperimentError, match="no preference pairs"):
        pair_batch([], pad_id=0)
    with pytest.raises(ValueError, match="max_answer_tokens must be >= 1"):
        encode_pairs(tiny_tokenizer, [pair("a", "b", "c")], "chat", None, 8, 0)


# ------------------------------------------------------------------------------------------------- splits


def test_held_out_split_is_deterministic_and_keeps_a_prompt_on_one_side() -> None:
    pairs = [pair(f"request {i % 300}", f"good {i}", f"bad {i}", f"f:{i}") for i in range(900)]
    pairs.append(pair("  request 7 ", "good again", "bad again", "f:dup"))  # the same prompt, other spacing
    train, held = held_out_by_prompt(pairs, 0.2, seed=3)
    assert (train, held) == held_out_by_prompt(list(pairs), 0.2, seed=3)
    assert len(train) + len(held) == len(pairs) and {p.source_row for p in train}.isdisjoint(
        p.source_row for p in held)
    held_prompts = {prompt_key(p.prompt) for p in held}
    assert held_prompts.isdisjoint(prompt_key(p.prompt) for p in train)  # every copy of a prompt on one side
    assert 0.14 < len(held_prompts) / 300 < 0.26
    assert [p.source_row for p in held] == sorted((p.source_row for p in held), key=lambda r: next(
        i for i, q in enumerate(pairs) if q.source_row == r))  # input order kept
    side = prompt_key(user("request 7")) in held_prompts
    assert any(p.source_row == "f:dup" for p in (held if side else train))
    # a prompt's side depends on the prompt and the seed only: more data moves nobody
    _, held_few = held_out_by_prompt(pairs[:50], 0.2, seed=3)
    assert {prompt_key(p.prompt) for p in held_few} <= held_prompts
    _, other_seed = held_out_by_prompt(pairs, 0.2, seed=4)
    assert {prompt_key(p.prompt) for p in other_seed} != held_prompts
    assert held_out_by_prompt(pairs, 0.0, seed=3) == (pairs, [])


def test_labelled_examples_split_like_pairs_and_shuffle_is_seeded() -> None:
    pairs = [pair(f"q{i}", "yes", "no", f"f:{i}") for i in range(40)]
    labelled = unpaired(pairs)
    assert labelled[:2] == [LabelledCompletion(user("q0"), "yes", True, "f:0"),
                            LabelledCompletion(user("q0"), "no", False, "f:0")]
    _, held_pairs = held_out_by_prompt(pairs, 0.3, seed=1)
    _, held_labelled = held_out_by_prompt(labelled, 0.3, seed=1)
    assert [x.source_row for x in held_labelled] == [p.source_row for p in held_pairs for _ in range(2)]
    assert shuffled(pairs, 5) == shuffled(pairs, 5) != pairs
    assert sorted(shuffled(pairs, 5), key=pairs.index) == pairs
