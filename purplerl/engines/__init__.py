"""Engines: where tokens are sampled and gradients computed. This factory and its table of capabilities are the
only place (with the CLI) that knows concrete engine names."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from purplerl.config import EngineConfig, ModelConfig
from purplerl.engines.capabilities import capabilities, check_capabilities
from purplerl.errors import UserError

if TYPE_CHECKING:
    from purplerl.engines.base import AdapterMixing, Engine, EngineSettings, ScalarHeads
    from purplerl.engines.distributed import World

ENGINES = ("local", "vllm", "tinker")
_TORCH_NAMES = ("AdapterMixing", "Engine", "EngineSettings", "ScalarHeads")  # engines.base: imported when used


def __getattr__(name: str) -> Any:
    """The protocol and settings of engines.base, which imports torch: `purplerl.engines.capabilities`, read by
    the recipe table and --help, does not."""
    if name in _TORCH_NAMES:
        from purplerl.engines import base

        return getattr(base, name)
    raise AttributeError(f"module 'purplerl.engines' has no attribute {name!r}")


def make_engine(model: ModelConfig, *, engine: EngineConfig | str = "local", seed: int = 0,
                settings: EngineSettings | None = None, world: World | None = None) -> Engine:
    """An engine of `engine.kind` (the section, or just its kind) holding `model` (its base and first adapter,
    "default"); over several processes (`world`, see engines.distributed), the local engine data-parallel."""
    from purplerl.engines.distributed import SINGLE

    world = SINGLE if world is None else world
    engine = EngineConfig(kind=engine) if isinstance(engine, str) else engine
    check_quantize(model, engine)
    check_optimizer(settings.optimizer if settings is not None else "adamw", engine)
    kind = engine.kind
    if kind == "local":
        from purplerl.engines.local import LocalEngine

        local = LocalEngine(model, seed=seed, settings=settings)
        if world.size == 1:
            return local
        from purplerl.engines.data_parallel import DataParallelEngine

        return DataParallelEngine(local, world)
    if world.size > 1:  # torchrun started several processes: only the local engine shards across them
        raise UserError(f"engine '{kind}' runs in one process, but torchrun started {world.size}: run it without "
                        f"torchrun (data parallel is the local engine's)")
    if kind == "vllm":
        from purplerl.engines.vllm import VLLMEngine  # imports vLLM itself only when built

        return VLLMEngine(model, engine, seed=seed, settings=settings)
    if kind == "tinker":
        from purplerl.engines.tinker import TinkerEngine  # imports the Tinker SDK itself only when built

        return TinkerEngine(model, engine, seed=seed)
    raise UserError(f"unknown engine '{kind}' (known: {', '.join(ENGINES)})")


def check_init_adapter(model: ModelConfig, engine: EngineConfig) -> str | None:
    """Check `model.init_adapter` against `model.name` from files alone (purplerl.engines.adapter_fit), before a run
    loads its data, scorers and model; return the note to show when it was trained on a model of another name. The
    tinker engine, and full-parameter training, refuse an init adapter when the engine is built."""
    if model.init_adapter is None or engine.kind == "tinker" or model.finetune == "full":
        return None
    from purplerl.engines.adapter_fit import check_adapter_fits

    return check_adapter_fits(model.init_adapter, model.name, model.revision, "model.init_adapter")


def check_quantize(model: ModelConfig, engine: EngineConfig) -> None:
    """Refuse, before any model loads, a quantized base (`model.quantize`) that the engine or this machine cannot
    load: the local engine loads it, through bitsandbytes on CPU or CUDA (purplerl.engines.loading.quantize_problem);
    vLLM and Tinker load the base their own way."""
    if model.quantize == "none":
        return
    if engine.kind != "local":
        raise UserError(f"model.quantize {model.quantize} is for engine.kind local: engine '{engine.kind}' loads its "
                        f"own base (use --model.quantize none)")
    from purplerl.engines.loading import require_quantizable

    require_quantizable(model.quantize)


def check_optimizer(name: str, engine: EngineConfig) -> None:
    """Refuse, before any model loads, an optimizer (`training.optimizer`) the engine cannot run: 8-bit AdamW runs
    in this process (the local engine, and vLLM's trainer) through bitsandbytes; a Tinker service runs its own
    AdamW."""
    if name == "adamw":
        return
    if engine.kind == "tinker":
        raise UserError(f"training.optimizer {name} runs in this process: a Tinker service steps its own AdamW "
                        f"(use --training.optimizer adamw)")
    import importlib.util

    if importlib.util.find_spec("bitsandbytes") is None:
        raise UserError(f"training.optimizer {name} needs bitsandbytes, which is not installed here: pip install "
                        f"bitsandbytes (`make test-quant` builds such a venv, .venv-quant)")


__all__ = ["ENGINES", "AdapterMixing", "Engine", "EngineSettings", "ScalarHeads", "capabilities",
           "check_capabilities", "check_init_adapter", "check_optimizer", "check_quantize", "make_engine"]
