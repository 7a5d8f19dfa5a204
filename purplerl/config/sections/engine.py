"""Where and how sampling and training run: the engine section, its fields keyed by engine kind."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from purplerl.config.base import Section, comma_list, once_each, read_when

ENGINE_KINDS = ("local", "vllm", "tinker")  # purplerl.engines.make_engine builds each
# on by default: each measured faster where it applies
FAST_PATHS = ("merged_sampler", "cuda_graphs", "fused_lora", "packed_decode")
# `compiled` is off by default: measured slower for every run shorter than its compile time (bench/NOTES.md)
FastPath = Literal["merged_sampler", "cuda_graphs", "fused_lora", "packed_decode", "compiled"]


def _kind(*kinds: str) -> tuple[Any, str]:
    return (lambda engine: engine.kind in kinds), "engine.kind is " + " or ".join(kinds)


def _engine_field(annotation: Any, *kinds: str) -> Any:
    return read_when(annotation, *_kind(*kinds))


class EngineConfig(Section):
    """Where and how sampling and training run (purplerl.engines). The fields of a kind exist only for it.
    `--engine vllm` is short for `--engine.kind vllm`, and a config file may say `engine: vllm`."""

    kind: Literal["local", "vllm", "tinker"] = Field("local", description=(
        "engine: 'local' (torch in this process, or `procs` processes), 'vllm' (vLLM samples, torch trains), 'tinker' "
        "(a Tinker-API service); each kind has its own fields"))
    procs: _engine_field(int, "local") = Field(1, ge=1, le=1024, description=(
        "data-parallel processes on this machine, launched with torchrun (1: this process)"))
    fast_paths: _engine_field(list[FastPath], "local", "vllm") = Field(
        default_factory=lambda: list(FAST_PATHS), description=(
            "same-maths fast paths that are on (leave one out to turn it off): merged_sampler (sample from a copy of "
            "the model with the LoRA update merged in: faster decoding, one extra copy of the weights), cuda_graphs "
            "(CUDA: each decoded token's forward replayed as one captured graph over a static KV cache), fused_lora "
            "(plain LoRA layers as one accumulating matmul), packed_decode (CPU, bf16: the merged copy decodes over "
            "weights prepacked for oneDNN, where a measurement cached per machine finds it faster); off by default, "
            "compiled (torch.compile of the decoder for training and scoring: 5% faster training passes after 3.5 "
            "minutes of compiling here, bench/NOTES.md); 'merged_sampler,fused_lora' works too"))

    @field_validator("fast_paths", mode="before")
    @classmethod
    def _split_paths(cls, value: Any) -> Any:
        return comma_list(value)

    @field_validator("fast_paths")
    @classmethod
    def _paths_once(cls, paths: list[str]) -> list[str]:
        return once_each(paths, "fast path")

    micro_batch_tokens: _engine_field(int, "local", "vllm") = Field(4096, ge=1, description=(
        "max padded tokens per forward/backward pass: length-sorted sequences fill each pass up to this (the memory "
        "knob)"))
    tinker_url: _engine_field(str | None, "tinker") = Field(None, description=(
        "base URL of the Tinker-API service (null: the SDK's default, or TINKER_BASE_URL); the API key is read from "
        "TINKER_API_KEY only"))
    tinker_retries: _engine_field(int, "tinker") = Field(3, ge=0, le=20, description=(
        "retries of one HTTP request before it fails"))
    tinker_timeout_s: _engine_field(float, "tinker") = Field(600.0, gt=0, le=86400, description=(
        "seconds one call to the service (retries included) may take before the run stops with one line"))
    tinker_loss_reduction: _engine_field(Literal["sum", "sequence_mean"], "tinker") = Field("sum", description=(
        "how the service reduces a datum's token losses: 'sum' (the Tinker API) or 'sequence_mean' (each datum divided "
        "by its weights' sum, gradients averaged over a step's datums: SkyRL's server)"))
    vllm_kv_cache_gib: _engine_field(int, "vllm") = Field(1, ge=1, description=(
        "on CPU: GiB of memory for vLLM's KV cache (VLLM_CPU_KVCACHE_SPACE)"))
    vllm_gpu_memory_utilization: _engine_field(float, "vllm") = Field(0.3, gt=0.0, lt=1.0, description=(
        "on CUDA: share of the GPU's memory vLLM takes (weights + KV cache); the trainer needs the rest"))
    vllm_is_correction: _engine_field(bool, "vllm") = Field(True, description=(
        "weight each token's policy gradient by min(pi_trainer / pi_vllm, vllm_is_cap), truncated importance sampling, "
        "with the trainer's logprobs as the old policy (off: vLLM's logprobs are the sampling logprobs)"))
    vllm_is_cap: _engine_field(float, "vllm") = Field(2.0, ge=1.0, description=(
        "truncation cap C of the importance-sampling weight"))

    @model_validator(mode="before")
    @classmethod
    def _kind_alone(cls, value: Any) -> Any:
        return {"kind": value} if isinstance(value, str) else value

    def fast_path(self, name: str) -> bool:
        return name in self.fast_paths
