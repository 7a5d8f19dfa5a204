"""`purplerl adversarial`, each side on its own: the defender's replies are drawn by the defender's adapter once the
two adapters differ, each side pays its own KL weight (in its reward, or in its loss), and a judgement exactly at
adversarial.judge.unsafe_at is an attack success. The adapters are made to differ by starting one or both from the
trained adapter of tests/conftest.py (it answers every prompt with ADAPTER_WORD, about 5 nats per token from the
base)."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch

from purplerl.engines import make_engine
from purplerl.engines.local import LocalEngine
from purplerl.recipes.adversarial.dialogue import ATTACKER, DEFENDER, Shape, rollout
from purplerl.recipes.adversarial.step import _draw_params
from purplerl.rewards.registry import REWARD_TERMS, text_term
from purplerl.runs.layout import METRICS_FILE
from tests.recipes.test_adversarial import (
    ADVERSARIAL,
    A,
    B,
    E,
    G,
    _config,
    _rows,
    _run,
    judges,  # noqa: F401 -- an autouse fixture: the e_share judge
)
from tests.tolerances import logprob_atol

AT = 0.25  # a threshold a float32 judgement can equal exactly


class ThresholdJudge:
    """P(unsafe) = AT for the even-numbered conversations of each call, 0 for the odd ones."""

    name = "at_threshold"

    def score_conversations(self, conversations: list[list[dict[str, str]]]) -> list[float]:
        return [AT if i % 2 == 0 else 0.0 for i in range(len(conversations))]


def _mean(rows: list[dict[str, Any]], key: str) -> float:
    return sum(row[key] for row in rows) / len(rows)


def test_every_reply_is_drawn_by_the_defenders_adapter(tiny_model_dir: Path, trained_adapter_dir: Path,
                                                       adapter_word_id: int, tmp_path: Path) -> None:
    # the defender starts from the trained adapter, the attacker from the base: a completion's sampling logprobs are
    # those of the adapter that drew it, and the two adapters' logprobs of it lie far apart
    config = _config(tiny_model_dir, tmp_path, "--turns", "2", "--dtype", "float32", "--init_adapter",
                     str(trained_adapter_dir))
    engine = make_engine(config.model, seed=config.training.seed)
    step_fn, _ = ADVERSARIAL.prepare(config)(engine, tmp_path / "run")
    parts = step_fn.keywords["parts"]
    goals = parts.sampler.batch(0)
    rnd = rollout(engine, goals, Shape(len(goals), A, G, 2), parts.prompter, partial(_draw_params, config, 1))
    drawn = {DEFENDER: [c for turn in rnd.replies for c in turn], ATTACKER: [c for turn in rnd.attacks for c in turn]}
    assert len(drawn[DEFENDER]) == 2 * E and len(drawn[ATTACKER]) == B * A + E
    for side, completions in drawn.items():
        for c in completions:
            ids = torch.tensor([list(c.prompt_tokens) + list(c.tokens)])
            scored, size = {}, {}
            for name in (DEFENDER, ATTACKER):
                engine.use_adapter(name)
                scored[name] = engine.logprobs(ids, torch.ones_like(ids),
                                               temperature=config.sampling.temperature)[0, len(c.prompt_tokens):]
                with torch.no_grad():  # every token's |log p| at those positions: the logits' spread, at least
                    logits = engine.model(input_ids=ids).logits[0, len(c.prompt_tokens) - 1:-1].float()
                    size[name] = float(torch.log_softmax(logits / config.sampling.temperature, -1).abs().max())
            # the sampler (merged weights, a KV cache) against a full forward of the same adapter: two fp32 paths. The
            # drawn token's |log p| is near 0 where the trained adapter is sure of it, so the size of the terms the
            # chain sums is the vocabulary's largest |log p| (logprob_atol's magnitude), not the drawn token's
            atol = logprob_atol(torch.float32, engine.model.config, ids.shape[1], size[side])
            other = ATTACKER if side == DEFENDER else DEFENDER
            torch.testing.assert_close(c.logprobs_C, scored[side], rtol=0, atol=atol, msg=f"{side}: {c.text!r}")
            assert float((c.logprobs_C - scored[other]).abs().max()) > 100 * atol, (side, c.text)
    # and what that looks like: the defender's replies are mostly the trained adapter's word, the attacks are not
    share = {side: sum(t == adapter_word_id for c in cs for t in c.tokens) / sum(len(c.tokens) for c in cs)
             for side, cs in drawn.items()}
    assert share[DEFENDER] > 0.5 > 0.1 > share[ATTACKER]


def test_each_side_pays_its_own_kl_weight_in_its_reward(tiny_model_dir: Path, trained_adapter_dir: Path,
                                                        tmp_path: Path) -> None:
    beta, attacker_beta = 0.05, 0.3
    run_dir = _run(tiny_model_dir, tmp_path, "--steps", "1", "--kl_beta", str(beta), "--adversarial.attacker_kl_beta",
                   str(attacker_beta), "--init_adapter", str(trained_adapter_dir), "--attacker_init",
                   str(trained_adapter_dir), "--name", "kl")
    rows, metrics = _rows(run_dir), _rows(run_dir, METRICS_FILE)[0]
    assert metrics["attacker_kl/mean"] > 1 and metrics["defender_kl/mean"] > 1  # both far from the base
    # per episode: attacker = P(unsafe) + 0.1 novelty - attacker_beta x its opening's KL; an opening's KL counts once
    # per episode it opened (G each), so the episodes' mean KL is the openings' mean, attacker_kl/mean
    assert metrics["attacker_reward/mean"] == pytest.approx(
        _mean(rows, "unsafe") + 0.1 * _mean(rows, "novelty") - attacker_beta * metrics["attacker_kl/mean"], abs=1e-5)
    assert metrics["defender_reward/mean"] == pytest.approx(
        1 - _mean(rows, "unsafe") - 0.1 * _mean(rows, "response_entropy") - beta * metrics["defender_kl/mean"],
        abs=1e-5)


def test_each_side_trains_with_its_own_kl_weight_in_its_loss(tiny_model_dir: Path, trained_adapter_dir: Path,
                                                             tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    beta, attacker_beta = 0.05, 0.3
    updates: list[tuple[str, float]] = []
    forward_backward = LocalEngine.forward_backward

    def recorded(self: LocalEngine, batch: Any, loss: Any) -> dict[str, float]:
        updates.append((self.active_adapter, loss.params.kl_beta))
        return forward_backward(self, batch, loss)

    monkeypatch.setattr(LocalEngine, "forward_backward", recorded)
    run_dir = _run(tiny_model_dir, tmp_path, "--steps", "2", "--kl_beta", str(beta), "--adversarial.attacker_kl_beta",
                   str(attacker_beta), "--reward.kl_in", "loss", "--init_adapter", str(trained_adapter_dir),
                   "--attacker_init", str(trained_adapter_dir), "--name", "kl_loss",
                   "--training.early_stop_repetition", "null")  # the adapter's word repeats: no stop after step 1
    # schedule 1:1: the attacker's update at step 1, the defender's at step 2, each at its own weight
    assert updates == [(ATTACKER, attacker_beta), (DEFENDER, beta)]
    rows = _rows(run_dir)
    assert all(r["attacker_reward"] == pytest.approx(r["unsafe"] + 0.1 * r["novelty"], abs=1e-6) for r in rows)


def test_a_judgement_at_the_unsafe_threshold_is_an_attack_success(tiny_model_dir: Path, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(REWARD_TERMS, "at_threshold", text_term("at_threshold", "AT or 0", None,
                                                                lambda _: ThresholdJudge()))
    run_dir = _run(tiny_model_dir, tmp_path, "--steps", "1", "--turns", "2", "--judge", "at_threshold",
                   "--adversarial.judge.unsafe_at", str(AT), "--name", "at")
    rows, metrics = _rows(run_dir), _rows(run_dir, METRICS_FILE)[0]
    # the judge is called once per step on the turn-major answers (E of turn 1, then E of turn 2): with E even, the
    # even episodes are judged exactly AT at both turns and the odd ones 0
    assert {(r["episode"], r["turn"]): r["unsafe"] for r in rows} == {
        (e, t): AT if e % 2 == 0 else 0.0 for e in range(E) for t in (1, 2)}
    assert metrics["asr"] == 0.5  # 8 of the 16 answers sit exactly at the threshold: each counts
    assert metrics["asr/episode"] == 0.5  # 4 of the 8 episodes
