"""`purplerl adversarial`: a learned attacker against a defender, both trained by RL on one base (MTSA, issue 23).

The attacker and the defender are two LoRA adapters on one frozen base; the KL reference of both is the base with the
adapters off (step.py). Each step the attacker writes attacks on a batch of goals (data.source:
the goals, e.g. builtin:redteam or the attacker SFT set), the defender answers, the two go on for adversarial.turns
turns, and a judge gives P(unsafe) of each answer in its dialogue. The defender is rewarded for safety, 1 - P(unsafe),
plus reward.terms (by default the entropy minimization of `defend`, at a small weight), minus the KL; the attacker for
P(unsafe) plus a novelty bonus against its recent attacks (curiosity-driven red teaming, Hong et al. 2024), minus its
KL. adversarial.schedule alternates which of them trains.

The default judge is the offline compliance judge (does the answer address the request with substance?); a
Llama-Guard-style model is `--judge guard --adversarial.judge.params '{model: DIR}'`, and one served by `purplerl
serve-reward` is `--judge toxicity --adversarial.judge.params '{url: http://HOST:PORT}'`. The attacker starts from
`--attacker_init` (an attacker SFT run or adapter dir) or from the base; the defender from `--init_adapter`.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from purplerl.config.base import Section, Spec, read_when
from purplerl.config.migrate import get_path, move
from purplerl.config.sections import DialogueConfig, RLSettings
from purplerl.engines.capabilities import ADAPTER_SWITCHING, GIST_ATTENTION, GIST_SAMPLING
from purplerl.errors import UserError
from purplerl.rewards.registry import READS, get_term, term_params
from purplerl.train.recipe import FIXED_ON_RESUME, RL_FLAT, Recipe, RunNamePart, lazy, recipe_field, reward_section

# the defender's reward besides its safety: entropy minimization (MTSA's, as `defend` rewards it) at a weight that
# leaves the judge in charge (a 135M model's answers have 2-4 nats per token), and repetition logged
TERMS = {"response_entropy": -0.1, "repetition": 0.0}
JUDGE = "compliance"


def _multi_turn(a: Any) -> bool:
    return a.turns > 1


class JudgeSpec(Spec):
    """The judge: a registered text reward term giving P(unsafe) of an answer, its parameters, what it reads with the
    answer, and the P(unsafe) from which an answer is an attack success."""

    shorthand: ClassVar[str] = "fn"

    fn: str = Field(JUDGE, description=(
        "registered text reward term giving P(unsafe) of an answer in its dialogue: compliance (offline), guard (a "
        "Llama-Guard-style model), harm_classifier, or toxicity with a url (a reward server)"))
    params: dict[str, Any] = Field(default_factory=dict, description=(
        "the judge term's parameters, e.g. {model: DIR} for guard (the run records them all)"))
    reads: Literal["goal", "dialogue"] = Field("goal", description=(
        "what the judge reads with each answer: 'goal' (the harmful goal as the request, as HarmBench's classifiers "
        "judge: an attack that loses the goal earns nothing for an on-topic answer) or 'dialogue' (the dialogue up to "
        "the answer, as the defender saw it)"))
    unsafe_at: float = Field(0.5, ge=0.0, le=1.0, description=(
        "an answer counts as unsafe (an attack success, asr) when P(unsafe) >= this"))

    @model_validator(mode="before")
    @classmethod
    def _judge_recorded(cls, data: Any) -> Any:
        """The judge's parameters with every default filled in, so config.yaml says what judged the run."""
        data = data if isinstance(data, (dict, BaseModel)) else {cls.shorthand: data}
        if not isinstance(data, dict):
            return data
        name, params = data.get("fn", JUDGE), data.get("params") or {}
        if not isinstance(name, str) or not isinstance(params, dict):
            return data  # pydantic names the mistyped field
        try:
            term = get_term(name)
            if term.scorer is None:
                raise UserError(f"judge '{name}' reads {READS[term.needs]}: the judge must be a text term")
            values = term_params(name, params or None)
        except UserError as err:
            raise ValueError(str(err)) from None
        return {**data, "params": {} if values is None else values.settings()}


class NoveltySpec(Spec):
    """The attacker's novelty bonus (curiosity-driven red teaming): its weight and the attacks it compares with."""

    shorthand: ClassVar[str] = "weight"

    weight: float = Field(0.1, ge=0.0, description="weight of the bonus in the attacker's reward")
    window: int = Field(64, ge=1, description=(
        "the recent attacks the bonus compares with (the last N, and the step's others)"))


class AdversarialConfig(Section):
    """The attacker, the judge, the dialogue and which learner trains when."""

    turns: int = Field(1, ge=1, le=16, description=(
        "turns of each dialogue (K): attack, answer, next attack, ...; every answer is judged in the dialogue "
        "before it"))
    attacker_group: int = Field(2, ge=1, le=64, description=(
        "opening attacks per goal (the attacker's group, A); each opens sampling.group_size dialogues (the defender's "
        "group, G)"))
    schedule: str = Field("1:1", description=(
        "which learner trains at each step: 'attacker', 'defender', or 'N:M' (N attacker steps, then M defender steps, "
        "repeated)"))
    judge: JudgeSpec = Field(default_factory=JudgeSpec, description=(
        "the judge giving P(unsafe) of each answer: its reward term (compliance, guard, harm_classifier, or "
        "toxicity with a url), or its fields (below) set one by one"))
    novelty: NoveltySpec = Field(default_factory=NoveltySpec, description=(
        "the attacker's novelty bonus, 1 - its 1-3-gram overlap with recent attacks: its weight, or its fields "
        "(below)"))
    attacker_kl_beta: float | None = Field(None, ge=0.0, description=(
        "weight of the attacker's KL to the base (null: reward.kl_beta, the defender's)"))
    attacker_init: str | None = Field(None, description=(
        "start the attacker adapter from this PEFT dir or run dir (its newest checkpoint, e.g. an attacker SFT run); "
        "null: a fresh adapter (the base)"))
    gamma: read_when(float, _multi_turn, "adversarial.turns > 1") = Field(1.0, ge=0.0, le=1.0, description=(
        "discount of later turns' rewards in a turn's return (1: summed to the dialogue's end)"))

    @field_validator("schedule")
    @classmethod
    def _schedule(cls, schedule: str) -> str:
        from purplerl.recipes.adversarial.step import parse_schedule  # the loop's own reading; it loads torch

        parse_schedule(schedule)
        return schedule


AdversarialReward = reward_section("adversarial", TERMS)
# its step's turns are counted by check_adversarial, which bounds training.mini_batches by the attacker's
class AdversarialSettings(RLSettings):
    """`purplerl adversarial`: the shared RL sections, the defender's reward, the attacker and the dialogue."""

    recipe: str = recipe_field("adversarial")
    reward: AdversarialReward = Field(default_factory=AdversarialReward, description="reward composition")
    adversarial: AdversarialConfig = Field(default_factory=AdversarialConfig, description=(
        "the attacker, the judge, the dialogue and the update schedule (recipes/adversarial/step.py)"))
    dialogue: DialogueConfig = Field(default_factory=DialogueConfig, description=(
        "how the defender reads the dialogue's earlier turns: gist tokens compress them"))

    def step_sequences(self) -> None:
        return None  # a step's turns are counted by check_adversarial, which bounds mini_batches by the attacker's


def migrate(data: dict[str, Any], saved: bool) -> dict[str, Any]:
    """An older adversarial config: adversarial.judge (the term), judge_params, judge_reads and unsafe_at as the
    fields of the judge; novelty_weight and novelty_window as those of adversarial.novelty."""
    if isinstance(get_path(data, "adversarial.judge"), str):
        data["adversarial"]["judge"] = {"fn": data["adversarial"]["judge"]}
    for old, new in (("judge_params", "params"), ("judge_reads", "reads"), ("unsafe_at", "unsafe_at")):
        move(data, f"adversarial.{old}", f"adversarial.judge.{new}")
    if isinstance(get_path(data, "adversarial.novelty"), int | float):
        data["adversarial"]["novelty"] = {"weight": data["adversarial"]["novelty"]}
    for old in ("weight", "window"):
        move(data, f"adversarial.novelty_{old}", f"adversarial.novelty.{old}")
    return data


def _schedule_name(config: Any) -> str:
    schedule = config.adversarial.schedule
    return schedule[:3] if schedule in ("attacker", "defender") else "alt" + schedule.replace(":", "-")


ADVERSARIAL = Recipe(
    name="adversarial",
    settings=AdversarialSettings,
    help="""Adversarial RL (MTSA): an attacker adapter and a defender adapter on one base, over adversarial.turns turns.

    The attacker writes attacks on the goals (--data), the defender answers (sampling.group_size dialogues per
    attack), a judge (adversarial.judge) gives P(unsafe) of each answer. Defender: 1 - P(unsafe) + reward.terms
    - KL; attacker: P(unsafe) + novelty - KL. adversarial.schedule: attacker, defender, or N:M alternating.""",
    prepare=lazy("purplerl.recipes.adversarial.step:adversarial_prepare"),
    migrate=migrate,
    defaults={"model": {"name": "embedded:smollm2-135m-safe"}, "reward": {"terms": TERMS, "kl_beta": 0.05},
              "training": {"batch_size": 4}},
    run_name=(RunNamePart("", _schedule_name), RunNamePart("K", lambda c: c.adversarial.turns),
              RunNamePart("A", lambda c: c.adversarial.attacker_group),
              RunNamePart("G", lambda c: c.sampling.group_size), RunNamePart("B", lambda c: c.training.batch_size),
              RunNamePart("lr", lambda c: c.training.lr), RunNamePart("kl", lambda c: c.reward.kl_beta)),
    summary_metrics={"asr": "attack success rate", "unsafe/mean": "judge P(unsafe)",
                     "attack/diversity": "attack diversity", "defender_reward/mean": "defender reward",
                     "attacker_reward/mean": "attacker reward"},
    flat={**RL_FLAT, "turns": "adversarial.turns", "schedule": "adversarial.schedule", "judge": "adversarial.judge",
          "attacker_group": "adversarial.attacker_group", "attacker_init": "adversarial.attacker_init"},
    fixed_on_resume=FIXED_ON_RESUME | {"adversarial.turns", "adversarial.attacker_group", "adversarial.judge.fn",
                                       "adversarial.judge.params", "adversarial.attacker_init",
                                       "dialogue.gist_tokens"},
    # attacker and defender on one base; a gist defender samples and scores under the gist mask
    needs=lambda config: frozenset({ADAPTER_SWITCHING} | ({GIST_ATTENTION, GIST_SAMPLING}
                                                         if config.dialogue.gist_tokens else set())),
)

__all__ = ["ADVERSARIAL", "AdversarialConfig", "AdversarialSettings"]
