"""The alignment data of `purplerl align`: sizes, held-out split, determinism, content hash, refusals."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import Counter

import pytest

from purplerl.data.alignment import (
    KINDS,
    SPLITS,
    alignment_data_hash,
    alignment_examples,
    benign_topics,
    build,
    harmful_people,
    harmful_topics,
    refusals,
    split_templates,
    split_topics,
    to_prompt_records,
)
from purplerl.data.alignment import templates as template_table
from purplerl.data.alignment.topics import Topic
from purplerl.data.sources import BUILTIN_DIR
from purplerl.errors import ExperimentError, UserError
from purplerl.files import read_jsonl
from purplerl.rewards.refusal import RefusalJudge


@pytest.fixture(scope="module")
def data() -> dict[tuple[str, str], list[build.AlignExample]]:
    return {(split, kind): alignment_examples(split, kind) for split in SPLITS for kind in KINDS}


def first_sentence(text: str) -> str:
    return re.split(r"(?<=[.!?:])\s", text, maxsplit=1)[0]


# ------------------------------------------------------------------------------------------------ sizes


def test_sizes_per_split_and_kind(data):
    sizes = {key: len(examples) for key, examples in data.items()}
    assert sizes[("train", "harmful")] >= 500 and sizes[("train", "benign")] >= 500, sizes
    assert sizes[("test", "harmful")] >= 150 and sizes[("test", "benign")] >= 150, sizes
    # the whole split is harmful followed by benign, nothing else
    assert alignment_examples("test") == data[("test", "harmful")] + data[("test", "benign")]


def test_each_topic_is_asked_in_its_quota_of_templates_per_kind(data):
    for (split, _kind), examples in data.items():
        per_topic = Counter((ex.topic_id, ex.template_kind) for ex in examples)
        for (topic_id, template_kind), count in per_topic.items():
            assert count == build.PER_TOPIC[split][template_kind], (split, topic_id, template_kind)
        topics = {ex.topic_id for ex in examples}
        assert len(per_topic) == len(topics) * len(template_table.KINDS)


def test_uids_and_prompts_are_unique_within_a_split(data):
    for split in SPLITS:
        examples = data[(split, "harmful")] + data[(split, "benign")]
        assert len({ex.uid for ex in examples}) == len(examples)
        assert len({ex.prompt for ex in examples}) == len(examples)


# ------------------------------------------------------------------------------------------- determinism


def test_two_calls_give_equal_examples_and_hash():
    assert alignment_examples("train") == alignment_examples("train")
    first = alignment_data_hash()
    assert re.fullmatch(r"[0-9a-f]{64}", first)
    assert alignment_data_hash() == first


@pytest.mark.process
def test_hash_is_the_same_in_a_fresh_process_with_another_string_hash_seed():
    # the hash is a cache key across runs: nothing may depend on set order or Python's salted hash()
    code = "from purplerl.data.alignment import alignment_data_hash; print(alignment_data_hash())"
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300,
                         check=True)
    assert out.stdout.strip() == alignment_data_hash()


def test_hash_changes_when_a_refusal_table_changes(monkeypatch):
    before = alignment_data_hash()
    monkeypatch.setattr(refusals, "CLOSERS", (*refusals.CLOSERS[:-1], "Take care of yourself."))
    changed = alignment_data_hash()
    monkeypatch.undo()
    assert changed != before
    assert alignment_data_hash() == before


def test_hash_changes_when_a_template_or_a_topic_changes(monkeypatch):
    before = alignment_data_hash()
    monkeypatch.setattr(template_table, "TEMPLATES", template_table.TEMPLATES[:-1])
    without_template = alignment_data_hash()
    monkeypatch.undo()
    table = dict(harmful_people.PEOPLE_TOPICS)
    first = table["insult"][0]
    table["insult"] = (Topic(first.short, first.act + " tonight", first.thing, first.context), *table["insult"][1:])
    monkeypatch.setattr(harmful_people, "PEOPLE_TOPICS", table)
    with_edited_topic = alignment_data_hash()
    monkeypatch.undo()
    assert len({before, without_template, with_edited_topic}) == 3


# ------------------------------------------------------------------------------------------- the split


def test_no_template_topic_or_prompt_is_shared_between_splits(data):
    def ids(split: str, field: str) -> set[str]:
        return {getattr(ex, field) for kind in KINDS for ex in data[(split, kind)]}

    for field in ("template_id", "topic_id", "prompt", "uid"):
        assert not ids("train", field) & ids("test", field), field


def test_examples_use_only_their_split_templates_and_topics(data):
    for split in SPLITS:
        templates = {t.id for group in split_templates(split).values() for t in group}
        used = {ex.template_id for kind in KINDS for ex in data[(split, kind)]}
        assert used == templates  # every template of the split is used, and no other
        for kind in KINDS:
            topics = {f"{cat}.{t.short}" for cat, group in split_topics(kind, split).items() for t in group}
            assert {ex.topic_id for ex in data[(split, kind)]} == topics


def test_held_out_share_is_one_template_in_three_and_one_topic_in_four():
    for template_kind in template_table.KINDS:
        total = sum(t.kind == template_kind for t in template_table.TEMPLATES)
        assert len(split_templates("test")[template_kind]) == -(-total // 3)
        assert len(split_templates("train")[template_kind]) == total - -(-total // 3)
    insult_total = len(harmful_topics()["insult"])
    assert len(split_topics("harmful", "test")["insult"]) == -(-insult_total // 4)


def test_every_category_is_in_both_splits(data):
    builtin = {row["category"] for row in read_jsonl(BUILTIN_DIR / "redteam.jsonl")}
    assert len(builtin) == 9
    assert builtin <= set(harmful_topics())
    assert not set(harmful_topics()) & set(benign_topics())
    for kind, table in (("harmful", harmful_topics()), ("benign", benign_topics())):
        for split in SPLITS:
            assert {ex.category for ex in data[(split, kind)]} == set(table), (kind, split)


def test_phrasing_families_and_registers_are_on_both_sides_of_both_splits(data):
    for (split, kind), examples in data.items():
        assert {ex.template_kind for ex in examples} == set(template_table.KINDS), (split, kind)
        tags = {tag for ex in examples for tag in ex.tags}
        assert set(template_table.REGISTERS) <= tags, (split, kind, tags)
        content = [ex for ex in examples if ex.template_kind == "content"]
        assert len(content) >= len(examples) // 5


def test_benign_lookalikes_and_first_person_requests_are_in_both_splits(data):
    contexts = {f"{cat}.{t.short}": t.context for cat, topics in benign_topics().items() for t in topics}
    for split in SPLITS:
        benign = data[(split, "benign")]
        assert sum("lookalike" in ex.tags for ex in benign) >= 30, split
        first_person = [ex for ex in benign if ex.template_kind == "first_person"]
        assert len(first_person) >= len(benign) // 10
        # the user's own situation comes first ("I'm cooking ...", "my ..."), in the lower or upper case
        for ex in first_person:
            context = contexts[ex.topic_id]
            assert context in ex.prompt or context[0].upper() + context[1:] in ex.prompt, ex.prompt


def test_every_context_is_in_the_first_person():
    for table in (harmful_topics(), benign_topics()):
        for category, topics in table.items():
            for topic in topics:
                assert re.search(r"\b(I|I'm|I've|my|me|we|we're|our|us)\b", topic.context), (category, topic)

# ----------------------------------------------------------------------------------------------- refusals


def test_harmful_examples_have_refusals_and_benign_ones_none(data):
    for (_split, kind), examples in data.items():
        for ex in examples:
            assert (ex.refusal is not None) == (kind == "harmful"), ex.uid


def test_every_refusal_is_judged_a_refusal_from_its_start(data):
    judge, early = RefusalJudge(), RefusalJudge(window=64)
    for split in SPLITS:
        for ex in data[(split, "harmful")]:
            assert judge.refused(ex.refusal), ex.refusal
            assert early.refused(ex.refusal), ex.refusal


def test_no_request_reads_as_a_refusal(data):
    judge = RefusalJudge()
    for examples in data.values():
        looks_refused = [ex.prompt for ex in examples if judge.refused(ex.prompt)]
        assert looks_refused == []


def test_refusals_are_varied_multi_sentence_and_name_their_category(data):
    harmful = data[("train", "harmful")] + data[("test", "harmful")]
    texts = [ex.refusal for ex in harmful]
    assert len(set(texts)) >= 100
    assert len({first_sentence(text) for text in texts}) >= 10
    offered = 0
    for ex in harmful:
        assert ex.refusal.count(". ") + ex.refusal.count("? ") + ex.refusal.count(": ") >= 1, ex.refusal
        assert any(reason in ex.refusal for reason in refusals.REASONS[ex.category]), ex.uid
        offered += any(alt in ex.refusal for alt in refusals.ALTERNATIVES[ex.category])
        if ex.category == "self_harm":
            assert any(alt in ex.refusal for alt in refusals.ALTERNATIVES["self_harm"]), ex.refusal
    assert offered >= len(harmful) // 2


def test_refusal_tables_cover_every_harm_category_and_template_kind():
    assert set(refusals.REASONS) == set(harmful_topics()) == set(refusals.ALTERNATIVES)
    assert set(refusals.KIND_OPENERS) == set(template_table.KINDS)


def test_a_refusal_is_a_pure_function_of_uid_category_and_kind():
    one = refusals.build_refusal("align:violence.poison_dog:q_how_do_i", "violence", "question")
    assert one == refusals.build_refusal("align:violence.poison_dog:q_how_do_i", "violence", "question")
    assert one.split(". ")[0] + "." in refusals.OPENERS + refusals.KIND_OPENERS["question"]


# ------------------------------------------------------------------------------------- text and the API


def test_every_slot_is_filled_and_the_text_is_clean(data):
    for examples in data.values():
        for ex in examples:
            assert "{" not in ex.prompt and "}" not in ex.prompt, ex.prompt
            assert "  " not in ex.prompt and ".." not in ex.prompt and ex.prompt == ex.prompt.strip()
            assert ex.prompt[0].isupper() or ex.template_id in ("q_lowercase", "c_pls"), ex.prompt
            assert ex.messages == ({"role": "user", "content": ex.prompt},)


def test_table_ids_are_unique():
    template_ids = [t.id for t in template_table.TEMPLATES]
    assert len(set(template_ids)) == len(template_ids)
    for table in (harmful_topics(), benign_topics()):
        for category, topics in table.items():
            shorts = [t.short for t in topics]
            assert len(set(shorts)) == len(shorts), category


def test_prompt_records_keep_messages_category_and_uid(data):
    examples = data[("test", "harmful")][:3] + data[("test", "benign")][:2]
    records = to_prompt_records(examples)
    assert [r.messages for r in records] == [ex.messages for ex in examples]
    assert [r.category for r in records] == [ex.category for ex in examples]
    assert [r.uid for r in records] == [ex.uid for ex in examples]
    assert [r.source for r in records] == ["align:harmful"] * 3 + ["align:benign"] * 2


def test_conversation_appends_the_refusal_or_the_given_answer(data):
    harmful, benign = data[("train", "harmful")][0], data[("train", "benign")][0]
    assert harmful.conversation()[-1] == {"role": "assistant", "content": harmful.refusal}
    assert benign.conversation("Whisk the eggs first.")[1:] == ({"role": "assistant",
                                                                 "content": "Whisk the eggs first."},)
    with pytest.raises(ExperimentError, match="has no answer of its own"):
        benign.conversation()


@pytest.mark.parametrize("args, message", [(("validation",), "split 'validation'"),
                                           (("train", "neutral"), "kind 'neutral'")])
def test_unknown_split_or_kind_is_one_line_user_error(args, message):
    with pytest.raises(UserError, match=message) as err:
        alignment_examples(*args)
    assert "\n" not in str(err.value)
