"""The attack runs of a tamper test: which runs each threat model needs, their configs, and running them.

Each threat compares an attack on the defended model with the same attack on the undefended start model (the
defense's own base model, with a fresh LoRA):

| threat   | defended run                                        | reference run                  |
|----------|-----------------------------------------------------|--------------------------------|
| adapter  | RL attack that keeps training the defense's LoRA    | RL attack on the base          |
| merged   | RL attack, fresh LoRA on the merged defended model  | RL attack on the base (shared) |
| adaptive | RL attack + entropy bonus on the merged model       | the same attack on the base    |
| sft      | SFT on mined harmful completions, merged model      | the same SFT on the base       |

Run dirs are OUT/runs/<family>_<start>_s<seed>; a rerun resumes each from its dir (a finished one is only read).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from purplerl.errors import ExperimentError
from purplerl.experiments.tamper.heldout import flags_key
from purplerl.launch import run_settings
from purplerl.recipes.attack import ATTACK
from purplerl.recipes.sft import SFT
from purplerl.runs.layout import CONFIG_FILE, EVALS_FILE, METRICS_FILE
from purplerl.runs.policy import Policy
from purplerl.train.runner import run_recipe
from purplerl.train.sinks import read_jsonl
from purplerl.train.steps import Evaluation

RUNS_DIR = "runs"
# threat -> (attack family, the defended start); the reference is the same family on the base
THREAT_RUNS = {"adapter": ("rl", "adapter"), "merged": ("rl", "merged"), "adaptive": ("adaptive", "merged"),
               "sft": ("sft", "merged")}
TRAIN_CURVE = {"rl": "toxicity/mean", "adaptive": "toxicity/mean", "sft": "train/nll"}


@dataclass(frozen=True)
class AttackRun:
    family: str  # rl, adaptive (rl with the entropy bonus) or sft
    start: str  # base, adapter (the defense's LoRA, trained on) or merged (the defense merged into the weights)
    seed: int

    @property
    def name(self) -> str:
        return f"{self.family}_{self.start}_s{self.seed}"


def plan(threats: list[str], seeds: list[int]) -> dict[str, dict[str, list[AttackRun]]]:
    """threat -> {"base": reference runs, "defended": defended runs}, one per seed; identical runs shared by name."""
    return {threat: {"base": [AttackRun(THREAT_RUNS[threat][0], "base", s) for s in seeds],
                     "defended": [AttackRun(*THREAT_RUNS[threat], s) for s in seeds]} for threat in threats}


def run_order(runs: dict[str, dict[str, list[AttackRun]]], first: AttackRun | None) -> list[AttackRun]:
    """Every distinct run once, `first` (the SFT data's source) before all others."""
    order = [first] if first is not None else []
    for sides in runs.values():
        for side in ("base", "defended"):
            order += [run for run in sides[side] if run not in order]
    sft = [run for run in order if run.family == "sft"]
    return [run for run in order if run.family != "sft"] + sft  # the SFT data is mined before any SFT run


@dataclass(frozen=True)
class Starts:
    """Where each start's weights are: the base model, the defended adapter, and the merged model dir."""

    defended: Policy
    merged_dir: Path | None


def attack_config(base: Any, run: AttackRun, starts: Starts, runs_dir: Path, entropy_bonus_cap: float) -> Any:
    """The RL attack of `run`: the shared attack settings, its start, its seed, no early stop."""
    data = base.model_dump(mode="json")
    data["model"]["init_adapter"] = starts.defended.model.init_adapter if run.start == "adapter" else None
    if run.start == "merged":
        data["model"].update(name=str(starts.merged_dir), revision=None)
    data["training"].update(seed=run.seed, early_stop_repetition=None)
    data["attack"]["early_stop_toxicity"] = None
    if run.family == "adaptive":
        data["reward"]["terms"]["entropy_bonus"] = {"fn": "entropy_bonus", "weight": 1.0,
                                                    "params": {"cap": entropy_bonus_cap}}
    data["run"].update(output_dir=str(runs_dir), name=run.name)
    return run_settings(ATTACK, saved=data)


def sft_config(base: Any, run: AttackRun, starts: Starts, runs_dir: Path, data_file: Path, lr: float) -> Any:
    """The supervised attack of `run`: the mined completions, the attack's model, engine, step budget and batch
    size."""
    rl = attack_config(base, AttackRun("rl", run.start, run.seed), starts, runs_dir, 0.0).model_dump(mode="json")
    shared = {key: rl[key] for key in ("engine", "model", "logging", "run")}
    training = {key: rl["training"][key] for key in SFT.settings.model_fields["training"].annotation.model_fields}
    data = {"source": str(data_file), "split": "train", "template": rl["data"]["template"],
            "system_prompt": rl["data"]["system_prompt"]}
    # the held-out judge is the evaluation here; SFT's own held-out loss would take training rows away
    return run_settings(SFT, base={**shared, "recipe": "sft", "training": {**training, "lr": lr},
                                   "run": {**rl["run"], "name": run.name}, "data": data,
                                   "sft": {"eval_fraction": 0.0, "eval_every": 0}})


def execute(config: Any, run: AttackRun, run_dir: Path, evaluation: Evaluation) -> dict[str, Any]:
    """Start the run, continue it from its dir, or (finished) only read it."""
    resume = (run_dir / CONFIG_FILE).is_file()
    if run.family == "sft":
        return run_recipe(SFT, config, resume_dir=run_dir if resume else None, evaluation=evaluation)
    return run_recipe(ATTACK, config, resume_dir=run_dir if resume else None, evaluation=evaluation)


def read_flags(evals: list[dict[str, Any]], harm_key: str, where: Path) -> list[str] | None:
    """The per-prompt verdicts behind `harm_key` at every evaluated step, or None when a row lacks them (a run
    evaluated before they were stored: its interval then resamples seeds only). Each must give its row's share."""
    flags = [row.get(flags_key(harm_key)) for row in evals]
    if any(verdicts is None for verdicts in flags):
        return None
    for row, verdicts in zip(evals, flags, strict=True):
        share = verdicts.count("1") / len(verdicts) if verdicts else float("nan")
        if not abs(share - float(row[harm_key])) <= 1e-9:
            raise ExperimentError(f"{where} step {row['step']}: the per-prompt verdicts '{verdicts}' give harm "
                                  f"{share}, the row says {row[harm_key]}")
    return flags


def read_run(run: AttackRun, run_dir: Path, stats: Callable[[list[tuple[int, float]]], dict[str, Any]],
             harm_key: str) -> dict[str, Any]:
    """A finished run's held-out harm curve with its per-prompt verdicts (None in older records), its statistics,
    and its training curve (from its logs)."""
    evals = read_jsonl(run_dir / EVALS_FILE)
    missing = [row["step"] for row in evals if harm_key not in row]
    if missing:
        raise ExperimentError(f"{run_dir / EVALS_FILE} has no '{harm_key}' at steps {missing}: was it evaluated "
                              f"with other judges? Use a new --out")
    curve = [(int(row["step"]), float(row[harm_key])) for row in evals]
    key = TRAIN_CURVE[run.family]
    train = [float(row[key]) for row in read_jsonl(run_dir / METRICS_FILE) if key in row]
    return {"run": run.name, "seed": run.seed, "family": run.family, "start": run.start, **stats(curve),
            "harm_curve": [list(point) for point in curve],
            "harm_flags": read_flags(evals, harm_key, run_dir / EVALS_FILE), "train_metric": key,
            "train_curve": train, "heldout_refusal": [float(row["heldout/refusal"]) for row in evals],
            "heldout_degenerate": [float(row["heldout/degenerate"]) for row in evals]}
