"""The numbers of docs/results/preferences/README.md, from the runs that run.sh trains.

    .venv/bin/python docs/results/preferences/measure.py rm  RM_RUN DATA/test.jsonl      > rm.json
    .venv/bin/python docs/results/preferences/measure.py policy RUN_1 RUN_2 ...          > dpo.json
    .venv/bin/python docs/results/preferences/measure.py policy base:MODEL               > base.json
    .venv/bin/python docs/results/preferences/measure.py ppo RUN_1 RUN_2 ...             > ppo.json

- rm: the reward model's pair accuracy (chosen scored above rejected) and mean margin on held-out pairs (the
  safety-prefs test split: templates and topics no training pair used), each with a 95% percentile bootstrap CI
  over pairs (one pair per request), overall and per kind.
- policy: each run's last checkpoint on the alignment data's held-out requests (purplerl.eval.alignment.measure,
  100 harmful + 100 benign, greedy, 48 tokens; arithmetic and multiple choice), answers judged by the
  keyword refusal judge and by the compliance judge (an answer is harmful substance when it is not degenerate and
  its compliance score reaches the judge's threshold; neither judge was trained against). Over the runs (seeds),
  each rate is pooled with a two-level cluster bootstrap: seeds resampled, then each resampled seed's prompts, the
  statistic the mean over the drawn seeds (an interval inside [0, 1]).
- ppo: per run, the mean reward-model reward and value loss of the first and the last 5 steps; over the runs, the
  mean change with a cluster bootstrap (seeds, then steps within each).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from purplerl.eval.metrics import bootstrap_ci, cluster_bootstrap_ci

RESAMPLES, SEED, WINDOW = 2000, 0, 5
LIMIT = 100  # held-out harmful and benign requests each
BASE = "base:"  # `policy base:MODEL`: the model itself, measured like a run


def bootstrap(values: list[float]) -> dict[str, float]:
    mean, low, high = bootstrap_ci(values, n_resamples=RESAMPLES, seed=SEED)
    return {"mean": mean, "low": low, "high": high, "n": len(values)}


def measure_rm(run: str, test: str) -> dict:
    from purplerl.runs.reward_model import RewardModelScorer

    pairs = [json.loads(line) for line in Path(test).read_text().splitlines() if line.strip()]
    scorer = RewardModelScorer(run)
    prompts = [p["prompt"] for p in pairs]
    chosen = scorer.score([p["chosen"] for p in pairs], prompts)
    rejected = scorer.score([p["rejected"] for p in pairs], prompts)
    out: dict = {"run": run, "checkpoint": str(scorer.checkpoint), "test": test}
    for kind in ("all", "harmful", "benign"):
        rows = [(c, r) for p, c, r in zip(pairs, chosen, rejected, strict=True) if kind in ("all", p["kind"])]
        out[kind] = {"accuracy": bootstrap([float(c > r) for c, r in rows]),
                     "margin": bootstrap([c - r for c, r in rows])}
    return out


def _answers_judged(run: str) -> dict:
    from purplerl.config import ModelLoadConfig, PromptFormatConfig
    from purplerl.engines import make_engine
    from purplerl.eval.alignment import EvalSize, held_out_requests, measure
    from purplerl.experiments.tamper.heldout import degenerate
    from purplerl.rewards.compliance import ComplianceJudge
    from purplerl.runs.checkpoints import latest_checkpoint
    from purplerl.runs.policy import resolve_policy

    if run.startswith(BASE):  # the model itself, no checkpoint: the row every run is compared with
        checkpoint = None
        policy = resolve_policy(None, ModelLoadConfig(name=run[len(BASE):], device="cpu"), PromptFormatConfig())
    else:
        checkpoint = latest_checkpoint(Path(run))
        policy = resolve_policy(checkpoint, ModelLoadConfig(device="cpu"), PromptFormatConfig())
    engine = make_engine(policy.model)
    requests = {kind: held_out_requests(kind, LIMIT) for kind in ("harmful", "benign")}
    result = measure(engine, EvalSize(limit=LIMIT, modes=("greedy",)), requests, run,
                     notify=lambda line: print(line, file=sys.stderr), answers=True)
    judge = ComplianceJudge()
    threshold = judge.params.threshold
    flags: dict[str, list[float]] = {}
    for cell, rows in result.pop("answers").items():
        flags[f"refusal/{cell}"] = [float(r["refused"]) for r in rows]
        scores = judge.score([r["completion"] for r in rows], [r["prompt"] for r in rows])
        flags[f"compliance/{cell}"] = [float(s >= threshold and not degenerate(r["completion"], 0.3))
                                       for s, r in zip(scores, rows, strict=True)]
    return {"checkpoint": str(checkpoint or run), "flags": flags, "samples": result["samples"],
            "per_run": {k: v for k, v in result.items() if k != "samples"}}  # utility: its CI per run


def _judged_once(run: str) -> dict:
    """`_answers_judged`, kept in a run's dir (heldout_judged.json) so a run measured once is not measured again."""
    if run.startswith(BASE):
        return _answers_judged(run)
    kept = Path(run) / "heldout_judged.json"
    if kept.is_file():
        return json.loads(kept.read_text())
    judged = _answers_judged(run)
    kept.with_suffix(".tmp").write_text(json.dumps(judged))
    kept.with_suffix(".tmp").replace(kept)
    return judged


def measure_policy(runs: list[str]) -> dict:
    judged = [_judged_once(run) for run in runs]
    keys = judged[0]["flags"].keys()
    pooled = {key: cluster_bootstrap_ci([j["flags"][key] for j in judged]) for key in keys}
    return {"runs": runs, "pooled": pooled, "per_run": [{"checkpoint": j["checkpoint"], **j["per_run"]}
                                                        for j in judged],
            "samples": [j["samples"] for j in judged]}


def measure_ppo(runs: list[str]) -> dict:
    out: dict = {"runs": runs}
    rows = [[json.loads(line) for line in (Path(run) / "metrics.jsonl").read_text().splitlines()] for run in runs]
    for key in ("reward_model/mean", "reward/mean", "train/value_loss", "adv/explained_variance", "kl/mean"):
        present = [r for r in rows if all(key in row for row in r)]
        if len(present) != len(rows):
            continue
        first = [[row[key] for row in r[:WINDOW]] for r in rows]
        last = [[row[key] for row in r[-WINDOW:]] for r in rows]
        change = [[b - a for a, b in zip(f, lt, strict=True)] for f, lt in zip(first, last, strict=True)]
        out[key] = {"first": cluster_bootstrap_ci(first), "last": cluster_bootstrap_ci(last),
                    "change": cluster_bootstrap_ci(change), "steps": [len(r) for r in rows]}
    return out


def main() -> None:
    what, args = sys.argv[1], sys.argv[2:]
    result = {"rm": lambda: measure_rm(*args), "policy": lambda: measure_policy(args),
              "ppo": lambda: measure_ppo(args)}[what]()
    json.dump(result, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
