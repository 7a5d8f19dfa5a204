"""Engines: where tokens are sampled and gradients computed. This factory is the only place (with the
CLI) that knows concrete engine names."""

from __future__ import annotations

from purplerl.config import Config
from purplerl.engines.base import Engine
from purplerl.errors import UserError


def make_engine(config: Config) -> Engine:
    if config.engine == "local":
        from purplerl.engines.local import LocalEngine

        return LocalEngine(config.model, seed=config.training.seed)
    raise UserError(f"unknown engine '{config.engine}'")


__all__ = ["Engine", "make_engine"]
