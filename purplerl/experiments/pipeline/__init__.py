"""`purplerl pipeline`: a staged RLHF pipeline in one YAML file, e.g. sft -> reward-model -> prefs (DPO) -> eval.

Each stage is a row of the recipe table with its settings, a refine stage or an eval stage (settings.py). A policy
stage trains from the model the last passing stage left and is merged into a plain model dir; the capability eval
and the adversarial validator measure it (measure.py, validator.py) and the gates decide whether the next stage
starts from it or it is rolled back (gates.py, run.py). history.json records every stage's config, metrics, gates
and decision (history.py); a killed pipeline resumes at its stage; `purplerl report OUT` draws the stages side by
side (report.py).
"""

from typing import Any

from purplerl.experiments.pipeline.history import HISTORY_FILE
from purplerl.experiments.pipeline.settings import PIPELINE, PipelineSettings
from purplerl.experiments.pipeline.stages import load_pipeline, read_pipeline


def __getattr__(name: str) -> Any:
    """`run_pipeline`, imported when first asked for: it runs the recipes (torch), and `purplerl pipeline --help`
    reads only the settings."""
    if name == "run_pipeline":
        from purplerl.experiments.pipeline.run import run_pipeline

        return run_pipeline
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["HISTORY_FILE", "PIPELINE", "PipelineSettings", "load_pipeline", "read_pipeline", "run_pipeline"]
