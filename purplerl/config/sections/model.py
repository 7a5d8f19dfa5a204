"""The policy model: which one to load and where, and what of it trains."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from purplerl.config.base import EMBEDDED_MODEL, Section, read_when
from purplerl.files import looks_local


def _hub_id(model: Any) -> bool:
    return not model.name.startswith("embedded:") and not looks_local(model.name)


class ModelLoadConfig(Section):
    """Which model to load and where: all that evaluating or sampling a model needs."""

    name: str = Field(EMBEDDED_MODEL, description=(
        "policy model: 'embedded:smollm2-135m-instruct', 'embedded:smollm2-135m-safe' (built by purplerl align; the "
        "attack's default), an HF id or a local path"))
    revision: read_when(str | None, _hub_id, "model.name is a hub id") = Field(None, description=(
        "hub revision (branch, tag or commit) of an HF model id"))
    dtype: Literal["auto", "float32", "bfloat16", "autocast_bf16"] = Field("auto", description=(
        "dtype of the frozen base weights and compute; 'auto': bfloat16 on bf16-capable GPUs and AMX/AVX512-BF16 CPUs, "
        "else float32; 'autocast_bf16': float32 weights, matmuls in bfloat16 under autocast (the optimizer keeps "
        "float32 master weights of the adapter)"))
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="'auto' picks cuda when available, else cpu")


def _lora(model: Any) -> bool:
    return model.finetune == "lora"


def _lora_field(annotation: Any) -> Any:
    return read_when(annotation, _lora, "model.finetune is lora")


Quantization = Literal["none", "4bit"]


class ModelConfig(ModelLoadConfig):
    """The policy a recipe trains: the model to load and what of it trains."""

    finetune: Literal["lora", "full"] = Field("lora", description=(
        "what trains: 'lora' (adapters on a frozen base) or 'full' (every weight, with an fp32 master and two AdamW "
        "moments each, ~16 bytes/param: ~2.2 GB for a 135M model)"))
    lora_rank: _lora_field(int) = Field(16, ge=1, le=1024, description="LoRA rank r")
    lora_alpha: _lora_field(float) = Field(32.0, gt=0, description="LoRA alpha (scale = alpha / r)")
    lora_dropout: _lora_field(float) = Field(0.0, ge=0.0, lt=1.0, description="LoRA dropout")
    lora_targets: _lora_field(str) = Field("all-linear", description=(
        "'all-linear' or comma-separated module names (q_proj,v_proj)"))
    init_adapter: _lora_field(str | None) = Field(None, description=(
        "PEFT adapter dir to start the policy from (e.g. a defended model)"))
    quantize: _lora_field(Quantization) = Field("none", description=(
        "'4bit': load the frozen base in 4 bits through bitsandbytes (QLoRA: NF4, double quantization, compute in "
        "model.dtype); the local engine, CPU or CUDA"))
