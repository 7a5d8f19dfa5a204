"""Which torch device a setting names: the one resolver the engines, scorers and judges share."""

from __future__ import annotations

from typing import TYPE_CHECKING

from purplerl.errors import UserError

if TYPE_CHECKING:
    import torch


def resolve_device(name: str) -> torch.device:
    """'auto' -> cuda when available, else cpu; 'cuda' (or 'cuda:N') without a GPU is a UserError."""
    import torch  # deferred: the config layer imports this module and must not pay for torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"device '{name}' requested but no CUDA device is available (use --device cpu)")
    try:
        return torch.device(name)
    except RuntimeError:
        raise UserError(f"unknown device '{name}' (use auto, cpu or cuda)") from None
