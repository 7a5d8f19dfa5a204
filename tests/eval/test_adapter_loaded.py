"""Wherever an adapter is given, it is the adapter that runs: LocalEngine(init_adapter), `purplerl sample
--checkpoint` and `purplerl eval --checkpoint` (tamper-test's attacked-from-adapter run is checked in
tests/recipes/test_tamper_verdict.py).

The adapter is the trained one from conftest (it answers every prompt with ADAPTER_WORD repeated). A fresh
LoRA computes exactly the base model, so these checks fail if a loader silently builds one instead.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from purplerl.config import ModelConfig
from purplerl.engines.local import LocalEngine
from purplerl.types import SamplingParams
from tests.conftest import ADAPTER_WORD, make_tiny_tokenizer

ANSWER = 4  # tokens of ADAPTER_WORD after the prompt


def _engine(model_dir: Path, adapter: Path | None) -> LocalEngine:
    return LocalEngine(ModelConfig(name=str(model_dir), device="cpu", dtype="float32", lora_rank=4,
                                   init_adapter=str(adapter) if adapter else None))


def _prompt_ids(text: str) -> list[int]:
    tokenizer = make_tiny_tokenizer()
    return tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                          add_generation_prompt=True))


def _hand_logprobs(model: torch.nn.Module, ids_1T: torch.Tensor) -> torch.Tensor:
    """log p(token t | tokens < t) for t = 1..T-1, straight from the model's logits."""
    with torch.no_grad():
        logits = model(input_ids=ids_1T).logits[0, :-1].float()
    return torch.log_softmax(logits, -1).gather(-1, ids_1T[0, 1:, None])[:, 0]


def test_init_adapter_scores_with_the_adapter_and_reference_with_the_base(
        tiny_model_dir: Path, trained_adapter_dir: Path, adapter_word_id: int) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    prompt = _prompt_ids("tell me about the sea")
    ids_1T = torch.tensor([prompt + [adapter_word_id] * ANSWER])
    targets_1T = torch.zeros_like(ids_1T)
    targets_1T[0, len(prompt):] = 1
    engine = _engine(tiny_model_dir, trained_adapter_dir)
    attention_1T = torch.ones_like(ids_1T)
    policy_T = engine.logprobs(ids_1T, attention_1T, targets_NT=targets_1T)[0, len(prompt):]
    reference_T = engine.logprobs(ids_1T, attention_1T, targets_NT=targets_1T, reference=True)[0, len(prompt):]

    base = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir)).eval()
    base_T = _hand_logprobs(base, ids_1T)[len(prompt) - 1:]
    adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(tiny_model_dir)),
                                        str(trained_adapter_dir)).eval()
    adapted_T = _hand_logprobs(adapted, ids_1T)[len(prompt) - 1:]
    assert policy_T.tolist() == pytest.approx(adapted_T.tolist(), abs=1e-4)
    assert reference_T.tolist() == pytest.approx(base_T.tolist(), abs=1e-4)
    # the trained adapter says the word with p > 0.5; the random base gives it about 1/400
    assert (policy_T > math.log(0.5)).all(), policy_T
    assert (reference_T < math.log(0.01)).all(), reference_T


def test_init_adapter_samples_from_the_adapter(tiny_model_dir: Path, trained_adapter_dir: Path,
                                               adapter_word_id: int) -> None:
    prompts = [_prompt_ids("hello world"), _prompt_ids("what is 17 + 25?")]
    greedy = SamplingParams(max_new_tokens=ANSWER, temperature=0.0)
    adapted = _engine(tiny_model_dir, trained_adapter_dir).sample(prompts, 1, greedy)
    assert [group[0].tokens for group in adapted] == [(adapter_word_id,) * ANSWER] * 2
    base = _engine(tiny_model_dir, None).sample(prompts, 1, greedy)
    assert all(adapter_word_id not in group[0].tokens for group in base), [g[0].tokens for g in base]


def _cli(*args: str | Path):
    from purplerl.cli import app

    result = CliRunner().invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return result.output


def test_sample_checkpoint_generates_from_the_adapter(tiny_model_dir: Path, trained_adapter_dir: Path) -> None:
    common = ["--prompt", "hello", "--prompt", "roast my friend", "--max-new-tokens", ANSWER, "--temperature", "0",
              "--device", "cpu"]
    # no --model: the base comes from the adapter's own adapter_config.json
    adapted = _cli("sample", "--checkpoint", trained_adapter_dir, *common)
    base = _cli("sample", "--model", tiny_model_dir, *common)
    words = (ADAPTER_WORD * ANSWER).strip()
    assert adapted.count(words) == 2, adapted
    assert ADAPTER_WORD.strip() not in base, base


def test_eval_checkpoint_generates_from_the_adapter(tiny_model_dir: Path, trained_adapter_dir: Path,
                                                    tmp_path: Path) -> None:
    out = tmp_path / "eval"
    _cli("eval", "--model", tiny_model_dir, "--checkpoint", trained_adapter_dir, "--suite", "diversity",
         "--limit", "3", "--max-new-tokens", ANSWER, "--temperature", "0", "--device", "cpu", "--out", out)
    label = trained_adapter_dir.resolve().name
    rows = {name: [json.loads(line) for line in (out / "generations" / f"{name}.jsonl").read_text().splitlines()]
            for name in ("base", label)}
    assert [r["completion"] for r in rows[label]] == [ADAPTER_WORD * ANSWER] * 3
    assert all(ADAPTER_WORD.strip() not in r["completion"] for r in rows["base"]), rows["base"]
    # the suite scored the adapter's text too: three identical answers are one unique answer in three
    result = json.loads((out / "eval.json").read_text())
    assert result["config"]["targets"][label] == str(trained_adapter_dir)
    assert result["targets"][label]["diversity"]["unique_fraction"] == pytest.approx(1 / 3)
