"""Loading a policy from a run or a checkpoint, prompted as it was trained.

`resolve_policy` is how `eval`, `sample` and `tamper-test` load a checkpoint: with the base model and prompt
format of the run that trained it (runs/<run>/config.yaml), or, for a bare adapter dir, the base model its
adapter_config.json names. `Policy.checked` checks that its adapter fits that base model, from files alone, before
any work starts.

A checkpoint of gradient routing (purplerl route) holds two adapters: the retain adapter (the policy's own,
`default`, at the top) and the forget adapter (its `forget` subdir). It loads in one of three modes, each a scale
per adapter: both (1, 1: the trained model, the default), retain_only (1, 0: the forget adapter ablated) and
forget_only (0, 1).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from purplerl.config import ModelConfig, ModelLoadConfig, PromptFormatConfig, Section, build, read_config_file
from purplerl.config.evaluation import ADAPTER_MODE_NAMES
from purplerl.engines.adapters import adapter_dir
from purplerl.engines.loading import is_full_model_dir, read_adapter_config
from purplerl.errors import UserError
from purplerl.prompting import render_prompt
from purplerl.runs.layout import CONFIG_FILE, run_config_of
from purplerl.types import PromptRecord, SamplingParams

# What a checkpoint's run decides about loading its base model and prompting it, unless the command sets it.
RUN_MODEL_FIELDS = ("name", "revision", "dtype")
RUN_PROMPT_FIELDS = ("template", "system_prompt", "max_prompt_tokens")
RETAIN, FORGET = "default", "forget"  # gradient routing's adapters: the policy's own, and the one hacks train
ADAPTER_MODES: dict[str, dict[str, float]] = {  # a routed checkpoint's modes: each adapter's scale
    "both": {RETAIN: 1.0, FORGET: 1.0}, "retain_only": {RETAIN: 1.0, FORGET: 0.0},
    "forget_only": {RETAIN: 0.0, FORGET: 1.0}}
if tuple(ADAPTER_MODES) != ADAPTER_MODE_NAMES:  # the settings' choices are these modes
    raise AssertionError(f"adapter modes {tuple(ADAPTER_MODES)} differ from the settings' {ADAPTER_MODE_NAMES}")


# what a command that loads one adapter says of a routed checkpoint: it takes the retain adapter, which is
# gradient routing's deployment (the forget adapter, where the hack was routed, ablated)
ROUTED_ONE_ADAPTER = ("note: {} is a gradient-routing checkpoint: its retain adapter is used, the forget adapter "
                      "left out (retain_only)")


def routed_checkpoint(path: str | Path) -> bool:
    """Whether a checkpoint dir holds gradient routing's forget adapter beside its policy's."""
    return (adapter_dir(Path(path), FORGET) / "adapter_config.json").is_file()


@dataclass(frozen=True)
class Policy:
    """A model to load (a base model, with a checkpoint's adapter or without) and the prompt format it expects."""

    model: ModelConfig  # init_adapter: the checkpoint dir, None for the base model alone (or a full checkpoint)
    prompt: PromptFormatConfig
    run_config: str | None = None  # the run's config.yaml the loading and prompting settings came from
    note: str | None = None  # what the user should be told (a bare adapter's fallback)
    base: ModelConfig | None = None  # a full-parameter checkpoint's base model (what without_adapter gives)
    mode: str | None = None  # a routed checkpoint's adapter mode (ADAPTER_MODES); None: a policy of one adapter

    def describe(self) -> dict[str, Any]:
        """What a generation depends on, for eval.json and a resumed eval's check."""
        return {"model": self.model.name, "revision": self.model.revision, "dtype": self.model.dtype,
                "adapter": self.model.init_adapter, **self.prompt.model_dump(mode="json"),
                "run_config": self.run_config, **({} if self.mode is None else {"adapters": self.mode})}

    def without_adapter(self) -> Policy:
        """The same base model, prompted the same way, with no adapter."""
        if self.base is not None:
            return replace(self, model=self.base, base=None, note=None, mode=None)
        return replace(self, model=self.model.model_copy(update={"init_adapter": None}), note=None, mode=None)

    def with_mode(self, mode: str) -> Policy:
        """This routed checkpoint in adapter mode `mode`; a policy of one adapter is its own `both`."""
        if mode not in ADAPTER_MODES:
            raise UserError(f"unknown adapter mode '{mode}' (known: {', '.join(ADAPTER_MODES)})")
        if self.mode is None and mode != "both":
            raise UserError(f"{self.model.init_adapter or self.model.name} has no forget adapter (not a checkpoint of "
                            f"purplerl route): adapter mode '{mode}' needs one")
        return self if self.mode is None else replace(self, mode=mode)

    def checked(self, what: str = "checkpoint") -> Policy:
        """This policy once its adapter is checked against its base model from files alone (shapes; no weight
        loads), so a misfit is one UserError before any work; a base model of another name adds a note."""
        if self.model.init_adapter is None:
            return self
        from purplerl.engines.adapter_fit import check_adapter_fits

        note = check_adapter_fits(self.model.init_adapter, self.model.name, self.model.revision, what)
        if self.mode is not None:
            check_adapter_fits(adapter_dir(Path(self.model.init_adapter), FORGET), self.model.name,
                               self.model.revision, f"{what}'s forget adapter")
        return replace(self, note="\n".join(line for line in (self.note, note) if line) or None)

    def load(self) -> Any:
        """The engine that samples from this policy (a routed checkpoint's adapters at its mode's scales)."""
        from purplerl.engines import make_engine

        engine = make_engine(self.model)
        if self.mode is not None:
            engine.create_adapter(FORGET, init=adapter_dir(Path(self.model.init_adapter), FORGET))
            engine.use_adapters(ADAPTER_MODES[self.mode])
        return engine

    def render(self, tokenizer: Any, records: list[PromptRecord]) -> list[list[int]]:
        """Each record's prompt tokens, in the format this policy was trained with."""
        p = self.prompt
        return [render_prompt(tokenizer, r, template=p.template, system_prompt=p.system_prompt,
                              max_prompt_tokens=p.max_prompt_tokens) for r in records]

    def generate(self, engine: Any, records: list[PromptRecord], n: int, params: SamplingParams) -> list[list[str]]:
        """The texts of `n` completions per record from `engine` (this policy, loaded), prompted in its format."""
        groups = engine.sample(self.render(engine.tokenizer, records), n, params)
        return [[c.text for c in group] for group in groups]


def _run_settings(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The model and prompt settings a run's config.yaml holds, each checked as its field would be. Only these
    are read, so a run of any recipe (whatever its other sections) is prompted as it was trained."""
    raw = read_config_file(path)
    model, data = raw.get("model"), raw.get("data")
    model = {k: v for k, v in model.items() if k in RUN_MODEL_FIELDS} if isinstance(model, dict) else {}
    data = {k: v for k, v in data.items() if k in RUN_PROMPT_FIELDS} if isinstance(data, dict) else {}
    try:
        build(_RunSettings, {"model": model, "data": data})
    except UserError as err:
        raise UserError(f"{path}: {err}") from None
    return model, data


class _RunSettings(Section):
    model: ModelLoadConfig
    data: PromptFormatConfig


def _unset(section: Section, values: dict[str, Any]) -> dict[str, Any]:
    """The values for fields the user left alone: what they set on the command line or in a file wins."""
    return {k: v for k, v in values.items() if k not in section.model_fields_set}


def resolve_policy(checkpoint: str | Path | None, model: ModelLoadConfig, prompt: PromptFormatConfig) -> Policy:
    """The one way `eval`, `sample` and `tamper-test` load a checkpoint, so a policy is prompted as it was trained.

    A checkpoint inside a run (runs/<run>/checkpoints/step_N) takes its base model (name, revision, dtype)
    and prompt format (template, system prompt, max prompt tokens) from runs/<run>/config.yaml. A bare PEFT
    adapter dir takes the base model its adapter_config.json names and the command's prompt format, and the
    returned note says so. Settings the user gave (`model`/`prompt` fields they set) win either way; device
    and engine knobs always come from the command. A full-parameter checkpoint (a model dir) is loaded as the
    model itself, in the same way."""
    values = model.model_dump()
    if checkpoint is None:
        return Policy(ModelConfig.model_validate({**values, "init_adapter": None}), prompt)
    checkpoint = Path(checkpoint)
    if is_full_model_dir(checkpoint):
        return _full_policy(checkpoint, model, prompt)
    adapter = read_adapter_config(checkpoint, "checkpoint")
    run_file = run_config_of(checkpoint)
    if run_file is not None:
        run_model, run_prompt = _run_settings(run_file)
        values.update(_unset(model, run_model))
        prompting = prompt.model_copy(update=_unset(prompt, run_prompt))
        return Policy(ModelConfig.model_validate({**values, "init_adapter": str(checkpoint)}), prompting,
                      run_config=str(run_file), mode="both" if routed_checkpoint(checkpoint) else None)
    base = adapter.get("base_model_name_or_path")
    if "name" not in model.model_fields_set:
        if not base:
            raise UserError(f"{checkpoint} names no base model (no run config.yaml, no base_model_name_or_path): "
                            "give --model")
        values["name"] = base
    note = (f"{checkpoint} is not a checkpoint of a run (no {CONFIG_FILE} two levels up): base model "
            f"{values['name']}, prompt format {prompt.template!r} with system prompt {prompt.system_prompt!r}")
    return Policy(ModelConfig.model_validate({**values, "init_adapter": str(checkpoint)}), prompt, note=note,
                  mode="both" if routed_checkpoint(checkpoint) else None)


def _full_policy(checkpoint: Path, model: ModelLoadConfig, prompt: PromptFormatConfig) -> Policy:
    """A full-parameter checkpoint: the model is the checkpoint dir itself; its run's dtype and prompt format
    apply, and the run's base model is what `without_adapter` compares it with."""
    values = {**model.model_dump(), "init_adapter": None}
    run_file = run_config_of(checkpoint)
    note = None
    if run_file is not None:
        run_model, run_prompt = _run_settings(run_file)
        values.update(_unset(model, run_model))
        prompt = prompt.model_copy(update=_unset(prompt, run_prompt))
    else:
        note = (f"{checkpoint} is not a checkpoint of a run (no {CONFIG_FILE} two levels up): a full model, "
                f"prompt format {prompt.template!r} with system prompt {prompt.system_prompt!r}")
    base = ModelConfig.model_validate(values)
    loaded = base.model_copy(update={"name": str(checkpoint), "revision": None, "finetune": "full"})
    return Policy(loaded, prompt, run_config=str(run_file) if run_file else None, note=note, base=base)
