"""A random-weight twin of a model: the same config and tokenizer, weights drawn from the config's initializer.

For running `make bench` where the real weights cannot be brought (a machine with no hub access and no room for
the embedded model): the throughput of a step depends on the shapes, the token counts and the code, not on the
weights. One thing does change: a random model almost never draws an end-of-sequence token, so every completion
runs to the full max_new_tokens (the most work per step), and the reward curve says nothing about learning.

Run: .venv/bin/python bench/random_twin.py SOURCE TARGET [--seed 0]
SOURCE needs only config.json and the tokenizer files (no weights); TARGET gets a loadable safetensors model dir.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import torch

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "generation_config.json", "vocab.json", "merges.txt")


def make_twin(source: Path, target: Path, seed: int = 0) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    if not (source / "config.json").is_file():
        raise SystemExit(f"{source} has no config.json")
    config = AutoConfig.from_pretrained(source)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    target.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(target)
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copy2(source / name, target / name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path)
    parser.add_argument("target", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    make_twin(args.source, args.target, args.seed)
    print(f"random-weight twin of {args.source} written to {args.target}")


if __name__ == "__main__":
    main()
