"""`purplerl sft`: supervised fine-tuning of a LoRA adapter (or, with `--model.finetune full`, of every weight) on
chat data (step.py), with the RL runs' run dir, atomic checkpoints, resume, metrics and report."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from purplerl.config import DialogueConfig, SFTConfig, SFTDataConfig
from purplerl.config.migrate import RL_TRAINING_FIELDS, pop_path
from purplerl.config.sections import RunSettings
from purplerl.engines.capabilities import GIST_ATTENTION, PACKED_ROWS
from purplerl.train.recipe import FIXED_ON_RESUME, FLAT, Recipe, RunNamePart, lazy, recipe_field


class SFTSettings(RunSettings):
    """`purplerl sft`: the shared training sections, the conversations and supervised fine-tuning."""

    recipe: str = recipe_field("sft")
    data: SFTDataConfig = Field(default_factory=SFTDataConfig, description="the conversations")
    sft: SFTConfig = Field(default_factory=SFTConfig, description="supervised fine-tuning (purplerl sft)")
    dialogue: DialogueConfig = Field(default_factory=DialogueConfig, description=(
        "multi-turn conversations: gist tokens compress the earlier turns"))


def migrate(data: dict[str, Any], saved: bool) -> dict[str, Any]:
    """An older SFT run's config.yaml held every RL section and field, none of which SFT read."""
    if not saved:
        return data
    for section in ("sampling", "reward"):
        data.pop(section, None)
    for name in RL_TRAINING_FIELDS:
        pop_path(data, f"training.{name}")
    for name in ("prompt_field", "category_field", "max_prompt_tokens", "shuffle"):
        pop_path(data, f"data.{name}")
    return data


SFT = Recipe(
    name="sft",
    settings=SFTSettings,
    help="""Supervised fine-tuning of a LoRA adapter on chat data (messages ending with the assistant's turn, or
    prompt/completion pairs); the loss covers only the assistant's tokens. --data names the data.""",
    prepare=lazy("purplerl.recipes.sft.step:sft_prepare"),
    defaults={"training": {"steps": 100, "batch_size": 8, "lr": 2e-4}},
    run_name=(RunNamePart("lr", lambda c: c.training.lr),
              RunNamePart("", lambda c: "full" if c.model.finetune == "full" else f"r{c.model.lora_rank}"),
              RunNamePart("B", lambda c: c.training.batch_size)),
    summary_metrics={"train/nll": "training NLL per token", "eval/loss": "held-out NLL",
                     "eval/answer_nll": "held-out last answer's NLL per token (gist tokens: against the full context)"},
    flat=FLAT,
    # which examples train and which are held out: a resume with others would train on held-out ones; and the
    # order a stream yields them in, which its saved position counts in
    fixed_on_resume=FIXED_ON_RESUME | {"sft.eval_split", "sft.eval_fraction", "data.streaming", "data.shuffle_buffer",
                                       "dialogue.gist_tokens"},
    longest_sequence=lambda c: (c.sft.max_tokens, "sft.max_tokens"),
    migrate=migrate,
    needs=lambda c: frozenset({PACKED_ROWS} if c.data.packing else ()) | frozenset(
        {GIST_ATTENTION} if c.dialogue.gist_tokens else ()),
)
