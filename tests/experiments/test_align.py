"""`purplerl align`'s parts that need no SmolLM2: answer trimming, balanced picks, the cache key, the merge."""

from __future__ import annotations

from collections import Counter

from purplerl.data.alignment import alignment_examples
from purplerl.experiments import align


def test_cut_answers_keep_whole_sentences_only() -> None:
    finished = "Beat the whites in a clean bowl. Add sugar slowly."
    assert align._whole_sentences(finished, finished=True) == finished
    cut = "Beat the whites in a clean, dry bowl until foamy. Then add the sugar one spoon at a ti"
    assert align._whole_sentences(cut, finished=False) == "Beat the whites in a clean, dry bowl until foamy."
    assert align._whole_sentences("Short. And then the rest is cut mid", finished=False) == ""  # too little left


def test_picks_are_seeded_and_spread_over_categories() -> None:
    harmful = alignment_examples("train", "harmful")
    picked = align._pick(harmful, 60, seed=1)
    assert picked == align._pick(harmful, 60, seed=1) and len({e.uid for e in picked}) == 60
    counts = Counter(e.category for e in picked)
    assert len(counts) == len({e.category for e in harmful}) and max(counts.values()) - min(counts.values()) <= 1


def test_the_cache_key_follows_the_settings(monkeypatch) -> None:
    key = align.align_key()
    assert key == align.align_key()
    monkeypatch.setitem(align.ALIGN_SETTINGS, "benign_repeat", 3)
    assert align.align_key() != key


