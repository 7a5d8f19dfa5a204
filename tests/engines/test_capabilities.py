"""The engine protocol is Tinker's core; what only some engines can do is a capability (engines.capabilities),
declared by the recipe that needs it and refused once, by the runner, in one line before anything loads. An engine
carries no refusal for a capability it lacks: it simply has no such method."""

from __future__ import annotations

import inspect

import pytest

from purplerl.config import EngineConfig, ModelConfig
from purplerl.engines import ENGINES
from purplerl.engines.base import AdapterMixing, Engine, GistAttention, GistSampling, ScalarHeads
from purplerl.engines.capabilities import (
    ADAPTER_MIXING,
    ADAPTER_SWITCHING,
    DESCRIBED,
    ENGINE_CAPABILITIES,
    GIST_ATTENTION,
    GIST_SAMPLING,
    PACKED_ROWS,
    SCALAR_HEADS,
    capabilities,
    check_capabilities,
)
from purplerl.errors import UserError
from purplerl.recipes import RECIPES

CORE_LIMIT = 15  # Tinker's core: sample, logprobs, forward_backward(+custom), optim_step, adapters, save/load, ...


def members(protocol: type) -> set[str]:
    """The methods and attributes a protocol declares itself (not those of its bases)."""
    own = {name for name in vars(protocol) if not name.startswith("_")}
    return own | set(getattr(protocol, "__annotations__", {}))


def test_the_core_protocol_is_small_and_each_capability_is_its_own() -> None:
    core = members(Engine)
    print(f"engine protocol: {len(core)} core members; ScalarHeads adds {sorted(members(ScalarHeads) - core)}, "
          f"AdapterMixing adds {sorted(members(AdapterMixing) - core)}")
    assert len(core) <= CORE_LIMIT, sorted(core)
    assert not core & {"values", "use_adapters", "adapter_scales"}
    assert members(GistAttention) - core == {"gist_logprobs"} and members(GistSampling) - core == {"gist_sample"}
    assert members(ScalarHeads) - core == {"values"} and members(AdapterMixing) - core == {"use_adapters",
                                                                                        "adapter_scales"}
    assert set(ENGINE_CAPABILITIES) == set(ENGINES) and set().union(*ENGINE_CAPABILITIES.values()) <= set(DESCRIBED)


def engine_classes() -> dict[str, type]:
    from purplerl.engines.data_parallel import DataParallelEngine
    from purplerl.engines.local import LocalEngine
    from purplerl.engines.tinker import TinkerEngine
    from purplerl.engines.vllm import VLLMEngine

    return {"local": LocalEngine, "data_parallel": DataParallelEngine, "vllm": VLLMEngine, "tinker": TinkerEngine}


@pytest.mark.parametrize("name", ["local", "data_parallel", "vllm", "tinker"])
def test_each_engine_has_the_core_and_exactly_the_capabilities_of_its_row(name: str) -> None:
    cls = engine_classes()[name]
    attributes = {n for klass in cls.__mro__ for n in vars(klass)} | set(getattr(cls, "__annotations__", {}))
    if name == "data_parallel":  # the local engine's, through __getattr__, but for what data parallel lacks
        attributes |= {n for n in dir(engine_classes()["local"]) if n not in ("use_adapters", "adapter_scales")}
    assert members(Engine) - {"tokenizer", "world", "sample_metrics"} <= attributes
    config = EngineConfig(kind="local" if name == "data_parallel" else name,
                          procs=2 if name == "data_parallel" else 1)
    found = capabilities(ModelConfig(), config)
    assert ("values" in attributes) == (SCALAR_HEADS in found)
    assert ("use_adapters" in attributes) == (ADAPTER_MIXING in found)
    assert ("gist_logprobs" in attributes) == (GIST_ATTENTION in found)
    assert ("gist_sample" in attributes) == (GIST_SAMPLING in found)
    create = inspect.signature(cls.create_adapter).parameters
    assert ("head" in create) == (SCALAR_HEADS in found) and ("rank" in create) == (ADAPTER_MIXING in found)
    source = inspect.getsource(inspect.getmodule(cls))
    assert "refuse_heads" not in source and "refuse_mixing" not in source  # no refusal of another recipe's need


@pytest.mark.parametrize(("kind", "procs", "finetune", "expected"), [
    ("local", 1, "lora", {SCALAR_HEADS, ADAPTER_MIXING, ADAPTER_SWITCHING, PACKED_ROWS, GIST_ATTENTION,
                          GIST_SAMPLING}),
    # data parallel: no adapters acting together
    ("local", 2, "lora", {SCALAR_HEADS, ADAPTER_SWITCHING, PACKED_ROWS, GIST_ATTENTION, GIST_SAMPLING}),
    # no frozen base to put adapters on; rows are packed and gist-masked all the same
    ("local", 1, "full", {PACKED_ROWS, GIST_ATTENTION, GIST_SAMPLING}),
    ("vllm", 1, "lora", {PACKED_ROWS, GIST_ATTENTION}),  # it trains through the local engine's trainer
    ("vllm", 1, "full", {PACKED_ROWS, GIST_ATTENTION}),
    ("tinker", 1, "lora", set()),  # a datum is one sequence
])
def test_the_table_narrowed_by_processes_and_full_fine_tuning(kind: str, procs: int, finetune: str,
                                                              expected: set[str]) -> None:
    assert capabilities(ModelConfig(finetune=finetune), EngineConfig(kind=kind, procs=procs)) == expected


def test_a_missing_capability_is_one_line_naming_it_and_where_it_is() -> None:
    with pytest.raises(UserError) as err:
        check_capabilities(frozenset({SCALAR_HEADS, ADAPTER_MIXING}), ModelConfig(), EngineConfig(kind="tinker"),
                           "recipe x")
    assert str(err.value) == ("recipe x needs adapters acting together or of another rank (gradient routing); "
                              "engine.kind tinker does not have them: use engine.kind local")  # the first, sorted
    check_capabilities(frozenset({SCALAR_HEADS}), ModelConfig(), EngineConfig(kind="local", procs=2), "recipe x")
    with pytest.raises(ValueError, match="unknown engine capability 'heads'"):
        check_capabilities(frozenset({"heads"}), ModelConfig(), EngineConfig(), "recipe x")


NEEDS = {"ppo": {SCALAR_HEADS}, "reward-model": {SCALAR_HEADS}, "prm": {SCALAR_HEADS}, "route": {ADAPTER_MIXING},
         "adversarial": {ADAPTER_SWITCHING}}


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_every_recipe_declares_what_it_needs_and_runs_where_it_has_it(name: str) -> None:
    recipe = RECIPES[name]
    config = recipe.build({})
    assert recipe.needs(config) == NEEDS.get(name, set())
    recipe.check_engine(config)  # the local engine in one process has every capability
    for kind in ("vllm", "tinker"):
        other = config.model_copy(update={"engine": config.engine.model_copy(update={"kind": kind})})
        if NEEDS.get(name):
            with pytest.raises(UserError, match=f"^recipe {name} needs .*; engine.kind {kind} does not have them"):
                recipe.check_engine(other)
        else:
            recipe.check_engine(other)


@pytest.mark.parametrize("name", ["sft", "prefs"])
def test_packing_needs_packed_rows_which_tinker_has_not(name: str) -> None:
    recipe = RECIPES[name]
    config = recipe.build({"data": {"packing": True}})
    assert recipe.needs(config) == {PACKED_ROWS}
    for kind in ("local", "vllm"):
        recipe.check_engine(config.model_copy(update={"engine": config.engine.model_copy(update={"kind": kind})}))
    tinker = config.model_copy(update={"engine": config.engine.model_copy(update={"kind": "tinker"})})
    with pytest.raises(UserError) as err:
        recipe.check_engine(tinker)
    assert str(err.value) == (f"recipe {name} needs packed rows, several sequences each attending only to itself "
                              "(data.packing); engine.kind tinker does not have them: use engine.kind local or vllm")
