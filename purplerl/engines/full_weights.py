"""Full-parameter checkpoints: a standard Hugging Face model dir (config.json, model.safetensors and the tokenizer,
so `from_pretrained` loads it standalone) beside the engine's optimizer and RNG files.

A LoRA checkpoint is a PEFT adapter dir instead (adapter_config.json); each kind is refused by the other mode's
engine with one line, since loading one as the other would silently train something else.
"""

from __future__ import annotations

from pathlib import Path

import torch

from purplerl.engines.loading import ADAPTER_CONFIG, MODEL_WEIGHTS_GLOB, is_full_model_dir
from purplerl.errors import UserError, first_line


def checkpoint_kind(path: Path) -> str | None:
    """'lora' for a PEFT adapter dir, 'full' for a Hugging Face model dir, None for neither."""
    if (Path(path) / ADAPTER_CONFIG).is_file():
        return "lora"
    return "full" if is_full_model_dir(path) else None


def refuse_other_kind(path: Path, finetune: str) -> None:
    """One line when checkpoint `path` was written by the other fine-tuning mode than `finetune`."""
    kind = checkpoint_kind(path)
    if kind is None or kind == finetune:
        return
    what = {"lora": "a LoRA adapter checkpoint (adapter_config.json)",
            "full": "a full-parameter checkpoint (a model dir, no adapter_config.json)"}[kind]
    raise UserError(f"{path} is {what}, but this engine has model.finetune '{finetune}': set --model.finetune "
                    f"{kind} to load it")


def save_model_dir(model: torch.nn.Module, tokenizer, path: Path) -> None:
    """The model (its weights as they are now) and tokenizer as a standard Hugging Face model dir."""
    from transformers.utils import logging as hf_logging

    # transformers draws a "Writing model shards" bar on every save: noise between a run's step lines
    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(path)
    finally:
        if shown:
            hf_logging.enable_progress_bar()
    tokenizer.save_pretrained(path)


def read_weights(path: Path, device: torch.device) -> dict[str, torch.Tensor]:
    """Every tensor of the safetensors files of model dir `path`, by name."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    files = sorted(Path(path).glob(MODEL_WEIGHTS_GLOB))
    if not files:
        raise UserError(f"{path} holds no model.safetensors")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            state.update(load_file(str(file), device=str(device)))
        except (SafetensorError, OSError) as err:
            raise UserError(f"cannot read {file}: {first_line(err)}") from None
    return state


@torch.no_grad()
def copy_weights(model: torch.nn.Module, state: dict[str, torch.Tensor], where: Path) -> None:
    """Copy every parameter of `model` from `state` in place. save_pretrained writes a tied weight once, under
    one of its names, so each parameter is looked up under every name it has."""
    names: dict[int, list[str]] = {}
    params: dict[int, torch.nn.Parameter] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
        params[id(p)] = p
    known = set(model.state_dict())
    unexpected = sorted(k for k in state if k not in known)
    if unexpected:
        raise UserError(f"weights in {where} do not match the model ({len(unexpected)} unexpected, e.g. "
                        f"{unexpected[0]}): was it trained from another base model?")
    for key, p in params.items():
        found = next((n for n in names[key] if n in state), None)
        if found is None:
            raise UserError(f"weights in {where} do not match the model: {names[key][0]} is missing")
        if state[found].shape != p.shape:
            raise UserError(f"weights in {where} do not match the model: {found} is {tuple(state[found].shape)}, "
                            f"the model's {tuple(p.shape)}")
        p.copy_(state[found])
