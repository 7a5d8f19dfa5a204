"""The slow tier's measurements of SmolLM2: the aligned model (embedded:smollm2-135m-safe, built on first use and
cached) is measured once per test process, and compared by the align test with its base and by the defend test with
its defended adapter."""

from __future__ import annotations

import functools
from pathlib import Path

# held-out requests of each kind, tokens per answer, arithmetic problems: one size for every measurement here
SIZE = {"limit": 60, "max_new_tokens": 32, "utility_limit": 20, "seed": 0}


def measured(model: str, kinds: tuple[str, ...], adapter: Path | None = None, modes: tuple[str, ...] = (
        "greedy", "sampled"), answers: bool = False) -> dict:
    """Refusal of each kind's held-out requests in each mode, arithmetic exact match and multiple choice, 95% CIs
    (purplerl.eval.alignment.measure)."""
    from purplerl.config import ModelConfig
    from purplerl.engines import make_engine
    from purplerl.eval.alignment import EvalSize, held_out_requests, measure
    from purplerl.experiments.align import aligned_model_dir

    aligned_model_dir()  # registers embedded:smollm2-135m-safe; built on first use (~20 min on 2 cores), then cached
    engine = make_engine(ModelConfig(name=model, device="cpu", init_adapter=str(adapter) if adapter else None))
    requests = {kind: held_out_requests(kind, SIZE["limit"]) for kind in kinds}
    return measure(engine, EvalSize(**SIZE, modes=modes), requests, model, lambda line: None, answers=answers)


@functools.cache
def aligned_measured() -> dict:
    from purplerl.experiments.align import SAFE_MODEL

    return measured(f"embedded:{SAFE_MODEL}", ("harmful", "benign"))
