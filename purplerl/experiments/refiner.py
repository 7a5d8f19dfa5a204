"""The iterative refiner: SFT data built by generate -> critique -> revise against written principles, the
supervised stage of Constitutional AI (Bai et al. 2022, arXiv:2212.08073).

The policy answers each prompt. Then, for `rounds` rounds, the critic is shown the conversation so far plus one
principle's critique request and critiques the current answer; the reviser (the critic, or the policy) is shown
that conversation plus the critique and the principle's revision request, and rewrites the answer. The last
revision is the SFT completion. Principles are taken per prompt in a seeded random order or cycled.

Out dir:
- `revisions.jsonl`: one object per prompt with every step (the prompt's messages, the initial answer, and per
  round the principle, the critique request and critique, the revision request and revision) and the final text.
- `sft.jsonl`: `prompt` (as the policy got it, system prompt included) + `completion` (the final revision) +
  `uid`, the rows `purplerl sft` reads (purplerl.data.sft); a prompt whose final revision is blank is only in
  revisions.jsonl (SFT refuses it).
- `refine.json`: the settings, the principles, and the names of the policy and the critic.

Deterministic given the seed: prompts are generated in fixed batches (positions in the prompt list), each call's
sampling seed hashes (seed, batch, round, step) and each prompt's principle order hashes (seed, uid). A killed run
resumes: revisions.jsonl is appended and fsynced after every batch; a rerun drops a line cut by the kill, skips the
batches that are done and generates a partly written batch again whole (same prompts, same seeds: the same texts),
appending its missing prompts. sft.jsonl is written whole from revisions.jsonl at the end. A rerun with other
settings is refused, except a new `data.limit`: the batches before it stay the same.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import Field, model_validator

from purplerl.config import (
    ModelConfig,
    ModelLoadConfig,
    PromptFormatConfig,
    PromptSourceConfig,
    Template,
    build,
    read_config_file,
)
from purplerl.config.base import Section, read_when
from purplerl.data.sources import load_prompts
from purplerl.engines import make_engine
from purplerl.engines.base import Engine
from purplerl.engines.model_cache import to_stderr
from purplerl.errors import ExperimentError, UserError
from purplerl.experiments.openai_compat import ChatEndpoint
from purplerl.experiments.principles import Principle, load_principles
from purplerl.files import fsync_path, read_json_object, read_jsonl_numbered, write_durably
from purplerl.outputs import check_output_dir
from purplerl.prompting import render_prompt, with_system_prompt
from purplerl.rewards.schema import scrub_surrogates
from purplerl.types import PromptRecord, SamplingParams

REVISIONS_FILE = "revisions.jsonl"
SFT_FILE = "sft.jsonl"
SETTINGS_FILE = "refine.json"
CRITIC_KEY_ENV = "PURPLERL_CRITIC_API_KEY"
Messages = list[dict[str, str]]  # chat messages [{role, content}]


class Generator(Protocol):
    """What answers chat conversations: a model through an engine (EngineGenerator) or a chat endpoint
    (purplerl.experiments.openai_compat.ChatEndpoint)."""

    @property
    def name(self) -> str:
        """What answers (a model name, an endpoint): recorded in refine.json, compared on resume."""
        ...

    def generate(self, conversations: list[Messages], sampling: SamplingParams) -> list[str]:
        """The assistant's next message in each conversation, in order."""
        ...


def _served(critic: Any) -> bool:
    return critic.url is not None


class CriticConfig(Section):
    """Who critiques (and revises, with reviser: critic): a local model, or an OpenAI-compatible endpoint."""

    url: str | None = Field(None, description=(
        "OpenAI-compatible base URL (http(s)://HOST/v1) the critic is asked at; null: a local model"))
    model: str | None = Field(None, description=(
        "with url: the model name sent to the endpoint (required); without: the local critic (HF id, local path or "
        "embedded:NAME), null: the policy critiques itself"))
    key_env: read_when(str, _served, "critic.url is set") = Field(CRITIC_KEY_ENV, description=(
        "environment variable holding the endpoint's API key, sent as a bearer token when set"))
    timeout_s: read_when(float, _served, "critic.url is set") = Field(60.0, gt=0.0, description=(
        "seconds to wait for one answer of the endpoint"))
    retries: read_when(int, _served, "critic.url is set") = Field(2, ge=0, le=20, description=(
        "retries after a connection error, HTTP 429 or 5xx, then the run stops"))
    backoff_s: read_when(float, _served, "critic.url is set") = Field(0.5, ge=0.0, description=(
        "wait before the first retry, doubled after each"))

    @model_validator(mode="after")
    def _endpoint(self) -> CriticConfig:
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"critic.url must start with http:// or https://, got '{self.url}'")
        if self.url is not None and not self.model:
            raise ValueError("critic.url needs critic.model: the model name the endpoint serves")
        return self


_FORMAT = PromptFormatConfig.model_fields


class RefineConfig(Section):
    """The iterative refiner (module docstring): prompts, models, principles and rounds."""

    data: PromptSourceConfig = Field(default_factory=PromptSourceConfig, description="the prompts to answer and refine")
    template: Template = Field(_FORMAT["template"].default, description=_FORMAT["template"].description)
    system_prompt: str | None = Field(None, description=(
        "system message prepended to every prompt (null: none); the critic and the reviser see it too"))
    max_context_tokens: int = Field(1024, ge=8, description=(
        "longest conversation a local model is given (a revision request holds the prompt, the answer and the "
        "critique); longer ones are cut from the left"))
    policy: ModelLoadConfig = Field(default_factory=ModelLoadConfig, description="the model that answers the prompts")
    critic: CriticConfig = Field(default_factory=CriticConfig, description="the model or endpoint that critiques")
    reviser: Literal["critic", "policy"] = Field("critic", description="who rewrites an answer given its critique")
    principles: str | None = Field(None, description=(
        "YAML or JSON file holding principles: [{name, critique, revision}] (null: the built-in list)"))
    principle_order: Literal["shuffle", "cycle"] = Field("shuffle", description=(
        "'shuffle': each prompt takes the principles in its own seeded order; 'cycle': in file order, prompt i "
        "starting at principle i"))
    rounds: int = Field(2, ge=1, le=64, description="critique-and-revise rounds per prompt")
    max_new_tokens: int = Field(128, ge=1, le=32768, description="longest answer, critique or revision in tokens")
    temperature: float = Field(0.7, ge=0.0, le=10.0, description="sampling temperature of every call (0: greedy)")
    batch_size: int = Field(8, ge=1, le=4096, description="prompts per generation call; part of what the seed fixes")
    seed: int = Field(0, description="seed of the principle orders and of every sampling call")


@dataclass(frozen=True)
class RefineResult:
    """What `refine` left in its out dir."""

    out_dir: Path
    prompts: int  # prompts of the source, all refined now
    refined: int  # prompts refined by this call (the others were done by an earlier, killed run)
    sft_rows: int  # rows of sft.jsonl
    blank: int  # prompts whose final revision is blank: in revisions.jsonl, not in sft.jsonl

    def describe(self) -> str:
        resumed = f" ({self.prompts - self.refined} done before)" if self.refined < self.prompts else ""
        blank = f"; {self.blank} blank final revisions left out of {SFT_FILE}" if self.blank else ""
        return (f"refined {self.prompts} prompts{resumed}: wrote {self.out_dir / SFT_FILE} ({self.sft_rows} rows) "
                f"and every step in {self.out_dir / REVISIONS_FILE}{blank}")


class EngineGenerator:
    """A Generator over a purplerl engine (local, vLLM, Tinker): each conversation rendered with `template`, cut
    from the left to `max_prompt_tokens`, one completion each. `engine` may be a function that builds it: it is
    then built on the first call, so a resume with nothing left to do loads no model."""

    def __init__(self, name: str, engine: Engine | Callable[[], Engine], template: Template = "chat",
                 max_prompt_tokens: int = 1024) -> None:
        self.name = name
        self.template = template
        self.max_prompt_tokens = max_prompt_tokens
        self._engine = engine if not callable(engine) else None
        self._build = engine if callable(engine) else None

    @classmethod
    def load(cls, model: ModelLoadConfig, template: Template, max_prompt_tokens: int) -> EngineGenerator:
        """`model` on the local engine, loaded on first use."""
        return cls(model.name, lambda: make_engine(ModelConfig(**model.model_dump())), template, max_prompt_tokens)

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            assert self._build is not None
            self._engine = self._build()
        return self._engine

    def generate(self, conversations: list[Messages], sampling: SamplingParams) -> list[str]:
        engine = self.engine
        tokens = [render_prompt(engine.tokenizer, PromptRecord(messages=tuple(c), uid=f"conversation {i}"),
                                self.template, None, self.max_prompt_tokens) for i, c in enumerate(conversations)]
        return [group[0].text for group in engine.sample(tokens, 1, sampling)]

    def close(self) -> None:
        if self._engine is not None:
            self._engine.close()


def load_refine_config(path: str | Path) -> RefineConfig:
    """A RefineConfig from a YAML or JSON file; a bad field is one UserError naming it."""
    return build(RefineConfig, read_config_file(Path(path).expanduser()))


def build_generators(settings: RefineConfig) -> tuple[EngineGenerator, EngineGenerator | ChatEndpoint]:
    """(policy, critic) as the settings name them; local models are loaded on first use, and a critic without
    model and url is the policy itself (self-critique)."""
    policy = EngineGenerator.load(settings.policy, settings.template, settings.max_context_tokens)
    c = settings.critic
    if c.url is not None:
        assert c.model is not None
        return policy, ChatEndpoint(c.url, c.model, c.key_env, c.timeout_s, c.retries, c.backoff_s)
    if c.model is None or c.model == settings.policy.name:
        return policy, policy
    model = ModelLoadConfig(name=c.model, dtype=settings.policy.dtype, device=settings.policy.device)
    return policy, EngineGenerator.load(model, settings.template, settings.max_context_tokens)


def refine_from_config(settings: RefineConfig, out_dir: Path,
                       notify: Callable[[str], None] = to_stderr) -> RefineResult:
    """`refine` with the policy and critic the settings name (what the CLI and the pipeline call)."""
    policy, critic = build_generators(settings)
    try:
        return refine(settings, out_dir, policy, critic, notify)
    finally:
        for generator in {id(policy): policy, id(critic): critic}.values():
            generator.close()


def refine_model(model: str, out: Path, notify: Callable[[str], None] = to_stderr, **settings: Any) -> Path:
    """A pipeline stage's call: RefineConfig fields as keywords (a bad one is one UserError naming it), `model` the
    policy; returns the SFT file the next stage trains on."""
    values = {**settings, "policy": {**(settings.get("policy") or {}), "name": model}}
    return refine_from_config(build(RefineConfig, values), Path(out), notify).out_dir / SFT_FILE


def refine(settings: RefineConfig, out_dir: Path, policy: Generator, critic: Generator,
           notify: Callable[[str], None] = to_stderr) -> RefineResult:
    """Refine every prompt of `settings.data` into `out_dir` (module docstring); prompts a killed run finished
    there are kept and skipped."""
    principles = load_principles(settings.principles)
    prompts = load_prompts(settings.data)  # typed DataConfig; it reads only the PromptSourceConfig fields
    inputs = [p for p in (settings.data.source, settings.principles) if p and not p.startswith(("builtin:", "hf:"))]
    out = check_output_dir(out_dir, "refine out dir", files=(REVISIONS_FILE, SFT_FILE, SETTINGS_FILE),
                           inputs=inputs)
    opening = {r.uid: with_system_prompt(r.messages, settings.system_prompt) for r in prompts}
    if len(opening) < len(prompts):
        raise UserError(f"data source {settings.data.source} gives two prompts the same uid: give each row its own "
                        "'uid' (or none: the row's position is used)")
    manifest = {"settings": settings.settings(), "principles": [asdict(p) for p in principles],
                "policy": policy.name, "critic": critic.name}
    _check_manifest(out / SETTINGS_FILE, manifest)
    done = _read_done(out / REVISIONS_FILE, opening, settings.data.source)
    out.mkdir(parents=True, exist_ok=True)
    write_durably(out / SETTINGS_FILE, json.dumps(manifest, indent=1, ensure_ascii=False) + "\n")
    reviser = critic if settings.reviser == "critic" else policy
    refined = 0
    for start in range(0, len(prompts), settings.batch_size):
        batch = prompts[start:start + settings.batch_size]
        if all(r.uid in done for r in batch):
            continue
        rows = _refine_batch(settings, start, [opening[r.uid] for r in batch], batch, principles,
                             (policy, critic, reviser))
        new = [row for row in rows if row["uid"] not in done]
        _append(out / REVISIONS_FILE, new)
        done.update((row["uid"], row) for row in new)
        refined += len(new)
        notify(f"refine: {len(done)}/{len(prompts)} prompts refined")
    finals = [(r, done[r.uid]["final"]) for r in prompts]
    sft = [{"prompt": _sft_prompt(opening[r.uid]), "completion": final, "uid": r.uid} for r, final in finals
           if final.strip()]
    write_durably(out / SFT_FILE, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in sft))
    return RefineResult(out, len(prompts), refined, len(sft), len(prompts) - len(sft))


def _refine_batch(settings: RefineConfig, start: int, openings: list[Messages], batch: list[PromptRecord],
                  principles: tuple[Principle, ...], models: tuple[Generator, Generator, Generator],
                  ) -> list[dict[str, Any]]:
    """Every step for one batch of prompts (starting at prompt `start`), as revisions.jsonl rows."""
    policy, critic, reviser = models
    initial = _generate(policy, openings, _sampling(settings, start, 0, "answer"))
    orders = [principle_order(settings, len(principles), r.uid, start + i) for i, r in enumerate(batch)]
    answers, steps = initial, [[] for _ in batch]
    for round_ in range(settings.rounds):
        chosen = [principles[order[round_ % len(order)]] for order in orders]
        asked = [[*conv, _say("assistant", answer), _say("user", p.critique)]
                 for conv, answer, p in zip(openings, answers, chosen, strict=True)]
        critiques = _generate(critic, asked, _sampling(settings, start, round_ + 1, "critique"))
        revise = [[*conv, _say("assistant", critique), _say("user", p.revision)]
                  for conv, critique, p in zip(asked, critiques, chosen, strict=True)]
        answers = _generate(reviser, revise, _sampling(settings, start, round_ + 1, "revision"))
        for i, p in enumerate(chosen):
            steps[i].append({"round": round_ + 1, "principle": p.name, "critique_request": p.critique,
                             "critique": critiques[i], "revision_request": p.revision, "revision": answers[i]})
    return [{"uid": r.uid, "source": r.source, "category": r.category, "prompt": conv, "initial": first,
             "rounds": rounds, "final": final}
            for r, conv, first, rounds, final in zip(batch, openings, initial, steps, answers, strict=True)]


def principle_order(settings: RefineConfig, count: int, uid: str, position: int) -> list[int]:
    """The principle indices a prompt's rounds take in turn: a permutation seeded by (seed, uid) ('shuffle'), or
    the file order starting at the prompt's position ('cycle'), so every principle is used across prompts."""
    if settings.principle_order == "cycle":
        return [(position + k) % count for k in range(count)]
    order = list(range(count))
    random.Random(_hash(settings.seed, "principles", uid)).shuffle(order)
    return order


def _sampling(settings: RefineConfig, start: int, round_: int, step: str) -> SamplingParams:
    return SamplingParams(max_new_tokens=settings.max_new_tokens, temperature=settings.temperature,
                          seed=_hash(settings.seed, start, round_, step))


def _hash(*parts: object) -> int:
    """A 31-bit seed from `parts`, the same in every process (Python's hash() of a str is salted per process)."""
    return int.from_bytes(hashlib.sha256("/".join(map(str, parts)).encode()).digest()[:4], "big") >> 1


def _say(role: str, content: str) -> dict[str, str]:
    return {"role": role, "content": content}


def _generate(generator: Generator, conversations: list[Messages], sampling: SamplingParams) -> list[str]:
    texts = generator.generate(conversations, sampling)
    if len(texts) != len(conversations):
        raise ExperimentError(f"{generator.name} answered {len(texts)} of {len(conversations)} conversations")
    # a lone surrogate (an endpoint's broken \u escape) could be neither written as UTF-8 nor tokenized by SFT
    return [scrub_surrogates(text).strip() for text in texts]


def _sft_prompt(opening: Messages) -> str | Messages:
    """The prompt as the policy was given it (system prompt included), as SFT reads it: the text of a lone user
    message, else the messages."""
    return opening[0]["content"] if len(opening) == 1 else opening


def _check_manifest(path: Path, manifest: dict[str, Any]) -> None:
    """Refuse an out dir refined with other settings; only data.limit may change (earlier batches stay)."""
    if not path.is_file():
        return
    saved = read_json_object(path)

    def comparable(m: dict[str, Any]) -> dict[str, Any]:
        settings = dict(m.get("settings") or {})
        settings["data"] = {k: v for k, v in (settings.get("data") or {}).items() if k != "limit"}
        return {**m, "settings": settings}

    old, new = comparable(saved), comparable(manifest)
    changed = [key for key in new if old.get(key) != new[key] and key != "settings"]
    changed += [f"settings.{key}" for key in new["settings"] if old["settings"].get(key) != new["settings"][key]]
    if changed:
        raise UserError(f"{path.parent} holds refinements made with other {', '.join(changed)} (see {path}): "
                        "use another out dir or the same settings")


def _read_done(path: Path, opening: dict[str, Messages], source: str) -> dict[str, dict[str, Any]]:
    """The rows of the prompts a killed run finished, checked against the prompts; a line cut by the kill is
    removed from the file first, so the next append starts on a line of its own."""
    if not path.is_file():
        return {}
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        with open(path, "r+b") as f:
            f.truncate(data.rfind(b"\n") + 1)
            os.fsync(f.fileno())
    done: dict[str, dict[str, Any]] = {}
    for lineno, row in read_jsonl_numbered(path):
        uid, where = row.get("uid"), f"{path}:{lineno}"
        if uid not in opening:
            raise UserError(f"{where}: prompt '{uid}' is not among the prompts of {source} (another source, or a "
                            "lower data.limit): use another out dir")
        if row.get("prompt") != opening[uid] or uid in done or not isinstance(row.get("final"), str):
            raise UserError(f"{where}: prompt '{uid}' is not as refined now (another prompt text, repeated, or no "
                            "final text): use another out dir")
        done[uid] = row
    return done


def _append(path: Path, rows: list[dict[str, Any]]) -> None:
    """Append whole lines and fsync them (and the directory, when the file is new)."""
    new = not path.exists()
    try:
        with open(path, "a", encoding="utf-8") as f:
            f.write("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
            f.flush()
            os.fsync(f.fileno())
        if new:
            fsync_path(path.parent)
    except OSError as err:
        raise ExperimentError(f"cannot append to {path}: {err.strerror or err}") from None
