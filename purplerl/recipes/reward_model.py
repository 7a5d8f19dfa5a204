"""`purplerl reward-model`: a reward model trained on preference pairs with the Bradley-Terry loss: K ensemble members,
each a LoRA adapter with a scalar head over one frozen base (train/reward_model.py), with the runs' run dir,
atomic checkpoints, resume, metrics and report. The run is then the `reward_model` reward term of any RL recipe
(`--reward.terms '{reward_model: 1}' --reward.reward_model.run RUN_DIR`), an eval judge, and `serve-reward --model
RUN_DIR`."""

from __future__ import annotations

from purplerl.config import PreferenceDataConfig
from purplerl.train.recipe import FLAT, Recipe, RunNamePart, run_settings
from purplerl.train.reward_model import RewardModelConfig, reward_model_prepare

RewardModelSettings = run_settings("reward-model", data=(PreferenceDataConfig, "the preference pairs"),
                                   reward_model=(RewardModelConfig, "the reward model (purplerl reward-model)"))


REWARD_MODEL = Recipe(
    name="reward-model",
    settings=RewardModelSettings,
    help="""Train a reward model on preference pairs (prompt, chosen, rejected): a scalar head on the base model plus
    LoRA, Bradley-Terry loss, optionally an ensemble of K members whose mean and std score answers. --data names the
    pairs.""",
    prepare=reward_model_prepare,
    # a reward model never samples: no merged copy of the weights for a sampler, no decoding graphs
    defaults={"training": {"steps": 100, "batch_size": 8, "lr": 1e-4}, "engine": {"fast_paths": ["fused_lora"]}},
    run_name=(RunNamePart("lr", lambda c: c.training.lr), RunNamePart("r", lambda c: c.model.lora_rank),
              RunNamePart("K", lambda c: c.reward_model.ensemble), RunNamePart("B", lambda c: c.training.batch_size)),
    summary_metrics={"train/loss": "Bradley-Terry loss", "train/accuracy": "training pair accuracy",
                     "eval/accuracy": "held-out pair accuracy", "eval/margin": "held-out reward margin"},
    flat={**FLAT, "ensemble": "reward_model.ensemble"},
)

__all__ = ["REWARD_MODEL", "RewardModelSettings"]
