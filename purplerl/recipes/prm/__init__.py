"""`purplerl prm`: a process reward model (Lightman et al. 2023, "Let's Verify Step by Step"): a LoRA adapter with a
scalar head over the frozen base, trained with binary cross-entropy on each reasoning step's label, read at the
step's last token (step.py; the math in purplerl.algorithms.process_reward), with the runs' run dir, atomic
checkpoints, resume, metrics and report. Its data are TRL's stepwise-supervision rows: `prompt`, `completions` (the
steps) and `labels` (a boolean per step). The run is then the `prm` reward term of any RL recipe (`--reward.terms
'{prm: 1}' --reward.terms.prm.params.run RUN_DIR`, its steps' probabilities aggregated by min, last, product or
mean), an eval judge, and `serve-reward --model RUN_DIR`."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field, field_validator

from purplerl.config import PreferenceDataConfig, Section
from purplerl.config.sections import RunSettings
from purplerl.engines.capabilities import SCALAR_HEADS
from purplerl.files import absolute_source
from purplerl.runs.process_reward import TERM
from purplerl.train.recipe import FIXED_ON_RESUME, FLAT, Recipe, RunNamePart, lazy, recipe_field


class StepDataConfig(PreferenceDataConfig):
    """Step-labelled answers, and how prompts and steps become tokens (purplerl.data.steps)."""

    source: Annotated[str, AfterValidator(absolute_source)] | None = Field(None, description=(
        "step-labelled answers: a .jsonl/.json/.parquet file, a prepared dir or 'hf:ORG/NAME'; each row a prompt (text "
        "or chat messages), completions (the answer's steps) and labels (true or false per step), TRL's layout"))
    max_answer_tokens: int = Field(256, ge=1, description=(
        "an answer's steps, each with its separator, past this many tokens are not read (logged as "
        "data/steps_truncated)"))


class PrmConfig(Section):
    """What a process reward model's run reads besides its data (`purplerl prm`)."""

    separator: str = Field("\n", description=(
        "the text that ends each step: appended to every step when training (TRL's step_separator), and where a "
        "scored answer is cut into steps; the head reads each step at its separator's last token"))
    eval_fraction: float = Field(0.1, ge=0.0, lt=1.0, description=(
        "share of the prompts held out for eval/step_accuracy and eval/outcome_accuracy, by a seeded hash of the "
        "prompt (a prompt's answers all on one side); 0: no eval"))
    eval_every: int = Field(10, ge=0, description=(
        "evaluate the held-out answers every N steps and at the last step (0: at the last step only)"))

    @field_validator("separator")
    @classmethod
    def _separates(cls, separator: str) -> str:
        if not separator:
            raise ValueError("must not be empty: it marks where each step ends")
        return separator


class PrmSettings(RunSettings):
    """`purplerl prm`: the shared training sections, the step-labelled answers and the process reward model."""

    recipe: str = recipe_field("prm")
    data: StepDataConfig = Field(default_factory=StepDataConfig, description="the step-labelled answers")
    prm: PrmConfig = Field(default_factory=PrmConfig, description="the process reward model (purplerl prm)")


PRM = Recipe(
    name="prm",
    settings=PrmSettings,
    help="""Train a process reward model on step-labelled answers (prompt, completions: [step, ...], labels: [bool,
    ...]): a scalar head on the base model plus LoRA, binary cross-entropy on each step's label at the step's last
    token. --data names the rows; the run is the `prm` reward term (--reward.terms.prm.params.run RUN_DIR).""",
    prepare=lazy("purplerl.recipes.prm.step:prm_prepare"),
    # a reward model never samples: no merged copy of the weights for a sampler, no decoding graphs
    defaults={"training": {"steps": 100, "batch_size": 8, "lr": 1e-4}, "engine": {"fast_paths": ["fused_lora"]}},
    run_name=(RunNamePart("lr", lambda c: c.training.lr), RunNamePart("r", lambda c: c.model.lora_rank),
              RunNamePart("B", lambda c: c.training.batch_size)),
    summary_metrics={"train/loss": "step BCE loss", "train/step_accuracy": "training step accuracy",
                     "eval/step_accuracy": "held-out step accuracy",
                     "eval/outcome_accuracy": "held-out all-steps-correct accuracy"},
    flat={**FLAT, "separator": "prm.separator"},
    # the held-out share fixes which answers train; the separator, what a step's last token is
    fixed_on_resume=FIXED_ON_RESUME | {"prm.eval_fraction", "prm.separator"},
    needs=lambda config: frozenset({SCALAR_HEADS}),  # the model's step head
    produces="scorer",
    scorer_term=TERM,
)

__all__ = ["PRM", "PrmConfig", "PrmSettings", "StepDataConfig"]
