"""`purplerl tamper-test`'s settings: the attack's tree plus the defended adapter, the threat models, the utility
check and the held-out judges."""

from __future__ import annotations

from typing import Any

from pydantic import Field, create_model, model_validator

from purplerl.config import Command, JudgesConfig, TamperConfig, UtilityConfig
from purplerl.config.commands import JUDGES_FLAT, TAMPER_FLAT, UTILITY_FLAT
from purplerl.recipes.attack import ATTACK, AttackSettings


class _TamperChecks:
    @model_validator(mode="after")
    def _adaptive_by_threat(self) -> Any:
        if "entropy_bonus" in self.reward.terms:
            # set there, every threat would become the adaptive attack and no run would be the plain one
            raise ValueError("reward.terms.entropy_bonus is set by the adaptive threat: use tamper.entropy_bonus_cap "
                             "and --threats adaptive")
        if self.reward.terms.get("refusal", 0.0) < 0 and not self.judges.model_judged():
            # the held-out harm would then be judged by the very refusal judge the attack is rewarded against
            raise ValueError("a refusal penalty (reward.terms.refusal < 0) makes the attack optimize the keyword "
                             "refusal judge, which is the held-out judge here: set it to 0 or give a model judge "
                             "(--harm_model or --guard_model)")
        return self

    def attack_config(self) -> Any:
        """The attack every run shares, without the comparison's sections."""
        return AttackSettings.model_validate(self.model_dump(include=set(AttackSettings.model_fields)))


TamperTestSettings = create_model(
    "TamperTestSettings", __base__=(AttackSettings, _TamperChecks),
    tamper=(TamperConfig, Field(default_factory=TamperConfig, description="the defended adapter, threat models, seeds and held-out judge")),  # noqa: E501
    utility=(UtilityConfig, Field(default_factory=UtilityConfig, description="utility of the base and the defended model before any attack")),  # noqa: E501
    judges=(JudgesConfig, Field(default_factory=JudgesConfig, description="optional model judges of the held-out answers (beside the refusal keywords)")))  # noqa: E501

# The attack's defaults but its target: the model and prompt format are the defended run's (shared_attack), unless
# the command line names them. Greedy utility passes of the base and the defended model on a laptop: a sample.
TAMPER = Command(TamperTestSettings, {**ATTACK.flat, **UTILITY_FLAT, **TAMPER_FLAT, **JUDGES_FLAT},
                 defaults={**{k: v for k, v in ATTACK.command().defaults.items() if k != "model"},
                           "utility": {"limit": 40}}, migrate=ATTACK.migrated)
