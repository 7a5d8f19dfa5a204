"""`purplerl tamper-test`'s settings, defined in purplerl.experiments.tamper_settings: outside this package, whose
`__init__` loads torch, so that `purplerl tamper-test --help` reads them without it."""

from purplerl.experiments.tamper_settings import TAMPER, TamperTestSettings

__all__ = ["TAMPER", "TamperTestSettings"]
