"""A trained reward model, loaded from its run, as the registered reward term `reward_model`.

A reward-model run (`purplerl reward-model`) leaves checkpoints whose adapters carry scalar heads: K ensemble
members over one base model. `RewardModelScorer` loads the newest intact checkpoint of a run (or a checkpoint
named directly) for scoring only (no optimizer state): the base once, each member as its own adapter with its
head. It prompts as the run trained: the run's base model, chat template, system prompt and token limits
(runs/<run>/config.yaml). An answer's score is its head's value at its last token; the reward is the members'
mean minus `penalty` x their standard deviation (algorithms.reward_model.ensemble_reward).

Loading a run for scoring (`load_for_scoring`) and recording the checkpoint that scored (`record_checkpoint`) serve
the process reward model's term too (purplerl.runs.process_reward).

Importing this module registers the term (a text term: RL rewards, eval judges, `serve-reward` and veRL's hook all
build it by name); the layers above that build terms by name import it. The run's config.yaml records the
checkpoint that scored, so a resumed RL run refuses a reward model that has changed since.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from purplerl.config import ModelLoadConfig, PromptFormatConfig, read_config_file
from purplerl.config.base import Section
from purplerl.errors import ExperimentError, UserError
from purplerl.rewards.registry import RewardTerm, ScoringInput, TermFn, TermOutput, register_term
from purplerl.runs.checkpoints import describe_skipped, newest_intact, verify_checkpoint
from purplerl.runs.layout import CHECKPOINTS_DIR, CONFIG_FILE, run_config_of

if TYPE_CHECKING:  # torch loads with the reward model; registering the term (the settings, --help) skips it
    import torch

TERM = "reward_model"


class RewardModelParams(Section):
    """The `reward_model` term's parameters."""

    run: str | None = Field(None, description=(
        "a reward-model run dir (purplerl reward-model), whose newest intact checkpoint scores, or one of its "
        "checkpoints"))
    penalty: float = Field(0.0, ge=0.0, description=(
        "lambda: the reward is the ensemble's mean score - lambda x its std over members (Coste et al. 2023); 0: the "
        "mean"))
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description=(
        "where the reward model runs ('auto': cuda when available)"))
    batch_size: int = Field(16, ge=1, description="answers per forward pass")
    checkpoint: str | None = Field(None, description=(
        "metadata, not a setting: the checkpoint that scored, recorded at start; a resumed run refuses another"))

    def incomplete(self) -> str | None:
        return "run: name the reward model's run dir (purplerl reward-model)" if self.run is None else None


def looks_like_run(path: str | Path) -> bool:
    """Whether `path` is a run dir or a checkpoint inside one (not a model dir): what `serve-reward --model`
    serves as a reward model."""
    path = Path(path)
    return path.is_dir() and ((path / CONFIG_FILE).is_file() or run_config_of(path) is not None)


def reward_model_checkpoint(path: str | Path, command: str = "reward-model") -> tuple[Path, list[str]]:
    """(the checkpoint to score with, its members: the adapters that carry a scalar head) of a run dir (its newest
    intact checkpoint) or of a checkpoint of a run of `purplerl COMMAND`; UserError for anything else."""
    from purplerl.engines.adapters import HEAD_FILE, adapter_dir

    path = Path(path)
    if (path / CONFIG_FILE).is_file():
        checkpoint, skipped = newest_intact(path)
        if checkpoint is None:
            why = f" ({describe_skipped(skipped)})" if skipped else ""
            raise UserError(f"{path} holds no intact checkpoint in {CHECKPOINTS_DIR}/{why}: train the reward model "
                            f"first (purplerl {command})")
    elif run_config_of(path) is not None:
        reason = verify_checkpoint(path)
        if reason is not None:
            raise UserError(f"checkpoint {path} cannot be trusted: {reason}")
        checkpoint = path
    else:
        raise UserError(f"{path} is neither a {command} run dir nor a checkpoint of one (runs/<run>/checkpoints/"
                        "step_N)")
    names = ["default", *sorted(d.name for d in checkpoint.iterdir() if (d / "adapter_config.json").is_file())]
    members = [name for name in names if (adapter_dir(checkpoint, name) / HEAD_FILE).is_file()]
    if not members:
        raise UserError(f"{checkpoint} holds no adapter with a scalar head: it is not a reward model's checkpoint")
    return checkpoint, members


@dataclass(frozen=True)
class ScoringModel:
    """A reward model's checkpoint loaded for scoring (no optimizer state): the base once, each member its own
    adapter with its head, prompted as its run trained."""

    checkpoint: Path  # the checkpoint that scores
    members: list[str]  # its adapters with a scalar head
    engine: Any  # the local engine holding them
    prompt: PromptFormatConfig  # the run's template, system prompt and prompt limit
    settings: dict[str, Any]  # the run's settings it reads, by dotted name ("data.max_answer_tokens")
    pad_id: int


def load_for_scoring(run: str | Path, device: str, reads: dict[str, type],
                     command: str = "reward-model") -> ScoringModel:
    """The newest intact checkpoint of a run of `purplerl COMMAND` (or the checkpoint named), loaded for scoring,
    with the run's settings `reads` names (dotted name -> int or str), checked before the model loads."""
    from purplerl.engines import EngineSettings, make_engine
    from purplerl.engines.adapters import adapter_dir
    from purplerl.runs.policy import resolve_policy

    checkpoint, members = reward_model_checkpoint(run, command)
    policy = resolve_policy(checkpoint, ModelLoadConfig(device=device), PromptFormatConfig())
    settings = {name: run_setting(Path(policy.run_config), name, kind, command) for name, kind in reads.items()}
    # a scorer never samples: no merged copy of the weights for a sampler
    engine = make_engine(policy.model.model_copy(update={"init_adapter": None}),
                         settings=EngineSettings(merged_sampler=False))
    for name in members:
        engine.create_adapter(name, init=adapter_dir(checkpoint, name), head=True)
    tokenizer = engine.tokenizer
    pad_id = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id)
    return ScoringModel(checkpoint, members, engine, policy.prompt, settings, pad_id)


def member_scores(engine: Any, members: list[str], input_ids_NT: torch.Tensor,
                  attention_mask_NT: torch.Tensor) -> torch.Tensor:
    """scores_KN: each member's (adapter + head's) value at each sequence's last real token."""
    import torch

    from purplerl.algorithms.reward_model import last_token_values

    scores = []
    for name in members:
        engine.use_adapter(name)
        scores.append(last_token_values(engine.values(input_ids_NT, attention_mask_NT), attention_mask_NT))
    return torch.stack(scores)


class RewardModelScorer:
    """A reward-model run's ensemble, loaded for scoring: `score` gives mean - penalty x std of each answer."""

    name = TERM
    needs_prompts = True

    def __init__(self, run: str | Path, penalty: float = 0.0, device: str = "auto", batch_size: int = 16) -> None:
        from purplerl.data.preference import end_of_turn_id

        loaded = load_for_scoring(run, device, {"data.max_answer_tokens": int})
        self.checkpoint, self.members, self.engine = loaded.checkpoint, loaded.members, loaded.engine
        self.prompt, self.pad_id = loaded.prompt, loaded.pad_id
        self.penalty, self.batch_size = penalty, batch_size
        # the longest answer the run trained on: longer answers are cut the same way
        self.max_answer_tokens = loaded.settings["data.max_answer_tokens"]
        self.end_id = end_of_turn_id(self.engine.tokenizer, self.prompt.template)

    @classmethod
    def from_params(cls, params: RewardModelParams) -> RewardModelScorer:
        if params.run is None:
            raise UserError(f"reward term '{TERM}' needs run: the reward model's run dir (purplerl reward-model)")
        return cls(params.run, params.penalty, params.device, params.batch_size)

    def member_scores(self, texts: list[str], prompts: list[str] | None) -> torch.Tensor:
        """scores_KN of every member for each answer `texts[n]` to the user prompt `prompts[n]`."""
        import torch

        from purplerl.data.preference import encode_answer
        from purplerl.data.sft import pad_batch

        if prompts is None:
            raise UserError(f"reward model {self.checkpoint} scores an answer to its prompt: give the prompts")
        if len(prompts) != len(texts):
            raise ExperimentError(f"reward model got {len(prompts)} prompts for {len(texts)} answers")
        p = self.prompt
        encoded = [encode_answer(self.engine.tokenizer, ({"role": "user", "content": prompt},), text, f"answer {i}",
                                 p.template, p.system_prompt, p.max_prompt_tokens, self.max_answer_tokens,
                                 end_id=self.end_id)
                   for i, (text, prompt) in enumerate(zip(texts, prompts, strict=True))]
        chunks = []
        for start in range(0, len(encoded), self.batch_size):
            batch = pad_batch(encoded[start:start + self.batch_size], self.pad_id)
            chunks.append(member_scores(self.engine, self.members, batch.input_ids_NT, batch.attention_mask_NT))
        return torch.cat(chunks, dim=1) if chunks else torch.zeros(len(self.members), 0)

    def score(self, texts: list[str], prompts: list[str] | None = None) -> list[float]:
        from purplerl.algorithms.reward_model import ensemble_reward

        _, _, reward_N = ensemble_reward(self.member_scores(texts, prompts), self.penalty)
        return reward_N.tolist()


def run_setting(run_config: Path, dotted: str, kind: type, command: str) -> Any:
    """The run's setting `section.name` (runs/<run>/config.yaml), an int >= 1 or a non-empty str as `kind` says: a
    scorer cuts and splits answers as its run trained; UserError when the config lacks it (not a run of `purplerl
    COMMAND`)."""
    section, _, name = dotted.partition(".")
    values = read_config_file(run_config).get(section)
    value = values.get(name) if isinstance(values, dict) else None
    if not isinstance(value, kind) or isinstance(value, bool) or not (value >= 1 if kind is int else value):
        raise UserError(f"{run_config} has no {dotted}: not the config of a {command} run")
    return value


def record_checkpoint(params: Any, checkpoint: Path, term: str) -> None:
    """Write the checkpoint that scores into a term's parameters (saved in the run's config.yaml); parameters that
    name another one (a resumed run) are refused: its rewards came from that one."""
    used = str(checkpoint.resolve())
    if params.checkpoint is not None and params.checkpoint != used:
        raise UserError(f"this run was scored by the reward model {params.checkpoint}, but {params.run} now gives "
                        f"{used}: set reward.terms.{term}.params.run to the checkpoint it used to resume")
    params.checkpoint = used


def _recorded(params: RewardModelParams, scorer: RewardModelScorer) -> None:
    record_checkpoint(params, scorer.checkpoint, TERM)


def _term(params: RewardModelParams) -> TermFn:
    """The training reward: mean - penalty x std per answer, with the mean and std logged."""
    from purplerl.algorithms.reward_model import ensemble_reward

    scorer = RewardModelScorer.from_params(params)
    _recorded(params, scorer)

    def reward(batch: ScoringInput) -> TermOutput:
        mean_N, std_N, reward_N = ensemble_reward(scorer.member_scores(batch.texts, batch.prompts), params.penalty)
        return TermOutput(reward_N, {f"{TERM}_mean": mean_N, f"{TERM}_std": std_N})

    return reward


register_term(RewardTerm(
    TERM, "a trained reward model's score (purplerl reward-model): its ensemble's mean minus penalty x std",
    "text", RewardModelParams, _term, RewardModelScorer.from_params))
