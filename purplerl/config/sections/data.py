"""Where rows come from (prompts, conversations, preference pairs), which are kept, and how a prompt becomes the
policy's tokens."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, Field, field_validator, model_validator

from purplerl.config.base import Section, Template, read_when
from purplerl.files import absolute_source


def _from_hub(source: Any) -> bool:
    return (source.source or "").startswith("hf:")


class RowSourceConfig(Section):
    """Where rows come from and which of them are kept (purplerl.data.sources)."""

    source: Annotated[str, AfterValidator(absolute_source)] = Field("builtin:redteam", description=(
        "'builtin:redteam', a .jsonl/.json/.parquet file, or 'hf:ORG/NAME'"))
    split: str = Field("train", description="split to read (builtin and hf sources)")
    hf_config: read_when(str | None, _from_hub, "data.source is hf:ORG/NAME") = Field(None, description=(
        "HF dataset config name"))
    filters: dict[str, Any] = Field(default_factory=dict, description=(
        "keep rows whose fields equal these values, e.g. {is_safe: false}"))
    limit: int | None = Field(None, ge=1, description="keep at most this many rows (after filtering)")


def _not_builtin(source: Any) -> bool:
    # a built-in set has its own fixed fields
    return not source.source.startswith("builtin:")


def _file_field(annotation: Any) -> Any:
    return read_when(annotation, _not_builtin, "data.source is a file or hf:ORG/NAME")


class PromptSourceConfig(RowSourceConfig):
    """Where prompts come from and which of them are kept (purplerl.data.sources.load_prompts)."""

    prompt_field: _file_field(str) = Field("prompt", description="field holding the prompt text or chat messages")
    category_field: _file_field(str | None) = Field(None, description=(
        "field holding the harm category (auto for known schemas)"))

    @field_validator("prompt_field")
    @classmethod
    def _named(cls, field: str) -> str:
        if not field.strip():
            raise ValueError("must name a field")
        return field


class PromptFormatConfig(Section):
    """How a prompt becomes the policy's tokens; a checkpoint is prompted the way its run trained it."""

    template: Template = Field("chat", description="'chat' uses the tokenizer's chat template; 'base' plain text")
    system_prompt: str | None = Field(None, description=(
        "system message prepended to every prompt (null: model default)"))
    max_prompt_tokens: int = Field(256, ge=8, description="prompts longer than this are cut from the left")


class EvalDataConfig(PromptFormatConfig, PromptSourceConfig):
    """Prompts of an evaluation: their source and, for targets that are not run checkpoints, their format."""


def _streaming(data: Any) -> bool:
    return data.streaming


def streamable(source: str) -> bool:
    """What `data.streaming` reads lazily (purplerl.data.stream): a built-in set, a .jsonl or .parquet file, or a
    prepared dir of <split>.parquet files; not a .json document (parsed whole) nor a hub dataset."""
    return not source.startswith("hf:") and not source.endswith(".json")


class SFTDataConfig(RowSourceConfig):
    """The conversations of a supervised run: their source, how they are rendered, and how they are read."""

    source: Annotated[str, AfterValidator(absolute_source)] = Field("builtin:redteam", description=(
        "a .jsonl/.json/.parquet file, a prepared dataset dir, or 'hf:ORG/NAME'"))
    template: Template = Field("chat", description="'chat' uses the tokenizer's chat template; 'base' plain text")
    system_prompt: str | None = Field(None, description=(
        "system message prepended to every conversation (null: model default)"))
    packing: bool = Field(False, description=(
        "lay each step's conversations end to end in rows of up to sft.max_tokens tokens, each attending only to "
        "itself: the same loss, less work on padding"))
    streaming: bool = Field(False, description=(
        "read a .jsonl/.parquet source lazily (data larger than memory), shuffled in a bounded buffer, each "
        "data-parallel rank taking every procs-th conversation; a resume continues at the next one"))
    shuffle_buffer: read_when(int, _streaming, "data.streaming is true") = Field(1000, ge=1, description=(
        "conversations held in the streaming shuffle buffer, seeded by training.seed (1: the file's order)"))

    @model_validator(mode="after")
    def _streamable(self) -> Any:
        if self.streaming and not streamable(self.source):
            raise ValueError(f"data.streaming reads a built-in set, a .jsonl or .parquet file or a dir of "
                             f"<split>.parquet files, not {self.source}: turn streaming off for it")
        return self


class PreferenceDataConfig(PromptFormatConfig, RowSourceConfig):
    """Preference data (pairs, or KTO's labelled answers), and how prompts and answers become tokens (as the
    policy samples them): `purplerl prefs` and `purplerl reward-model`."""

    source: Annotated[str, AfterValidator(absolute_source)] | None = Field(None, description=(
        "preference data: a .jsonl/.json/.parquet file, a prepared dir or 'hf:ORG/NAME' (pairs: prompt + chosen + "
        "rejected as text or chat messages, HH-RLHF dialogues, UltraFeedback message lists; KTO rows: prompt + "
        "completion + label)"))
    max_answer_tokens: int = Field(256, ge=1, description=(
        "answers longer than this (with their end-of-turn token) are cut at the end"))
    skip_bad_rows: bool = Field(False, description=(
        "leave out rows that hold no usable example (counted, the first one named) instead of stopping at the first: "
        "public sets like HH-RLHF hold a few"))


class PrefsDataConfig(PreferenceDataConfig):
    """The preference data of `purplerl prefs`, and how its batches are laid out."""

    packing: bool = Field(False, description=(
        "lay each step's answers end to end in rows of up to max_prompt_tokens + max_answer_tokens tokens, each "
        "attending only to itself: the same loss, less work on padding"))


class DataConfig(EvalDataConfig):
    """Prompts of an RL recipe: source, format, and the order they are drawn in."""

    shuffle: bool = Field(True, description="shuffle prompts each epoch (seeded)")


class DialogueConfig(Section):
    """How a multi-turn conversation's earlier turns are read."""

    gist_tokens: int = Field(0, ge=0, le=64, description=(
        "K gist tokens after each earlier assistant turn, through which alone later turns read it (Mu et al. 2023; "
        "purplerl.data.gist): history costs K keys instead of its length; 0: every turn reads the whole dialogue"))
