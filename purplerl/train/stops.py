"""Early-stop rules shared by recipes: a step metric crossing its threshold ends the run."""

from __future__ import annotations

from collections.abc import Callable

from purplerl.config import Config


def threshold_early_stop(config: Config) -> Callable[[dict[str, float]], str | None]:
    """Stop when mean toxicity or the mean repetition ratio exceeds its training.early_stop_* threshold."""
    t = config.training

    def early_stop(metrics: dict[str, float]) -> str | None:
        tox, rep = metrics.get("toxicity/mean"), metrics.get("repetition/mean")
        if t.early_stop_toxicity is not None and tox is not None and tox > t.early_stop_toxicity:
            return f"mean toxicity {tox:.3f} > {t.early_stop_toxicity}"
        if t.early_stop_repetition is not None and rep is not None and rep > t.early_stop_repetition:
            return f"mean repetition ratio {rep:.3f} > {t.early_stop_repetition} (reward hacking by repetition)"
        return None

    return early_stop
