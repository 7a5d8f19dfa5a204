"""Toxicity/harm scorers: the embedded linear model, or any HF sequence-classification model.

Both score the response text alone: `prompts` is accepted (the Scorer protocol) and ignored, so a
response that merely quotes a toxic prompt is not credited for it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from purplerl.devices import resolve_device
from purplerl.errors import ExperimentError, UserError, first_line
from purplerl.files import looks_local
from purplerl.hub import require_hub_model
from purplerl.rewards.base import Scorer
from purplerl.rewards.schema import scrub_surrogates

if TYPE_CHECKING:
    from purplerl.config import ClassifierConfig, ToxicityConfig


class EmbeddedToxicityScorer:
    """P(toxic) in [0, 1] from alt-profanity-check (a linear SVM on TF-IDF, shipped in its wheel).

    Empty or whitespace-only text scores exactly 0.0: the model would otherwise return its intercept
    (about 0.04), a reward for saying nothing.
    """

    name = "toxicity"
    label_name = "toxic"  # what the server reports as the scored output

    def __init__(self) -> None:
        # Imported here: it pulls in scikit-learn, which is slow to import and only needed when scoring.
        from profanity_check import predict_prob

        self._predict_prob = predict_prob

    def score(self, texts: list[str], prompts: list[str] | None = None) -> list[float]:
        scores = [0.0] * len(texts)
        nonempty = [i for i, text in enumerate(texts) if text.strip()]
        if nonempty:
            probs = self._predict_prob([texts[i] for i in nonempty])
            for i, prob in zip(nonempty, probs, strict=True):
                scores[i] = float(prob)
        return scores


def load_pretrained(auto_class: Any, model: str, what: str) -> tuple[Any, Any]:
    """(tokenizer, model) of an HF id or a local dir through `auto_class` (an AutoModelFor... class); a local
    path that is no directory, or any loading failure, is one UserError naming `what`."""
    from transformers import AutoTokenizer

    local = looks_local(model)
    if local and not Path(model).expanduser().is_dir():
        raise UserError(f"{what} not found: {model} is not a directory")
    where = str(Path(model).expanduser()) if local else model
    if not local:
        require_hub_model(model, None)  # offline and not cached: one line now, not a minute of retries
    try:
        # The model first: its errors ("Unrecognized model in ...") say more than the tokenizer's.
        loaded = auto_class.from_pretrained(where)
        tokenizer = AutoTokenizer.from_pretrained(where)
    except (OSError, ValueError, KeyError) as err:
        raise UserError(f"cannot load {what} '{model}': {first_line(err)}") from None
    return tokenizer, loaded


def resolve_label(label: str | int, id2label: dict[int, str], num_labels: int, model: str) -> int:
    """Index of `label` among the classifier outputs: by index, or by name (case-insensitive)."""
    known = ", ".join(f"{i}={id2label.get(i, '?')}" for i in range(num_labels))
    if isinstance(label, int):
        if not 0 <= label < num_labels:
            raise UserError(f"label index {label} is out of range for classifier '{model}' (labels: {known})")
        return label
    matches = [int(i) for i, name in id2label.items() if str(name).lower() == label.lower()]
    if not matches and label.isdigit():
        return resolve_label(int(label), id2label, num_labels, model)
    if len(matches) != 1:
        reason = "unknown" if not matches else "ambiguous"
        raise UserError(f"{reason} label '{label}' for classifier '{model}' (labels: {known})")
    return matches[0]


class HFClassifierScorer:
    """Probability of one label of an HF sequence-classification model, for each text.

    Softmax over the logits, or sigmoid for a single-logit model. Texts are scored in batches of
    `batch_size`, truncated to `max_length` tokens (their first ones; their last ones with keep="end"), in eval
    mode without gradients. Empty texts are classified like any other (BERT-style tokenizers still add
    [CLS]/[SEP]).
    """

    name = "toxicity"

    def __init__(self, model: str, label: str | int, device: str = "cpu", batch_size: int = 32,
                 max_length: int = 512) -> None:
        if batch_size < 1 or max_length < 1:
            raise UserError(f"batch_size and max_length must be >= 1, got {batch_size} and {max_length}")
        self.model_name = model
        self.device = resolve_device(device)
        self.batch_size = batch_size
        self.max_length = max_length
        from transformers import AutoModelForSequenceClassification

        self._tokenizer, self._model = load_pretrained(AutoModelForSequenceClassification, model,
                                                       "toxicity classifier")
        config = self._model.config
        self.label_index = resolve_label(label, dict(config.id2label or {}), int(config.num_labels), model)
        self.label_name = str((config.id2label or {}).get(self.label_index, self.label_index))
        if self._tokenizer.pad_token is None:
            if self._tokenizer.eos_token is None:
                raise UserError(f"tokenizer of classifier '{model}' has neither a pad nor an eos token")
            # Decoder classifiers (Llama-style) ship without a pad token; padding is masked out anyway.
            self._tokenizer.pad_token = self._tokenizer.eos_token
        if config.pad_token_id is None:
            config.pad_token_id = self._tokenizer.pad_token_id
        self._model.to(self.device).eval()

    def score(self, texts: list[str], prompts: list[str] | None = None,
              keep: Literal["start", "end"] = "start") -> list[float]:
        scores: list[float] = []
        # the tokenizer reads its truncation side from an attribute: set for this call only
        side, self._tokenizer.truncation_side = self._tokenizer.truncation_side, "left" if keep == "end" else "right"
        try:
            for start in range(0, len(texts), self.batch_size):
                scores.extend(self._probabilities(texts, start))
        finally:
            self._tokenizer.truncation_side = side
        return scores

    def _probabilities(self, texts: list[str], start: int) -> list[float]:
        """P(label) of texts[start:start + batch_size]."""
        # lone surrogates (which tokenizers reject) are scored as U+FFFD, as the reward server scores them
        batch = [scrub_surrogates(text) for text in texts[start:start + self.batch_size]]
        enc = self._tokenizer(batch, padding=True, truncation=True, max_length=self.max_length, return_tensors="pt")
        empty = (enc["attention_mask"].sum(dim=1) == 0).nonzero()
        if len(empty):
            i = start + int(empty[0])
            raise ExperimentError(f"classifier '{self.model_name}' tokenizer produced no tokens for text {i}: "
                                  f"{texts[i][:80]!r}")
        import torch  # loaded with the model; the term registry is read without it (--help)

        enc = {k: v.to(self.device) for k, v in enc.items()}
        with torch.no_grad():
            logits_NL = self._model(**enc).logits.float()
        if logits_NL.shape[-1] == 1:
            probs_N = torch.sigmoid(logits_NL[:, 0])
        else:
            probs_N = torch.softmax(logits_NL, dim=-1)[:, self.label_index]
        return [float(p) for p in probs_N.cpu()]


def make_toxicity_scorer(cfg: ToxicityConfig) -> Scorer:
    """The reward server's client when `cfg.url` is set (API key from env), else `make_classifier(cfg)`."""
    if cfg.url is not None:
        from purplerl.config import API_KEY_ENV
        from purplerl.rewards.client import HTTPScorer  # httpx only for runs that score over HTTP

        return HTTPScorer(cfg.url, api_key=os.environ.get(API_KEY_ENV) or None, timeout_s=cfg.timeout_s,
                          retries=cfg.retries, backoff_s=cfg.backoff_s)
    return make_classifier(cfg)


def make_classifier(cfg: ClassifierConfig) -> Scorer:
    """In-process scorer: 'embedded' -> EmbeddedToxicityScorer; anything else is an HF classifier id or path."""
    if cfg.model == "embedded":
        return EmbeddedToxicityScorer()
    if cfg.label is None:
        raise UserError(f"a label is required for HF classifier '{cfg.model}': its output name or index "
                        "(reward.toxicity.label, or serve-reward --label)")
    return HFClassifierScorer(cfg.model, cfg.label, device=cfg.device, batch_size=cfg.batch_size,
                              max_length=cfg.max_length)
