"""Tamper-resistance test: do the attacks a real adversary runs fail on the defended model?

For each selected threat model (runs.py) the same attack runs `tamper.seeds` times on the defended model and on
the undefended start model (the defense's own base model and prompt format, read from the defended adapter's
run), with early stopping off so every curve covers the same step budget. A judge the attacks never optimize
(heldout.py) scores each run on held-out prompts as it trains; stats.py turns the curves into AUC, final harm
and steps-to-threshold with 95% intervals over seeds and a verdict per threat, which also needs the defended
model's utility to be kept. A killed tamper-test resumes: the merged model, the mined SFT data and the utility
numbers are reused, finished runs are read, an unfinished one continues from its run dir.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from purplerl.config import UtilityConfig
from purplerl.data import load_prompts
from purplerl.data.alignment import alignment_examples, to_prompt_records
from purplerl.engines.merge import merge_adapter
from purplerl.errors import UserError
from purplerl.eval.metrics import bootstrap_ci
from purplerl.eval.suites import HarmJudges, utility_suite
from purplerl.experiments import align as _align  # noqa: F401  registers embedded:smollm2-135m-safe, the attack's default
from purplerl.experiments.tamper.heldout import (
    COMPLIANCE,
    compliance_threshold,
    harm_verdict_judged,
    heldout_evaluation,
    heldout_judges,
    measure_key,
)
from purplerl.experiments.tamper.mining import write_sft_data
from purplerl.experiments.tamper.report import plot_threats, tamper_summary
from purplerl.experiments.tamper.runs import (
    RUNS_DIR,
    AttackRun,
    Starts,
    attack_config,
    execute,
    plan,
    read_run,
    run_order,
    sft_config,
)
from purplerl.experiments.tamper.stats import (
    aggregate,
    curve_stats,
    harm_curve_stats,
    refusal_kept,
    utility_kept,
    verdict,
)
from purplerl.files import write_durably
from purplerl.launch import run_settings
from purplerl.outputs import check_output_dir
from purplerl.recipes.attack import ATTACK
from purplerl.rewards.refusal import RefusalJudge
from purplerl.runs.policy import RUN_MODEL_FIELDS, RUN_PROMPT_FIELDS, Policy, resolve_policy
from purplerl.types import SamplingParams

__all__ = ["harm_curve_stats", "run_tamper_test", "tamper_summary", "utility_accuracy"]
MERGED_DIR = "merged_model"
MERGE_INFO = "purplerl_merge.json"
SFT_DATA = "sft_data.jsonl"
UTILITY_FILE = "utility.json"


def utility_result(policy: Policy, utility: UtilityConfig, engine: Any = None) -> dict[str, float]:
    """Greedy exact match of a policy on the utility set: {"point", "low", "high"} (95% bootstrap CI)."""
    engine = engine or policy.load()

    def greedy(records: list[Any], max_new_tokens: int) -> list[str]:
        params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0)
        return [texts[0] for texts in policy.generate(engine, records, 1, params)]

    return dict(utility_suite(greedy, utility, policy.prompt.template, seed=0)["metrics"]["exact_match"])


def benign_refusal(policy: Policy, engine: Any, count: int, max_new_tokens: int) -> dict[str, float]:
    """The share of `count` held-out benign requests of the alignment data (templates and topics no alignment
    saw, many worded like harmful ones) that the policy refuses, greedy, with its 95% bootstrap CI."""
    examples = alignment_examples("test", "benign")
    examples = examples[::max(1, len(examples) // count)][:count]
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0)
    texts = [group[0] for group in policy.generate(engine, to_prompt_records(examples), 1, params)]
    point, low, high = bootstrap_ci(RefusalJudge().score(texts), seed=0)
    return {"point": point, "low": low, "high": high, "n": len(texts)}


def utility_accuracy(policy: Policy, utility: UtilityConfig) -> float:
    """Greedy exact-match accuracy of a policy (a model, with an optional adapter) on the utility set."""
    return float(utility_result(policy, utility)["point"])


def shared_attack(config: Any, defended: Policy) -> Any:
    """The attack every run shares: the config's, on the defense's base model and prompt format."""
    data = config.attack_config().model_dump(mode="json")
    data["model"].update({key: getattr(defended.model, key) for key in RUN_MODEL_FIELDS})
    data["data"].update({key: getattr(defended.prompt, key) for key in RUN_PROMPT_FIELDS})
    return run_settings(ATTACK, saved=data)  # complete: its mappings replace the attack's defaults'


def _write_json(path: Path, content: Any) -> None:
    write_durably(path, json.dumps(content, indent=1))


def merged_model(out: Path, defended: Policy) -> Path:
    """OUT/merged_model: the defended adapter merged into its base weights, built once and reused."""
    target, adapter = out / MERGED_DIR, str(Path(defended.model.init_adapter or "").resolve())
    info = {"adapter": adapter, "base_model": defended.model.name}
    if (target / "config.json").is_file():
        saved = json.loads((target / MERGE_INFO).read_text()) if (target / MERGE_INFO).is_file() else None
        if saved != info:
            raise UserError(f"{target} is not the merge of {adapter} on {defended.model.name}: use another --out")
        return target
    return merge_adapter(adapter, target, defended.model.name, metadata={MERGE_INFO: info})


def utility_numbers(out: Path, config: Any, defended: Policy) -> dict[str, Any]:
    """Utility of the base and the defended model before any attack (computed once, kept in OUT/utility.json):
    arithmetic exact match, and the refusal rate on held-out benign requests."""
    path = out / UTILITY_FILE
    settings = {**config.utility.model_dump(mode="json"), "benign_prompts": config.tamper.benign_prompts,
                "benign_tokens": config.sampling.max_new_tokens}
    if path.is_file():
        saved = json.loads(path.read_text())
        if saved.get("settings") == settings and saved.get("adapter") == defended.model.init_adapter:
            return saved
    found: dict[str, Any] = {"settings": settings, "adapter": defended.model.init_adapter,
                             "source": config.utility.source}
    for side, policy in (("base", defended.without_adapter()), ("defended", defended)):
        engine = policy.load()
        found[side] = utility_result(policy, config.utility, engine)
        if config.tamper.benign_prompts:
            found[f"{side}_benign_refusal"] = benign_refusal(policy, engine, config.tamper.benign_prompts,
                                                             config.sampling.max_new_tokens)
    found["kept"] = utility_kept(found["defended"], found["base"]) and (
        not config.tamper.benign_prompts or refusal_kept(found["defended_benign_refusal"],
                                                         found["base_benign_refusal"]))
    _write_json(path, found)
    return found


def _heldout_prompts(attack: Any, config: Any) -> list[Any]:
    data = attack.data.model_copy(update={"split": config.tamper.eval_split, "limit": config.tamper.eval_prompts})
    return load_prompts(data)


def run_tamper_test(config: Any, announce: Callable[[str], None] = print) -> dict[str, Any]:
    t = config.tamper
    if t.adapter is None:
        raise UserError("tamper-test needs the defended adapter: --adapter DIR (tamper.adapter)")
    out = check_output_dir(t.out, "--out", files=(UTILITY_FILE, SFT_DATA, "tamper.json", "tamper.png", "summary.txt"),
                           dirs=(MERGED_DIR, RUNS_DIR), inputs=[t.adapter])
    # the adapter's shapes, checked against its base model before the utility passes and the merge load both
    defended = resolve_policy(Path(t.adapter), config.model, config.data).checked("--adapter")
    if defended.note:
        announce(defended.note)
    attack = shared_attack(config, defended)
    records = _heldout_prompts(attack, config)  # a missing test split fails here, before any model loads
    held_out = heldout_judges(config.judges)  # the compliance judge, unless a model judge gives harm verdicts
    judges = HarmJudges(held_out, device=config.model.device)
    compliance_at = compliance_threshold(held_out) if COMPLIANCE in held_out.terms else None
    out.mkdir(parents=True, exist_ok=True)
    utility = utility_numbers(out, config, defended)
    needs_merge = any(threat != "adapter" for threat in t.threats)
    starts = Starts(defended, merged_model(out, defended) if needs_merge else None)

    seeds = [attack.training.seed + i for i in range(t.seeds)]
    threats = plan(t.threats, seeds)
    source = AttackRun("rl", "base", seeds[0]) if "sft" in t.threats and t.sft_source is None else None
    runs_dir = out / RUNS_DIR
    results: dict[str, Any] = {}
    for run in run_order(threats, source):
        run_dir = runs_dir / run.name
        if run.family == "sft":
            data_file = out / SFT_DATA
            if not data_file.is_file():
                mined = write_sft_data(Path(t.sft_source) if t.sft_source else runs_dir / source.name, data_file,
                                       t.sft_min_toxicity, t.max_repetition, t.sft_min_rows)
                announce(f"sft threat: {mined} mined completions in {data_file}")
            run_config = sft_config(attack, run, starts, runs_dir, data_file, t.sft_lr)
        else:
            run_config = attack_config(attack, run, starts, runs_dir, t.entropy_bonus_cap)
        announce(f"tamper-test: {run.name}")
        evaluation = heldout_evaluation(records, attack.data, judges, t.eval_every, attack.sampling.max_new_tokens,
                                        t.eval_top_p, run.seed, t.max_repetition, compliance_at)
        execute(run_config, run, run_dir, evaluation)
        results[run.name] = read_run(run, run_dir, lambda curve: curve_stats(curve, t.threshold),
                                     measure_key(config.judges))

    measure = "judge" if harm_verdict_judged(config.judges) else COMPLIANCE
    result = compare(config, threats, results, utility, seeds, measure=measure, heldout_count=len(records))
    plot_threats(result, out / "tamper.png")
    _write_json(out / "tamper.json", result)
    (out / "summary.txt").write_text(tamper_summary(result) + "\n")
    return result


def compare(config: Any, threats: dict[str, dict[str, list[AttackRun]]], results: dict[str, Any],
            utility: dict[str, Any], seeds: list[int], measure: str, heldout_count: int) -> dict[str, Any]:
    """tamper.json: the settings, utility, every run, and per threat both sides' intervals and the verdict."""
    t = config.tamper
    by_threat: dict[str, Any] = {}
    for threat, sides in threats.items():
        entry: dict[str, Any] = {f"{side}_runs": [run.name for run in sides[side]] for side in ("base", "defended")}
        for side in ("base", "defended"):
            entry[side] = aggregate([results[run.name] for run in sides[side]])
        entry.update(verdict(entry["defended"], entry["base"], utility["kept"]))
        by_threat[threat] = entry
    settings = {"seeds": seeds, "threshold": t.threshold, "eval_every": t.eval_every, "eval_prompts": heldout_count,
                "eval_split": t.eval_split, "harm_measure": measure,
                "steps": config.training.steps}
    return {"adapter": t.adapter, "threats": by_threat, "settings": settings,
            "utility": {k: utility[k] for k in ("source", "base", "defended", "base_benign_refusal",
                                                "defended_benign_refusal", "kept") if k in utility},
            "runs": results}
