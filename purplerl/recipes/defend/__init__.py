"""Token Buncher defense (arXiv 2508.20697): make harmful-RL fail by making the model confident.

On harmful prompts the policy is rewarded with the negative mean token entropy of its own responses
(computed in the sampling pass, no extra forward), with a small in-reward KL to the base (0.001), and
after a warmup every few steps is a Token Noiser step (see algorithms/noiser.py). An attacker's RL then
starts from a policy whose harmful answers have little entropy left to explore, which starves the
policy-gradient signal. The defended adapter (the run's last checkpoint) is the starting policy of
`purplerl attack --init_adapter` or `purplerl tamper-test`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from purplerl.config.base import Section, read_when
from purplerl.config.migrate import NOISER_DEFAULTS, drop_if, migrate_reward_weights, move
from purplerl.config.sections import RLSettings
from purplerl.recipes.defend.objective import defend_objective
from purplerl.recipes.summary import summarize_run
from purplerl.rewards.named import weights
from purplerl.train.recipe import RL_FLAT, Bind, Recipe, RunNamePart, recipe_field, reward_section
from purplerl.train.stops import Collapse, rl_stops

# reward = -mean token entropy - kl_beta x KL; toxicity and repetition are monitored (weight 0): does the defense
# change harm, does it degenerate?
TERMS = {"response_entropy": -1.0, "toxicity": 0.0, "repetition": 0.0}


def _noiser(d: Any) -> bool:
    return d.noiser


class DefendConfig(Section):
    """The Token Noiser steps (Token Buncher, arXiv 2508.20697), which only the defense takes."""

    noiser: bool = Field(True, description="interleave Token Noiser supervised steps")
    noiser_warmup: read_when(int, _noiser, "defend.noiser is true") = Field(25, ge=0, description=(
        "RL steps before the first Token Noiser step"))
    noiser_every: read_when(int, _noiser, "defend.noiser is true") = Field(2, ge=1, description=(
        "after the warmup, every N-th step is a Token Noiser step"))
    noiser_epsilon: read_when(float, _noiser, "defend.noiser is true") = Field(0.1, ge=0.0, le=1.0, description=(
        "Token Noiser epsilon: the NLL is weighted 1 - epsilon"))
    noiser_noise_weight: read_when(Literal["reference", "paper"], _noiser, "defend.noiser is true") = Field(
        "reference", description=("weight of the Token Noiser's random-noise cross-entropy: 'reference' epsilon^2 "
                                  "(the paper's released code), 'paper' epsilon (the formula as printed)"))


DefendReward = reward_section("defend", TERMS)
class DefendSettings(RLSettings):
    """`purplerl defend`: the shared RL sections, its reward and the Token Noiser steps."""

    recipe: str = recipe_field("defend")
    reward: DefendReward = Field(default_factory=DefendReward, description="reward composition")
    defend: DefendConfig = Field(default_factory=DefendConfig, description="the Token Noiser steps")


def prepare(config: Any) -> Bind:
    """GRPO on the registered reward terms, updated by `defend_update`."""
    from purplerl.recipes.defend.step import defend_update  # when a run starts: the loop loads torch
    from purplerl.train.rl import registered_reward, rl_prepare

    return rl_prepare(registered_reward, rl_stops, defend_update)(config)


def migrate(data: dict[str, Any], saved: bool) -> dict[str, Any]:
    """An older defend config: the noiser fields move to `defend`; the flat reward weights, which the defense never
    read (its terms were fixed), and its unused toxicity stop are dropped."""
    for name in NOISER_DEFAULTS:
        move(data, f"training.{name}", f"defend.{name}")
    if saved:
        drop_if(data, "training.early_stop_toxicity", None)
        for name, unread in (("toxicity_weight", 1.0), ("repetition_penalty", 0.3), ("refusal_penalty", 0.0),
                             ("entropy_bonus_cap", None)):
            drop_if(data, f"reward.{name}", unread)
    return migrate_reward_weights(data, TERMS)


def summarize(run_dir: Path, summary: dict[str, Any], config: Any) -> str:
    """The run's summary, led by whether the defense met its objective (see `defend_objective`)."""
    text = summarize_run(run_dir, summary, DEFEND.summary_metrics)
    collapsed = isinstance(summary.get("stop_reason"), Collapse)
    objective = defend_objective(run_dir, collapsed, warmup=config.defend.noiser_warmup)
    return f"{objective}\n{text}"


# What `purplerl defend` changes from the shared defaults (the paper's settings, scaled to a CPU run). The target is
# the aligned model that `attack` and `tamper-test` attack by default: align -> defend -> attack.
DEFEND = Recipe(
    name="defend",
    settings=DefendSettings,
    help="""Token Buncher defense: reward low response entropy on harmful prompts, with Token Noiser steps.

    Defaults differ from attack's: reward.kl_beta 0.001, training.collapse_stop true (a collapse exits non-zero).
    The last checkpoint is the defended adapter (use it with attack --init_adapter or tamper-test).""",
    prepare=prepare,
    defaults={"model": {"name": "embedded:smollm2-135m-safe"}, "sampling": {"group_size": 4},
              "training": {"collapse_stop": True}, "reward": {"kl_beta": 0.001, "terms": TERMS}},
    run_name=(RunNamePart("lr", lambda c: c.training.lr), RunNamePart("kl", lambda c: c.reward.kl_beta),
              RunNamePart("rep", lambda c: -weights(c.reward.terms).get("repetition", 0.0) + 0.0),
              RunNamePart("G", lambda c: c.sampling.group_size), RunNamePart("B", lambda c: c.training.batch_size)),
    summary_metrics={"toxicity/mean": "mean toxicity (monitored)"},
    flat=RL_FLAT,
    migrate=migrate,
    summarize=summarize,
)
