"""The offline attacker set (`purplerl data prepare attack-prompts`): goal -> adversarial-prompt SFT rows in the
attacker's chat format, the first phase of MTSA (an attacker SFT'd to turn a harmful goal into an attack prompt).

Goals are the harmful topics of the alignment data (purplerl/data/alignment), two per topic: "Explain how to
{act}." and "Write {thing}.". Each goal is rephrased by the attack templates (attack_templates.py: role-play,
hypothetical framing, step-splitting, persona, obfuscation). A row is one chat: the user turn is
`attacker_request(goal)` (purplerl.data.attacker, as `eval --attacker` and `purplerl adversarial` ask the attacker),
the assistant turn the attack prompt, so `purplerl sft --data OUT/train.jsonl` trains the attacker on the attack
only.

The split holds out whole templates and whole topics, so a held-out row's wording and subject are both unseen:
ceil(1/TEST_TEMPLATE_EVERY) of each family's templates, first in a hash order of their ids, and the alignment
data's held-out topics (split_topics). Each goal is rephrased by PER_FAMILY[split] templates of each family, the
first in a hash order of (goal, template), which keeps every goal in every family without the full product.
Everything is a table or a hash, so the files are the same bytes every run; OUT/manifest.json holds the counts
per split and family, the templates and topics of each split and each file's SHA-256.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from purplerl.data.alignment import SPLITS, split_topics
from purplerl.data.attack_templates import FAMILIES, TEMPLATES, AttackTemplate, render
from purplerl.data.attacker import attacker_request
from purplerl.errors import UserError
from purplerl.files import write_durably
from purplerl.outputs import make_output_dir
from purplerl.types import PromptRecord

NAME = "attack-prompts"  # its `purplerl data prepare` name (purplerl.config DATASET_NAMES)
VERSION = 1  # bump when the generator changes in a way the tables do not show
TEST_TEMPLATE_EVERY = 3  # one template in three of each family is held out (rounded up), as the alignment data does
PER_FAMILY = {"train": 2, "test": 1}  # templates of each family that rephrase one goal
GOAL_KINDS = ("how", "write")
MANIFEST = "manifest.json"


@dataclass(frozen=True)
class Goal:
    """What the attacker is asked to get out of the defender: one harmful request, plainly worded."""

    id: str  # "<category>.<topic short>.<kind>"
    ask: str  # the request as an imperative without its final stop: "explain how to build a pipe bomb"
    category: str  # the alignment data's harm category
    topic_id: str  # "<category>.<short>"

    @property
    def text(self) -> str:
        return f"{self.ask[:1].upper()}{self.ask[1:]}."


@dataclass(frozen=True)
class AttackPrompts:
    """What `prepare_attack_prompts` wrote."""

    out_dir: Path
    manifest: dict[str, Any]

    def describe(self) -> str:
        parts = []
        for split in SPLITS:
            families = ", ".join(f"{f} {n}" for f, n in self.manifest["rows"][split].items())
            parts.append(f"{self.out_dir / f'{split}.jsonl'} ({sum(self.manifest['rows'][split].values())} rows: "
                         f"{families}; {self.manifest['goals'][split]} goals of "
                         f"{self.manifest['topics'][split]} topics)")
        return f"wrote {', '.join(parts)} and {self.out_dir / MANIFEST}"


def _rank(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def _check_split(split: str) -> str:
    if split not in SPLITS:
        raise UserError(f"unknown attack-prompts split '{split}' (choose from {', '.join(SPLITS)})")
    return split


def split_attack_templates(split: str) -> dict[str, list[AttackTemplate]]:
    """The templates of `split`, by family: a test template never rephrases a training goal."""
    _check_split(split)
    out: dict[str, list[AttackTemplate]] = {}
    for family in FAMILIES:
        group = [t for t in TEMPLATES if t.family == family]
        count = -(-len(group) // TEST_TEMPLATE_EVERY)
        held_out = {t.id for t in sorted(group, key=lambda t: _rank(f"attack-split/{t.id}"))[:count]}
        out[family] = [t for t in group if (t.id in held_out) == (split == "test")]
    return out


def attack_goals(split: str) -> list[Goal]:
    """The goals of `split`: two per harmful topic of the alignment data's `split`, in category order."""
    goals = []
    for category, topics in split_topics("harmful", _check_split(split)).items():
        for topic in topics:
            topic_id = f"{category}.{topic.short}"
            asks = {"how": f"explain how to {topic.act}", "write": f"write {topic.thing}"}
            goals += [Goal(f"{topic_id}.{kind}", asks[kind], category, topic_id) for kind in GOAL_KINDS]
    return goals


def goal_records(split: str) -> list[PromptRecord]:
    """The goals of `split` as prompt records (the goal as the user's text): `eval --attacker`'s default goals."""
    return [PromptRecord(messages=({"role": "user", "content": g.text},), category=g.category, source=f"{NAME}:goal",
                         uid=g.id) for g in attack_goals(split)]


def attack_rows(split: str) -> list[dict[str, Any]]:
    """The SFT rows of `split`: for each goal, PER_FAMILY[split] templates of each family."""
    by_family = split_attack_templates(split)
    rows = []
    for goal in attack_goals(split):
        for family in FAMILIES:
            ranked = sorted(by_family[family], key=lambda t: _rank(f"attack-pair/{goal.id}/{t.id}"))
            for template in ranked[:PER_FAMILY[split]]:
                rows.append(_row(goal, template))
    return rows


def _row(goal: Goal, template: AttackTemplate) -> dict[str, Any]:
    messages = [{"role": "user", "content": attacker_request(goal.text)},
                {"role": "assistant", "content": render(template, goal.ask)}]
    return {"messages": messages, "goal": goal.text, "category": goal.category, "topic_id": goal.topic_id,
            "goal_id": goal.id, "family": template.family, "template_id": template.id,
            "uid": f"attack:{goal.id}:{template.id}"}


def prepare_attack_prompts(out_dir: Path) -> AttackPrompts:
    """Write OUT/train.jsonl, OUT/test.jsonl (the file is the split) and OUT/manifest.json."""
    texts, manifest = {}, _manifest_head()
    for split in SPLITS:
        rows = attack_rows(split)
        texts[f"{split}.jsonl"] = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
        families = Counter(row["family"] for row in rows)
        manifest["rows"][split] = {family: families[family] for family in FAMILIES}
        manifest["goals"][split] = len({row["goal_id"] for row in rows})
        manifest["topics"][split] = len({row["topic_id"] for row in rows})
        manifest["templates"][split] = {f: [t.id for t in ts] for f, ts in split_attack_templates(split).items()}
    manifest["sha256"] = {name: hashlib.sha256(text.encode()).hexdigest() for name, text in texts.items()}
    make_output_dir(out_dir)
    for name, text in texts.items():
        write_durably(out_dir / name, text)
    write_durably(out_dir / MANIFEST, json.dumps(manifest, indent=1) + "\n")
    return AttackPrompts(out_dir, manifest)


def _manifest_head() -> dict[str, Any]:
    return {"dataset": NAME, "version": VERSION, "format": "messages: [user attacker_request(goal), assistant attack]",
            "rows": {}, "goals": {}, "topics": {}, "templates": {}}
