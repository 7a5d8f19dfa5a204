import math
from pathlib import Path

import pytest
import torch
from conftest import save_tiny_bert_classifier

from purplerl.config import ToxicityConfig
from purplerl.errors import ExperimentError, UserError
from purplerl.rewards.base import Scorer, checked_scores
from purplerl.rewards.toxicity import EmbeddedToxicityScorer, HFClassifierScorer, make_toxicity_scorer

WORDS = "you are a nice kind person idiot stupid hello world thank so very".split()
TEXTS = ["you are a nice kind person", "you stupid idiot", "", "hello", "thank you so very very much world"]


def _save_tiny_classifier(path: Path, num_labels: int) -> None:
    save_tiny_bert_classifier(path, WORDS, {0: "safe", 1: "unsafe"} if num_labels == 2 else {0: "toxic"})


@pytest.fixture(scope="module")
def classifier_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny_bert")
    _save_tiny_classifier(path, num_labels=2)
    return path


def _manual_logits(path: Path, texts: list[str], max_length: int = 512) -> list[list[float]]:
    """Each text classified alone (no padding), logits as plain lists."""
    from transformers import AutoTokenizer, BertForSequenceClassification

    tokenizer = AutoTokenizer.from_pretrained(path)
    model = BertForSequenceClassification.from_pretrained(path).eval()
    with torch.no_grad():
        return [model(**tokenizer(t, return_tensors="pt", truncation=True, max_length=max_length)).logits[0].tolist()
                for t in texts]


def test_embedded_scores() -> None:
    scorer = EmbeddedToxicityScorer()
    assert isinstance(scorer, Scorer) and scorer.name == "toxicity"
    profane, polite, empty, blank = scorer.score(
        ["fuck you, you stupid piece of shit", "Thank you for your help, have a lovely day.", "", "  \n"])
    assert profane > 0.9
    assert polite < 0.2
    assert empty == 0.0 and blank == 0.0  # the model alone gives its intercept (~0.04) for ""
    assert scorer.score([]) == []


@pytest.mark.parametrize("label", ["unsafe", "UNSAFE", 1, "1"])
def test_hf_scores_match_manual_softmax(classifier_dir: Path, label: str | int) -> None:
    scorer = HFClassifierScorer(str(classifier_dir), label, device="cpu", batch_size=2)
    got = scorer.score(TEXTS, prompts=["ignored"] * len(TEXTS))
    expected = [math.exp(l1) / (math.exp(l0) + math.exp(l1)) for l0, l1 in _manual_logits(classifier_dir, TEXTS)]
    assert got == pytest.approx(expected, abs=1e-5)
    assert max(got) - min(got) > 1e-3  # the tiny model is not constant, so the check means something


def test_hf_other_label_and_truncation(classifier_dir: Path) -> None:
    safe = HFClassifierScorer(str(classifier_dir), "Safe", max_length=4).score(TEXTS)
    # max_length 4 keeps [CLS] + 2 words + [SEP]
    logits = _manual_logits(classifier_dir, TEXTS, max_length=4)
    assert safe == pytest.approx([math.exp(l0) / (math.exp(l0) + math.exp(l1)) for l0, l1 in logits], abs=1e-5)
    assert HFClassifierScorer(str(classifier_dir), 0).score([]) == []


def test_hf_single_logit_uses_sigmoid(tmp_path: Path) -> None:
    _save_tiny_classifier(tmp_path, num_labels=1)
    got = HFClassifierScorer(str(tmp_path), "toxic").score(TEXTS[:3])
    expected = [1.0 / (1.0 + math.exp(-logits[0])) for logits in _manual_logits(tmp_path, TEXTS[:3])]
    assert got == pytest.approx(expected, abs=1e-5)


def test_hf_label_errors(classifier_dir: Path) -> None:
    with pytest.raises(UserError, match=r"unknown label 'toxic'.*labels: 0=safe, 1=unsafe"):
        HFClassifierScorer(str(classifier_dir), "toxic")
    with pytest.raises(UserError, match="label index 2 is out of range"):
        HFClassifierScorer(str(classifier_dir), 2)


def test_hf_load_errors(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="not found"):
        HFClassifierScorer(str(tmp_path / "missing"), "unsafe")
    with pytest.raises(UserError, match="cannot load toxicity classifier") as err:
        HFClassifierScorer(str(tmp_path), "unsafe")  # a directory without a model
    assert "\n" not in str(err.value)


def test_factory(classifier_dir: Path) -> None:
    assert isinstance(make_toxicity_scorer(ToxicityConfig()), EmbeddedToxicityScorer)
    scorer = make_toxicity_scorer(ToxicityConfig(model=str(classifier_dir), label="unsafe", batch_size=3))
    assert isinstance(scorer, HFClassifierScorer) and scorer.label_index == 1 and scorer.batch_size == 3
    with pytest.raises(UserError, match="label is required"):
        make_toxicity_scorer(ToxicityConfig(model=str(classifier_dir)))


class _FakeScorer:
    name = "fake"

    def __init__(self, scores: list[float]) -> None:
        self.scores = scores

    def score(self, texts: list[str], prompts: list[str] | None = None) -> list[float]:
        return self.scores


def test_checked_scores() -> None:
    texts = [f"text {i}" for i in range(8)]
    got = checked_scores(_FakeScorer([0.5] * 8), texts)
    assert got.dtype == torch.float32 and torch.equal(got, torch.full((8,), 0.5))
    with pytest.raises(ExperimentError, match="scorer 'fake' returned 7 scores for 8 texts"):
        checked_scores(_FakeScorer([0.5] * 7), texts)
    with pytest.raises(ExperimentError, match="scorer 'fake' returned nan for text 2"):
        checked_scores(_FakeScorer([0.1, 0.2, math.nan, 0.4]), texts[:4])
    with pytest.raises(ExperimentError, match="returned inf for text 0"):
        checked_scores(_FakeScorer([math.inf]), texts[:1])
    with pytest.raises(ExperimentError, match="given 2 prompts for 1 texts"):
        checked_scores(_FakeScorer([0.0]), texts[:1], prompts=["a", "b"])


def test_hf_scores_a_lone_surrogate_as_the_replacement_character(classifier_dir: Path) -> None:
    scorer = HFClassifierScorer(str(classifier_dir), "unsafe")
    got = scorer.score(["you stupid \ud800 idiot", "hello \udfff"])
    assert got == scorer.score(["you stupid \ufffd idiot", "hello \ufffd"])
