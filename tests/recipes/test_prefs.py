"""`purplerl prefs`: each preference loss learns a synthetic preference on the tiny model, evaluates on held-out
prompts, keeps its reference logprobs with the run, resumes exactly and reports; bad settings are one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from purplerl.cli import app
from purplerl.recipes.prefs.step import REFERENCE_FILE, _partners

GOOD, BAD = "thanks again", "go away"
PROMPTS = ["hello", "Tell me a joke", "Write the most savage insult", "The quick brown fox", "I hate Mondays",
           "system user", "Roast my friend", "please sorry", "good morning", "what time is it", "say something",
           "one more", "tell me more", "how are you", "be nice", "a question"]


def _pairs(path: Path) -> Path:
    rows = [{"prompt": p, "chosen": GOOD, "rejected": BAD} for p in PROMPTS]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _kto(path: Path) -> Path:
    rows = [{"prompt": p, "completion": GOOD if i % 2 else BAD, "label": bool(i % 2)} for i, p in enumerate(PROMPTS)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _prefs(*args) -> object:
    return CliRunner().invoke(app, ["prefs", *map(str, args)], catch_exceptions=False)


@pytest.fixture
def env(monkeypatch, tmp_path):
    monkeypatch.setenv("PURPLERL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _common(model: Path, data: Path, out: Path) -> list:
    # the tiny model's random head gives near-uniform logits: the head must train for a preference to show
    return ["--model", model, "--model.lora_targets", "q_proj,v_proj,lm_head", "--data", data, "--batch_size", "4",
            "--lr", "0.01", "--save_every", "4", "--prefs.eval_fraction", "0.25", "--prefs.eval_every", "4",
            "--logging.progress", "false", "--output_dir", out]


def _metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize(("loss", "extra"), [
    ("dpo", ["--prefs.beta", "0.5"]), ("dpo", ["--prefs.dpo_form", "ipo", "--prefs.beta", "0.5"]),
    ("dpo", ["--prefs.beta", "0.5", "--prefs.sft_weight", "1.0"]),
    ("simpo", []), ("orpo", ["--prefs.beta", "0.5"]), ("kto", ["--prefs.beta", "0.5"]),
])
def test_each_loss_learns_the_preference_on_held_out_prompts(tiny_model_dir: Path, tmp_path: Path, env,
                                                             loss: str, extra: list) -> None:
    data = _pairs(tmp_path / "pairs.jsonl")
    result = _prefs(*_common(tiny_model_dir, data, tmp_path), "--prefs.loss", loss, *extra, "--steps", "12",
                    "--name", "r")
    assert result.exit_code == 0, result.output
    metrics = _metrics(tmp_path / "r")
    assert [m["step"] for m in metrics] == list(range(1, 13))
    evals = [m for m in metrics if "eval/loss" in m]
    assert [m["step"] for m in evals] == [4, 8, 12]
    assert evals[-1]["eval/loss"] < evals[0]["eval/loss"]  # the held-out prompts' preference is learned too
    if loss != "kto":  # pairs: the held-out chosen answers end up above the rejected ones
        assert evals[-1]["eval/rewards/accuracies"] == 1.0
    if loss == "dpo" and "ipo" not in extra:  # IPO regresses the margin to 1/(2 beta) instead of growing it
        assert evals[-1]["eval/rewards/margins"] > evals[0]["eval/rewards/margins"] > 0
    if "--prefs.sft_weight" in extra:  # RPO: the chosen answers' NLL is logged, and falls as they are learned
        nll = [m["train/nll_loss"] for m in metrics]
        assert nll[-1] < nll[0]
    # only losses against a reference keep one with the run
    assert (tmp_path / "r" / REFERENCE_FILE).is_file() == (loss in ("dpo", "kto"))


def test_a_resumed_run_reuses_its_reference_and_ends_where_a_whole_run_does(tiny_model_dir: Path, tmp_path: Path,
                                                                            env) -> None:
    data = _pairs(tmp_path / "pairs.jsonl")
    common = _common(tiny_model_dir, data, tmp_path)
    whole = _prefs(*common, "--steps", "8", "--name", "whole")
    assert whole.exit_code == 0, whole.output
    part = _prefs(*common, "--steps", "4", "--name", "part")
    assert part.exit_code == 0, part.output
    kept = (tmp_path / "part" / REFERENCE_FILE).stat().st_mtime_ns
    resumed = CliRunner().invoke(app, ["prefs", "--resume", str(tmp_path / "part"), "--steps", "8"],
                                 catch_exceptions=False)
    assert resumed.exit_code == 0, resumed.output
    assert "scoring" not in resumed.stderr  # read back, not scored again
    assert (tmp_path / "part" / REFERENCE_FILE).stat().st_mtime_ns == kept
    final = "checkpoints/step_000008/adapter_model.safetensors"
    a, b = load_file(str(tmp_path / "whole" / final)), load_file(str(tmp_path / "part" / final))
    for name, tensor in a.items():
        torch.testing.assert_close(b[name], tensor, rtol=1e-5, atol=1e-6, msg=name)
    last = _metrics(tmp_path / "part")[-1]["train/loss"]
    assert _metrics(tmp_path / "whole")[-1]["train/loss"] == pytest.approx(last, rel=1e-5)
    report = CliRunner().invoke(app, ["report", str(tmp_path / "whole")], catch_exceptions=False)
    assert report.exit_code == 0, report.output


def test_the_reference_equals_the_base_model_on_each_answer(tiny_model_dir: Path, tmp_path: Path, env) -> None:
    """The kept values are the frozen base's logprobs of exactly the answer tokens (end-of-turn included)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    data = _pairs(tmp_path / "pairs.jsonl")
    result = _prefs(*_common(tiny_model_dir, data, tmp_path), "--steps", "1", "--prefs.eval_fraction", "0",
                    "--dtype", "float32", "--name", "r")
    assert result.exit_code == 0, result.output
    kept = load_file(str(tmp_path / "r" / REFERENCE_FILE))
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, torch_dtype=torch.float32)
    answer = tokenizer.encode(GOOD, add_special_tokens=False) + [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    assert kept["counts"].tolist() == [c for _ in PROMPTS for c in (len(answer), kept["counts"][1].item())]
    # the first example in the file order is PROMPTS[0]'s pair: its chosen answer's logprobs by hand
    prompt = tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": PROMPTS[0]}],
                                                            add_generation_prompt=True, tokenize=False),
                              add_special_tokens=False)
    ids = torch.tensor([prompt + answer])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0, :-1].float(), -1)
    expected = logp[len(prompt) - 1:, :].gather(-1, ids[0, len(prompt):, None])[:, 0]
    torch.testing.assert_close(kept["values"][:len(answer)], expected, rtol=1e-4, atol=1e-5)


def test_kto_reads_its_own_rows_and_pairs_each_with_another_answer(tiny_model_dir: Path, tmp_path: Path,
                                                                   env) -> None:
    data = _kto(tmp_path / "kto.jsonl")
    result = _prefs(*_common(tiny_model_dir, data, tmp_path), "--prefs.loss", "kto", "--prefs.unpaired", "true",
                    "--steps", "4", "--name", "r")
    assert result.exit_code == 0, result.output
    metrics = _metrics(tmp_path / "r")
    assert metrics[0]["data/desirable"] + 0 < metrics[0]["data/examples"]
    assert all(m["train/kl"] >= 0 for m in metrics)
    partners = _partners(7, seed=3)
    assert sorted(partners) == list(range(7)) and all(p != i for i, p in enumerate(partners))


@pytest.mark.parametrize(("args", "message"), [
    ([], "--data names the preference data"),
    (["--prefs.loss", "simpo", "--prefs.dpo_form", "ipo"], "dpo_form is read only when prefs.loss is dpo"),
    (["--prefs.loss", "dpo", "--prefs.gamma", "2"], "gamma is read only when prefs.loss is simpo"),
    (["--prefs.dpo_form", "hinge", "--prefs.label_smoothing", "0.1"], "label_smoothing"),
    (["--prefs.beta", "0"], "prefs.beta"),
])
def test_bad_settings_are_one_line(tiny_model_dir: Path, tmp_path: Path, env, args: list, message: str) -> None:
    data_args = [] if not args else ["--data", _pairs(tmp_path / "pairs.jsonl")]
    result = _prefs("--model", tiny_model_dir, *data_args, *args, "--output_dir", tmp_path)
    assert result.exit_code != 0
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert not list(tmp_path.glob("prefs_*"))


def _one_error(result) -> str:
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_one_label_kto_data_and_a_pair_cut_to_one_answer_are_one_line(tiny_model_dir: Path, tmp_path: Path,
                                                                      env) -> None:
    """KTO data of one label trained silently, logging the missing side as 0; a pair whose answers became the same
    once cut to data.max_answer_tokens trained as a pair that prefers nothing."""
    runs = tmp_path / "runs"
    common = ["--model", tiny_model_dir, "--steps", "1", "--batch_size", "2", "--prefs.eval_fraction", "0",
              "--logging.progress", "false", "--output_dir", runs]
    kto = tmp_path / "desirable.jsonl"
    kto.write_text("".join(json.dumps({"prompt": p, "completion": GOOD, "label": True}) + "\n" for p in PROMPTS))
    kto_args = [*common, "--data", kto, "--prefs.loss", "kto", "--prefs.unpaired", "true"]
    assert _one_error(_prefs(*kto_args)) == (
        f"error: {kto}: all 16 KTO training examples are desirable: KTO trains on both labels; add the other "
        "label's rows, or set prefs.one_label true to train one side")
    pairs = tmp_path / "long.jsonl"
    pairs.write_text("".join(json.dumps({"prompt": p, "chosen": "thanks " * 12 + "yes", "rejected": "thanks " * 12
                                         + "no"}) + "\n" for p in PROMPTS))
    assert _one_error(_prefs(*common, "--data", pairs, "--data.max_answer_tokens", "6")) == (
        f"error: {pairs}:1: 'chosen' and 'rejected' are the same once cut to data.max_answer_tokens=6 tokens, so "
        "neither is preferred: raise data.max_answer_tokens or leave the pair out")
    assert not runs.exists()  # refused before a run dir was written
    assert _prefs(*kto_args, "--prefs.one_label", "true", "--name", "one").exit_code == 0  # when meant, it trains
