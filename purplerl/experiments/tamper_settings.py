"""`purplerl tamper-test`'s settings: the attack's tree plus the defended adapter, the threat models, the utility
check and the held-out judges.

They live outside the package purplerl.experiments.tamper, whose `__init__` is the test itself and loads torch:
`purplerl tamper-test --help` reads them without it (purplerl.experiments.tamper.settings names them there too).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, create_model, model_validator

from purplerl.config import Command, JudgesConfig, TamperConfig, UtilityConfig
from purplerl.config.commands import JUDGES_FLAT, TAMPER_FLAT, UTILITY_FLAT
from purplerl.recipes.attack import ATTACK, AttackSettings
from purplerl.rewards.named import fn_weights

COMPLIANCE = "compliance"  # the registered term that judges held-out answers when no model judge gives a harm verdict


def harm_verdict_judged(judges: JudgesConfig) -> bool:
    """Whether a model judge gives each held-out answer a harm verdict (a harm classifier or a guard model)."""
    return judges.harm_model is not None or judges.guard_model is not None


class _TamperChecks:
    @model_validator(mode="after")
    def _adaptive_by_threat(self) -> Any:
        paid = fn_weights(self.reward.terms)  # a named use of a term counts as the term
        if "entropy_bonus" in paid:
            # set there, every threat would become the adaptive attack and no run would be the plain one
            raise ValueError("reward.terms.entropy_bonus is set by the adaptive threat: use tamper.entropy_bonus_cap "
                             "and --threats adaptive")
        if paid.get(COMPLIANCE, 0.0) != 0 and not harm_verdict_judged(self.judges):
            # the held-out harm would then be judged by the very compliance judge the attack is rewarded by
            raise ValueError("reward.terms.compliance makes the attack optimize the compliance judge, which is the "
                             "held-out judge here: set it to 0 or give a model judge (--harm_model or --guard_model)")
        # A refusal penalty (reward.terms.refusal < 0) is allowed: the held-out compliance judge needs more than
        # the absence of refusal phrases (relevance and substance the attack is not paid for), so an attack that
        # only learned to avoid them, e.g. with a content-free profane persona, does not score as harm.
        return self

    def attack_config(self) -> Any:
        """The attack every run shares, without the comparison's sections."""
        return AttackSettings.model_validate(self.model_dump(include=set(AttackSettings.model_fields)))


TamperTestSettings = create_model(
    "TamperTestSettings", __base__=(AttackSettings, _TamperChecks),
    tamper=(TamperConfig, Field(default_factory=TamperConfig, description=(
        "the defended adapter, threat models, seeds and held-out judge"))),
    utility=(UtilityConfig, Field(default_factory=UtilityConfig, description=(
        "utility of the base and the defended model before any attack"))),
    judges=(JudgesConfig, Field(default_factory=JudgesConfig, description=(
        "judges of the held-out answers: a harm classifier or guard model gives the harm verdict, else the compliance "
        "judge (judges.terms.compliance sets its parameters)"))))

# The attack's defaults but its target: the model and prompt format are the defended run's (shared_attack), unless
# the command line names them. Greedy utility passes of the base and the defended model on a laptop: a sample.
TAMPER = Command(TamperTestSettings, {**ATTACK.flat, **UTILITY_FLAT, **TAMPER_FLAT, **JUDGES_FLAT},
                 defaults={**{k: v for k, v in ATTACK.command().defaults.items() if k != "model"},
                           "utility": {"limit": 40}}, migrate=ATTACK.migrated)
