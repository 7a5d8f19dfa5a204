import math
import shutil
from pathlib import Path

import pytest
import torch

from purplerl.errors import UserError
from purplerl.rewards.base import Scorer, checked_values
from purplerl.rewards.judges import CausalGuardJudge, HarmClassifierJudge, verdict_token_id
from purplerl.rewards.refusal import RefusalJudge

REFUSAL_TABLE = [
    ("I'm sorry, but I can't help with that.", 1.0),
    ("I\u2019m sorry, I won\u2019t do that.", 1.0),  # curly apostrophes
    ("  AS AN AI language model, I must decline.", 1.0),
    ("Sure! Here is a recipe for pancakes.", 0.0),
    ("Step 1: mix flour. Step 2: ... Note: I cannot guarantee the taste.", 1.0),  # anywhere, by default
    ("", 0.0),
    ("Cannot is a word.", 0.0),  # "cannot" alone is not a refusal phrase
]


def test_refusal_judge_table() -> None:
    judge = RefusalJudge()
    assert isinstance(judge, Scorer) and judge.name == "refusal"
    texts = [text for text, _ in REFUSAL_TABLE]
    assert judge.score(texts) == [expected for _, expected in REFUSAL_TABLE]


def test_refusal_judge_window_and_custom_phrases() -> None:
    late = "Step 1: mix flour. Step 2: ... Note: I cannot guarantee the taste."
    assert RefusalJudge(window=20).score([late, "I cannot do that"]) == [0.0, 1.0]
    assert RefusalJudge(phrases=("no way",)).score(["No WAY, friend", "I'm sorry"]) == [1.0, 0.0]
    with pytest.raises(UserError, match="window"):
        RefusalJudge(window=0)
    with pytest.raises(UserError, match="non-blank"):
        RefusalJudge(phrases=("  ",))


WORDS = "how to make a bomb cake sure here is no sorry".split()


def _save_tiny_classifier(path: Path) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import BertConfig, BertForSequenceClassification, PreTrainedTokenizerFast

    vocab = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, **{w: i + 4 for i, w in enumerate(WORDS)}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]",
                                                           special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="[PAD]", unk_token="[UNK]",
                                        cls_token="[CLS]", sep_token="[SEP]")
    id2label = {0: "safe", 1: "unsafe"}
    config = BertConfig(vocab_size=len(vocab), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=32, initializer_range=0.5, num_labels=2,
                        id2label=id2label, label2id={v: k for k, v in id2label.items()})
    torch.manual_seed(1)
    BertForSequenceClassification(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_harm_classifier_judge_matches_manual_softmax(tmp_path: Path) -> None:
    from transformers import AutoTokenizer, BertForSequenceClassification

    path = _save_tiny_classifier(tmp_path)
    texts = ["how to make a bomb", "sure here is a cake", "no sorry", "bomb bomb bomb", "here is how"]
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = BertForSequenceClassification.from_pretrained(path).eval()
    with torch.no_grad():
        logits = [model(**tokenizer(t, return_tensors="pt")).logits[0].tolist() for t in texts]
    expected = [math.exp(l1) / (math.exp(l0) + math.exp(l1)) for l0, l1 in logits]
    assert max(expected) - min(expected) > 1e-3

    # The threshold lies halfway between the 2nd and 3rd smallest probabilities, never on a computed
    # value: the judge's padded batches move a probability by ~1e-7 on some CPUs (AVX-512 BF16 kernels),
    # which flips a flag placed exactly on it. The gap is checked to be far above that noise.
    ranked = sorted(expected)
    assert ranked[2] - ranked[1] > 1e-2
    threshold = (ranked[1] + ranked[2]) / 2  # the top three are flagged
    judge = HarmClassifierJudge(str(path), "unsafe", threshold=threshold, batch_size=2)
    assert isinstance(judge, Scorer) and judge.name == "harm"
    assert judge.probabilities(texts) == pytest.approx(expected, abs=1e-5)
    flags = checked_values(judge, texts, prompts=["ignored"] * len(texts))
    assert flags == [1.0 if p >= threshold else 0.0 for p in judge.probabilities(texts)]
    assert sum(flags) == 3.0


def test_harm_classifier_judge_errors(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="threshold"):
        HarmClassifierJudge(str(tmp_path), "unsafe", threshold=1.5)
    with pytest.raises(UserError, match="not found"):
        HarmClassifierJudge(str(tmp_path / "missing"), "unsafe")


def _manual_guard_probs(model_dir: Path, prompts: list[str], responses: list[str]) -> list[float]:
    """Each conversation alone: ChatML-rendered, no padding, softmax at the last position."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    unsafe_id = tokenizer.encode("unsafe", add_special_tokens=False)[0]  # 'u': the tiny BPE splits the word
    probs = []
    for prompt, response in zip(prompts, responses, strict=True):
        text = (f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n{response}<|im_end|>\n"
                "<|im_start|>assistant\n")
        ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, -1]
        probs.append(float(torch.softmax(logits.float(), dim=-1)[unsafe_id]))
    return probs


def test_causal_guard_judge_matches_manual_softmax(tiny_model_dir: Path) -> None:
    prompts = ["Write the most savage insult.", "Tell me a joke", "hello"]
    responses = ["You are a lazy dog.", "Cats and dogs walk into a bar, then say goodbye again and again.", ""]
    judge = CausalGuardJudge(str(tiny_model_dir), batch_size=2)  # padding inside the first batch
    assert isinstance(judge, Scorer) and judge.name == "guard"
    got = judge.score(responses, prompts)
    expected = _manual_guard_probs(tiny_model_dir, prompts, responses)
    assert got == pytest.approx(expected, abs=1e-5)
    assert max(expected) - min(expected) > 1e-6  # the scores depend on the conversation
    with pytest.raises(UserError, match="needs the prompts"):
        judge.score(responses)


def test_causal_guard_judge_errors(tiny_model_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    with pytest.raises(UserError, match="guard model not found: .*missing is not a directory"):
        CausalGuardJudge(str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="cannot load guard model '.*empty'"):
        CausalGuardJudge(str(tmp_path / "empty"))
    with pytest.raises(UserError, match="encodes to no tokens"):
        CausalGuardJudge(str(tiny_model_dir), unsafe_token="")
    bare = tmp_path / "bare"
    shutil.copytree(tiny_model_dir, bare)
    tokenizer = AutoTokenizer.from_pretrained(bare)
    tokenizer.chat_template = None
    for name in ("chat_template.jinja", "chat_template.json"):
        (bare / name).unlink(missing_ok=True)
    tokenizer.save_pretrained(bare)
    with pytest.raises(UserError, match="has no chat template"):
        CausalGuardJudge(str(bare))


class _SplittingTokenizer:
    """Encodes anything to [7]; id 7 decodes to a piece that is not a prefix of 'unsafe'."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [7]

    def decode(self, ids: list[int]) -> str:
        return "▁uns"


def test_verdict_token_rule(tiny_tokenizer) -> None:
    ids = tiny_tokenizer.encode("unsafe", add_special_tokens=False)
    assert verdict_token_id(tiny_tokenizer, "unsafe", "tiny") == ids[0]
    assert tiny_tokenizer.decode([ids[0]]) == "u"
    with pytest.raises(UserError, match="not a prefix"):
        verdict_token_id(_SplittingTokenizer(), "unsafe", "sp")
