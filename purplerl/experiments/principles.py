"""Principles of the iterative refiner (purplerl.experiments.refiner): each a critique request and a revision
request, as in Constitutional AI (Bai et al. 2022, arXiv:2212.08073). A small built-in list, or a YAML or JSON file:

    principles:
      - name: harm
        critique: Point out every way your last answer could help someone hurt people.
        revision: Rewrite your last answer so that it gives no help toward harm. Give only the new answer.

The requests are the user's turns after the assistant's answer (critique) and after the critique (revision), so
they speak to the assistant about "your last answer".
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pydantic import Field, field_validator

from purplerl.config import build, read_config_file
from purplerl.config.base import Section
from purplerl.errors import UserError


@dataclass(frozen=True)
class Principle:
    name: str  # short id, recorded with each round
    critique: str  # asks for a critique of the assistant's last answer in the light of the principle
    revision: str  # asks for that answer rewritten to address the critique


# Written for purplerl in the manner of Constitutional AI's critique/revision pairs: each names what to look for,
# and its revision asks for the whole answer again, so a revision stands alone as a completion.
DEFAULT_PRINCIPLES: tuple[Principle, ...] = (
    Principle("harm", "Point out every way your last answer could help someone hurt people or break the law.",
              "Rewrite your last answer so that it gives no help toward harm, while still helping with any safe "
              "part of the request. Give only the new answer."),
    Principle("respect", "Point out anything in your last answer that insults, mocks or demeans a person or a "
                         "group.",
              "Rewrite your last answer without any insult, mockery or contempt. Give only the new answer."),
    Principle("honesty", "Point out any claim in your last answer that is false, invented, or more certain than "
                         "the facts allow.",
              "Rewrite your last answer so that every claim is true or marked as uncertain. Give only the new "
              "answer."),
    Principle("helpfulness", "Point out where your last answer refuses, lectures or dodges a part of the request "
                             "that is safe to help with.",
              "Rewrite your last answer to help fully with what is safe and to decline only what is harmful, "
              "briefly and kindly. Give only the new answer."),
    Principle("care", "Point out anything in your last answer that a kind and thoughtful person would not say to "
                      "someone who might be young or vulnerable.",
              "Rewrite your last answer the way a kind and thoughtful person would say it. Give only the new "
              "answer."),
)


class PrincipleEntry(Section):
    name: str = Field(description="short id of the principle, recorded with each round")
    critique: str = Field(description="the request for a critique of the assistant's last answer")
    revision: str = Field(description="the request for that answer rewritten to address the critique")

    @field_validator("name", "critique", "revision")
    @classmethod
    def _not_blank(cls, text: str) -> str:
        if not text.strip():
            raise ValueError("must not be blank")
        return text


class PrinciplesFile(Section):
    principles: list[PrincipleEntry] = Field(min_length=1, description="the principles, in cycling order")


def load_principles(path: str | None) -> tuple[Principle, ...]:
    """The principles of a YAML or JSON file (`principles: [{name, critique, revision}]`), or the built-in ones."""
    if path is None:
        return DEFAULT_PRINCIPLES
    try:
        entries = build(PrinciplesFile, read_config_file(Path(path).expanduser())).principles
    except UserError as err:
        raise UserError(f"principles {path}: {err}") from None
    names = [entry.name for entry in entries]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise UserError(f"principles {path}: names repeat ({', '.join(repeated)}): give each principle its own")
    return tuple(Principle(e.name, e.critique, e.revision) for e in entries)


