"""A local trainer's checkpoint: every adapter as a standard PEFT dir (`default` at the top, others in subdirs by
name, each with its scalar head when it has one), each adapter's optimizer state, which adapters act (and their
scales and which of them train), and the global RNG. Full-parameter training saves the model itself as a Hugging
Face model dir (fp32 weights + tokenizer, loadable on its own) instead of the adapters.

The functions take the local trainer (purplerl.engines.local_training.LocalTrainer, typed Any: only the engines'
factory imports a concrete engine) and read its adapters, model and settings."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import torch

from purplerl.engines.adapters import HEAD_FILE, adapter_dir, adapter_weights_file
from purplerl.engines.full_weights import copy_weights, read_weights, refuse_other_kind, save_model_dir
from purplerl.engines.loading import load_tensors
from purplerl.errors import UserError, first_line

OPTIMIZER_FILE = "optimizer.pt"
RNG_FILE = "rng_state.pt"


def save_state(trainer: Any, path: Path) -> None:
    """Write the trainer's adapters (or full model), optimizer states, acting adapters and RNG into `path`."""
    adapters = trainer._adapters
    with trainer.fp32_adapter():  # the exported weights are the exact fp32 masters
        if trainer.full:
            save_model_dir(trainer.model, trainer.tokenizer, path)
        else:
            trainer.model.save_pretrained(path, selected_adapters=trainer.adapters)
            adapters.save_heads(path)
    # sampling draws from its own seeded generator; the global RNG still drives LoRA dropout
    rng = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    optimizers = {"adapters": {name: adapters.get(name).optimizer.state_dict() for name in trainer.adapters},
                  "active": trainer.active_adapter, "scales": trainer.adapter_scales,
                  "trained": list(trainer.trained_adapters)}
    # serialized in memory and written by Python: a full disk then raises OSError(ENOSPC), where torch's
    # own file writer reports only "unexpected pos"
    for name, obj in ((OPTIMIZER_FILE, optimizers), (RNG_FILE, rng)):
        buffer = io.BytesIO()
        torch.save(obj, buffer)
        with open(path / name, "wb") as f:
            f.write(buffer.getbuffer())


def load_state(trainer: Any, path: Path) -> None:
    """Restore what `save_state` wrote; adapters the checkpoint has and the trainer lacks are created as saved
    (their rank and targets are the checkpoint's)."""
    refuse_other_kind(path, trainer.cfg.finetune)
    if trainer.full:
        weights = read_weights(path, trainer.device)
        with trainer.fp32_adapter():  # copied into the masters; the compute-dtype weights follow on exit
            copy_weights(trainer.model, weights, path)
    else:
        names = ["default", *sorted(d.name for d in path.iterdir() if (d / "adapter_config.json").is_file())]
        for name in names:
            if name not in trainer.adapters:
                trainer.create_adapter(name, init=adapter_dir(path, name),
                                       head=(adapter_dir(path, name) / HEAD_FILE).is_file())
            trainer._adapters.load_weights(name, adapter_weights_file(path, name))
            trainer.touch()
    state = load_tensors(path / OPTIMIZER_FILE, trainer.device)
    # a checkpoint of one unnamed adapter (purplerl before named adapters) holds a plain state dict
    optimizers = state.get("adapters") if isinstance(state, dict) and "adapters" in state else {"default": state}
    for name, optimizer_state in optimizers.items():
        try:
            trainer._adapters.get(name).optimizer.load_state_dict(optimizer_state)
        except (KeyError, ValueError, TypeError) as err:
            raise UserError(f"optimizer state of adapter '{name}' in {path} does not match it: "
                            f"{first_line(err)}") from None
    if isinstance(state, dict) and isinstance(state.get("scales"), dict):  # saved since adapters act together
        trainer.use_adapters(state["scales"], state.get("trained"))
    else:
        trainer.use_adapter(str(state.get("active", "default")) if isinstance(state, dict) else "default")
    if (path / RNG_FILE).is_file():
        rng = load_tensors(path / RNG_FILE, torch.device("cpu"))
        if not isinstance(rng, dict) or not isinstance(rng.get("cpu"), torch.Tensor):
            raise UserError(f"{path / RNG_FILE} does not hold an RNG state")
        torch.set_rng_state(rng["cpu"])
        if "cuda" in rng and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])
