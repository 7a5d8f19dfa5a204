"""`purplerl eval --rewards a,b`: score answers with named rewards or registered terms that the policy may never have
been trained on, so a combined reward can be taken apart (small-rl's --eval_rewards: did the policy learn the task,
sentence_length_5, or the hack, happy_count?).

Each name is a named reward (purplerl.rewards.named: the built-in catalogue, plus eval.rewards_file) or a registered
term, expanded exactly as `--reward NAME` expands it for training. For every target two sets of answers are scored:

- `rewards`: the eval's own fresh samples of the target (the harm suite's generations on eval's prompts);
- `rewards_logged`, for a checkpoint inside a run: the samples its run logged (samples.jsonl) in the checkpoint's
  last save interval, steps (N - run.save_every, N]: the answers the policies that led to checkpoint N drew on the
  training prompts. `by_step` holds each step's means up to N, the curve of each part of the reward.

Metrics: NAME is the reward's weighted sum of its terms (no KL: that is the training loop's, against a policy's
base), NAME/TERM each term of a combination unweighted, NAME/rh_rate the share a detector labels a hack; each a mean
with a 95% percentile-bootstrap CI over the answers (purplerl.eval.metrics.bootstrap_ci). A term that reads the
policy's token entropies or the loop's KL cannot score saved text and is refused before any model loads; a
ground_truth term reads the answers' rows' ground truths (eval's data, or the logged rows) and refuses rows without.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from purplerl.config.loader import read_config_file
from purplerl.errors import ExperimentError, UserError
from purplerl.eval.metrics import bootstrap_ci
from purplerl.files import read_jsonl
from purplerl.rewards.compose import Reward
from purplerl.rewards.named import TermSpec, catalogue, expand
from purplerl.rewards.registry import READS, ScoringInput, get_term
from purplerl.runs.checkpoints import step_of
from purplerl.runs.layout import SAMPLES_FILE, run_config_of
from purplerl.types import PromptRecord

SCORABLE = ("text", "ground_truth")  # what a saved answer (and its row) can give a term


@dataclass(frozen=True)
class NamedReward:
    name: str
    terms: dict[str, float | TermSpec]  # what the name expands into (as reward.terms)
    reward: Reward

    @property
    def reads_ground_truth(self) -> bool:
        return any(need == "ground_truth" for need in self.reward.needs.values())


def load_rewards(names: Sequence[str], rewards_file: str | None = None) -> list[NamedReward]:
    """Each name expanded and built (models load here, once); a term that cannot score saved text is refused."""
    known = catalogue(rewards_file)
    out = []
    for name in names:
        terms = {k: TermSpec.model_validate(v) if isinstance(v, dict) else float(v)
                 for k, v in expand(name, known).items()}
        for term, entry in terms.items():
            need = get_term(entry.fn if isinstance(entry, TermSpec) else term).needs
            if need not in SCORABLE:
                raise UserError(f"eval.rewards: '{name}' term '{term}' reads {READS[need]}, which saved answers do "
                                "not have")
        out.append(NamedReward(name, terms, Reward(terms)))
    return out


def check_ground_truths(rewards: Sequence[NamedReward], prompts: Sequence[PromptRecord], where: str) -> None:
    """A reward reading ground truths refuses, before generation, prompts without one."""
    lacking = sum(p.ground_truth is None for p in prompts)
    reader = next((r.name for r in rewards if r.reads_ground_truth), None)
    if reader is not None and lacking:
        raise UserError(f"eval.rewards: '{reader}' reads {READS['ground_truth']}, and {lacking} of the "
                        f"{len(prompts)} prompts of {where} have none")


def rescore(rows: Sequence[dict[str, Any]], rewards: Sequence[NamedReward], seed: int = 0) -> dict[str, Any]:
    """{"n", "metrics": {NAME, NAME/TERM, NAME/rh_rate: {point, low, high}}} over rows {completion, prompt,
    ground_truth?}."""
    if not rows:
        raise ExperimentError("eval.rewards: no answers to score")
    metrics: dict[str, dict[str, float]] = {}
    for name, values in per_sample(rows, rewards).items():
        point, low, high = bootstrap_ci(values, seed=seed)
        metrics[name] = {"point": point, "low": low, "high": high}
    return {"n": len(rows), "metrics": metrics}


def per_sample(rows: Sequence[dict[str, Any]], rewards: Sequence[NamedReward]) -> dict[str, list[float]]:
    """Each metric's value per row (see the module docstring for the names)."""
    batch = ScoringInput(texts=[str(r["completion"]) for r in rows], prompts=[str(r["prompt"]) for r in rows],
                         ground_truths=[r.get("ground_truth") for r in rows])
    out: dict[str, list[float]] = {}
    for named in rewards:
        scored = named.reward(batch)
        out[named.name] = scored.total_N.tolist()
        if len(named.terms) > 1:
            out.update({f"{named.name}/{term}": scored.components[term].tolist() for term in named.terms})
        if scored.is_rh_N is not None:
            out[f"{named.name}/rh_rate"] = scored.is_rh_N.float().tolist()
    return out


def logged_rows(checkpoint: Path) -> tuple[list[dict[str, Any]], int, int] | None:
    """(the rows its run logged up to the checkpoint's step N, first step of its save interval, N), or None for a
    checkpoint outside a run (or a run without samples)."""
    config = run_config_of(checkpoint)
    samples = None if config is None else config.parent / SAMPLES_FILE
    if samples is None or not samples.is_file():
        return None
    save_every = read_config_file(config).get("run", {}).get("save_every")
    if not isinstance(save_every, int) or save_every < 1:
        raise ExperimentError(f"{config}: run.save_every is {save_every!r}, not a step count")
    step = step_of(checkpoint)
    rows = [r for r in read_jsonl(samples) if isinstance(r.get("step"), int) and r["step"] <= step]
    return rows, max(1, step - save_every + 1), step


def rescore_logged(checkpoint: Path, rewards: Sequence[NamedReward], seed: int = 0) -> dict[str, Any] | None:
    """`rescore` of the run's samples in the checkpoint's save interval, with `steps` [first, N] and `by_step`
    (each logged step's mean of every metric); None outside a run."""
    found = logged_rows(checkpoint)
    if found is None:
        return None
    rows, first, last = found
    window = [r for r in rows if r["step"] >= first]
    if not window:
        raise ExperimentError(f"{checkpoint}: its run logged no samples in steps {first}..{last}")
    values = per_sample(rows, rewards)
    steps = [r["step"] for r in rows]
    by_step = {str(s): {name: sum(v for v, t in zip(vals, steps, strict=True) if t == s) / steps.count(s)
                        for name, vals in values.items()} for s in sorted(set(steps))}
    return {**rescore(window, rewards, seed), "steps": [first, last], "by_step": by_step}


def target_rewards(rows: Sequence[dict[str, Any]], prompts: Sequence[PromptRecord], rewards: Sequence[NamedReward],
                   checkpoint: str | None, seed: int = 0) -> dict[str, Any]:
    """One eval target's results: `rewards` on its fresh samples (each row's ground truth from its prompt) and, for
    a checkpoint inside a run, `rewards_logged` on its run's samples."""
    fresh = [{**row, "ground_truth": prompts[row["prompt_index"]].ground_truth} for row in rows]
    out: dict[str, Any] = {"rewards": rescore(fresh, rewards, seed)}
    logged = None if checkpoint is None else rescore_logged(Path(checkpoint), rewards, seed)
    if logged is not None:
        out["rewards_logged"] = logged
    return out


def describe(rewards: Sequence[NamedReward]) -> dict[str, dict[str, Any]]:
    """What each name expanded into (eval.json records it: a named reward's file may change)."""
    return {r.name: {k: v.model_dump(mode="json") if isinstance(v, TermSpec) else v for k, v in r.terms.items()}
            for r in rewards}
