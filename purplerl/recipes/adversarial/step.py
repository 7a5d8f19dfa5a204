"""Adversarial RL with two learners on one base (MTSA; issue 23): a learned attacker against a defender, judged.

The attacker and the defender are two LoRA adapters on one frozen base: ATTACKER, and the policy's own adapter
(DEFENDER), which the run's checkpoints hold at the top as any policy's, so eval and tamper-test take the defender.
The reference of both sides' KL is the base with the adapters off. One step is one round, laid out by
purplerl.recipes.adversarial.dialogue: for B goals the attacker writes A opening attacks each (in its chat,
purplerl.data.attacker), each opening starts G episodes with the defender, and the two speak K turns. The judge, a
ConversationScorer, gives P(unsafe) of every defender turn in the context of the dialogue before it. Per turn,

    defender: r = (1 - P(unsafe)) + the weighted reward.terms (the entropy term of `defend`) - kl_beta x KL
    attacker: r = P(unsafe) + novelty.weight x novelty - attacker_kl_beta x KL

(the KL of the turn's own tokens; with reward.kl_in loss it is a loss term instead). Returns run to the episode's
end (discounted by adversarial.gamma) and advantages are computed per turn position across each side's group
(`dialogue.position_advantages`). The side the schedule names trains on its own turns only: each turn is one row
whose loss mask covers that turn's tokens, with the dialogue before it as the prompt. Both sides' rewards are
logged at every step.
"""

from __future__ import annotations

import dataclasses
import re
import sys
import time
from collections import deque
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

from purplerl.algorithms.advantages import ADVANTAGES, zscore
from purplerl.algorithms.kl import sequence_kl
from purplerl.data import PromptSampler, load_prompts
from purplerl.data.gist import gist_token_id, row_keys
from purplerl.engines.adapter_fit import check_adapter_fits
from purplerl.engines.adapters import adapter_dir
from purplerl.engines.base import Engine
from purplerl.errors import ExperimentError, UserError
from purplerl.recipes.adversarial.dialogue import (
    ATTACKER,
    DEFENDER,
    Prompter,
    Round,
    Shape,
    distinct_ngrams,
    diversity,
    episode_goal,
    judge_dialogues,
    novelty,
    opening_advantages,
    position_advantages,
    rollout,
    turn_returns,
)
from purplerl.rewards.base import ConversationScorer
from purplerl.rewards.compose import Reward
from purplerl.rewards.conversation import conversation_judge
from purplerl.rewards.registry import ScoringInput
from purplerl.runs.checkpoints import describe_skipped, newest_intact
from purplerl.runs.layout import CONFIG_FILE, SAMPLES_FILE
from purplerl.train.batch import build_train_batch, completion_first_keys, sequence_tensors
from purplerl.train.loop import adam_params, completion_shape, minibatch_updates, policy_loss, sampling_seed
from purplerl.train.recipe import Bind
from purplerl.train.sinks import read_jsonl
from purplerl.train.steps import EarlyStop, StepFn
from purplerl.train.stops import rl_stops
from purplerl.types import Completion, PromptRecord, RewardBreakdown, SamplingParams

_SCHEDULE = re.compile(r"(\d+):(\d+)")


def parse_schedule(text: str) -> tuple[int, int]:
    """(attacker steps, defender steps) of one cycle: 'attacker' (1, 0), 'defender' (0, 1), 'N:M' (N, M)."""
    named = {"attacker": (1, 0), "defender": (0, 1)}
    if text in named:
        return named[text]
    match = _SCHEDULE.fullmatch(text)
    if match is None or int(match[1]) < 1 or int(match[2]) < 1:
        raise ValueError(f"unknown schedule {text!r}: 'attacker', 'defender', or 'N:M' (N attacker steps, then M "
                         "defender steps, N and M >= 1)")
    return int(match[1]), int(match[2])


def trained_side(step: int, schedule: str) -> str:
    """The adapter that trains at `step` (1-based): the first N steps of each cycle the attacker's, then M the
    defender's."""
    n, m = parse_schedule(schedule)
    return ATTACKER if (step - 1) % (n + m) < n else DEFENDER


def attacker_beta(config: Any) -> float:
    """The attacker's KL weight: adversarial.attacker_kl_beta, or reward.kl_beta (the defender's) when null."""
    beta = config.adversarial.attacker_kl_beta
    return config.reward.kl_beta if beta is None else beta


def check_adversarial(config: Any) -> None:
    """What the recipe refuses in one line before anything loads."""
    a, t = config.adversarial, config.training
    if config.engine.procs != 1:
        raise UserError(f"adversarial runs in one process, not engine.procs {config.engine.procs}: a round's "
                        "dialogues are not split across processes")
    if t.advantage not in ADVANTAGES:
        raise UserError(f"training.advantage '{t.advantage}': adversarial compares each turn's returns within a "
                        f"group, so it takes a group estimator ({', '.join(ADVANTAGES)})")
    if parse_schedule(a.schedule)[0] and a.attacker_group < 2:
        raise UserError(f"adversarial.attacker_group {a.attacker_group}: the attacker's advantages compare the "
                        f"openings of one goal, so it needs 2 or more while adversarial.schedule '{a.schedule}' "
                        "trains the attacker")
    if config.dialogue.gist_tokens and (a.turns == 1 or config.data.template != "chat"):
        why = ("adversarial.turns > 1: one turn has no earlier answer to compress" if a.turns == 1 else
               "data.template chat: gist tokens follow the answers the chat template marks")
        raise UserError(f"dialogue.gist_tokens {config.dialogue.gist_tokens} needs {why}")
    rows = t.batch_size * a.attacker_group * (1 + (a.turns - 1) * config.sampling.group_size)
    if t.mini_batches > rows:
        raise UserError(f"training.mini_batches={t.mini_batches} exceeds the attacker's {rows} turns per step "
                        "(training.batch_size x adversarial.attacker_group openings, then one attack per episode "
                        "and turn)")


def attacker_checkpoint(path: str | None, model: Any) -> Path | None:
    """The adapter dir adversarial.attacker_init names: a PEFT dir, or a run dir's newest intact checkpoint (an
    adversarial checkpoint gives its attacker adapter); checked against the base model from files alone."""
    if path is None:
        return None
    where = Path(path)
    if (where / CONFIG_FILE).is_file():
        checkpoint, skipped = newest_intact(where)
        if checkpoint is None:
            why = f" ({describe_skipped(skipped)})" if skipped else ""
            raise UserError(f"adversarial.attacker_init {where} is a run dir without an intact checkpoint{why}")
        where = checkpoint
    if (adapter_dir(where, ATTACKER) / "adapter_config.json").is_file():
        where = adapter_dir(where, ATTACKER)
    note = check_adapter_fits(where, model.name, model.revision, "adversarial.attacker_init")
    if note:
        print(note, file=sys.stderr)
    return where


def defender_terms(config: Any) -> Reward:
    return Reward(dict(config.reward.terms))  # the defender's reward.terms, built now (the step weighs the KL)


class Window:
    """The attacker's last `size` attacks, for the novelty bonus, in the order they were drawn. A resumed run
    rebuilds it from samples.jsonl (cut back to its checkpoint by then), so it holds what the unbroken run held."""

    def __init__(self, size: int, group: int, samples: Path) -> None:
        self.attacks: deque[str] = deque(maxlen=size)
        self.group, self.samples, self.loaded = group, samples, False

    def recent(self, step: int) -> list[str]:
        if not self.loaded:
            self.loaded = True
            self.add([row for row in read_jsonl(self.samples) if row["step"] < step])
        return list(self.attacks)

    def add(self, rows: list[dict[str, Any]]) -> None:
        """The attacks of sample rows, each once: an opening is the prompt of its G episodes' first turns."""
        self.attacks.extend(row["prompt"] for row in rows if row["turn"] > 1 or row["episode"] % self.group == 0)


@dataclass
class Parts:
    engine: Engine
    sampler: PromptSampler
    prompter: Prompter
    judge: ConversationScorer
    terms: Reward  # the defender's reward.terms
    window: Window


@dataclass(frozen=True)
class Side:
    """One learner's turns of a round (turn-major rows) with their tensors and KL to the base."""

    completions: list[Completion]
    tensors: dict[str, torch.Tensor]
    ref_NT: torch.Tensor
    kl_N: torch.Tensor


def _side(engine: Engine, completions: list[Completion], config: Any,
          prompt_keys: list[list[int]] | None = None) -> Side:
    """A side's rows; with `prompt_keys` (a gist defender), gist rows scored as they were sampled."""
    tensors = sequence_tensors(completions, int(engine.tokenizer.pad_token_id))
    mask_NT = tensors["loss_mask_NT"]
    score = {"reference": True, "temperature": config.sampling.temperature, "targets_NT": mask_NT}
    rows = (tensors["input_ids_NT"], tensors["attention_mask_NT"])
    if prompt_keys is None:
        ref_NT = engine.logprobs(*rows, **score)
    else:
        tensors["first_key_NT"] = completion_first_keys(completions, prompt_keys, mask_NT.shape[1])
        ref_NT = engine.gist_logprobs(*rows, tensors["first_key_NT"], **score)
    kl_N = sequence_kl(tensors["sampling_logprobs_NT"], ref_NT, mask_NT, config.reward.kl_estimator)
    return Side(completions, tensors, ref_NT, kl_N)


def per_episode(rows_N: torch.Tensor, shape: Shape) -> torch.Tensor:
    """An attacker value per row (turn-major: B x A openings, then E per later turn) as [E, K]; an opening's value
    goes to each of its G episodes."""
    opening = rows_N[:shape.goals * shape.openings].repeat_interleave(shape.group)
    later = rows_N[shape.goals * shape.openings:].reshape(shape.turns - 1, shape.episodes)
    return torch.cat([opening[None], later]).T.contiguous()


@dataclass(frozen=True)
class Scored:
    unsafe_EK: torch.Tensor  # the judge's P(unsafe) of each defender turn
    defender_EK: torch.Tensor  # per-turn rewards
    attacker_EK: torch.Tensor
    novelty_N: torch.Tensor  # per attacker row
    terms: RewardBreakdown  # the defender's reward.terms, per defender row


def score_round(parts: Parts, rnd: Round, shape: Shape, attacker: Side, defender: Side, config: Any,
                window: list[str]) -> Scored:
    """Both sides' per-turn rewards (the module docstring's formulas)."""
    a, r, K, E = config.adversarial, config.reward, shape.turns, shape.episodes
    goals = None
    if a.judge.reads == "goal":
        texts = [goal.messages[-1]["content"] for goal in rnd.goals]
        goals = [texts[episode_goal(e, shape.openings, shape.group)] for e in range(E)]
    unsafe_EK = judge_dialogues(parts.judge, rnd.dialogues, K, goals)
    prompts = [rnd.attack_text(e, t) for t in range(1, K + 1) for e in range(E)]
    terms = parts.terms(ScoringInput(texts=[c.text for c in defender.completions], prompts=prompts,
                                     completions=defender.completions))
    in_reward = r.kl_in == "reward"
    defender_EK = 1.0 - unsafe_EK + terms.total_N.reshape(K, E).T - \
        (r.kl_beta if in_reward else 0.0) * defender.kl_N.reshape(K, E).T
    novelty_N = torch.tensor(novelty([c.text for c in attacker.completions], window))
    attacker_EK = unsafe_EK + a.novelty.weight * per_episode(novelty_N, shape) - \
        (attacker_beta(config) if in_reward else 0.0) * per_episode(attacker.kl_N, shape)
    if r.zscore:
        defender_EK, attacker_EK = (zscore(x.reshape(-1)).reshape(x.shape) for x in (defender_EK, attacker_EK))
    return Scored(unsafe_EK, defender_EK, attacker_EK, novelty_N, terms)


def side_advantages(scored: Scored, shape: Shape, config: Any) -> tuple[torch.Tensor, torch.Tensor,
                                                                          dict[str, float]]:
    """(defender, attacker) advantages per row, turn-major, and the estimators' metrics."""
    t, gamma = config.training, config.adversarial.gamma
    estimate = partial(position_advantages, estimator=t.advantage)
    defender_EK, metrics = estimate(turn_returns(scored.defender_EK, gamma), shape.group)
    returns_EK = turn_returns(scored.attacker_EK, gamma)
    openings = torch.zeros(shape.goals * shape.openings)
    if shape.openings > 1:  # a goal's only opening has nothing to be compared with
        openings, opening_metrics = opening_advantages(returns_EK[:, 0], shape.group, shape.openings, t.advantage)
        metrics |= {f"attacker/{k}": v for k, v in opening_metrics.items()}
    later = [openings]
    if shape.turns > 1:
        later_EK, _ = estimate(returns_EK[:, 1:], shape.openings * shape.group)
        later.append(later_EK.T.reshape(-1))
    return defender_EK.T.reshape(-1), torch.cat(later), metrics


def train_side(engine: Engine, side: str, learner: Side, advantages_N: torch.Tensor, config: Any,
               step: int) -> dict[str, float]:
    """The policy-gradient loss on one side's turns, into its adapter alone."""
    loss = policy_loss(config)
    if config.reward.kl_in == "loss":  # the KL as a loss term, at this side's own weight
        beta = attacker_beta(config) if side == ATTACKER else config.reward.kl_beta
        loss = dataclasses.replace(loss, params=dataclasses.replace(loss.params, kl_beta=beta))
    batch = build_train_batch(learner.tensors, advantages_N, learner.ref_NT if loss.params.kl_beta else None)
    engine.use_adapter(side)
    metrics = minibatch_updates(engine, batch, config, step, loss, adam_params(config.training))
    if not torch.isfinite(torch.tensor([metrics["loss"], metrics["grad_norm"]])).all():
        raise ExperimentError(f"step {step}: the {side} update gave a non-finite loss or gradient norm")
    return metrics


def _draw_params(config: Any, step: int, turn: int, side: str) -> SamplingParams:
    s = config.sampling
    # a pure function of (seed, step, turn, side): a resumed run draws what the unbroken run drew
    seed = sampling_seed(config.training.seed * 64 + 2 * (turn - 1) + (side == DEFENDER), step)
    return SamplingParams(max_new_tokens=s.max_new_tokens, temperature=s.temperature, top_p=s.top_p, top_k=s.top_k,
                          seed=seed)


def adversarial_step(step: int, config: Any, parts: Parts) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """One round (1-based step): sample -> reference -> score -> advantages -> train one side -> log."""
    a = config.adversarial
    clock = [time.perf_counter()]
    goals = parts.sampler.batch(step - 1)
    shape = Shape(len(goals), a.attacker_group, config.sampling.group_size, a.turns)
    rnd = rollout(parts.engine, goals, shape, parts.prompter, partial(_draw_params, config, step))
    cuts = parts.prompter.take_cuts()
    clock.append(time.perf_counter())

    attacker = _side(parts.engine, [c for turn in rnd.attacks for c in turn], config)
    defender = _side(parts.engine, [c for turn in rnd.replies for c in turn], config,
                     None if rnd.reply_keys is None else [k for turn in rnd.reply_keys for k in turn])
    clock.append(time.perf_counter())
    window = parts.window.recent(step)
    scored = score_round(parts, rnd, shape, attacker, defender, config, window)
    clock.append(time.perf_counter())

    defender_N, attacker_N, adv_metrics = side_advantages(scored, shape, config)
    side = trained_side(step, a.schedule)
    learner, advantages_N = (attacker, attacker_N) if side == ATTACKER else (defender, defender_N)
    train_metrics = train_side(parts.engine, side, learner, advantages_N, config, step)
    clock.append(time.perf_counter())

    rows = sample_rows(step, rnd, shape, scored, defender_N, attacker_N)
    parts.window.add(rows)
    metrics = round_metrics(rnd, shape, scored, attacker, defender, a.judge.unsafe_at, cuts, clock)
    metrics |= {f"adv/{k}": v for k, v in adv_metrics.items()}
    metrics |= {f"train/{k}": float(v) for k, v in train_metrics.items()}
    metrics["train/attacker"] = float(side == ATTACKER)
    return metrics, rows


def round_metrics(rnd: Round, shape: Shape, scored: Scored, attacker: Side, defender: Side, unsafe_at: float,
                  cuts: dict[str, int], clock: list[float]) -> dict[str, float]:
    """One line of metrics.jsonl: both sides' rewards, the judge, the defender's entropy and shape, attack success
    and diversity (clock: the step's start, then the end of sample, reference, score, train)."""
    start, sampled, referenced, scored_at, trained = clock
    unsafe_EK, attacks = scored.unsafe_EK, [c.text for c in attacker.completions]
    replies, mask_NT = defender.completions, defender.tensors["loss_mask_NT"]
    metrics = {
        "unsafe/mean": float(unsafe_EK.mean()), "asr": float((unsafe_EK >= unsafe_at).float().mean()),
        "defender_reward/mean": float(scored.defender_EK.mean()),
        "attacker_reward/mean": float(scored.attacker_EK.mean()), "novelty/mean": float(scored.novelty_N.mean()),
        **{f"{name}/mean": float(v.mean()) for name, v in scored.terms.components.items() if name != "reward_raw"},
        "entropy/mean": float(sum(float(c.entropies_C.sum()) for c in replies) / mask_NT.sum()),
        "defender_kl/mean": float(defender.kl_N.mean()), "attacker_kl/mean": float(attacker.kl_N.mean()),
        "attack/diversity": diversity(attacks), "attack/distinct_2": distinct_ngrams(attacks, 2),
        "attack/len_mean": float(attacker.tensors["loss_mask_NT"].sum(-1).mean()),
        "completion/len_mean": float(mask_NT.sum(-1).mean()),
        "completion/stop_frac": sum(c.finish_reason == "stop" for c in replies) / len(replies),
        **completion_shape(replies),
        "dialogue/attacker_cut_frac": cuts[ATTACKER] / len(attacks),
        "dialogue/defender_cut_frac": cuts[DEFENDER] / len(replies),
        "time/sample_s": sampled - start, "time/reference_s": referenced - sampled,
        "time/score_s": scored_at - referenced, "time/train_s": trained - scored_at,
    }
    keys_KE = row_keys(mask_NT, defender.tensors.get("first_key_NT")).reshape(shape.turns, -1)  # attention cost
    metrics["dialogue/defender_keys"] = float(keys_KE.mean())
    if shape.turns > 1:  # an episode succeeds when any of its answers was unsafe
        metrics["asr/episode"] = float((unsafe_EK >= unsafe_at).any(dim=1).float().mean())
        metrics |= {f"unsafe/turn{t + 1}": float(unsafe_EK[:, t].mean()) for t in range(shape.turns)}
        metrics |= {f"dialogue/defender_keys_turn{t + 1}": float(keys_KE[t].mean()) for t in range(shape.turns)}
    return metrics


def sample_rows(step: int, rnd: Round, shape: Shape, scored: Scored, defender_N: torch.Tensor,
                attacker_N: torch.Tensor) -> list[dict[str, Any]]:
    """One line of samples.jsonl per defender turn, episode by episode: the goal, the turn's attack (`prompt`) and
    answer (`completion`), the judge's P(unsafe), both sides' rewards and advantages, the defender's terms."""
    rows = []
    openings = shape.goals * shape.openings
    components = {k: v for k, v in scored.terms.components.items() if k != "reward_raw"}
    for e in range(shape.episodes):
        goal: PromptRecord = rnd.goals[e // (shape.openings * shape.group)]
        for t in range(shape.turns):
            d, att = t * shape.episodes + e, e // shape.group if t == 0 else openings + (t - 1) * shape.episodes + e
            reply = rnd.replies[t][e]
            rows.append({
                "step": step, "uid": goal.uid, "category": goal.category, "goal": goal.messages[-1]["content"],
                "episode": e, "turn": t + 1, "prompt": rnd.attack_text(e, t + 1), "completion": reply.text,
                "finish_reason": reply.finish_reason, "unsafe": float(scored.unsafe_EK[e, t]),
                "defender_reward": float(scored.defender_EK[e, t]),
                "attacker_reward": float(scored.attacker_EK[e, t]), "novelty": float(scored.novelty_N[att]),
                **{name: float(v[d]) for name, v in components.items()},
                "defender_advantage": float(defender_N[d]), "attacker_advantage": float(attacker_N[att]),
            })
    return rows


def adversarial_prepare(config: Any) -> Bind:
    """`prepare` of the adversarial recipe: checks, the goals, the judge and the defender's terms, made before the
    engine exists; at binding, the attacker adapter beside the defender's (a resumed run's came with its
    checkpoint)."""
    check_adversarial(config)
    a, d, t = config.adversarial, config.data, config.training
    init = attacker_checkpoint(a.attacker_init, config.model)
    sampler = PromptSampler(load_prompts(d), t.batch_size, t.seed, shuffle=d.shuffle)
    try:
        judge = conversation_judge(a.judge.fn, a.judge.params or None)
    except UserError as err:
        raise UserError(f"adversarial.judge: {err}") from None
    terms, stops = defender_terms(config), rl_stops(config)

    def bind(engine: Engine, run_dir: Path) -> tuple[StepFn, EarlyStop]:
        if ATTACKER not in engine.adapters:
            engine.create_adapter(ATTACKER, init=init)
        gist = config.dialogue.gist_tokens
        prompter = Prompter(engine.tokenizer, d.template, d.system_prompt, d.max_prompt_tokens, gist,
                            gist_token_id(engine.tokenizer) if gist else None)
        window = Window(a.novelty.window, config.sampling.group_size, Path(run_dir) / SAMPLES_FILE)
        parts = Parts(engine, sampler, prompter, judge, terms, window)
        return partial(adversarial_step, config=config, parts=parts), stops

    return bind
