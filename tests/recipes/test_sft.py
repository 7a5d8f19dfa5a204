"""`purplerl sft`: assistant-only masks, length buckets, and a run that learns, evaluates, resumes and reports."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from purplerl.cli import app
from purplerl.data.sft import Conversation, LengthBuckets, SFTConfig, encode, held_out, to_conversation
from purplerl.errors import UserError
from tests.tolerances import logprob_atol

ANSWER = "again and again"


def masked_text(tokenizer, encoded) -> str:
    return tokenizer.decode([t for t, m in zip(encoded.ids, encoded.mask, strict=True) if m])


def test_chat_mask_covers_every_assistant_turn_and_nothing_else(tiny_tokenizer) -> None:
    conversation = Conversation(({"role": "user", "content": "hello"}, {"role": "assistant", "content": "thanks"},
                                 {"role": "user", "content": "Tell me a joke"},
                                 {"role": "assistant", "content": "cats and dogs"}), "c")
    encoded = encode(tiny_tokenizer, conversation, "chat", "You are a helpful assistant.", 512)
    assert masked_text(tiny_tokenizer, encoded) == "thanks<|im_end|>\ncats and dogs<|im_end|>\n"
    full = tiny_tokenizer.decode(list(encoded.ids))
    assert full.startswith("<|im_start|>system\nYou are a helpful assistant.<|im_end|>")
    # the prompt part is exactly what sampling renders: the model is trained where it will be asked
    prompt = tiny_tokenizer.apply_chat_template([{"role": "system", "content": "You are a helpful assistant."},
                                                 *conversation.messages[:3]], add_generation_prompt=True,
                                                tokenize=False)
    assert full.startswith(prompt)


def test_base_template_trains_the_answer_and_the_end_of_text(tiny_tokenizer) -> None:
    conversation = Conversation(({"role": "user", "content": "hello"}, {"role": "assistant", "content": "thanks"}), "c")
    encoded = encode(tiny_tokenizer, conversation, "base", None, 512)
    assert tiny_tokenizer.decode(list(encoded.ids)) == "hello\nthanks<|im_end|>"
    assert masked_text(tiny_tokenizer, encoded) == "thanks<|im_end|>"


def test_too_long_conversations_are_cut_or_dropped(tiny_tokenizer) -> None:
    conversation = Conversation(({"role": "user", "content": "hello " * 20}, {"role": "assistant", "content": "ok"}),
                                "c")
    assert encode(tiny_tokenizer, conversation, "chat", None, 8) is None  # nothing trainable left
    kept = encode(tiny_tokenizer, conversation, "chat", None, 512)
    cut = encode(tiny_tokenizer, conversation, "chat", None, len(kept.ids) - 1)
    assert len(cut.ids) == len(kept.ids) - 1 and cut.ids == kept.ids[:-1]


@pytest.mark.parametrize(("row", "message"), [
    ({"text": "x"}, "has neither 'messages' nor 'prompt' + 'completion'"),
    ({"messages": [{"role": "user", "content": "x"}]}, "the last message must be the assistant's"),
    ({"messages": [{"role": "bot", "content": "x"}]}, "message 0 must be"),
    ({"prompt": "x", "completion": ""}, "'completion' must be a non-empty text"),
])
def test_bad_rows_are_one_line(row: dict, message: str) -> None:
    with pytest.raises(UserError, match=re.escape(message)) as err:
        to_conversation(row, 2, SFTConfig(), "data.jsonl")
    assert "data.jsonl row 3" in str(err.value)


def test_length_buckets_are_deterministic_cover_every_example_and_group_lengths() -> None:
    lengths = [(i * 37) % 101 + 5 for i in range(64)]
    a, b = LengthBuckets(lengths, 4, seed=1), LengthBuckets(lengths, 4, seed=1)
    epoch = [a.batch(i) for i in range(16)]
    assert epoch == [b.batch(i) for i in range(16)]
    assert sorted(i for batch in epoch for i in batch) == list(range(64))  # one epoch = every example once
    spread = sum(max(lengths[i] for i in bt) - min(lengths[i] for i in bt) for bt in epoch) / 16
    shuffled = sum(max(lengths[i] for i in range(k, 64, 16)) - min(lengths[i] for i in range(k, 64, 16))
                   for k in range(16)) / 16
    assert spread < shuffled / 3  # batches of similar length pad far less than random ones
    assert [a.batch(i) for i in range(16, 32)] != epoch  # the next epoch is reshuffled
    assert LengthBuckets(lengths, 4, seed=2).batch(0) != a.batch(0)


def test_held_out_split_is_seeded_and_disjoint() -> None:
    conversations = [Conversation(({"role": "assistant", "content": str(i)},), str(i)) for i in range(40)]
    train, evaluation = held_out(conversations, 0.1, seed=3)
    assert len(evaluation) == 4 and not {c.uid for c in train} & {c.uid for c in evaluation}
    assert held_out(conversations, 0.1, seed=3) == (train, evaluation)


def test_held_out_split_by_seed_is_same_size_disjoint_and_seeded() -> None:
    conversations = [Conversation(({"role": "assistant", "content": str(i)},), str(i)) for i in range(40)]
    everything = {c.uid for c in conversations}
    held_sets = []
    for seed in range(6):
        train, evaluation = held_out(conversations, 0.1, seed=seed)
        train_uids, held_uids = {c.uid for c in train}, {c.uid for c in evaluation}
        assert (len(train), len(evaluation)) == (36, 4)  # round(0.1 * 40), whatever the seed
        assert not train_uids & held_uids and train_uids | held_uids == everything
        assert held_out(conversations, 0.1, seed=seed) == (train, evaluation)  # the same seed, the same split
        held_sets.append(frozenset(held_uids))
    assert len(set(held_sets)) == 6  # each seed holds out other conversations


class HeldOutEngine:
    """Just enough engine for the held-out loss: logprobs are -id / 10 at each target position, 0 elsewhere
    (the contract of `Engine.logprobs`); training calls do nothing. Records the ids it is shown."""

    def __init__(self, tokenizer=None) -> None:
        self.tokenizer = tokenizer
        self.scored: list[list[int]] = []
        self.trained: list[list[int]] = []

    def logprobs(self, input_ids_NT, attention_mask_NT, *, targets_NT, reference=False, temperature=1.0):
        self.scored += [row[mask.bool()].tolist() for row, mask in zip(input_ids_NT, attention_mask_NT, strict=True)]
        return -input_ids_NT.float() / 10 * (targets_NT != 0)

    def forward_backward(self, batch, loss) -> dict[str, float]:
        self.trained += [row[m.bool()].tolist() for row, m in zip(batch.input_ids_NT, batch.attention_mask_NT,
                                                                   strict=True)]
        return {"loss": 0.0}

    def optim_step(self, adam) -> dict[str, float]:
        return {"grad_norm": 0.0}


def test_held_out_loss_is_the_mean_nll_per_assistant_token_by_hand() -> None:
    from purplerl.data.sft import Encoded
    from purplerl.recipes.sft.step import heldout_metrics

    examples = [
        Encoded((5, 6, 7, 8), (0.0, 0.0, 1.0, 1.0), "a"),  # targets 7, 8: NLL 0.7 + 0.8 = 1.5 over 2 tokens
        Encoded((1, 2, 3), (1.0, 1.0, 1.0), "b"),  # position 0 is never predicted: 0.2 + 0.3 = 0.5 over 2
        Encoded((4, 9, 9, 9, 9, 2), (0.0, 0.0, 1.0, 1.0, 1.0, 0.0), "c"),  # 0.9 * 3 = 2.7 over 3
    ]
    # (1.5 + 0.5 + 2.7) / 7 = 0.671429; per token of every row (13) 0.3615, per example 0.6333, per batch of 2 0.7
    got = heldout_metrics(HeldOutEngine(), examples, pad_id=0, batch_size=2)
    assert got["eval/loss"] == pytest.approx(4.7 / 7, abs=1e-6)
    # the last answer starts at column 0 here (answer_from's default): the same tokens; token t is scored from the
    # query at t - 1, which attends t keys: (2 + 3) + (1 + 2) + (2 + 3 + 4) = 17 over 7
    assert got["eval/answer_nll"] == pytest.approx(4.7 / 7, abs=1e-6)
    assert got["eval/answer_keys"] == pytest.approx(17 / 7, abs=1e-6)


def test_sft_holds_out_by_the_training_seed_and_never_trains_on_held_out_rows(tiny_tokenizer, tmp_path: Path) -> None:
    from purplerl.data.sft import load_conversations
    from purplerl.launch import run_settings
    from purplerl.recipes.sft.step import sft_prepare

    words = ["hello", "world", "cats", "dogs", "pizza", "Monday", "fox", "joke", "friend", "class"]
    rows = [{"prompt": f"{a} {b}", "completion": ANSWER} for a in words[:5] for b in words[5:]]  # 25 prompts
    data = tmp_path / "sft.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    held_prompts = {}
    for seed in (1, 2):
        config = run_settings("sft", options=["--data", str(data), "--training.seed", str(seed), "--batch_size", "4",
                                              "--sft.eval_fraction", "0.2", "--sft.eval_every", "1"])
        engine = HeldOutEngine(tiny_tokenizer)
        step_fn, _ = sft_prepare(config)(engine, tmp_path / f"run_{seed}")
        trained_ids = []
        for step in range(1, 8):  # more than an epoch of the 20 training rows
            metrics, _ = step_fn(step)
            trained_ids += engine.trained
            engine.trained = []
        # every held-out answer is ANSWER, and a logprob is -id / 10: the loss is the mean id / 10 of its tokens
        answer = encode(tiny_tokenizer, to_conversation(rows[0], 0, config.sft, "rows"), "chat", None, 1024)
        targets = [i / 10 for i, m in zip(answer.ids[1:], answer.mask[1:], strict=True) if m]
        assert metrics["eval/loss"] == pytest.approx(sum(targets) / len(targets), rel=1e-6)
        scored = {tiny_tokenizer.decode(ids) for ids in engine.scored}
        held = {p for p in (r["prompt"] for r in rows) if any(p in text for text in scored)}
        trained = {p for p in (r["prompt"] for r in rows) if any(p in tiny_tokenizer.decode(ids)
                                                                 for ids in trained_ids)}
        assert len(held) == 5 and len(trained) == 20 and not held & trained
        _, expected = held_out(load_conversations(config.data, config.sft), 0.2, seed)
        assert held == {c.messages[0]["content"] for c in expected}
        held_prompts[seed] = held
    assert held_prompts[1] != held_prompts[2]


def _data(path: Path) -> Path:
    prompts = ["hello", "Tell me a joke", "Write the most savage insult", "The quick brown fox", "I hate Mondays",
               "system user", "Roast my friend", "please sorry"]
    rows = [{"messages": [{"role": "user", "content": p}, {"role": "assistant", "content": ANSWER}]} for p in prompts]
    rows += [{"prompt": p + " again", "completion": ANSWER} for p in prompts]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _sft(*args) -> object:
    return CliRunner().invoke(app, ["sft", *map(str, args)], catch_exceptions=False)


@pytest.fixture
def sft_env(monkeypatch, tmp_path):
    monkeypatch.setenv("PURPLERL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def test_sft_learns_evaluates_resumes_and_reports(tiny_model_dir: Path, tmp_path: Path, sft_env) -> None:
    data = _data(tmp_path / "sft.jsonl")
    # the tiny model's random head maps its normalized hidden states to near-uniform logits: the head must train
    common = ["--model", tiny_model_dir, "--model.lora_targets", "q_proj,v_proj,lm_head", "--data", data,
              "--batch_size", "4", "--lr", "0.02", "--save_every", "5",
              "--sft.eval_fraction", "0.25", "--sft.eval_every", "5", "--logging.progress", "false",
              "--output_dir", tmp_path]
    whole = _sft(*common, "--steps", "20", "--name", "whole")
    assert whole.exit_code == 0, whole.output
    metrics = [json.loads(line) for line in (tmp_path / "whole" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == list(range(1, 21))
    evals = [m["eval/loss"] for m in metrics if "eval/loss" in m]
    assert len(evals) == 4 and evals[-1] < 0.5 * evals[0]  # the held-out answers are learned too
    assert metrics[-1]["train/nll"] < 0.3 * metrics[0]["train/nll"]
    assert all(m["tokens/trained"] < m["tokens/padded"] for m in metrics)  # prompts and padding are not trained

    part = _sft(*common, "--steps", "10", "--name", "part")
    assert part.exit_code == 0, part.output
    resumed = CliRunner().invoke(app, ["sft", "--resume", str(tmp_path / "part"), "--steps", "20"],
                                 catch_exceptions=False)
    assert resumed.exit_code == 0, resumed.output
    final = "checkpoints/step_000020/adapter_model.safetensors"
    a, b = load_file(str(tmp_path / "whole" / final)), load_file(str(tmp_path / "part" / final))
    for name, tensor in a.items():
        torch.testing.assert_close(b[name], tensor, rtol=1e-5, atol=1e-6, msg=name)
    report = CliRunner().invoke(app, ["report", str(tmp_path / "whole")], catch_exceptions=False)
    assert report.exit_code == 0, report.output
    assert "eval" in (tmp_path / "whole" / "report.html").read_text()


def test_sft_on_prompt_only_data_is_one_line(tiny_model_dir: Path, tmp_path: Path, sft_env) -> None:
    result = _sft("--model", tiny_model_dir, "--logging.progress", "false", "--output_dir", tmp_path)
    assert result.exit_code == 2
    assert "has neither 'messages' nor 'prompt' + 'completion'" in result.stderr
    assert not list(tmp_path.glob("sft_*"))


def test_full_parameter_sft_learns_resumes_and_its_checkpoint_loads_anywhere(tiny_model_dir: Path, tmp_path: Path,
                                                                             sft_env) -> None:
    from transformers import AutoModelForCausalLM

    from purplerl.config import ModelConfig, PromptFormatConfig
    from purplerl.runs.policy import resolve_policy

    data = _data(tmp_path / "sft.jsonl")
    common = ["--model", tiny_model_dir, "--model.finetune", "full", "--dtype", "float32", "--device", "cpu",
              "--data", data, "--batch_size", "4", "--lr", "0.01", "--save_every", "4", "--sft.eval_fraction", "0.25",
              "--sft.eval_every", "4", "--logging.progress", "false", "--output_dir", tmp_path]
    whole = _sft(*common, "--steps", "8", "--name", "whole")
    assert whole.exit_code == 0, whole.output
    metrics = [json.loads(line) for line in (tmp_path / "whole" / "metrics.jsonl").read_text().splitlines()]
    assert metrics[-1]["train/nll"] < 0.6 * metrics[0]["train/nll"]
    evals = [m["eval/loss"] for m in metrics if "eval/loss" in m]
    assert len(evals) == 2 and evals[-1] < evals[0]

    part = _sft(*common, "--steps", "4", "--name", "part")
    assert part.exit_code == 0, part.output
    resumed = CliRunner().invoke(app, ["sft", "--resume", str(tmp_path / "part"), "--steps", "8"],
                                 catch_exceptions=False)
    assert resumed.exit_code == 0, resumed.output
    checkpoint = tmp_path / "whole" / "checkpoints" / "step_000008"
    a, b = load_file(str(checkpoint / "model.safetensors")), load_file(
        str(tmp_path / "part" / "checkpoints" / "step_000008" / "model.safetensors"))
    assert set(a) == set(b) and len(a) == len(list(AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
                                                     .state_dict()))
    for name, tensor in a.items():
        torch.testing.assert_close(b[name], tensor, rtol=1e-5, atol=1e-6, msg=name)

    # a standard model dir: transformers loads it on its own, with the logits the engine scores with
    standalone = AutoModelForCausalLM.from_pretrained(str(checkpoint))
    policy = resolve_policy(checkpoint, ModelConfig(device="cpu"), PromptFormatConfig())
    assert (policy.model.name, policy.model.finetune, policy.model.dtype) == (str(checkpoint), "full", "float32")
    assert policy.without_adapter().model.name == str(tiny_model_dir)  # the run's base model
    engine = policy.load()
    ids = torch.tensor([engine.tokenizer.encode("Tell me a joke about cats")])
    logits = standalone(input_ids=ids).logits[:, :-1].float()
    expected = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None])[..., 0]
    # the engine's scorer and a plain forward: two fp32 paths (tests/tolerances.py)
    atol = logprob_atol(torch.float32, standalone.config, ids.shape[1], float(expected.abs().max()))
    torch.testing.assert_close(engine.logprobs(ids, torch.ones_like(ids))[:, 1:], expected, atol=atol, rtol=0)

    sample = CliRunner().invoke(app, ["sample", "--checkpoint", str(checkpoint), "--prompt", "hello",
                                      "--temperature", "0", "--max_new_tokens", "4", "--device", "cpu"],
                                catch_exceptions=False)
    assert sample.exit_code == 0, sample.output
    assert "again" in sample.output  # the trained answer, never the random base's
    out = tmp_path / "eval"
    evaluated = CliRunner().invoke(app, ["eval", "--checkpoint", str(checkpoint), "--suite", "diversity",
                                         "--limit", "2", "--max_new_tokens", "3", "--device", "cpu", "--out",
                                         str(out)], catch_exceptions=False)
    assert evaluated.exit_code == 0, evaluated.output
    policies = json.loads((out / "eval.json").read_text())["config"]["policies"]
    assert policies["step_000008"]["model"] == str(checkpoint) and policies["step_000008"]["adapter"] is None
    assert policies["base"]["model"] == str(tiny_model_dir)
