"""`purplerl eval`: generate from the base model and each checkpoint, then run the suites on the generations.

Generations go to OUT/generations/<label>.jsonl one prompt at a time (its n samples together), so a killed
eval resumes: a complete file is not touched again, a partial one continues after its last whole prompt.
Each batch samples with seed + (index of its first prompt), so a resumed file holds what an uninterrupted
run would have written for the same batch boundaries. OUT/eval.json holds the settings, every target's
suite results and every sample with every judge's score; OUT/report.html shows the same.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from purplerl.config import EvalCommandConfig
from purplerl.errors import UserError
from purplerl.eval.attacker import ATTACKS_FILE, attack, describe_attacker, load_goals, resolve_attacker
from purplerl.eval.choice import NO_CHOICE
from purplerl.eval.rescore import check_ground_truths, describe, load_rewards, target_rewards
from purplerl.eval.suites import HarmJudges, choice_suite, diversity_suite, harm_suite, math_suite, table, utility_suite
from purplerl.files import looks_local, read_json_object, read_jsonl, safe_file_stem, write_durably
from purplerl.outputs import check_output_dir
from purplerl.runs.layout import CHECKPOINTS_DIR
from purplerl.types import PromptRecord

BASE_LABEL = "base"
GENERATION_FILE = "generation.json"
GENERATIONS_DIR = "generations"
_MISSING = object()
# Settings a generations file depends on, besides each target's policy (model, adapter, prompt format): a
# rerun into the same OUT must match them, or it would mix samples.
GENERATION_KEYS = ("data.source", "data.split", "data.limit", "data.prompt_field", "data.hf_config", "data.filters",
                   "eval.n", "eval.seed", "eval.batch_size", "sampling.max_new_tokens", "sampling.temperature",
                   "sampling.top_p", "sampling.top_k")


def setting(cfg: EvalCommandConfig, dotted: str) -> Any:
    """The value of a dotted config field, e.g. 'sampling.top_p'."""
    node: Any = cfg
    for part in dotted.split("."):
        node = getattr(node, part)
    return node


def validate(cfg: EvalCommandConfig, announce: Callable[[str], None] = print) -> dict[str, Any]:
    """Check what the config cannot (files, devices, environment) before any model loads or any file is
    written; return the targets as {label: Policy}, the base model first. Labels name files
    (generations/<label>.jsonl), so they are safe file stems."""
    from purplerl.devices import resolve_device
    from purplerl.runs.policy import resolve_policy

    resolve_device(cfg.model.device)  # 'cuda' on a machine without one fails here, not after generation.json exists
    check_output_dir(cfg.eval.out, "--out", files=(GENERATION_FILE, "eval.json", "report.html", ATTACKS_FILE),
                     dirs=(GENERATIONS_DIR,), inputs=[*cfg.eval.checkpoints, cfg.eval.attacker])
    _validate_judges(cfg)
    if "utility" in cfg.eval.suites and cfg.utility.math_source is not None:
        from purplerl.eval.math_problems import load_math_set

        load_math_set(cfg.utility.math_source, cfg.utility.math_limit)  # a bad set stops here, before any model loads
    checkpoints: dict[str, Any] = {}
    wanted = cfg.eval.adapters if cfg.eval.checkpoints else []  # the adapter modes of a routed checkpoint
    for checkpoint in map(Path, cfg.eval.checkpoints):
        if not checkpoint.is_dir():
            raise UserError(f"checkpoint dir not found: {checkpoint}")
        # every adapter is checked against its base model here: a misfit found at its turn to generate would
        # come after the base model's generations were written
        policy = resolve_policy(checkpoint, cfg.model, cfg.data).checked("--checkpoint")
        if policy.note:
            announce(policy.note)
        # a routed checkpoint is a target per adapter mode (eval.adapters), labelled LABEL-MODE but for both
        modes = wanted if policy.mode is not None else ["both"]
        for label in _labels(checkpoint.resolve()):
            targets = {safe_file_stem(label if mode == "both" else f"{label}-{mode}"): mode for mode in modes}
            if not any(target in checkpoints or target == BASE_LABEL for target in targets):
                break
        else:
            raise UserError(f"two targets would share the label '{safe_file_stem(label)}': give checkpoints distinct "
                            "dir names")
        checkpoints.update({target: policy.with_mode(mode) for target, mode in targets.items()})
    base = _base_policy(cfg, checkpoints)
    return {BASE_LABEL: base, **checkpoints, **_baselines(cfg, base, {BASE_LABEL, *checkpoints})}


def baseline_label(name: str) -> str:
    """A baseline model's target label: the last part of its name (embedded:NAME, ORG/NAME, a path)."""
    return safe_file_stem(name.rstrip("/").replace(":", "/").rsplit("/", 1)[-1] or name)


def _baselines(cfg: EvalCommandConfig, base: Any, taken: set[str]) -> dict[str, Any]:
    """eval.baselines as targets {label: Policy}: each model alone, prompted as the base model is."""
    found = {}
    for name in cfg.eval.baselines:
        label = baseline_label(name)
        if label in taken or label in found:
            raise UserError(f"baseline '{name}' would share the target label '{label}' with another target: "
                            "evaluate it separately")
        model = base.without_adapter().model.model_copy(update={"name": name, "revision": None})
        found[label] = replace(base.without_adapter(), model=model, run_config=None)
    return found


def _labels(checkpoint: Path) -> tuple[str, str]:
    """A checkpoint's target label, then the one taken when another target has it: runs/A/checkpoints/step_N is
    step_N, then A-step_N (the final checkpoints of several runs share their step)."""
    parent = checkpoint.parent.parent if checkpoint.parent.name == CHECKPOINTS_DIR else checkpoint.parent
    return checkpoint.name, f"{parent.name}-{checkpoint.name}"


def _base_policy(cfg: EvalCommandConfig, checkpoints: dict[str, Any]) -> Any:
    """The base model: the checkpoints' own (prompted as their run was trained), unless --model names one."""
    from purplerl.runs.policy import resolve_policy

    if not checkpoints:
        return resolve_policy(None, cfg.model, cfg.data)
    bases = sorted({policy.model.name for policy in checkpoints.values()})
    if len(bases) > 1:
        raise UserError(f"the checkpoints were trained on different base models ({', '.join(bases)}): "
                        "evaluate them separately or set --model")
    return next(iter(checkpoints.values())).without_adapter()


def _validate_judges(cfg: EvalCommandConfig) -> None:
    """The optional harm judges' files and keys, checked before any model loads."""
    from purplerl.rewards.judges import api_key_from_env

    guard = cfg.judges.guard_model
    if guard is not None and looks_local(guard) and not Path(guard).expanduser().exists():
        raise UserError(f"guard model not found: {Path(guard).expanduser()}")
    api_key_from_env(cfg.judges.strongreject_key_env)
    from purplerl.eval.suites import check_judge_term
    from purplerl.rewards.registry import term_params

    for name, params in cfg.judges.terms.items():  # the term judges' names and parameters, before any model loads
        check_judge_term(name)
        term_params(name, params)


def load_eval_prompts(cfg: EvalCommandConfig) -> list[PromptRecord]:
    """data.source's prompts; with an attacker, the goals it writes the prompts from (purplerl.eval.attacker)."""
    from purplerl.data.sources import load_prompts

    records = load_goals(cfg) if cfg.eval.attacker is not None else load_prompts(cfg.data)
    if "diversity" in cfg.eval.suites and len(records) * cfg.eval.n < 2:
        raise UserError("the diversity suite needs at least 2 completions: raise --limit or --n")
    return records


def _generation(cfg: EvalCommandConfig, policies: dict[str, Any], attacker: Any = None) -> dict[str, Any]:
    return {**{key: setting(cfg, key) for key in GENERATION_KEYS},
            "targets": {label: _generated_by(policy) for label, policy in policies.items()},
            "attacker": describe_attacker(cfg, attacker)}


def _generated_by(policy: Any) -> dict[str, Any]:
    """What a target's samples depend on; its adapter as an absolute path, so a rerun from elsewhere matches."""
    found = policy.describe()
    del found["run_config"]  # follows from the adapter's path
    if found["adapter"] is not None:
        found["adapter"] = str(Path(found["adapter"]).resolve())
    return found


def _check_same_generation(cfg: EvalCommandConfig, policies: dict[str, Any], out: Path, attacker: Any = None) -> None:
    """Refuse an OUT whose generations were made with other settings (another attacker's prompts included); writes
    nothing. A target new to OUT is fine (it gets its own file)."""
    path = out / GENERATION_FILE
    if not path.is_file():
        return
    saved, now = read_json_object(path), _generation(cfg, policies, attacker)
    changed = [key for key in GENERATION_KEYS if saved.get(key, _MISSING) != now[key]]
    changed += ["eval.attacker"] if saved.get("attacker") != now["attacker"] else []  # older files: no attacker
    saved_targets = saved.get("targets") if isinstance(saved.get("targets"), dict) else {}
    changed += [f"target {label}" for label in now["targets"]
                if label in saved_targets and saved_targets[label] != now["targets"][label]]
    if changed:
        raise UserError(f"{out} holds generations made with other settings ({', '.join(changed)}): "
                        "use another --out or the same settings")


def _record_generation(cfg: EvalCommandConfig, policies: dict[str, Any], out: Path, attacker: Any = None) -> None:
    """Write OUT/generation.json just before the first sample is: a run that fails earlier (a bad device, a
    model that does not load) leaves nothing that would refuse the corrected rerun. Targets new to OUT are
    added to it."""
    path = out / GENERATION_FILE
    record = _generation(cfg, policies, attacker)
    if path.is_file():
        saved = read_json_object(path)
        record["targets"] = {**saved.get("targets", {}), **record["targets"]}
        if record == saved:
            return
    (out / GENERATIONS_DIR).mkdir(parents=True, exist_ok=True)
    write_durably(path, json.dumps(record, indent=1))


def read_generations(path: Path, prompts: list[PromptRecord], n: int) -> list[dict[str, Any]]:
    """The rows of the whole prompts already in `path`, checked against `prompts`; a cut tail is dropped."""
    if not path.is_file():
        return []
    rows = read_jsonl(path, cut_tail=True)  # a line cut by a kill is generated again
    rows = rows[: len(rows) // n * n]
    if len(rows) > len(prompts) * n:
        raise UserError(f"{path} holds more samples than {len(prompts)} prompts x {n}: use another --out")
    for i, row in enumerate(rows):
        record = prompts[i // n]
        if (row.get("prompt_index"), row.get("sample"), row.get("uid")) != (i // n, i % n, record.uid):
            raise UserError(f"{path} line {i + 1} is not sample {i % n} of prompt '{record.uid}': use another --out")
    return rows


def _rewrite(path: Path, rows: list[dict[str, Any]]) -> None:
    write_durably(path, "".join(json.dumps(row) + "\n" for row in rows))


class _Target:
    """One model to evaluate; its engine loads on first use (a finished target may never need one)."""

    def __init__(self, cfg: EvalCommandConfig, label: str, policy: Any) -> None:
        self.cfg, self.label, self.policy = cfg, label, policy
        self._engine: Any = None

    @property
    def engine(self) -> Any:
        if self._engine is None:
            self._engine = self.policy.load()
        return self._engine

    def sample(self, records: list[PromptRecord], n: int, max_new_tokens: int, temperature: float,
               seed: int) -> list[list[str]]:
        from purplerl.types import SamplingParams

        s = self.cfg.sampling
        greedy = temperature == 0.0  # truncation means nothing to an argmax
        params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature,
                                top_p=1.0 if greedy else s.top_p, top_k=0 if greedy else s.top_k, seed=seed)
        return self.policy.generate(self.engine, records, n, params)

    def greedy(self, records: list[PromptRecord], max_new_tokens: int) -> list[str]:
        return [texts[0] for texts in self.sample(records, 1, max_new_tokens, 0.0, self.cfg.eval.seed)]


def generate(target: _Target, prompts: list[PromptRecord], path: Path, start: int, advance: Any,
             record: Callable[[], None], goals: dict[str, str] | None = None) -> None:
    """Append samples for prompts[start:] to `path`, one batch at a time, calling advance() per batch and
    record() before the first batch is written; `goals` (uid -> goal) puts each attack's goal in its rows."""
    cfg = target.cfg
    size = cfg.eval.batch_size
    for first in range(start, len(prompts), size):
        batch = prompts[first:first + size]
        groups = target.sample(batch, cfg.eval.n, cfg.sampling.max_new_tokens, cfg.sampling.temperature,
                               cfg.eval.seed + first)
        record()
        with path.open("a") as sink:
            for offset, (prompt, texts) in enumerate(zip(batch, groups, strict=True)):
                for k, text in enumerate(texts):
                    row = {"uid": prompt.uid, "prompt_index": first + offset, "sample": k,
                           "category": prompt.category, **({"goal": goals[prompt.uid]} if goals else {}),
                           "prompt": prompt.messages[-1]["content"], "completion": text}
                    sink.write(json.dumps(row) + "\n")
        advance()


def _resume_points(targets: list[_Target], prompts: list[PromptRecord], out: Path, n: int) -> dict[str, int]:
    """Per target, the index of the first prompt without samples; a cut tail is dropped first."""
    starts = {}
    for t in targets:
        path = out / GENERATIONS_DIR / f"{t.label}.jsonl"
        kept = read_generations(path, prompts, n)
        if path.is_file() and path.read_bytes() != "".join(json.dumps(row) + "\n" for row in kept).encode():
            _rewrite(path, kept)  # drop a cut tail (and a missing last newline) before appending
        starts[t.label] = len(kept) // n
    return starts


def run_eval(cfg: EvalCommandConfig, console: Any = None, announce: Callable[[str], None] = print) -> dict[str, Any]:
    """Generate (or resume) every target's samples, run the suites, write OUT/eval.json; return its dict."""
    from rich.progress import Progress

    policies = validate(cfg, announce)
    attacker = resolve_attacker(cfg, announce)  # None without eval.attacker
    prompts = load_eval_prompts(cfg)
    rewards = load_rewards(cfg.eval.rewards, cfg.eval.rewards_file)  # eval --rewards (purplerl.eval.rescore)
    check_ground_truths(rewards, prompts, f"data.source {cfg.data.source}")
    judges = HarmJudges(cfg.judges, device=cfg.model.device) if "harm" in cfg.eval.suites else None
    out = Path(cfg.eval.out)
    _check_same_generation(cfg, policies, out, attacker)
    goals = None
    if attacker is not None:  # the goals become the attacker's prompts before any target loads
        attacks = attack(cfg, attacker, prompts, out)
        prompts, goals = attacks.records(), attacks.goal_of()
    targets = [_Target(cfg, label, policy) for label, policy in policies.items()]
    starts = _resume_points(targets, prompts, out, cfg.eval.n)
    total = sum(math.ceil((len(prompts) - starts[t.label]) / cfg.eval.batch_size) for t in targets)
    results: dict[str, dict[str, Any]] = {}
    samples: list[dict[str, Any]] = []
    with Progress(console=console, transient=False) as progress:
        task = progress.add_task("generating", total=max(total, 1))
        for t in targets:
            path = out / GENERATIONS_DIR / f"{t.label}.jsonl"
            progress.update(task, description=f"generating {t.label}")
            generate(t, prompts, path, starts[t.label], lambda: progress.advance(task),
                     lambda: _record_generation(cfg, policies, out, attacker), goals)
            rows = read_generations(path, prompts, cfg.eval.n)
            scored = judges.score(rows) if judges is not None else rows
            results[t.label] = {suite: SUITE_RUNS[suite](cfg, t, rows, scored) for suite in cfg.eval.suites}
            if rewards:
                results[t.label].update(target_rewards(rows, prompts, rewards, t.policy.model.init_adapter,
                                                       cfg.eval.seed))
            samples.extend({"target": t.label, **row} for row in scored)
            t._engine = None  # free the weights before the next target loads
    result = {"config": {**cfg.model_dump(mode="json"),
                         "targets": {label: policy.model.init_adapter for label, policy in policies.items()},
                         "policies": {label: policy.describe() for label, policy in policies.items()},
                         "judges": judges.describe() if judges else {}, "rewards": describe(rewards),
                         "attacker": describe_attacker(cfg, attacker)},
              "targets": results, "baselines": [baseline_label(name) for name in cfg.eval.baselines],
              "samples": samples}
    out.mkdir(parents=True, exist_ok=True)
    (out / "eval.json").write_text(json.dumps(result, indent=1))
    (out / "report.html").write_text(eval_html(result), encoding="utf-8")
    return result


def eval_html(result: dict[str, Any]) -> str:
    """report.html of an eval: checkpoints side by side (see purplerl.eval.compare)."""
    from purplerl.eval.compare import eval_report

    return eval_report(result)


def _harm(cfg: EvalCommandConfig, target: _Target, rows: list[dict[str, Any]], scored: list[dict[str, Any]]) -> Any:
    return harm_suite(scored, cfg.judges.harm_threshold, cfg.eval.seed)


def _utility(cfg: EvalCommandConfig, target: _Target, rows: list[dict[str, Any]],
             scored: list[dict[str, Any]]) -> Any:
    u, template = cfg.utility, target.policy.prompt.template
    # the math and choice prompts are worded for the target's own format ("Question: ... Answer:" for base)
    found = utility_suite(target.greedy, u, template, cfg.eval.seed)
    if u.choice_source is not None and u.choice_source.strip().lower() not in NO_CHOICE:
        choice = choice_suite(target.engine, u.choice_source, u.choice_limit, template, cfg.eval.seed,
                              cfg.eval.batch_size)
        found["metrics"].update(choice["metrics"])
        found["choice"] = choice["choice"]
    if u.math_source is not None:  # chain of thought: its own, longer token budget
        math = math_suite(target.greedy, u.math_source, u.math_limit, u.math_max_new_tokens, template, cfg.eval.seed)
        found["metrics"].update(math["metrics"])
        found["math"] = math["math"]
    return found


def _diversity(cfg: EvalCommandConfig, target: _Target, rows: list[dict[str, Any]],
               scored: list[dict[str, Any]]) -> Any:
    return diversity_suite(scored)


# How each suite of purplerl.eval.suites.SUITES runs on one target's (rows, judged rows).
SUITE_RUNS: dict[str, Callable[[EvalCommandConfig, _Target, list[dict[str, Any]], list[dict[str, Any]]], Any]] = {
    "harm": _harm, "utility": _utility, "diversity": _diversity}


def eval_table(result: dict[str, Any]) -> str:
    return table(result["targets"])
