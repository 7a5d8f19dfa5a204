"""Attacker SFT (issue 23 item 2): `purplerl sft` trains on the attack-prompts set as written, the loss on the attack
prompt only, and leaves an attacker adapter in its run dir."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from purplerl.cli import app
from purplerl.data.attack_prompts import prepare_attack_prompts

LIMIT = 6


@pytest.fixture(scope="module")
def attack_set(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return prepare_attack_prompts(tmp_path_factory.mktemp("attack_prompts")).out_dir


class RecordingEngine:
    """Just enough engine for sft's step: records each training batch and trains nothing."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.batches: list = []

    def forward_backward(self, batch, loss) -> dict[str, float]:
        self.batches.append(batch)
        return {"nll": 1.0}

    def optim_step(self, adam) -> dict[str, float]:
        return {"grad_norm": 0.0}


def test_the_loss_mask_covers_the_attack_prompt_and_nothing_else(attack_set: Path, tiny_tokenizer,
                                                                 tmp_path: Path) -> None:
    from purplerl.launch import run_settings
    from purplerl.recipes.sft.step import sft_prepare

    rows = [json.loads(line) for line in (attack_set / "train.jsonl").read_text().splitlines()[:LIMIT]]
    config = run_settings("sft", options=["--data", str(attack_set / "train.jsonl"), "--data.limit", str(LIMIT),
                                          "--batch_size", "3", "--sft.eval_fraction", "0"], base={"recipe": "sft"})
    engine = RecordingEngine(tiny_tokenizer)
    step_fn, _ = sft_prepare(config)(engine, tmp_path / "run")
    for step in (1, 2):  # one epoch of the 6 rows
        step_fn(step)
    seen = []
    for batch in engine.batches:
        for ids, attention, mask in zip(batch.input_ids_NT, batch.attention_mask_NT, batch.loss_mask_NT, strict=True):
            ids = ids[attention.bool()].tolist()
            trained = tiny_tokenizer.decode([t for t, m in zip(ids, mask.tolist(), strict=False) if m])
            untrained = tiny_tokenizer.decode([t for t, m in zip(ids, mask.tolist(), strict=False) if not m])
            row = next(r for r in rows if r["messages"][1]["content"] in tiny_tokenizer.decode(ids))
            user, attack = row["messages"]
            assert trained == attack["content"] + "<|im_end|>\n"  # the attack and its end of turn, all of it
            # the rest is the attacker's request as sampling renders it: never trained on
            assert untrained == tiny_tokenizer.apply_chat_template([user], add_generation_prompt=True, tokenize=False)
            seen.append(row["uid"])
    assert sorted(seen) == sorted(r["uid"] for r in rows)


def test_sft_on_the_attack_set_writes_an_attacker_adapter(attack_set: Path, tiny_model_dir: Path, tmp_path: Path,
                                                          monkeypatch) -> None:
    monkeypatch.setenv("PURPLERL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    result = CliRunner().invoke(app, [
        "sft", "--model", str(tiny_model_dir), "--data", str(attack_set / "train.jsonl"), "--data.limit", str(LIMIT),
        "--steps", "2", "--batch_size", "2", "--save_every", "2", "--sft.eval_fraction", "0", "--device", "cpu",
        "--logging.progress", "false", "--output_dir", str(tmp_path), "--name", "attacker"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    run = tmp_path / "attacker"
    checkpoint = run / "checkpoints" / "step_000002"
    adapter_config = json.loads((checkpoint / "adapter_config.json").read_text())
    assert adapter_config["peft_type"] == "LORA" and adapter_config["base_model_name_or_path"] == str(tiny_model_dir)
    weights = load_file(str(checkpoint / "adapter_model.safetensors"))
    lora_b = [t for name, t in weights.items() if "lora_B" in name]
    assert lora_b and any(float(t.abs().sum()) > 0 for t in lora_b)  # B starts at zero: two steps moved it
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(torch.isfinite(torch.tensor(m["train/nll"])) and m["train/nll"] > 0 for m in metrics)
    assert all(0 < m["tokens/trained"] < m["tokens/padded"] for m in metrics)
