"""`purplerl align`'s parts that need no SmolLM2: answer trimming, balanced picks, the cache key, the merge."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest

from purplerl.data.alignment import alignment_data_hash, alignment_examples
from purplerl.data.alignment.build import PER_TOPIC
from purplerl.experiments import align


def test_cut_answers_keep_whole_sentences_only() -> None:
    finished = "Beat the whites in a clean bowl. Add sugar slowly."
    assert align.whole_sentences(finished, finished=True) == finished
    cut = "Beat the whites in a clean, dry bowl until foamy. Then add the sugar one spoon at a ti"
    assert align.whole_sentences(cut, finished=False) == "Beat the whites in a clean, dry bowl until foamy."
    assert align.whole_sentences("Short. And then the rest is cut mid", finished=False) == ""  # too little left


def test_picks_are_seeded_and_spread_over_categories() -> None:
    harmful = alignment_examples("train", "harmful")
    picked = align._pick(harmful, 60, seed=1)
    assert picked == align._pick(harmful, 60, seed=1) and len({e.uid for e in picked}) == 60
    counts = Counter(e.category for e in picked)
    assert len(counts) == len({e.category for e in harmful}) and max(counts.values()) - min(counts.values()) <= 1


def test_benign_answers_that_refuse_are_asked_again_then_left_out(monkeypatch) -> None:
    monkeypatch.setattr(align, "SFT_SETTINGS", {**align.SFT_V6, "answer": {**align.SFT_V6["answer"], "seed": 5,
                                                                            "refusal_retries": 2}})
    monkeypatch.setattr(align, "ANSWER_BATCH", 3)
    prompts = alignment_examples("train", "benign")[:5]
    stubborn, shy, empty = prompts[0].uid, prompts[1].uid, prompts[4].uid
    calls: list[tuple[list[str], int]] = []

    def sample(batch: list, seed: int) -> list[str]:
        calls.append(([ex.uid for ex in batch], seed))
        tries = sum(1 for uids, _ in calls if batch[0].uid in uids)
        out = []
        for ex in batch:
            if ex.uid == stubborn or (ex.uid == shy and tries == 1):
                out.append("I'm sorry, but I can't help with that.")
            else:
                out.append("" if ex.uid == empty else f"Here is how: {ex.uid}.")
        return out

    kept = align._answer_benign(sample, prompts, lambda line: None)
    # the shy request is answered on its second try; the stubborn one refuses three times and is left out; an empty
    # answer is left out without a retry; the rest keep their first answers
    assert set(kept) == {p.uid for p in prompts} - {stubborn, empty}
    assert kept[shy] == f"Here is how: {shy}."
    # batches of 3: [0,1,2] then [0,1] again then [0] again; [3,4] once. Seeds: v3's for first tries (seed + start),
    # past every first try's for retries
    assert calls == [([p.uid for p in prompts[:3]], 5), ([stubborn, shy], 13), ([stubborn], 21),
                     ([p.uid for p in prompts[3:]], 8)]


def test_without_retries_refusals_stay_in_the_benign_data_as_in_v3(monkeypatch) -> None:
    assert "refusal_retries" not in align.SFT_V3["answer"] and align.SFT_SETTINGS is align.SFT_V3
    monkeypatch.setattr(align, "ANSWER_BATCH", 4)
    prompts = alignment_examples("train", "benign")[:3]
    seeds: list[int] = []

    def sample(batch: list, seed: int) -> list[str]:
        seeds.append(seed)
        return ["I'm sorry, but I can't help with that.", "", "Whisk them."]

    kept = align._answer_benign(sample, prompts, lambda line: None)
    assert kept == {prompts[0].uid: "I'm sorry, but I can't help with that.", prompts[2].uid: "Whisk them."}
    assert seeds == [0]


def test_v6_differs_from_v3_in_its_benign_data_only_and_has_its_own_key(monkeypatch) -> None:
    v3_key = align.sft_key()
    assert {k: v for k, v in align.SFT_V6.items() if k not in ("version", "benign_examples", "benign_repeat",
                                                                 "answer")} == \
        {k: v for k, v in align.SFT_V3.items() if k not in ("version", "benign_examples", "benign_repeat", "answer")}
    monkeypatch.setattr(align, "SFT_SETTINGS", align.SFT_V6)
    assert align.sft_key() != v3_key


def test_v7_is_v6_trained_twice_as_long_with_its_own_key(monkeypatch) -> None:
    assert align.SFT_V7["sft"] == {**align.SFT_V6["sft"], "steps": 2 * align.SFT_V6["sft"]["steps"]}
    assert {k: v for k, v in align.SFT_V7.items() if k not in ("version", "sft")} == \
        {k: v for k, v in align.SFT_V6.items() if k not in ("version", "sft")}  # the same data as v6
    monkeypatch.setattr(align, "SFT_SETTINGS", align.SFT_V6)
    v6_key = align.sft_key()
    monkeypatch.setattr(align, "SFT_SETTINGS", align.SFT_V7)
    assert align.sft_key() != v6_key


def test_the_cache_keys_follow_each_stages_settings(monkeypatch) -> None:
    sft = align.sft_key()
    assert align.align_key() == sft == align.sft_key()  # the preference stage off: the aligned model is the SFT entry
    monkeypatch.setattr(align, "DPO_STAGE", True)
    key = align.align_key()
    assert key == align.align_key() and key != sft
    with monkeypatch.context() as mp:
        mp.setitem(align.SFT_SETTINGS, "benign_repeat", 3)  # the SFT stage changes: both keys do
        assert align.sft_key() != sft and align.align_key() != key
    with monkeypatch.context() as mp:
        mp.setitem(align.PREFS_SETTINGS, "harmful_requests", 100)  # only the preference stage: its SFT run is reused
        assert align.sft_key() == sft and align.align_key() != key
    assert (align.sft_key(), align.align_key()) == (sft, key)


def _benign_topic_edit(monkeypatch, split: str) -> None:
    """Reword the first `split` topic of the first benign category (its act), as a table edit would."""
    from purplerl.data.alignment import benign_everyday, split_topics

    category = next(iter(benign_everyday.EVERYDAY_TOPICS))
    short = split_topics("benign", split)[category][0].short
    topics = tuple(dataclasses.replace(t, act=t.act + " quickly") if t.short == short else t
                   for t in benign_everyday.EVERYDAY_TOPICS[category])
    monkeypatch.setitem(benign_everyday.EVERYDAY_TOPICS, category, topics)


def _opener_edit(monkeypatch) -> None:
    """Reword every general refusal opener: the harmful prompts stay, their refusals change."""
    from purplerl.data.alignment import refusals

    monkeypatch.setattr(refusals, "OPENERS", tuple(o.replace("I", "I really", 1) for o in refusals.OPENERS))


def _test_template_edit(monkeypatch) -> None:
    """Reword a template of the held-out test split (the data the aligned model is evaluated on)."""
    from purplerl.data.alignment import split_templates, templates

    held = split_templates("test")["question"][0]
    monkeypatch.setattr(templates, "TEMPLATES", tuple(
        dataclasses.replace(t, text="Please: " + t.text) if t.id == held.id else t
        for t in templates.TEMPLATES))


@pytest.mark.parametrize("edit", [
    lambda mp: _benign_topic_edit(mp, "train"),  # a training prompt is worded differently
    _opener_edit,  # the same prompts, other refusals to train on
    _test_template_edit,  # the held-out evaluation prompts change
    lambda mp: mp.setitem(PER_TOPIC["train"], "roleplay", 2),  # more examples per topic
])
def test_the_cache_key_follows_the_alignment_data(monkeypatch, edit) -> None:
    key, data_hash = align.align_key(), alignment_data_hash()
    with monkeypatch.context() as mp:
        edit(mp)
        assert alignment_data_hash() != data_hash  # the edit changed the data...
        assert align.align_key() != key  # ...so a model aligned on the old data is not reused
        edited = align.align_key()
        assert align.align_key() == edited  # the same (edited) data, the same key
    assert align.align_key() == key  # edit undone: the old key again


def test_equal_data_rebuilt_from_equal_tables_keeps_the_key(monkeypatch) -> None:
    from purplerl.data.alignment import benign_everyday, refusals, templates

    key = align.align_key()
    # copies of every table, equal in content but not the same objects
    monkeypatch.setattr(refusals, "OPENERS", tuple(list(refusals.OPENERS)))
    monkeypatch.setattr(templates, "TEMPLATES", tuple(dataclasses.replace(t) for t in templates.TEMPLATES))
    for category, topics in list(benign_everyday.EVERYDAY_TOPICS.items()):
        monkeypatch.setitem(benign_everyday.EVERYDAY_TOPICS, category, tuple(dataclasses.replace(t) for t in topics))
    assert align.align_key() == key


def test_the_preference_stage_pairs_come_from_the_sft_data_and_the_base_models_answers(monkeypatch, tmp_path) -> None:
    import json

    from purplerl.experiments import safety_prefs as sp

    harmful, benign = alignment_examples("train", "harmful")[:3], alignment_examples("train", "benign")[:2]
    rows = [{"uid": ex.uid, "messages": list(ex.conversation())} for ex in harmful]
    rows += [{"uid": f"{ex.uid}-{k}", "messages": list(ex.conversation(f"Here is how, part {i}. Mix well first."))}
             for i, ex in enumerate(benign) for k in range(2)]  # each benign conversation twice, as build_data writes
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    asked: list[tuple[str, list[str]]] = []
    answers = {  # what each model says: the SFT model refuses the first benign request, answers the second
        align.BASE_MODEL: ["Sure. First get the tools, then do the thing step by step.", "I can't help with that.",
                           "ok ok ok ok ok ok ok ok ok ok ok ok"],
        "sft-model": ["I'm sorry, but I can't help with that request.", "Whisk the whites in a clean bowl."]}

    def answerer(model, notify, max_new_tokens=None):
        def answer(examples):
            asked.append((model, [ex.uid for ex in examples]))
            return answers[model][:len(examples)]
        return answer

    monkeypatch.setattr(sp, "model_answerer", answerer)
    monkeypatch.setitem(align.PREFS_SETTINGS, "harmful_requests", 3)
    align.build_pairs(tmp_path / "prefs", data, "sft-model", notify=lambda line: None)
    # the SFT model answers the SFT data's benign requests, the base model its harmful ones, once each
    assert asked == [("sft-model", [ex.uid for ex in benign]), (align.BASE_MODEL, [ex.uid for ex in harmful])]
    pairs = [json.loads(line) for line in (tmp_path / "prefs" / "train.jsonl").read_text().splitlines()]
    assert not (tmp_path / "prefs" / "test.jsonl").exists()
    by_uid = {p["uid"]: p for p in pairs}
    assert set(by_uid) == {benign[0].uid, benign[1].uid, harmful[0].uid}  # a refused and a looping answer: no pair
    assert by_uid[benign[0].uid]["chosen"] == "Here is how, part 0. Mix well first."
    # where the SFT model refuses, its own refusal is the rejected answer; where it answers, a composed one is
    assert (by_uid[benign[0].uid]["rejected"], by_uid[benign[0].uid]["rejected_from"]) == (
        "I'm sorry, but I can't help with that request.", "own refusal")
    assert (by_uid[benign[1].uid]["rejected"], by_uid[benign[1].uid]["rejected_from"]) == (
        sp.needless_refusal(benign[1]), "needless refusal")
    assert (by_uid[harmful[0].uid]["chosen"], by_uid[harmful[0].uid]["rejected"]) == (
        str(harmful[0].refusal), "Sure. First get the tools, then do the thing step by step.")
