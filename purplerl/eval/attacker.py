"""A learned attacker as `purplerl eval`'s prompt source (issue 23 item 6): goals -> the attacker's prompts -> the
models under evaluation, so the attack success rate of a learned attacker against a base and a defended model is
one command.

`eval.attacker` names an attacker checkpoint, or a run dir whose newest intact checkpoint is taken (e.g. the run of
`purplerl sft --data` on the attack-prompts set), loaded with its run's base model and prompt format. Each goal
(the text of a data.source prompt; with data.source left at its default, the held-out goals of the attack-prompts
set, purplerl.data.attack_prompts) is asked as `attacker_request(goal)`, the way the attacker was trained, and one
attack is sampled per goal: temperature eval.attacker_temperature (0: greedy), the sampling section's top_p and
top_k, at most eval.attacker_max_new_tokens, each batch of eval.batch_size goals seeded with eval.seed + the index
of its first goal, as the targets' batches are. The attacks, with the attacker's description, go to OUT/attacks.json
before any target samples; a rerun into OUT with the same attacker and goals reads them back.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from purplerl.config import EvalCommandConfig, ModelLoadConfig, PromptFormatConfig
from purplerl.data.attacker import ATTACKER_ADAPTER, attacker_messages
from purplerl.errors import UserError
from purplerl.files import read_json_object, write_durably
from purplerl.types import PromptRecord, SamplingParams

ATTACKS_FILE = "attacks.json"


@dataclass(frozen=True)
class Attacks:
    """The goals and the attack the attacker wrote for each (same order)."""

    goals: list[PromptRecord]  # the goal is each record's last message
    texts: list[str]

    def records(self, source: str = "attacker") -> list[PromptRecord]:
        """The attacks as the targets' prompts: one user turn each, with its goal's category and uid."""
        return [PromptRecord(messages=({"role": "user", "content": text},), category=goal.category, source=source,
                             uid=goal.uid) for goal, text in zip(self.goals, self.texts, strict=True)]

    def goal_of(self) -> dict[str, str]:
        """uid -> goal text, for the targets' sample rows."""
        return {goal.uid: goal_text(goal) for goal in self.goals}


def goal_text(record: PromptRecord) -> str:
    return record.messages[-1]["content"]


def attacker_checkpoint(path: str) -> Path:
    """The checkpoint `eval.attacker` names: a checkpoint dir as is, a run dir's newest intact checkpoint."""
    from purplerl.engines.loading import is_full_model_dir
    from purplerl.runs.checkpoints import latest_checkpoint

    given = Path(path).expanduser()
    if not given.is_dir():
        raise UserError(f"--attacker {given}: no such directory (give an attacker checkpoint or its run dir)")
    if (given / "adapter_config.json").is_file() or is_full_model_dir(given):
        return given
    latest = latest_checkpoint(given)
    if latest is None:
        raise UserError(f"--attacker {given} is neither a checkpoint (no adapter_config.json) nor a run dir with an "
                        "intact checkpoint")
    return latest


def resolve_attacker(cfg: EvalCommandConfig, announce: Any = print) -> Any:
    """The attacker's Policy, checked against its base model from files alone, or None without eval.attacker. Its
    base model and prompt format are its run's whatever --model says (that names the targets' base)."""
    if cfg.eval.attacker is None:
        return None
    from purplerl.runs.policy import resolve_policy

    checkpoint = attacker_checkpoint(cfg.eval.attacker)
    policy = resolve_policy(checkpoint, ModelLoadConfig(device=cfg.model.device), PromptFormatConfig())
    trained = checkpoint / ATTACKER_ADAPTER
    if (trained / "adapter_config.json").is_file():  # `purplerl adversarial`'s checkpoint: its attacker, not defender
        policy = replace(policy, model=policy.model.model_copy(update={"init_adapter": str(trained)}))
    policy = policy.checked("--attacker")
    if policy.note:
        announce(policy.note)
    return policy


def load_goals(cfg: EvalCommandConfig) -> list[PromptRecord]:
    """The goals: data.source's prompts, or the attack-prompts set's goals of data.split when data.source is left at
    its default."""
    from purplerl.data.sources import load_prompts

    if "source" in cfg.data.model_fields_set:
        return load_prompts(cfg.data)
    if cfg.data.filters:
        raise UserError("data.filters select rows of a data.source: the attack-prompts goals take none (give "
                        "--prompts FILE of goals to filter)")
    from purplerl.data.attack_prompts import goal_records

    goals = goal_records(cfg.data.split)
    return goals[: cfg.data.limit] if cfg.data.limit is not None else goals


def describe_attacker(cfg: EvalCommandConfig, policy: Any) -> dict[str, Any] | None:
    """What the attacks depend on (None without an attacker): the policy (its adapter as an absolute path) and how
    it samples; recorded in generation.json and attacks.json, so a rerun with another attacker is refused."""
    if policy is None:
        return None
    found = policy.describe()
    del found["run_config"]  # follows from the adapter's path
    for key in ("adapter", "model"):
        if found[key] is not None and Path(found[key]).exists():
            found[key] = str(Path(found[key]).resolve())
    e = cfg.eval
    return {**found, "temperature": e.attacker_temperature, "max_new_tokens": e.attacker_max_new_tokens,
            "goals": cfg.data.source if "source" in cfg.data.model_fields_set else f"attack-prompts:{cfg.data.split}"}


def attack(cfg: EvalCommandConfig, policy: Any, goals: list[PromptRecord], out: Path) -> Attacks:
    """The attacker's prompt for each goal: read back from OUT/attacks.json when it holds these goals from this
    attacker, else sampled (module docstring) and written there before any target samples."""
    described = describe_attacker(cfg, policy)
    path = out / ATTACKS_FILE
    if path.is_file():
        saved = read_json_object(path)
        rows = saved.get("attacks")
        if saved.get("attacker") == described and isinstance(rows, list) and \
                [(r.get("uid"), r.get("goal")) for r in rows] == [(g.uid, goal_text(g)) for g in goals]:
            return Attacks(goals, [str(r["attack"]) for r in rows])
    texts = sample_attacks(cfg, policy, goals)
    rows = [{"uid": g.uid, "category": g.category, "goal": goal_text(g), "attack": text}
            for g, text in zip(goals, texts, strict=True)]
    out.mkdir(parents=True, exist_ok=True)
    write_durably(path, json.dumps({"attacker": described, "attacks": rows}, indent=1, ensure_ascii=False))
    return Attacks(goals, texts)


def sample_attacks(cfg: EvalCommandConfig, policy: Any, goals: list[PromptRecord]) -> list[str]:
    """One attack per goal from the attacker, asked with attacker_request(goal), in batches of eval.batch_size."""
    engine = policy.load()
    temperature, s = cfg.eval.attacker_temperature, cfg.sampling
    greedy = temperature == 0.0  # truncation means nothing to an argmax
    asks = [PromptRecord(messages=tuple(attacker_messages(goal_text(g), [])), category=g.category, uid=g.uid)
            for g in goals]
    texts: list[str] = []
    size = cfg.eval.batch_size
    for first in range(0, len(asks), size):
        params = SamplingParams(max_new_tokens=cfg.eval.attacker_max_new_tokens, temperature=temperature,
                                top_p=1.0 if greedy else s.top_p, top_k=0 if greedy else s.top_k,
                                seed=cfg.eval.seed + first)
        texts += [group[0].strip() for group in policy.generate(engine, asks[first:first + size], 1, params)]
    return texts
