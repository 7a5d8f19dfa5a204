"""`purplerl ppo`: PPO with a critic, the classic RLHF loop (Ziegler et al. 2019; Stiennon et al. 2020; InstructGPT,
Ouyang et al. 2022), as veRL's PPO trainer runs it with a critic (its GAE, whitening and clipped value loss).

Each step: sample -> the frozen base's logprobs -> reward (the registered terms of `reward.terms`) -> the critic's
values -> per-token rewards r_t = -kl_beta * KL_t (k1: logp_policy - logp_base per completion token) plus the
sequence reward at the last token -> GAE(gamma, lam) advantages, whitened, and returns -> the policy's clipped
surrogate (ppo_clip) and the critic's clipped value loss, each for ppo_epochs x mini_batches optimizer steps. The
critic is a LoRA adapter with a scalar head over the policy's frozen base (purplerl.recipes.ppo.step).

The default reward is the attack's (toxicity - 0.3 x repetition on the aligned model): PPO red-teams as GRPO does.
The RLHF form rewards a trained reward model: `--reward.terms '{reward_model: 1}'
--reward.terms.reward_model.params.run RUN` (purplerl reward-model), and `--critic.init
RUN/checkpoints/step_N/member0` starts the critic from it.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from purplerl.config.base import Section
from purplerl.config.sections import RLSettings
from purplerl.engines.capabilities import SCALAR_HEADS
from purplerl.train.recipe import FIXED_ON_RESUME, RL_FLAT, Bind, Recipe, RunNamePart, recipe_field, reward_section
from purplerl.train.stops import rl_stops

TERMS = {"toxicity": 1.0, "repetition": -0.3}


class CriticConfig(Section):
    """The critic: a LoRA adapter with a scalar head over the policy's frozen base, and its value loss."""

    vf_coef: float = Field(0.1, gt=0.0, description=(
        "weight of the value loss (TRL's vf_coef); the critic has its own optimizer, so it scales the critic's "
        "gradient"))
    cliprange_value: float = Field(0.2, gt=0.0, description=(
        "the value loss clips the critic's new values to within this of the values the advantages were computed with "
        "(TRL's cliprange_value)"))
    lr: float | None = Field(None, gt=0.0, lt=1.0, description=(
        "the critic's AdamW learning rate (null: training.lr)"))
    init: str | None = Field(None, description=(
        "a reward model's member dir (RUN/checkpoints/step_N/member0: a LoRA adapter with its scalar head) to start "
        "the critic from, as InstructGPT starts the value function from the reward model; null: a fresh adapter and "
        "head"))


PPOReward = reward_section("ppo", TERMS)
class PPOSettings(RLSettings):
    """`purplerl ppo`: the shared RL sections, its reward and the critic."""

    recipe: str = recipe_field("ppo")
    reward: PPOReward = Field(default_factory=PPOReward, description="reward composition")
    critic: CriticConfig = Field(default_factory=CriticConfig, description="the critic (value function) and its loss")


def prepare(config: Any) -> Bind:
    """The RL loop with the critic's values and update (purplerl.recipes.ppo.step), on the registered reward terms."""
    from purplerl.recipes.ppo.step import critic_prepare  # when a run starts: the loop loads torch
    from purplerl.train.rl import registered_reward

    return critic_prepare(registered_reward, rl_stops)(config)


# PPO's own defaults are TRL's PPOConfig's (TRL 1.16 removed its PPOTrainer): GAE with gamma 1 and lam 0.95 (the
# training fields), KL coefficient 0.05 in the token rewards, 4 PPO epochs, ratio clip 0.2, value clip 0.2, vf_coef
# 0.1 (the critic section).
PPO = Recipe(
    name="ppo",
    settings=PPOSettings,
    help="""PPO with a critic (the classic RLHF loop): GAE advantages from a value head on its own adapter over the
    policy's base, the KL to the base in the per-token rewards, the clipped surrogate and a clipped value loss.

    The reward is any registered terms (the reward.terms setting). For a trained reward model, use the term
    reward_model and set its params.run to the reward model's run dir (docs/recipes/ppo.md shows the two options).
    The critic trains on the local engine only.""",
    prepare=prepare,
    defaults={"model": {"name": "embedded:smollm2-135m-safe"},
              "training": {"advantage": "gae", "loss": "ppo_clip", "ppo_epochs": 4},
              "reward": {"kl_beta": 0.05, "terms": TERMS}},
    run_name=(RunNamePart("lr", lambda c: c.training.lr), RunNamePart("kl", lambda c: c.reward.kl_beta),
              RunNamePart("lam", lambda c: c.training.lam),
              RunNamePart("E", lambda c: c.training.ppo_epochs), RunNamePart("B", lambda c: c.training.batch_size)),
    summary_metrics={"reward/mean": "mean reward", "train/value_loss": "value loss",
                     "adv/explained_variance": "explained variance of the returns", "kl/mean": "KL to the base"},
    flat={**RL_FLAT, "gamma": "training.gamma", "lam": "training.lam", "ppo_epochs": "training.ppo_epochs",
          "vf_coef": "critic.vf_coef", "cliprange_value": "critic.cliprange_value"},
    fixed_on_resume=FIXED_ON_RESUME | {"critic.init"},
    needs=lambda config: frozenset({SCALAR_HEADS}),  # the critic
)

__all__ = ["PPO", "CriticConfig", "PPOSettings"]
