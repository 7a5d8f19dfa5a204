"""The bookkeeping of adversarial dialogues (MTSA's attacker against a defender, issue 23): how a round's episodes
are laid out, how each side's prompt is fitted to the context, per-turn credit, and the attacker's novelty.

Layout. A round has B goals. The attacker writes A opening attacks per goal, and each opening starts G episodes
(the defender's group): episode e = (b x A + a) x G + g. Every episode runs K turns of (attack, answer); at turns
after the first each episode draws its own attack and its own answer. Per-turn tensors are [E, K].

Credit. Each turn t of episode e has a reward r[e, t] per side; its return is the discounted sum to the episode's
end, R[e, t] = sum over s >= t of gamma^(s - t) x r[e, s] (gamma 1: the plain sum). Advantages are computed per turn
position across a group (`position_advantages`): the defender's group at turn t is the G episodes of one opening;
the attacker's at turn t > 1 the A x G episodes of one goal, and at turn 1 its A openings, each valued by the mean
return of the G episodes it opened (`opening_advantages`): the P(unsafe) of the defender's G answers, averaged.

Novelty (curiosity-driven red teaming, Hong et al. 2024, arXiv 2402.19464, whose bonus is minus the SelfBLEU of an
attack against the attacks before it). Here, with words = the lowercased runs of letters and digits:

    overlap(x, R) = mean over n in 1..3 (where x has n-grams) of
                    |n-grams of x (with repeats) found among the n-grams of R| / |n-grams of x|
    novelty(x)    = 1 - overlap(x, R),   R = the window of recent attacks + the other attacks of the round

An attack without words has overlap 1 (novelty 0); against an empty R the overlap is 0. Attack diversity, logged,
is 1 - the mean overlap of each attack with the round's other attacks (a self-BLEU-style score).
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from numbers import Real
from typing import Any

import torch

from purplerl.algorithms.advantages import ADVANTAGES
from purplerl.data.attacker import ATTACKER_ADAPTER, attacker_messages
from purplerl.data.gist import first_keys, insert_gists
from purplerl.engines.base import Engine
from purplerl.errors import ExperimentError, UserError
from purplerl.prompting import render_prompt, with_system_prompt
from purplerl.rewards.base import ConversationScorer
from purplerl.types import Completion, PromptRecord, SamplingParams

Message = dict[str, str]  # {"role": "user" | "assistant", "content": ...}
ATTACKER, DEFENDER = ATTACKER_ADAPTER, "default"  # the adapters: the defender is the policy's own, as in any run
NOVELTY_MAX_N = 3  # n-gram sizes 1..3: BLEU's 4-grams are rare in attacks of a few dozen words
_WORD = re.compile(r"[a-z0-9]+")
_UNCUT = 10**9  # a prompt budget no dialogue reaches: the rendered length before any cut


def episode_goal(episode: int, openings: int, group: int) -> int:
    """The goal index b of episode e = (b x A + a) x G + g."""
    return episode // (openings * group)


def fit_dialogue(messages: list[Message], count: Callable[[list[Message]], int], limit: int,
                 keep_first: bool) -> tuple[list[Message], int]:
    """`messages` with their earliest turns dropped, a (message, reply) pair at a time, until `count(messages)`
    (the rendered prompt's tokens) is at most `limit`; returns them and the number of pairs dropped. The last message
    (the one answered) is never dropped; with `keep_first` the first one is kept instead (the attacker's request,
    which names the goal: the attacker rather loses the whole exchange than its goal). A dialogue still too long is
    left to the renderer's token cut."""
    head, body = (messages[:1], messages[1:]) if keep_first else ([], list(messages))
    least = 0 if keep_first else 1
    dropped = 0
    while len(body) >= least + 2 and count(head + body) > limit:
        body = body[2:]
        dropped += 1
    return head + body, dropped


def turn_returns(rewards_EK: torch.Tensor, gamma: float) -> torch.Tensor:
    """R[e, t] = sum over s >= t of gamma^(s - t) x r[e, s]: each turn's return to the episode's end."""
    if rewards_EK.ndim != 2:
        raise ExperimentError(f"turn rewards must have shape [E, K], got {tuple(rewards_EK.shape)}")
    returns_EK = torch.zeros_like(rewards_EK, dtype=torch.float32)
    later_E = torch.zeros(rewards_EK.shape[0])
    for t in reversed(range(rewards_EK.shape[1])):
        later_E = rewards_EK[:, t].float() + gamma * later_E
        returns_EK[:, t] = later_E
    return returns_EK


def position_advantages(returns_EK: torch.Tensor, group: int,
                        estimator: str) -> tuple[torch.Tensor, dict[str, float]]:
    """Advantages [E, K]: at each turn position, the estimator (GRPO, Dr. GRPO, RLOO) over groups of `group`
    consecutive episodes. Metrics are the estimator's, averaged over the positions."""
    if returns_EK.shape[0] % group:
        raise ExperimentError(f"{returns_EK.shape[0]} episodes do not split into groups of {group}")
    columns, rows = [], []
    for t in range(returns_EK.shape[1]):
        advantages_BG, metrics = ADVANTAGES[estimator](returns_EK[:, t].reshape(-1, group))
        columns.append(advantages_BG.reshape(-1))
        rows.append(metrics)
    return torch.stack(columns, dim=1), {k: sum(m[k] for m in rows) / len(rows) for k in rows[0]}


def opening_advantages(returns_E: torch.Tensor, group: int, openings: int,
                       estimator: str) -> tuple[torch.Tensor, dict[str, float]]:
    """Advantages [B x A] of the opening attacks: each opening's value is the mean turn-1 return of its G episodes,
    compared with the other openings of its goal."""
    value_BA = returns_E.reshape(-1, group).mean(dim=1)
    advantages, metrics = ADVANTAGES[estimator](value_BA.reshape(-1, openings))
    return advantages.reshape(-1), metrics


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def _grams(tokens: Sequence[str], n: int) -> list[tuple[str, ...]]:
    return [tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)]


def ngram_overlap(text: str, references: Sequence[str], max_n: int = NOVELTY_MAX_N) -> float:
    """overlap(x, R) of the module docstring: the mean over n of the share of x's n-grams found in R."""
    tokens = words(text)
    if not tokens:
        return 1.0
    seen = {g for ref in references for n in range(1, max_n + 1) for g in _grams(words(ref), n)}
    shares = [sum(g in seen for g in grams) / len(grams)
              for grams in (_grams(tokens, n) for n in range(1, max_n + 1)) if grams]
    return sum(shares) / len(shares)


def novelty(attacks: Sequence[str], window: Sequence[str]) -> list[float]:
    """novelty(x) = 1 - overlap(x, window + the other attacks), for each attack of a round."""
    return [1.0 - ngram_overlap(x, [*window, *attacks[:i], *attacks[i + 1:]]) for i, x in enumerate(attacks)]


def diversity(attacks: Sequence[str]) -> float:
    """1 - the mean overlap of each attack with the others of the round (needs two attacks; one: 0)."""
    if len(attacks) < 2:
        return 0.0
    return 1.0 - sum(ngram_overlap(x, [*attacks[:i], *attacks[i + 1:]]) for i, x in enumerate(attacks)) / len(attacks)


def distinct_ngrams(texts: Sequence[str], n: int = 2) -> float:
    """Distinct n-grams / all n-grams pooled over the texts (Li et al. 2016); 0 without n-grams."""
    grams = [g for t in texts for g in _grams(words(t), n)]
    return len(set(grams)) / len(grams) if grams else 0.0


@dataclass(frozen=True)
class Shape:
    """A round's layout: B goals x A openings x G episodes, each of K turns."""

    goals: int  # B
    openings: int  # A, the attacker's group
    group: int  # G, the defender's group
    turns: int  # K

    @property
    def episodes(self) -> int:
        return self.goals * self.openings * self.group


@dataclass(frozen=True)
class Round:
    """What one round drew. Turn t's attacks are attacks[t - 1]: B x A openings at turn 1 (opening o starts episodes
    o x G .. o x G + G - 1), one per episode after; replies[t - 1] holds one answer per episode."""

    goals: list[PromptRecord]  # B
    attacks: list[list[Completion]]  # K lists: B x A, then E each
    replies: list[list[Completion]]  # K lists of E
    dialogues: list[list[Message]]  # E, the defender's view: user = attacks, assistant = answers (2K messages)
    reply_keys: list[list[list[int]]] | None = None  # with gist tokens: K lists of E, each answer's prompt's first keys

    def attack_text(self, episode: int, turn: int) -> str:
        """The attack of episode e at turn t (1-based)."""
        return self.dialogues[episode][2 * (turn - 1)]["content"]


@dataclass
class Prompter:
    """Each side's prompt tokens for a dialogue, fitted to `max_prompt_tokens` by `fit_dialogue`; the prompts cut
    are counted per side (read and reset by `take_cuts`), and the first cut is said in one line. With `gist_tokens`
    K > 0 the defender's prompt has K gist tokens (`gist_id`) after each earlier answer, each token a first key
    (purplerl.data.gist), and the gist tokens count towards the fit."""

    tokenizer: Any
    template: str
    system_prompt: str | None  # the defender's; the attacker is asked as its SFT data asked it (no system prompt)
    max_prompt_tokens: int
    gist_tokens: int = 0
    gist_id: int | None = None
    cuts: dict[str, int] = field(default_factory=lambda: {ATTACKER: 0, DEFENDER: 0})
    warned: bool = False

    def defender(self, dialogue: list[Message]) -> list[int]:
        return self.defender_prompt(dialogue)[0]

    def defender_prompt(self, dialogue: list[Message]) -> tuple[list[int], list[int] | None]:
        """The defender's prompt tokens and, with gist tokens, each token's first key (None without)."""
        messages, ids = self._fitted(list(dialogue), self.system_prompt, keep_first=False, side=DEFENDER,
                                     per_answer=self.gist_tokens)
        if not self.gist_tokens:
            return ids, None
        ends = self._answer_ends(messages, ids)
        ids, _, blocks = insert_gists(ids, [0.0] * len(ids), ends, self.gist_tokens, int(self.gist_id))
        return ids, first_keys(len(ids), blocks, self.gist_tokens)

    def attacker(self, goal: str, dialogue: list[Message]) -> list[int]:
        return self._fitted(attacker_messages(goal, dialogue), None, keep_first=True, side=ATTACKER)[1]

    def take_cuts(self) -> dict[str, int]:
        cuts, self.cuts = self.cuts, {ATTACKER: 0, DEFENDER: 0}
        return cuts

    def _render(self, messages: list[Message], system_prompt: str | None, limit: int) -> list[int]:
        record = PromptRecord(messages=tuple(messages), uid="dialogue")
        return render_prompt(self.tokenizer, record, template=self.template,  # type: ignore[arg-type]
                             system_prompt=system_prompt, max_prompt_tokens=limit)

    def _answer_ends(self, messages: list[Message], ids: list[int]) -> list[int]:
        """The column after each answer (its end-of-turn included) in the defender's prompt `ids`: the length of
        the dialogue rendered through it, which must be a prefix of the prompt."""
        chat = with_system_prompt(tuple(messages), self.system_prompt)
        ends = []
        for i, message in enumerate(chat):
            if message["role"] != "assistant":
                continue
            text = self.tokenizer.apply_chat_template(chat[:i + 1], add_generation_prompt=False, tokenize=False)
            through = list(self.tokenizer.encode(text, add_special_tokens=False))
            if ids[:len(through)] != through:
                raise UserError(f"the chat template of '{self.tokenizer.name_or_path}' does not render a dialogue's "
                                "turns as a prefix of it, so gist tokens cannot follow an answer: set "
                                "dialogue.gist_tokens 0")
            ends.append(len(through))
        return ends

    def _fitted(self, messages: list[Message], system_prompt: str | None, keep_first: bool, side: str,
                per_answer: int = 0) -> tuple[list[Message], list[int]]:
        """(messages, prompt tokens) with the earliest exchanges dropped until the prompt, and `per_answer` tokens
        more per answer (gist tokens), fit."""
        def count(ms: list[Message]) -> int:
            return len(self._render(ms, system_prompt, _UNCUT)) + per_answer * sum(m["role"] == "assistant"
                                                                                   for m in ms)

        whole = self._render(messages, system_prompt, _UNCUT)
        length = count(messages)
        if length <= self.max_prompt_tokens:
            return messages, whole
        self.cuts[side] += 1
        if not self.warned:
            self.warned = True
            who = "attacker" if side == ATTACKER else "defender"
            print(f"warning: a dialogue's {who} prompt has {length} tokens, over data.max_prompt_tokens="
                  f"{self.max_prompt_tokens}: its earliest turns are cut (each step logs the share cut as "
                  "dialogue/<side>_cut_frac)", file=sys.stderr)
        fitted, _ = fit_dialogue(messages, count, self.max_prompt_tokens, keep_first)
        # fitted with an answer left, it fits; a lone last message too long is cut by the renderer (no answer: no gist)
        return fitted, self._render(fitted, system_prompt, self.max_prompt_tokens)


def _drawn(engine: Engine, prompts: list[list[int]], n: int, params: SamplingParams,
           keys: list[list[int]] | None = None) -> list[Completion]:
    """n completions per prompt; with `keys`, of gist prompts (engines.base.GistSampling)."""
    groups = engine.sample(prompts, n, params) if keys is None else engine.gist_sample(prompts, keys, n, params)
    completions = [c for group in groups for c in group]
    if len(completions) != len(prompts) * n:
        raise ExperimentError(f"the engine returned {len(completions)} completions, expected {len(prompts) * n}")
    return completions


def _answers(engine: Engine, prompter: Prompter, dialogues: list[list[Message]], n: int,
             params: SamplingParams) -> tuple[list[Completion], list[list[int]] | None]:
    """The defender's n answers to each dialogue, and with gist tokens each answer's prompt's first keys."""
    prompts = [prompter.defender_prompt(d) for d in dialogues]
    keys = None if not prompter.gist_tokens else [k for _, k in prompts]
    answered = _drawn(engine, [p for p, _ in prompts], n, params, keys)
    return answered, None if keys is None else [k for k in keys for _ in range(n)]


def rollout(engine: Engine, goals: list[PromptRecord], shape: Shape, prompter: Prompter,
            params: Callable[[int, str], SamplingParams]) -> Round:
    """One round: at each turn the attacker writes (A openings per goal at turn 1, one attack per episode after),
    then the defender answers (G per opening at turn 1, one per episode after). `params(turn, side)`: how each
    side draws at each turn (its seed)."""
    A, G = shape.openings, shape.group
    texts = [record.messages[-1]["content"] for record in goals]
    dialogues: list[list[Message]] = [[] for _ in range(shape.episodes)]
    attacks: list[list[Completion]] = []
    replies: list[list[Completion]] = []
    keys: list[list[list[int]]] = []
    for turn in range(1, shape.turns + 1):
        engine.use_adapter(ATTACKER)
        if turn == 1:
            drawn = _drawn(engine, [prompter.attacker(goal, []) for goal in texts], A, params(turn, ATTACKER))
            per_episode = [drawn[e // G] for e in range(shape.episodes)]
        else:
            drawn = per_episode = _drawn(engine, [prompter.attacker(texts[episode_goal(e, A, G)], d)
                                                  for e, d in enumerate(dialogues)], 1, params(turn, ATTACKER))
        attacks.append(drawn)
        for dialogue, attack in zip(dialogues, per_episode, strict=True):
            dialogue.append({"role": "user", "content": attack.text})
        engine.use_adapter(DEFENDER)
        if turn == 1:
            answered, first = _answers(engine, prompter, [dialogues[o * G] for o in range(len(drawn))], G,
                                       params(turn, DEFENDER))
        else:
            answered, first = _answers(engine, prompter, dialogues, 1, params(turn, DEFENDER))
        replies.append(answered)
        keys.append(first or [])
        for dialogue, reply in zip(dialogues, answered, strict=True):
            dialogue.append({"role": "assistant", "content": reply.text})
    return Round(goals, attacks, replies, dialogues, keys if prompter.gist_tokens else None)


def judge_dialogues(judge: ConversationScorer, dialogues: list[list[Message]], turns: int,
                    goals: list[str] | None = None) -> torch.Tensor:
    """P(unsafe) [E, K] of every defender turn, judged in the dialogue up to it, or with `goals` (one per episode)
    as the answer to its episode's goal alone (the goal as the request: success is serving the goal, whatever the
    attack said); ExperimentError naming the episode and turn of a value that is not a probability."""
    if goals is None:
        conversations = [d[:2 * t] for t in range(1, turns + 1) for d in dialogues]  # turn-major
    else:
        conversations = [[{"role": "user", "content": goals[e]}, d[2 * t - 1]]
                         for t in range(1, turns + 1) for e, d in enumerate(dialogues)]
    values = list(judge.score_conversations(conversations))
    if len(values) != len(conversations):
        raise ExperimentError(f"judge '{judge.name}' returned {len(values)} scores for {len(conversations)} "
                              "dialogues")
    probs: list[float] = []
    for i, value in enumerate(values):
        number = float(value) if isinstance(value, Real) and not isinstance(value, bool) else math.nan
        if not (math.isfinite(number) and 0.0 <= number <= 1.0):
            raise ExperimentError(f"judge '{judge.name}' gave P(unsafe) {value!r} for episode {i % len(dialogues)}, "
                                  f"turn {i // len(dialogues) + 1}: expected a probability in [0, 1]")
        probs.append(number)
    return torch.tensor(probs, dtype=torch.float32).reshape(turns, len(dialogues)).T.contiguous()
