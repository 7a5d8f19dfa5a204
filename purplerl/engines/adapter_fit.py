"""Whether a LoRA adapter fits a model, decided from files before either loads.

Every command that takes an adapter (eval and sample --checkpoint, export --merge, tamper-test --adapter, a run's
model.init_adapter) calls `check_adapter_fits` before its work starts. It reads the shapes of the adapter's tensors
from the safetensors header (no weight is read) and compares them with the model's modules, built from its
config.json on the meta device (no weight is allocated; a fraction of a second). PEFT finds a mismatch only when it
loads the adapter, after the model has loaded (92 s into tamper-test, or after eval wrote the base model's
generations), and an adapter built for a deeper model it loads without a word: the keys of the layers the model
lacks are dropped as unexpected.

Shapes are the hard check: an adapter whose shapes do not fit cannot compute anything on this model. The base model
the adapter_config.json names is only compared, and a different one is a note, not an error: that name is a path or
hub id on the machine that trained the adapter, so a local copy, a re-download or purplerl's own cache dir of the
same model spells it differently. The note says which two names differ, so a user who meant another model sees it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from purplerl.engines.loading import (
    ADAPTER_WEIGHTS,
    DERIVED_MODELS,
    EMBEDDED_MODELS,
    EMBEDDED_PREFIX,
    cache_dir,
    model_source,
    read_adapter_config,
)
from purplerl.errors import UserError, first_line
from purplerl.files import looks_local

PEFT_PREFIX = "base_model.model."  # how PEFT's save_pretrained names every tensor of a causal LM's adapter
# LoRA tensor name endings -> which side of the adapted layer the tensor's shape must match: A reads the layer's
# inputs ([r, in]), B writes its outputs ([out, r]); an embedding's A reads token ids ([r, vocab]).
LORA_ENDINGS = {".lora_A.weight": "A", ".lora_B.weight": "B", ".lora_embedding_A": "A", ".lora_embedding_B": "B"}
# (inputs, outputs) attribute pairs of the layers LoRA adapts: linear, embedding, convolution, GPT-2's Conv1D
LAYER_DIMS = (("in_features", "out_features"), ("num_embeddings", "embedding_dim"), ("in_channels", "out_channels"),
              ("nx", "nf"))


def adapter_shapes(adapter_dir: str | Path) -> dict[str, tuple[int, ...]]:
    """Every tensor of the adapter's weights file and its shape, without reading a weight."""
    import torch
    from safetensors import SafetensorError, safe_open

    file = next(Path(adapter_dir) / name for name in ADAPTER_WEIGHTS if (Path(adapter_dir) / name).is_file())
    try:
        if file.suffix == ".safetensors":
            with safe_open(str(file), "pt") as weights:
                return {key: tuple(weights.get_slice(key).get_shape()) for key in weights.keys()}
        # a pickled adapter has no header: loaded onto the meta device, its tensors keep shapes and no data
        state = torch.load(file, map_location="meta", weights_only=True)
        return {key: tuple(value.shape) for key, value in state.items()}
    except (OSError, ValueError, RuntimeError, AttributeError, SafetensorError) as err:
        raise UserError(f"cannot read the adapter weights {file}: {first_line(err)[:200]}") from None


def model_skeleton(name: str, revision: str | None = None) -> Any:
    """The causal LM `name` built from its config on the meta device: its modules and shapes, no weights."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    path = model_source(name, revision)  # a hub id that cannot be served fails now, without transformers' retries
    try:
        config = AutoConfig.from_pretrained(path, revision=revision)
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(config)
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise UserError(f"cannot load model '{name}': {first_line(err)[:300]}") from None


def layer_dims(module: Any) -> tuple[int, int] | None:
    """(inputs, outputs) of a layer LoRA can adapt, or None for one whose sizes this check does not know."""
    for inputs, outputs in LAYER_DIMS:
        if hasattr(module, inputs) and hasattr(module, outputs):
            return int(getattr(module, inputs)), int(getattr(module, outputs))
    return None


def _lora_problem(module_name: str, side: str, shape: tuple[int, ...], model: Any, ranks: set[int]) -> str | None:
    try:
        module = model.get_submodule(module_name)
    except AttributeError:
        return f"it adapts {module_name}, which this model does not have"
    rank = shape[0] if side == "A" else shape[1] if len(shape) > 1 else None
    if rank not in ranks:
        allowed = ", ".join(map(str, sorted(ranks)))
        return f"its {module_name} has rank {rank}, where its adapter_config.json gives rank {allowed}"
    dims = layer_dims(module)
    if dims is None or len(shape) < 2:
        return None
    if side == "A" and shape[1] != dims[0]:
        return f"{module_name} takes {dims[0]} inputs, the adapter's lora_A {shape[1]}"
    if side == "B" and shape[0] != dims[1]:
        return f"{module_name} gives {dims[1]} outputs, the adapter's lora_B {shape[0]}"
    return None


def fit_problems(shapes: dict[str, tuple[int, ...]], model: Any, ranks: set[int]) -> list[str]:
    """What in an adapter's tensors (`shapes`) does not fit `model` (a skeleton will do), the LoRA layers' misfits
    first; `ranks` are the LoRA ranks its config allows. A tensor that is neither a LoRA weight nor a copy of a
    weight of the model (another PEFT method's own) is left to PEFT."""
    own = {name: tuple(tensor.shape) for name, tensor in model.state_dict(keep_vars=True).items()}
    layers: list[str | None] = []
    copies: list[str | None] = []
    for key, shape in shapes.items():
        name = key.removeprefix(PEFT_PREFIX)
        ending = next((end for end in LORA_ENDINGS if name.endswith(end)), None)
        if ending is not None:
            layers.append(_lora_problem(name.removesuffix(ending), LORA_ENDINGS[ending], shape, model, ranks))
            continue
        # modules_to_save and saved embedding layers: a copy of the model's own weight, shape for shape
        weight = name.replace(".base_layer.", ".")
        if weight in own and own[weight] != shape:
            copies.append(f"its copy of {weight} has shape {list(shape)}, the model's {list(own[weight])}")
    problems = [problem for problem in layers + copies if problem]
    if not layers:
        problems.append("it holds no LoRA weights (no lora_A / lora_B tensors)")
    return problems


def model_identity(name: str) -> str:
    """One spelling per model, to compare an adapter's recorded base with the model in use: `embedded:NAME` for
    purplerl's cache dir of that model, the resolved path of a local dir, the hub id itself."""
    if name.startswith(EMBEDDED_PREFIX):
        return name
    path = Path(name).expanduser()
    if looks_local(name) and path.absolute().parent == (cache_dir() / "models").absolute():
        for short in sorted([*EMBEDDED_MODELS, *DERIVED_MODELS], key=len, reverse=True):
            if path.name.startswith(f"{short}-"):
                return EMBEDDED_PREFIX + short
    return str(path.resolve()) if looks_local(name) else name.rstrip("/")


def _sizes(model: Any) -> str:
    """The sizes an adapter is built for, as the model's config states them."""
    config = model.config
    hidden, layers = getattr(config, "hidden_size", None), getattr(config, "num_hidden_layers", None)
    return f"hidden size {hidden}, {layers} layers"


def check_adapter_fits(adapter_dir: str | Path, model: str, revision: str | None = None,
                       what: str = "adapter") -> str | None:
    """Raise one UserError, naming the first misfit, when the LoRA adapter in `adapter_dir` cannot load onto
    `model`; else return a note when its config names another base model (None when it names this one or none).
    `what` names where the adapter came from (an option or setting)."""
    config = read_adapter_config(adapter_dir, what)
    ranks = {config.get("r", 8), *config.get("rank_pattern", {}).values()}  # 8: PEFT's default rank
    skeleton = model_skeleton(model, revision)
    problems = fit_problems(adapter_shapes(adapter_dir), skeleton, ranks)
    base = config.get("base_model_name_or_path")
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        trained = f"it was trained on '{base}'" if base else "was it trained on another model?"
        raise UserError(f"{what} {adapter_dir} does not fit model '{model}' ({_sizes(skeleton)}): {problems[0]}"
                        f"{more}; {trained}")
    if base and model_identity(base) != model_identity(model):
        return (f"note: {what} {adapter_dir} was trained on '{base}' and is loaded on '{model}': the shapes fit, "
                "so it loads; make sure it is the same model")
    return None
