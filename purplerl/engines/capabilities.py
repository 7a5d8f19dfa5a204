"""What an engine can do beyond the core protocol (engines.base.Engine), as one table: a recipe declares what it
needs (`Recipe.needs`), and the runner refuses an engine that lacks it once, in one line, before anything loads.
No torch here: the recipe table and `--help` read it."""

from __future__ import annotations

from purplerl.config import EngineConfig, ModelConfig
from purplerl.errors import UserError

SCALAR_HEADS = "scalar_heads"  # engines.base.ScalarHeads: adapters with a scalar head (reward models, critics)
ADAPTER_MIXING = "adapter_mixing"  # engines.base.AdapterMixing: adapters acting together, or of another rank
ADAPTER_SWITCHING = "adapter_switching"  # several learners' adapters trained in turn on one base in this process
PACKED_ROWS = "packed_rows"  # batches of packed rows (TrainBatch.position_ids_NT): `data.packing`
GIST_ATTENTION = "gist_attention"  # engines.base.GistAttention: gist rows (TrainBatch.first_key_NT)
GIST_SAMPLING = "gist_sampling"  # engines.base.GistSampling: decoding from gist prompts
ADAPTER_CAPABILITIES = frozenset({SCALAR_HEADS, ADAPTER_MIXING, ADAPTER_SWITCHING})  # they need a frozen base

DESCRIBED = {  # each capability in words, for the refusal
    SCALAR_HEADS: "scalar heads on named adapters (a reward model, a critic)",
    ADAPTER_MIXING: "adapters acting together or of another rank (gradient routing)",
    ADAPTER_SWITCHING: "two learners' adapters switched on one base model held in this process",
    PACKED_ROWS: "packed rows, several sequences each attending only to itself (data.packing)",
    GIST_ATTENTION: "gist rows, earlier turns read only through gist tokens (dialogue.gist_tokens)",
    GIST_SAMPLING: "sampling from gist prompts, the history read through gist tokens (dialogue.gist_tokens)",
}

# vLLM samples with one LoRA slot of model.lora_rank and holds no heads (it trains through the local engine's
# trainer, which packs); Tinker's adapters are separate training clients on the service, it returns no hidden
# states for a head, and its datums are one sequence each. Only the local decode loop samples under a gist mask.
ENGINE_CAPABILITIES: dict[str, frozenset[str]] = {
    "local": frozenset({SCALAR_HEADS, ADAPTER_MIXING, ADAPTER_SWITCHING, PACKED_ROWS, GIST_ATTENTION,
                        GIST_SAMPLING}),
    "vllm": frozenset({PACKED_ROWS, GIST_ATTENTION}),
    "tinker": frozenset(),
}


def capabilities(model: ModelConfig, engine: EngineConfig) -> frozenset[str]:
    """What the engine of `engine` holding `model` can do beyond the core: its kind's row, less adapter mixing
    under data parallel (engine.procs > 1: each rank's rows of each label differ in number, which one weight per
    call does not follow), and less every adapter capability in full-parameter training (no frozen base)."""
    found = ENGINE_CAPABILITIES.get(engine.kind, frozenset())
    if engine.procs > 1:
        found -= {ADAPTER_MIXING}
    if model.finetune != "lora":
        found -= ADAPTER_CAPABILITIES
    return found


def check_capabilities(needs: frozenset[str], model: ModelConfig, engine: EngineConfig, who: str) -> None:
    """Refuse in one line, before any model loads, an engine (with its model) that lacks a capability `who`
    needs: the first missing one, and where it is found."""
    unknown = sorted(needs - DESCRIBED.keys())
    if unknown:
        raise ValueError(f"{who} declares an unknown engine capability '{unknown[0]}' (known: {', '.join(DESCRIBED)})")
    missing = sorted(needs - capabilities(model, engine))
    if not missing:
        return
    need = missing[0]
    if model.finetune != "lora" and need in ADAPTER_CAPABILITIES:
        why = f"model.finetune {model.finetune} trains no adapters over a frozen base: use model.finetune lora"
    elif need in ENGINE_CAPABILITIES.get(engine.kind, frozenset()):  # its kind has it, its process count not
        why = f"engine.procs {engine.procs} runs data parallel, which does not: use engine.procs 1"
    else:
        kinds = " or ".join(kind for kind, found in ENGINE_CAPABILITIES.items() if need in found)
        why = f"engine.kind {engine.kind} does not have them: use engine.kind {kinds}"
    raise UserError(f"{who} needs {DESCRIBED[need]}; {why}")
