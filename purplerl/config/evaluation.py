"""The settings of judging a model: the tree of `purplerl eval` (its targets, suites and judges), and the utility
and judges sections that tamper-test shares with it."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from purplerl.config.base import Section, choices, comma_list, once_each, read_when
from purplerl.config.sections import EvalDataConfig, GenerationConfig, ModelLoadConfig

# The names each of these fields may hold live here, with the settings: the module that implements them
# (purplerl.eval.run's suites) sits above config and checks that it covers them.
SUITE_NAMES = ("harm", "utility", "diversity")
SUITE = choices(SUITE_NAMES, "suite")
# a gradient-routing checkpoint's adapter modes (purplerl.runs.policy.ADAPTER_MODES gives each its scales)
ADAPTER_MODE_NAMES = ("both", "retain_only", "forget_only")
AdapterMode = Literal["both", "retain_only", "forget_only"]


class UtilityConfig(Section):
    """The benign-work check that a defense or an attack must not break (purplerl.eval.utility)."""

    source: str = Field("builtin:arithmetic", description=(
        "math set: 'builtin:arithmetic', a .jsonl/.parquet file or a dir from `purplerl data prepare gsm8k`"))
    limit: int | None = Field(None, ge=1, description="at most this many math problems (null: all)")
    max_new_tokens: int = Field(128, ge=8, le=32768, description=(
        "greedy tokens per math answer: a worked answer ends with '#### n' after its reasoning, so it needs more room "
        "than sampling.max_new_tokens gives a harm probe"))


def _math(u: Any) -> bool:
    return u.math_source is not None


class EvalUtilityConfig(UtilityConfig):
    choice_source: str | None = Field("builtin:choice", description=(
        "multiple-choice set scored by option log-likelihood: builtin:choice, a file/dir, hf:ORG/NAME[:CONFIG]; null "
        "or 'none' skips it"))
    choice_limit: int | None = Field(None, ge=1, description="at most this many multiple-choice questions (null: all)")
    math_source: str | None = Field(None, description=(
        "MATH-style problems solved step by step, scored by exact match of the last \\boxed{} answer after MATH's "
        "normalisation: builtin:math, a .jsonl/.parquet file or dir in MATH-500's fields, hf:ORG/NAME[:CONFIG] (e.g. "
        "hf:HuggingFaceH4/MATH-500); null or 'none' skips it"))
    math_limit: read_when(int | None, _math, "utility.math_source is set") = Field(None, ge=1, description=(
        "at most this many MATH-style problems (null: all)"))
    math_max_new_tokens: read_when(int, _math, "utility.math_source is set") = Field(512, ge=16, le=32768, description=(
        "greedy tokens per MATH-style solution: the reasoning comes before the boxed answer, and a solution cut "
        "before its box has no answer"))

    @field_validator("math_source")
    @classmethod
    def _none_skips(cls, source: str | None) -> str | None:
        return None if source is None or source.strip().lower() in ("", "none") else source


def _attacker(e: Any) -> bool:
    return e.attacker is not None


def _checkpoints(e: Any) -> bool:
    return bool(e.checkpoints)


class EvalConfig(Section):
    checkpoints: list[str] = Field(default_factory=list, description=(
        "PEFT adapter dirs evaluated beside the base model, each prompted as its run was trained; repeat --checkpoint"))
    baselines: list[str] = Field(default_factory=list, description=(
        "other models evaluated beside, with no adapter and prompted as the base model, e.g. the model before "
        "alignment (embedded:smollm2-135m-instruct); each is a target labelled by its name, and the reading quotes "
        "its compliance ('A,B' works too)"))
    suites: list[SUITE] = Field(default_factory=lambda: list(SUITE_NAMES), description=(
        "which suites to run, in order ('harm,utility' works too; default: all)"))
    n: int = Field(1, ge=1, le=1024, description="completions per prompt")
    seed: int = Field(0, description="sampling and bootstrap seed")
    batch_size: int = Field(16, ge=1, description="prompts per sampling call")
    out: str = Field("runs/eval", description="output dir; a rerun into it resumes the generations")
    adapters: read_when(list[AdapterMode], _checkpoints, "eval.checkpoints is set") = Field(
        default_factory=lambda: ["both"], description=(
            "a gradient-routing checkpoint (purplerl route) is evaluated once per mode: both adapters, retain_only "
            "(the forget adapter ablated), forget_only; its label gets -MODE but for both ('both,retain_only' works "
            "too); other checkpoints are evaluated once"))

    @field_validator("adapters", mode="before")
    @classmethod
    def _split_modes(cls, value: Any) -> Any:
        return comma_list(value)

    @field_validator("adapters")
    @classmethod
    def _modes_once(cls, modes: list[str]) -> list[str]:
        if not modes:
            raise ValueError("name at least one adapter mode")
        return once_each(modes, "adapter mode")

    @field_validator("baselines", mode="before")
    @classmethod
    def _split_baselines(cls, value: Any) -> Any:
        return comma_list(value)

    @field_validator("baselines")
    @classmethod
    def _baselines_once(cls, names: list[str]) -> list[str]:
        return once_each(names, "baseline")

    @field_validator("suites", mode="before")
    @classmethod
    def _split_commas(cls, value: Any) -> Any:
        return comma_list(value)

    @field_validator("suites")
    @classmethod
    def _once_each(cls, suites: list[str]) -> list[str]:
        if not suites:
            raise ValueError("name at least one suite")
        return once_each(suites, "suite")

    # eval.rewards: purplerl.eval.rescore (named rewards from purplerl/rewards/named_rewards.yaml, or registered terms)
    rewards: list[str] = Field(default_factory=list, description=(
        "named rewards or registered terms scored on every target's answers (and on a run checkpoint's logged "
        "samples), each a mean with a 95% CI; a combination also per term, a detector its rh_rate: the decomposition "
        "of a combined reward ('sentence_length_5,happy_count' works too)"))
    rewards_file: read_when(str | None, lambda e: bool(e.rewards), "eval.rewards is set") = Field(None, description=(
        "a rewards YAML file whose named rewards eval.rewards may also name"))
    # eval.attacker: purplerl.eval.attacker (a learned attacker's prompts as the targets' harm prompts, issue 23)
    attacker: str | None = Field(None, description=(
        "an attacker checkpoint or its run dir (e.g. purplerl sft on `data prepare attack-prompts`, or a `purplerl "
        "adversarial` run: its trained attacker): it writes one attack per goal, asked as it was trained, and the "
        "attacks are every target's prompts; the goals are data.source's prompts, or with data.source left unset the "
        "attack-prompts set's goals of data.split (null: the prompts go to the targets as they are)"))
    attacker_temperature: read_when(float, _attacker, "eval.attacker is set") = Field(
        1.0, ge=0.0, le=10.0, description=(
            "the attacker's sampling temperature (0: greedy), seeded by eval.seed; top_p and top_k as the targets'"))
    attacker_max_new_tokens: read_when(int, _attacker, "eval.attacker is set") = Field(
        256, ge=1, le=32768, description="longest attack in tokens")

    @field_validator("rewards", mode="before")
    @classmethod
    def _split_rewards(cls, value: Any) -> Any:
        return comma_list(value)

    @field_validator("rewards")
    @classmethod
    def _rewards_once(cls, names: list[str]) -> list[str]:
        return once_each(names, "reward")


# A judge's fields are read once its model (or URL) is set; the field paired with it is read when given alone
# too, so that the pair check of JudgesConfig names both instead of refusing it as unread.
def _harm_pair(j: Any) -> bool:
    return j.harm_model is not None or j.harm_label is not None


def _harm_judge(j: Any) -> bool:
    return j.harm_model is not None or j.guard_model is not None


def _guard(j: Any) -> bool:
    return j.guard_model is not None


def _strongreject_model(j: Any) -> bool:
    return j.strongreject_url is not None or j.strongreject_model is not None


def _strongreject_key(j: Any) -> bool:
    return j.strongreject_url is not None or j.strongreject_key_env is not None


class JudgesConfig(Section):
    """The optional model judges of the harm suite (the refusal keywords and embedded toxicity always run)."""

    harm_model: str | None = Field(None, description="HF harm classifier reading the response only; with harm_label")
    harm_label: read_when(str | None, _harm_pair, "judges.harm_model is set") = Field(None, description=(
        "the harm classifier's harmful label (name or index)"))
    harm_threshold: read_when(float, _harm_judge, "judges.harm_model or judges.guard_model is set") = Field(
        0.5, ge=0.0, le=1.0, description="P(harmful) at which a response is flagged")
    guard_model: str | None = Field(None, description=(
        "Llama-Guard-style causal LM judge (HF id or path): guard_unsafe = P(unsafe); without harm_model its verdict "
        "is the harm verdict"))
    guard_unsafe_token: read_when(str, _guard, "judges.guard_model is set") = Field("unsafe", description=(
        "the guard's verdict word for unsafe"))
    strongreject_url: str | None = Field(None, description=(
        "OpenAI-compatible base URL (http(s)://.../v1) of the StrongREJECT rubric judge"))
    strongreject_model: read_when(str | None, _strongreject_model, "judges.strongreject_url is set") = Field(
        None, description="model name sent to strongreject_url")
    strongreject_key_env: read_when(str | None, _strongreject_key, "judges.strongreject_url is set") = Field(
        None, description="environment variable holding the StrongREJECT endpoint's API key")

    terms: dict[str, dict[str, Any]] = Field(default_factory=dict, description=(
        "more judges: registered text reward terms and their parameters, e.g. {repetition: {ngram: 2}, guard: {model: "
        "ORG/GUARD}}; each is scored on every answer and reported as term/NAME, its mean with a 95% CI"))

    @model_validator(mode="after")
    def _pairs(self) -> JudgesConfig:
        if (self.harm_model is None) != (self.harm_label is None):
            raise ValueError("harm_model and harm_label go together: give both or neither")
        if (self.strongreject_url is None) != (self.strongreject_model is None):
            raise ValueError("strongreject_url and strongreject_model go together: give both or neither")
        if self.strongreject_url is not None and not self.strongreject_url.startswith(("http://", "https://")):
            raise ValueError(f"strongreject_url must start with http:// or https://, got '{self.strongreject_url}'")
        if self.strongreject_key_env is not None and self.strongreject_url is None:
            raise ValueError("strongreject_key_env needs strongreject_url and strongreject_model")
        if not self.guard_unsafe_token.strip():
            raise ValueError("guard_unsafe_token must not be empty")
        return self

    def model_judged(self) -> bool:
        return self.guard_model is not None or self.strongreject_url is not None or self.harm_model is not None


class EvalCommandConfig(Section):
    """`purplerl eval`: the base model and each checkpoint, on the same prompts, judged the same way."""

    model: ModelLoadConfig = Field(default_factory=ModelLoadConfig, description=(
        "the base model (default: the checkpoints' run's)"))
    sampling: GenerationConfig = Field(default_factory=GenerationConfig, description="how completions are drawn")
    data: EvalDataConfig = Field(default_factory=EvalDataConfig, description=(
        "the prompts, and how a model that is not a run checkpoint is prompted"))
    eval: EvalConfig = Field(default_factory=EvalConfig, description="targets, suites and output")
    judges: JudgesConfig = Field(default_factory=JudgesConfig, description="optional model judges of the harm suite")
    utility: EvalUtilityConfig = Field(default_factory=EvalUtilityConfig, description="the utility suite")

    @model_validator(mode="after")
    def _judges_need_harm(self) -> EvalCommandConfig:
        if (self.judges.model_judged() or self.judges.terms) and "harm" not in self.eval.suites:
            raise ValueError("the judges score the harm suite: add harm to eval.suites (--suite)")
        return self
