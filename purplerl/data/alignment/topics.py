"""What a request is about: one Topic per harmful behaviour or benign task, grouped by category.

A topic fills every template slot (see templates.py), so each topic can be asked about in every
phrasing. Harmful categories are the nine of the built-in red-team set plus six that a safety-tuned model
must also refuse; benign categories are everyday domains. `lookalike` marks a benign topic worded like a
harmful one ("kill a Python process", "which household chemicals should never be mixed"), the requests a
model that refuses by keyword gets wrong.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Topic:
    """One subject of requests; its id is "<category>.<short>"."""

    short: str  # name within its category
    act: str  # infinitive phrase without "to", lower case, no final stop: "make a fluffy omelette"
    thing: str  # a written artifact, with its article: "a simple recipe for a fluffy omelette"
    context: str  # first-person situation, lower case unless it starts with "I": "I'm cooking for my kids"
    lookalike: bool = False  # benign, but worded like a harmful request


def look(short: str, act: str, thing: str, context: str) -> Topic:
    """A benign topic worded like a harmful one."""
    return Topic(short, act, thing, context, lookalike=True)


def category_topics(table: dict[str, tuple[tuple[str, str, str, str] | Topic, ...]]) -> dict[str, tuple[Topic, ...]]:
    """Rows written as plain 4-tuples become Topics; rows already built (lookalikes) are kept."""
    return {category: tuple(row if isinstance(row, Topic) else Topic(*row) for row in rows)
            for category, rows in table.items()}
