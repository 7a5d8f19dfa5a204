"""A training run's console output, trackers and run directory, and the trees of sections every training recipe
(RunSettings) and every RL recipe (RLSettings) starts from."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from purplerl.config.base import Section, comma_list, once_each
from purplerl.config.sections.data import DataConfig
from purplerl.config.sections.engine import EngineConfig
from purplerl.config.sections.model import ModelConfig
from purplerl.config.sections.reward import RewardBase
from purplerl.config.sections.sampling import SamplingConfig
from purplerl.config.sections.training import RLTrainingConfig, TrainingConfig
from purplerl.files import plain_name_problem

TRACKER_NAMES = ("wandb", "tensorboard", "mlflow")  # purplerl.train.trackers opens each


class LoggingConfig(Section):
    progress: bool | int = Field(True, description=(
        "the console: true shows a rich progress bar, false nothing, an integer N the bar and N completions per step"))

    @field_validator("progress")
    @classmethod
    def _progress(cls, value: bool | int) -> bool | int:
        if not isinstance(value, bool) and value < 1:
            raise ValueError(f"must be true, false or a number of completions >= 1, got {value}")
        return value
    trackers: list[Literal["wandb", "tensorboard", "mlflow"]] = Field(default_factory=list, description=(
        "experiment trackers that get the metrics, samples and evaluations of the JSONL logs, each step once its "
        "checkpoint is saved: wandb (offline, run_dir/wandb), tensorboard (run_dir/tensorboard), mlflow (file store "
        "run_dir/mlruns); 'wandb,mlflow' works too; needs pip install 'purplerl[trackers]'"))

    @field_validator("trackers", mode="before")
    @classmethod
    def _split_trackers(cls, value: Any) -> Any:
        return comma_list(value)

    @field_validator("trackers")
    @classmethod
    def _trackers_once(cls, trackers: list[str]) -> list[str]:
        return once_each(trackers, "tracker")

    def printed_samples(self) -> int:
        """Completions printed to the console per step (logging.progress N)."""
        return 0 if isinstance(self.progress, bool) else self.progress


class RunConfig(Section):
    output_dir: str = Field("runs", description="parent directory of run directories")
    name: str | None = Field(None, description="run directory name (null: recipe_model_hyperparameters_sSEED)")
    save_every: int = Field(10, ge=1, description="checkpoint every N steps (and always at the end)")
    keep_last: int = Field(3, ge=1, description="checkpoints kept on disk")

    @field_validator("name")
    @classmethod
    def _check_name(cls, name: str | None) -> str | None:
        # the name is one directory under output_dir: '../x' or '/tmp/x' would put the run somewhere else
        problem = None if name is None else plain_name_problem(name)
        if problem:
            raise ValueError(problem)
        return name


class RunSettings(Section):
    """The sections every training recipe shares; each recipe's settings class adds its own
    (purplerl.train.recipe)."""

    recipe: str = Field(description=(
        "metadata, not a setting: the recipe this config is for (each recipe's tree sets it)"))
    engine: EngineConfig = Field(default_factory=EngineConfig, description="where and how sampling and training run")
    model: ModelConfig = Field(default_factory=ModelConfig, description="policy model and adapter")
    training: TrainingConfig = Field(default_factory=TrainingConfig, description="optimization")
    logging: LoggingConfig = Field(default_factory=LoggingConfig, description="console output and experiment trackers")
    run: RunConfig = Field(default_factory=RunConfig, description="run directory and checkpoints")


class RLSettings(RunSettings):
    """The shared RL sections: prompts, rollout sampling, the policy-gradient training and the KL. The `reward`
    section is each RL recipe's own (its terms: purplerl.train.recipe.reward_section)."""

    sampling: SamplingConfig = Field(default_factory=SamplingConfig, description="rollout sampling")
    training: RLTrainingConfig = Field(default_factory=RLTrainingConfig, description="optimization and stop rules")
    data: DataConfig = Field(default_factory=DataConfig, description="prompt source")
    reward: RewardBase = Field(default_factory=RewardBase, description="reward composition")

    def step_sequences(self) -> tuple[int, str] | None:
        """(the sequences one step of the shared RL loop trains on in each process, how they are counted), which
        training.mini_batches may not exceed; None where a recipe counts a step's sequences itself."""
        t, procs = self.training, self.engine.procs
        return (t.batch_size * self.sampling.group_size // procs,
                "training.batch_size x sampling.group_size" + (" / engine.procs" if procs > 1 else ""))

    @model_validator(mode="after")
    def _mini_batches_fit(self) -> RLSettings:
        # refused with the settings, not at step 1 after the run dir was written
        found = self.step_sequences()
        if found is not None and self.training.mini_batches > found[0]:
            rows, counted = found
            raise ValueError(f"training.mini_batches={self.training.mini_batches} exceeds the {rows} sequences a step "
                             f"trains on ({counted}): give at most {rows}")
        return self
