"""A trained process reward model, loaded from its run, as the registered reward term `prm`.

A `purplerl prm` run leaves checkpoints holding one adapter with a scalar head. `ProcessRewardScorer` loads the
newest intact checkpoint of a run (or a checkpoint named directly) for scoring, as purplerl.runs.reward_model loads
an outcome reward model: prompted as the run trained (its base model, chat template, system prompt and token
limits) and cutting answers into steps at the run's separator (prm.separator). Each step's probability of being
correct is the sigmoid of the head's value at the step's last token (purplerl.data.steps); the answer's reward is
their aggregate, named by `aggregation`: min, last, product or mean (purplerl.algorithms.process_reward).

Importing this module registers the term (a text term: RL rewards, eval judges, `serve-reward` and veRL's hook all
build it by name); the layers above that build terms by name import it. An RL run's config.yaml records the
checkpoint that scored, so a resumed run refuses a process reward model that has changed since.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import Field

from purplerl.algorithms.names import STEP_AGGREGATION_NAMES
from purplerl.config.base import Section, choices
from purplerl.errors import ExperimentError, UserError
from purplerl.rewards.registry import RewardTerm, ScoringInput, TermFn, TermOutput, register_term
from purplerl.runs.reward_model import load_for_scoring, record_checkpoint

if TYPE_CHECKING:  # torch loads with the model; registering the term (the settings, --help) skips it
    import torch

TERM = "prm"
COMMAND = "prm"  # the command whose runs this term reads, as its messages name it


class ProcessRewardParams(Section):
    """The `prm` term's parameters."""

    run: str | None = Field(None, description=(
        "a process reward model's run dir (purplerl prm), whose newest intact checkpoint scores, or one of its "
        "checkpoints"))
    aggregation: choices(STEP_AGGREGATION_NAMES, "step aggregation") = Field("min", description=(
        "how the steps' probabilities of being correct make the answer's reward: min (the weakest step), last, "
        "product (every step correct, Lightman et al. 2023) or mean; product and min pay for fewer steps"))
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description=(
        "where the model runs ('auto': cuda when available)"))
    batch_size: int = Field(16, ge=1, description="answers per forward pass")
    checkpoint: str | None = Field(None, description=(
        "metadata, not a setting: the checkpoint that scored, recorded at start; a resumed run refuses another"))

    def incomplete(self) -> str | None:
        return "run: name the process reward model's run dir (purplerl prm)" if self.run is None else None


class ProcessRewardScorer:
    """A `purplerl prm` run's model, loaded for scoring: `score` gives each answer's aggregated step probability."""

    name = TERM
    needs_prompts = True

    def __init__(self, run: str | Path, aggregation: str = "min", device: str = "auto", batch_size: int = 16) -> None:
        from purplerl.algorithms.process_reward import STEP_AGGREGATIONS
        from purplerl.data.steps import StepFormat

        if aggregation not in STEP_AGGREGATIONS:
            raise UserError(f"unknown step aggregation '{aggregation}' (known: {', '.join(STEP_AGGREGATIONS)})")
        loaded = load_for_scoring(run, device, {"data.max_answer_tokens": int, "prm.separator": str}, COMMAND)
        if len(loaded.members) != 1:
            raise UserError(f"{loaded.checkpoint} holds {len(loaded.members)} adapters with a scalar head "
                            f"({', '.join(loaded.members)}); a {COMMAND} run's checkpoint holds one")
        self.checkpoint, self.engine, self.pad_id = loaded.checkpoint, loaded.engine, loaded.pad_id
        self.adapter = loaded.members[0]
        self.aggregation, self.batch_size = aggregation, batch_size
        p = loaded.prompt
        self.format = StepFormat(p.template, p.system_prompt, p.max_prompt_tokens,
                                 loaded.settings["data.max_answer_tokens"], loaded.settings["prm.separator"])

    @classmethod
    def from_params(cls, params: ProcessRewardParams) -> ProcessRewardScorer:
        if params.run is None:
            raise UserError(f"reward term '{TERM}' needs run: the process reward model's run dir (purplerl prm)")
        return cls(params.run, params.aggregation, params.device, params.batch_size)

    def step_logits(self, texts: list[str], prompts: list[str] | None) -> list[torch.Tensor]:
        """For each answer `texts[n]` to the user prompt `prompts[n]`: its steps' logits [S >= 1], the head's values
        at the last token of each step that fits the run's max_answer_tokens."""
        from purplerl.data.steps import encode_steps, split_steps, step_batch

        if prompts is None:
            raise UserError(f"process reward model {self.checkpoint} scores an answer to its prompt: give the prompts")
        if len(prompts) != len(texts):
            raise ExperimentError(f"process reward model got {len(prompts)} prompts for {len(texts)} answers")
        encoded = [encode_steps(self.engine.tokenizer, ({"role": "user", "content": prompt},),
                                split_steps(text, self.format.separator), f"answer {i}", self.format)
                   for i, (text, prompt) in enumerate(zip(texts, prompts, strict=True))]
        self.engine.use_adapter(self.adapter)
        out = []
        for start in range(0, len(encoded), self.batch_size):
            chunk = encoded[start:start + self.batch_size]
            batch = step_batch(chunk, self.pad_id)
            values_NT = self.engine.values(batch.input_ids_NT, batch.attention_mask_NT)
            out += [values_NT[row, list(e.read_at)] for row, e in enumerate(chunk)]
        return out

    def rewards(self, texts: list[str], prompts: list[str] | None) -> tuple[torch.Tensor, torch.Tensor]:
        """(reward_N, steps_N): each answer's aggregated step probability, and how many of its steps were read."""
        import torch

        from purplerl.algorithms.process_reward import aggregate_steps

        logits = self.step_logits(texts, prompts)
        reward_N = torch.stack([aggregate_steps(steps, self.aggregation) for steps in logits]) if logits \
            else torch.zeros(0)
        return reward_N, torch.tensor([float(len(steps)) for steps in logits])

    def score(self, texts: list[str], prompts: list[str] | None = None) -> list[float]:
        return self.rewards(texts, prompts)[0].tolist()


def _term(params: ProcessRewardParams) -> TermFn:
    """The training reward: each answer's aggregated step probability, with its number of steps logged (a policy
    that learns to write fewer steps shows there)."""
    scorer = ProcessRewardScorer.from_params(params)
    record_checkpoint(params, scorer.checkpoint, TERM)

    def reward(batch: ScoringInput) -> TermOutput:
        reward_N, steps_N = scorer.rewards(batch.texts, batch.prompts)
        return TermOutput(reward_N, {f"{TERM}_steps": steps_N})

    return reward


register_term(RewardTerm(
    TERM, "a trained process reward model's score (purplerl prm): its step probabilities aggregated by min, last, "
    "product or mean", "text", ProcessRewardParams, _term, ProcessRewardScorer.from_params))
