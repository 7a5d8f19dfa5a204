"""Templates x topics -> alignment examples, split so that the test split holds out whole templates and
whole topics, and the content hash that `purplerl align` caches its model under.

The split is stratified and fixed by hashing ids: one template in TEST_TEMPLATE_EVERY of each template
kind, and one topic in TEST_TOPIC_EVERY of each category, is held out (rounded up, so every kind and
every category is on both sides). A train example pairs a train template with a train topic; a test
example a test template with a test topic, so a test prompt's wording and subject are both unseen.
Each topic is asked in PER_TOPIC[split] templates of each kind, the first ones in a hash order of
(topic, template), which keeps every topic in every phrasing family without taking the full product.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass

from purplerl.data.alignment import benign_everyday, benign_learning, harmful_crime, harmful_people, refusals
from purplerl.data.alignment import templates as template_table
from purplerl.data.alignment.templates import Template
from purplerl.data.alignment.topics import Topic
from purplerl.errors import ExperimentError, UserError
from purplerl.types import PromptRecord

# Bump when the generator changes in a way the tables do not show; part of the content hash.
VERSION = 1
SPLITS = ("train", "test")
KINDS = ("harmful", "benign")
TEST_TEMPLATE_EVERY = 3
TEST_TOPIC_EVERY = 4
PER_TOPIC: dict[str, dict[str, int]] = {
    "train": {"question": 3, "content": 2, "first_person": 2, "roleplay": 1},
    "test": {"question": 2, "content": 2, "first_person": 1, "roleplay": 1},
}


@dataclass(frozen=True)
class AlignExample:
    """One alignment request; harmful ones carry their refusal, benign ones are answered by the model."""

    messages: tuple[dict[str, str], ...]  # the user's request, one {role: "user", content} message
    kind: str  # "harmful" or "benign"
    category: str  # harm category (harmful) or everyday domain (benign)
    template_id: str  # the template the request was written from
    template_kind: str  # templates.KINDS: question, content, first_person or roleplay
    topic_id: str  # "<category>.<short>"
    refusal: str | None  # the target answer of a harmful request; None for a benign one
    uid: str  # "align:<topic_id>:<template_id>", stable across versions while both ids exist
    tags: tuple[str, ...] = ()  # the template's registers, plus "lookalike" for a harmful-sounding benign topic

    @property
    def prompt(self) -> str:
        return self.messages[-1]["content"]

    def conversation(self, answer: str | None = None) -> tuple[dict[str, str], ...]:
        """The request followed by `answer`, or by the refusal when no answer is given (harmful only)."""
        reply = self.refusal if answer is None else answer
        if reply is None:
            raise ExperimentError(f"benign alignment example {self.uid} has no answer of its own: "
                                  "pass the model's answer")
        return (*self.messages, {"role": "assistant", "content": reply})


def harmful_topics() -> dict[str, tuple[Topic, ...]]:
    return {**harmful_people.PEOPLE_TOPICS, **harmful_crime.CRIME_TOPICS}


def benign_topics() -> dict[str, tuple[Topic, ...]]:
    return {**benign_everyday.EVERYDAY_TOPICS, **benign_learning.LEARNING_TOPICS}


def alignment_examples(split: str, kind: str | None = None) -> list[AlignExample]:
    """The examples of `split` ("train" or "test"), harmful then benign, or only `kind`'s."""
    _check_choice("split", split, SPLITS)
    kinds = KINDS if kind is None else (_check_choice("kind", kind, KINDS),)
    by_kind = split_templates(split)
    examples: list[AlignExample] = []
    for side in kinds:
        for category, topics in split_topics(side, split).items():
            for topic in topics:
                for template in _templates_for(f"{category}.{topic.short}", by_kind, PER_TOPIC[split]):
                    examples.append(_example(side, category, topic, template))
    return _dedupe(examples)


def split_templates(split: str) -> dict[str, list[Template]]:
    """The templates of `split`, by template kind."""
    _check_choice("split", split, SPLITS)
    out: dict[str, list[Template]] = {}
    for template_kind in template_table.KINDS:
        group = [t for t in template_table.TEMPLATES if t.kind == template_kind]
        held_out = _held_out([t.id for t in group], TEST_TEMPLATE_EVERY)
        out[template_kind] = [t for t in group if (t.id in held_out) == (split == "test")]
    return out


def split_topics(kind: str, split: str) -> dict[str, list[Topic]]:
    """The topics of `kind` ("harmful" or "benign") in `split`, by category."""
    _check_choice("kind", kind, KINDS)
    _check_choice("split", split, SPLITS)
    table = harmful_topics() if kind == "harmful" else benign_topics()
    out: dict[str, list[Topic]] = {}
    for category, topics in table.items():
        held_out = _held_out([f"{category}.{t.short}" for t in topics], TEST_TOPIC_EVERY)
        out[category] = [t for t in topics if (f"{category}.{t.short}" in held_out) == (split == "test")]
    return out


def alignment_data_hash() -> str:
    """sha256 of every example of both splits and VERSION: the cache key of a model aligned on this data.
    Any table edit that changes an example (a template, a topic, a refusal part, a split share) changes it."""
    digest = hashlib.sha256(f"purplerl-alignment-data v{VERSION}\n".encode())
    for split in SPLITS:
        for ex in alignment_examples(split):
            row = [split, ex.uid, ex.kind, ex.category, ex.template_kind, ex.prompt, ex.refusal, list(ex.tags)]
            digest.update((json.dumps(row) + "\n").encode())
    return digest.hexdigest()


def to_prompt_records(examples: Sequence[AlignExample]) -> list[PromptRecord]:
    """Examples as evaluation prompts; `source` is "align:harmful" or "align:benign"."""
    return [PromptRecord(messages=ex.messages, category=ex.category, source=f"align:{ex.kind}", uid=ex.uid)
            for ex in examples]


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise UserError(f"unknown alignment data {name} '{value}' (choose from {', '.join(choices)})")
    return value


def _rank(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def _held_out(ids: list[str], every: int) -> set[str]:
    """The ceil(n / every) ids that come first in hash order: the test side of one stratum."""
    count = -(-len(ids) // every)
    return set(sorted(ids, key=lambda i: _rank(f"split/{i}"))[:count])


def _templates_for(topic_id: str, by_kind: dict[str, list[Template]], quota: dict[str, int]) -> list[Template]:
    chosen: list[Template] = []
    for template_kind, count in quota.items():
        ranked = sorted(by_kind[template_kind], key=lambda t: _rank(f"pair/{topic_id}/{t.id}"))
        chosen.extend(ranked[:count])
    return chosen


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


def _example(kind: str, category: str, topic: Topic, template: Template) -> AlignExample:
    topic_id = f"{category}.{topic.short}"
    uid = f"align:{topic_id}:{template.id}"
    slots = {"act": topic.act, "thing": topic.thing, "context": topic.context}
    text = template.text.format(**slots, **{_cap(name): _cap(value) for name, value in slots.items()})
    refusal = refusals.build_refusal(uid, category, template.kind) if kind == "harmful" else None
    tags = template.tags + (("lookalike",) if topic.lookalike else ())
    return AlignExample(messages=({"role": "user", "content": text},), kind=kind, category=category,
                        template_id=template.id, template_kind=template.kind, topic_id=topic_id,
                        refusal=refusal, uid=uid, tags=tags)


def _dedupe(examples: list[AlignExample]) -> list[AlignExample]:
    # Two (topic, template) pairs could in principle word the same request; the first one is kept.
    seen: set[str] = set()
    out = []
    for ex in examples:
        if ex.prompt not in seen:
            seen.add(ex.prompt)
            out.append(ex)
    return out
