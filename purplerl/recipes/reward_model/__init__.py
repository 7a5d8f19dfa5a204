"""`purplerl reward-model`: a reward model trained on preference pairs with the Bradley-Terry loss: K ensemble members,
each a LoRA adapter with a scalar head over one frozen base (step.py), with the runs' run dir,
atomic checkpoints, resume, metrics and report. The run is then the `reward_model` reward term of any RL recipe
(`--reward.terms '{reward_model: 1}' --reward.terms.reward_model.params.run RUN_DIR`), an eval judge, and
`serve-reward --model RUN_DIR`."""

from __future__ import annotations

from pydantic import Field

from purplerl.config import PreferenceDataConfig, Section
from purplerl.config.sections import RunSettings
from purplerl.engines.capabilities import SCALAR_HEADS
from purplerl.runs.reward_model import TERM
from purplerl.train.recipe import FIXED_ON_RESUME, FLAT, Recipe, RunNamePart, lazy, recipe_field


class RewardModelConfig(Section):
    """What a reward-model run reads besides its data (`purplerl reward-model`)."""

    ensemble: int = Field(1, ge=1, le=32, description=(
        "K members, each its own LoRA adapter and scalar head over the one base, differing by seed (init and data "
        "order); the reward term gives their mean minus a penalty x their std"))
    margin: bool = Field(False, description=(
        "subtract each pair's margin, its source's score_chosen - score_rejected (UltraFeedback's ratings), inside the "
        "loss: -log sigmoid(r_c - r_r - m) (Llama 2; TRL's margin column)"))
    center_coef: float = Field(0.0, ge=0.0, description=(
        "weight of mean((r_c + r_r)^2), which centres the rewards on 0 (Eisenstein et al. 2023; TRL's "
        "center_rewards_coefficient); 0: off"))
    eval_fraction: float = Field(0.1, ge=0.0, lt=1.0, description=(
        "share of the prompts held out for eval/accuracy and eval/margin, by a seeded hash of the prompt (a prompt's "
        "pairs all on one side); 0: no eval"))
    eval_every: int = Field(10, ge=0, description=(
        "evaluate the held-out pairs every N steps and at the last step (0: at the last step only)"))


class RewardModelSettings(RunSettings):
    """`purplerl reward-model`: the shared training sections, the preference pairs and the reward model."""

    recipe: str = recipe_field("reward-model")
    data: PreferenceDataConfig = Field(default_factory=PreferenceDataConfig, description="the preference pairs")
    reward_model: RewardModelConfig = Field(default_factory=RewardModelConfig, description=(
        "the reward model (purplerl reward-model)"))


REWARD_MODEL = Recipe(
    name="reward-model",
    settings=RewardModelSettings,
    help="""Train a reward model on preference pairs (prompt, chosen, rejected): a scalar head on the base model plus
    LoRA, Bradley-Terry loss, optionally an ensemble of K members whose mean and std score answers. --data names the
    pairs.""",
    prepare=lazy("purplerl.recipes.reward_model.step:reward_model_prepare"),
    # a reward model never samples: no merged copy of the weights for a sampler, no decoding graphs
    defaults={"training": {"steps": 100, "batch_size": 8, "lr": 1e-4}, "engine": {"fast_paths": ["fused_lora"]}},
    run_name=(RunNamePart("lr", lambda c: c.training.lr), RunNamePart("r", lambda c: c.model.lora_rank),
              RunNamePart("K", lambda c: c.reward_model.ensemble), RunNamePart("B", lambda c: c.training.batch_size)),
    summary_metrics={"train/loss": "Bradley-Terry loss", "train/accuracy": "training pair accuracy",
                     "eval/accuracy": "held-out pair accuracy", "eval/margin": "held-out reward margin"},
    flat={**FLAT, "ensemble": "reward_model.ensemble"},
    # the ensemble size fixes the experiment (each member's seed and data order, the mean every consumer takes);
    # the held-out share fixes which pairs train
    fixed_on_resume=FIXED_ON_RESUME | {"reward_model.ensemble", "reward_model.eval_fraction"},
    needs=lambda config: frozenset({SCALAR_HEADS}),  # each member's reward head
    produces="scorer",
    scorer_term=TERM,
)

__all__ = ["REWARD_MODEL", "RewardModelConfig", "RewardModelSettings"]
