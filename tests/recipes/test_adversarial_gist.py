"""The adversarial defender with gist tokens (dialogue.gist_tokens K): its prompts carry K gist tokens after each
earlier answer, fitted with them counted; it samples, is scored against the base and trains under the gist mask
(a fresh adapter is the base, so its sampled logprobs are the reference's to fp32's bound, and they are not the
plain causal forward's); a run of two turns goes end to end, and the settings it cannot use are refused in one
line."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest
import torch

from purplerl.data.gist import first_keys, gist_token_id, insert_gists
from purplerl.engines import make_engine
from purplerl.errors import UserError
from purplerl.prompting import render_prompt
from purplerl.recipes.adversarial.dialogue import ATTACKER, DEFENDER, Prompter, Shape, rollout
from purplerl.recipes.adversarial.step import _draw_params, _side, train_side
from purplerl.runs.layout import METRICS_FILE
from purplerl.train.runner import run_recipe
from purplerl.types import PromptRecord
from tests.recipes.test_adversarial import ADVERSARIAL, A, B, E, G, _config, _rows, _run, judges  # noqa: F401
from tests.tolerances import logprob_atol

K = 2


def _whole(tokenizer, messages: list[dict[str, str]]) -> list[int]:
    return render_prompt(tokenizer, PromptRecord(messages=tuple(messages)), "chat", None, 10**6)


def test_the_defender_prompt_has_k_gist_tokens_after_each_answer_and_fits_with_them(tiny_tokenizer) -> None:
    turns = ["first attack " * 3, "first reply " * 3, "second attack", "second reply", "third attack"]
    dialogue = [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(turns)]
    gid = gist_token_id(tiny_tokenizer)
    whole = _whole(tiny_tokenizer, dialogue)
    prompter = Prompter(tiny_tokenizer, "chat", None, len(whole) + 2 * K, K, gid)
    ids, keys = prompter.defender_prompt(dialogue)
    ends = [i for i in range(len(whole) + 1) if tiny_tokenizer.decode(whole[:i]).endswith("<|im_end|>\n")][1::2]
    expected, _, blocks = insert_gists(whole, [0.0] * len(whole), ends, K, gid)
    assert ids == expected and len(ids) == len(whole) + 2 * K and ids.count(gid) == 2 * K
    assert keys == first_keys(len(ids), blocks, K) and keys[-1] == blocks[-1]
    assert tiny_tokenizer.decode(ids[blocks[-1] + K:]).startswith("<|im_start|>user\nthird attack")
    assert prompter.take_cuts()[DEFENDER] == 0
    # one token short with the gist tokens counted (the plain prompt would fit): the first exchange goes
    short = Prompter(tiny_tokenizer, "chat", None, len(whole) + 2 * K - 1, K, gid)
    ids, keys = short.defender_prompt(dialogue)
    shorter = _whole(tiny_tokenizer, dialogue[2:])
    assert len(ids) == len(shorter) + K and ids.count(gid) == K and short.take_cuts()[DEFENDER] == 1
    assert "first reply" not in tiny_tokenizer.decode(ids)


@pytest.fixture
def gisted(tiny_model_dir: Path, tmp_path: Path):
    config = _config(tiny_model_dir, tmp_path, "--turns", "2", "--dialogue.gist_tokens", str(K), "--lr", "5e-2",
                     "--dtype", "float32")
    engine = make_engine(config.model, seed=config.training.seed)
    step_fn, _ = ADVERSARIAL.prepare(config)(engine, tmp_path / "run")
    return engine, step_fn.keywords["parts"], config


def test_the_gist_defender_samples_scores_and_trains_under_the_gist_mask(gisted) -> None:
    engine, parts, config = gisted
    goals = parts.sampler.batch(0)
    rnd = rollout(engine, goals, Shape(len(goals), A, G, 2), parts.prompter, partial(_draw_params, config, 1))
    gid = gist_token_id(engine.tokenizer)
    replies = [c for turn in rnd.replies for c in turn]
    keys = [k for turn in rnd.reply_keys for k in turn]
    for i, (reply, first) in enumerate(zip(replies, keys, strict=True)):
        turn, e = divmod(i, E)
        prompt = parts.prompter.defender_prompt(rnd.dialogues[e][:2 * turn + 1])
        assert list(reply.prompt_tokens) == prompt[0] and first == prompt[1]
        assert reply.prompt_tokens.count(gid) == K * turn  # none at turn 1, one block after the first answer
    for attack in (c for turn in rnd.attacks for c in turn):
        assert gid not in attack.prompt_tokens  # the attacker reads the dialogue whole
    defender = _side(engine, replies, config, keys)
    mask_NT, sampled = defender.tensors["loss_mask_NT"], defender.tensors["sampling_logprobs_NT"]
    width = mask_NT.shape[1]
    atol = logprob_atol(torch.float32, engine.trainer.causal_lm.config, width, float(sampled.abs().max()))
    # the fresh defender adapter is the base: what it drew is what the base scores under the same mask
    torch.testing.assert_close(defender.ref_NT * mask_NT, sampled, rtol=0, atol=atol)
    plain = _side(engine, replies, config)
    later = slice(E, 2 * E)  # the second turn's answers read the first through the gist block
    assert float((plain.ref_NT[later] - sampled[later]).abs().max()) > 10 * atol  # a near-uniform tiny model
    assert float(defender.kl_N.abs().max()) <= atol * width
    before = [p.detach().clone() for n, p in engine.model.named_parameters() if "lora_" in n and f".{DEFENDER}." in n]
    metrics = train_side(engine, DEFENDER, defender, torch.linspace(-1, 1, len(replies)), config, 1)
    after = [p for n, p in engine.model.named_parameters() if "lora_" in n and f".{DEFENDER}." in n]
    assert metrics["loss"] == metrics["loss"] and any(not torch.equal(a, b) for a, b in zip(before, after,
                                                                                             strict=True))
    assert ATTACKER in engine.adapters


def test_a_two_turn_gist_run_goes_end_to_end(tiny_model_dir: Path, tmp_path: Path) -> None:
    run_dir = _run(tiny_model_dir, tmp_path, "--steps", "2", "--turns", "2", "--dialogue.gist_tokens", str(K),
                   "--name", "gist")
    metrics = _rows(run_dir, METRICS_FILE)
    assert [m["step"] for m in metrics] == [1, 2] and [m["train/attacker"] for m in metrics] == [1.0, 0.0]
    assert all(m["defender_kl/mean"] == m["defender_kl/mean"] for m in metrics)  # finite, not NaN
    assert len(_rows(run_dir)) == 2 * 2 * E
    # the attention's cost per answer token: the first turns are the plain run's (same draws, no history), the
    # second ones read the history through K gist tokens instead of whole
    plain = _rows(_run(tiny_model_dir, tmp_path, "--steps", "1", "--turns", "2", "--name", "plain"), METRICS_FILE)[0]
    first = metrics[0]
    assert first["dialogue/defender_keys_turn1"] == pytest.approx(plain["dialogue/defender_keys_turn1"])
    assert first["dialogue/defender_keys_turn2"] < plain["dialogue/defender_keys_turn2"] - 10


@pytest.mark.parametrize("args, says", [
    (["--dialogue.gist_tokens", "2"], "dialogue.gist_tokens 2 needs adversarial.turns > 1"),
    (["--turns", "2", "--dialogue.gist_tokens", "2", "--data.template", "base"], "needs data.template chat"),
    (["--turns", "2", "--dialogue.gist_tokens", "-1"], "dialogue.gist_tokens"),
])
def test_a_gist_setting_it_cannot_use_is_one_line(args: list[str], says: str, tiny_model_dir: Path,
                                                  tmp_path: Path) -> None:
    with pytest.raises(UserError, match=says) as err:
        run_recipe(ADVERSARIAL, _config(tiny_model_dir, tmp_path, *args))
    assert "\n" not in str(err.value)
