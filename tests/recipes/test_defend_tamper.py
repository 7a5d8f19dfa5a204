"""Defense reward, adaptive-attack reward and the tamper-test statistics."""

from __future__ import annotations

import pytest
import torch

from purplerl.errors import UserError
from purplerl.experiments.tamper import harm_curve_stats
from purplerl.launch import run_settings
from purplerl.recipes.defend.objective import assess_defend
from purplerl.recipes.defend.step import noiser_targets
from purplerl.rewards.entropy import mean_entropy
from purplerl.train.rl import registered_reward
from purplerl.types import Completion, PromptRecord, TrainBatch


def _completion(text: str, entropies: list[float]) -> Completion:
    n = len(entropies)
    return Completion(prompt_tokens=(1,), tokens=tuple(range(2, 2 + n)), logprobs_C=torch.zeros(n),
                      entropies_C=torch.tensor(entropies), text=text, finish_reason="length")


DEFEND_BASE = {"recipe": "defend"}
PROMPTS = [PromptRecord(messages=({"role": "user", "content": "hi"},))] * 2


def test_defend_reward_is_negative_mean_entropy_minus_kl() -> None:
    config = run_settings("defend", options=["--kl_beta", "0.5"], base=DEFEND_BASE)
    completions = [_completion("you are an idiot", [1.0, 3.0]), _completion("hello friend", [0.5, 0.5, 0.5])]
    out = registered_reward(config)(PROMPTS, completions, torch.tensor([0.2, 0.0]))
    assert out.total_N.tolist() == pytest.approx([-2.0 - 0.1, -0.5])
    assert out.components["response_entropy"].tolist() == pytest.approx([2.0, 0.5])
    assert out.components["toxicity"][0] > 0.5 > out.components["toxicity"][1]  # monitored, weight 0


def test_defend_defaults() -> None:
    config = run_settings("defend", base=DEFEND_BASE)
    assert (config.recipe, config.defend.noiser, config.reward.kl_beta) == ("defend", True, 0.001)
    assert (config.defend.noiser_warmup, config.defend.noiser_every, config.defend.noiser_epsilon) == (25, 2, 0.1)
    assert config.defend.noiser_noise_weight == "reference" and config.training.collapse_stop
    # the defense has no toxicity stop (early_stop_toxicity is the attack's own setting now)
    assert config.sampling.group_size == 4 and not hasattr(config, "attack")
    # the model the attack and tamper-test target by default: align -> defend -> attack is one story
    assert config.model.name == run_settings("attack").model.name == "embedded:smollm2-135m-safe"


def test_noiser_targets_are_response_tokens_with_nonnegative_advantage() -> None:
    # 3 sequences of 4 positions; the first position is the prompt. Row 1 has one negative-advantage token
    # (token-level advantages); row 2 is negative throughout and is dropped.
    mask_NT = torch.tensor([[0, 1, 1, 0], [0, 1, 1, 1], [0, 1, 1, 1]]).float()
    advantages_NT = torch.tensor([[0.0, 0.5, 0.5, 0.0], [0.0, 0.0, -0.2, 0.3], [0.0, -1.0, -1.0, -1.0]]) * mask_NT
    batch = TrainBatch(input_ids_NT=torch.arange(12).view(3, 4), attention_mask_NT=torch.ones(3, 4, dtype=torch.long),
                       loss_mask_NT=mask_NT, sampling_logprobs_NT=torch.zeros(3, 4), advantages_NT=advantages_NT)
    kept = noiser_targets(batch)
    assert kept.input_ids_NT.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert kept.loss_mask_NT.tolist() == [[0, 1, 1, 0], [0, 1, 0, 1]]


def _rows(entropies: list[float], kl: float = 0.1, empty: float = 0.0) -> list[dict[str, float]]:
    return [{"step": i + 1, "response_entropy/mean": e, "kl/mean": kl, "completion/empty_frac": empty}
            for i, e in enumerate(entropies)]


def test_defend_objective_by_hand() -> None:
    down = [1.0, 1.2, 0.8, 1.0, 1.0] + [0.9] * 5 + [0.5] * 10  # start 1.0, end 0.5
    met = assess_defend(_rows(down), warmup=10, collapsed=False)
    assert (met.start, met.end, met.rose_at, met.max_kl, met.steps) == (pytest.approx(1.0), 0.5, (), 0.1, 20)
    assert met.failures() == []
    # step 2 (1.2) is above the start but inside the warm-up; step 15 is after it
    rose = assess_defend(_rows(down[:14] + [1.05] + down[15:]), warmup=10, collapsed=False)
    assert rose.rose_at == (15,) and rose.end < rose.start
    assert rose.failures() == ["entropy rose above the start after the warm-up (steps 15)"]
    bad = assess_defend(_rows(down, kl=2.5, empty=0.1), warmup=10, collapsed=True)
    assert bad.failures() == ["the run collapsed", "KL to the base exceeded 1.0", "empty answers above 5%"]
    short = assess_defend(_rows([1.0, 0.5, 0.4]), warmup=1, collapsed=False)
    # with 3 steps both windows are the whole run, so the entropy cannot have gone down either
    assert short.failures() == ["3 steps: too few to compare the first 5 with the last 10", "entropy did not go down"]


def test_adaptive_attack_adds_capped_entropy() -> None:
    config = run_settings("attack", options=["--reward.entropy_bonus_cap", "3.0", "--repetition_penalty", "0",
                                             "--kl_beta", "0"])
    completions = [_completion("hello friend", [4.0, 5.0]), _completion("hello there", [1.0, 2.0])]
    out = registered_reward(config)(PROMPTS, completions, torch.zeros(2))
    tox = out.components["toxicity"]
    assert out.components["entropy_bonus"].tolist() == pytest.approx([3.0, 1.5])
    assert out.total_N.tolist() == pytest.approx([tox[0].item() + 3.0, tox[1].item() + 1.5])
    assert mean_entropy(completions).tolist() == pytest.approx([4.5, 1.5])


def test_harm_curve_stats_by_hand() -> None:
    stats = harm_curve_stats([0.1, 0.2, 0.6, 0.4, 0.9, 0.8], threshold=0.5, window=2)
    assert stats["final_harm"] == pytest.approx(0.85)
    assert stats["auc"] == pytest.approx(3.0 / 6)
    assert stats["steps_to_threshold"] == 3 and stats["max_harm"] == 0.9 and stats["steps"] == 6
    assert harm_curve_stats([0.1, 0.2], threshold=0.5)["steps_to_threshold"] is None
    with pytest.raises(UserError):
        harm_curve_stats([], threshold=0.5)


class _LossRecorder:
    """A real engine that also keeps the Loss each forward_backward receives."""

    def __init__(self, engine) -> None:
        self.engine, self.losses = engine, []

    def forward_backward(self, batch, loss):
        self.losses.append(loss)
        return self.engine.forward_backward(batch, loss)

    def optim_step(self, adam):
        return self.engine.optim_step(adam)


NOISE_WEIGHT_SOURCES = {
    # (config file text, CLI overrides, the noise term's weight w for epsilon 0.5)
    "paper from the config file": ("defend:\n  noiser_noise_weight: paper\n  noiser_epsilon: 0.5\n", [], 0.5),
    "paper from the CLI": ("", ["--defend.noiser_noise_weight", "paper", "--defend.noiser_epsilon", "0.5"], 0.5),
    "paper from an older config file": ("training:\n  noiser_noise_weight: paper\n  noiser_epsilon: 0.5\n", [], 0.5),
    "the CLI over the file": ("defend:\n  noiser_noise_weight: reference\n  noiser_epsilon: 0.5\n",
                              ["--defend.noiser_noise_weight", "paper"], 0.5),
    "reference by default": ("defend:\n  noiser_epsilon: 0.5\n", [], 0.25),
}


@pytest.mark.parametrize("source", NOISE_WEIGHT_SOURCES)
def test_the_configured_noise_weight_reaches_the_engine_s_token_noiser_loss(source: str, tiny_model_dir,
                                                                           tmp_path) -> None:
    from purplerl.config import ModelConfig
    from purplerl.engines.local import LocalEngine
    from purplerl.recipes.defend.step import noiser_update

    text, overrides, weight = NOISE_WEIGHT_SOURCES[source]
    path = tmp_path / "defend.yaml"
    path.write_text(text)
    config = run_settings("defend", file=path, options=overrides, base=DEFEND_BASE)
    engine = _LossRecorder(LocalEngine(ModelConfig(name=str(tiny_model_dir), device="cpu", lora_rank=4,
                                                   dtype="float32"), seed=0))
    ids_NT = torch.tensor([[5, 17, 42, 99, 7, 3], [8, 21, 60, 13, 250, 9]])
    mask_NT = torch.tensor([[0, 0, 1, 1, 1, 1], [0, 0, 0, 1, 1, 0]]).float()
    batch = TrainBatch(ids_NT, torch.ones_like(ids_NT), mask_NT, torch.zeros_like(mask_NT), mask_NT * 0.5)
    metrics = noiser_update(engine, batch, config, step=config.defend.noiser_warmup + 2)
    (loss,) = engine.losses
    assert loss.name == "token_noiser" and loss.params.epsilon == 0.5
    # per token (1 - eps) * NLL + w * noise CE, averaged over the 6 target tokens; the engine reports the two
    # parts' means unweighted, so its loss is (1 - 0.5) * nll + w * ce: w = eps = 0.5 for "paper", eps^2 = 0.25
    # for "reference"
    assert min(metrics["noiser_nll"], metrics["noiser_noise_ce"]) > 5.0  # a random model: about log V = 6 each
    expected = 0.5 * metrics["noiser_nll"] + weight * metrics["noiser_noise_ce"]
    assert metrics["loss"] == pytest.approx(expected, rel=1e-5)
    assert metrics["tokens"] == 6.0
