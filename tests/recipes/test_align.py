"""`purplerl align`'s parts that need no SmolLM2: answer trimming, balanced picks, the cache key, the merge."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import torch

from purplerl.data.alignment import alignment_examples
from purplerl.recipes import align


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


def test_the_merged_model_equals_base_plus_adapter(tiny_model_dir: Path, trained_adapter_dir: Path,
                                                   tmp_path: Path) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    align.merge_adapter(trained_adapter_dir, tmp_path / "merged", base_model=str(tiny_model_dir))
    assert not list(tmp_path.glob("merged.*.tmp"))  # written aside and renamed
    ids = torch.tensor([[5, 17, 42, 9, 3]])
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir),
                                        str(trained_adapter_dir)).eval()
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    with torch.no_grad():
        got, want, plain = merged(ids).logits, adapted(ids).logits, base(ids).logits
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert float((want - plain).abs().max()) > 0.1  # the adapter was trained: merging it changed the model
