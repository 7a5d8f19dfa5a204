"""The README's `purplerl defend --config examples/configs/defend.yaml` on the embedded model (make test-slow,
~8 min on 2 AVX512-BF16 cores, ~20 min in fp32 on AVX2 ones): Token Buncher meets its own objective,
stably, and the defended adapter keeps its utility.

- harmful-prompt response entropy: the last 10 steps below the first 5, and no step after the warm-up above
  the start (recipes/summary.py DefendObjective);
- KL to the base below MAX_KL_PER_TOKEN at every step; no collapse (the run would exit non-zero);
- benign answers non-empty; arithmetic exact match and multiple-choice accuracy of the defended adapter inside
  the 95% CI of the aligned model it starts from.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
BENIGN_PROMPTS = 40  # held-out benign requests of the alignment data


def _utility(model: str, adapter: Path | None) -> dict[str, dict[str, float]]:
    """Arithmetic exact match, multiple-choice accuracy (with 95% CIs) and the empty share of benign answers."""
    from purplerl.config import ModelConfig
    from purplerl.config.commands import UtilityConfig
    from purplerl.data.alignment import alignment_examples, to_prompt_records
    from purplerl.engines import make_engine
    from purplerl.eval.suites import choice_suite, utility_suite
    from purplerl.experiments import align  # noqa: F401 -- registers embedded:smollm2-135m-safe, the defended start
    from purplerl.prompting import render_prompt
    from purplerl.types import SamplingParams

    engine = make_engine(ModelConfig(name=model, device="cpu", init_adapter=str(adapter) if adapter else None))

    def greedy(records, max_new_tokens: int) -> list[str]:
        tokens = [render_prompt(engine.tokenizer, r, template="chat", system_prompt=None, max_prompt_tokens=256)
                  for r in records]
        groups = engine.sample(tokens, 1, SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0))
        return [g[0].text for g in groups]

    arithmetic = utility_suite(greedy, UtilityConfig(), "chat", seed=0)["metrics"]["exact_match"]
    choice = choice_suite(engine, "builtin:choice", None, "chat", seed=0, batch_size=8)["metrics"]["choice_accuracy"]
    benign = alignment_examples("test", "benign")[:BENIGN_PROMPTS]
    answers = greedy(to_prompt_records(benign), 32)
    return {"arithmetic": arithmetic, "choice": choice,
            "benign_empty": {"point": sum(not a.strip() for a in answers) / len(answers)}}


def _within(value: float, reference: dict[str, float]) -> bool:
    return reference["low"] <= value <= reference["high"]


@pytest.mark.slow
def test_default_defend_lowers_and_holds_entropy_with_bounded_kl_and_kept_utility(tmp_path: Path) -> None:
    from purplerl.recipes.summary import MAX_KL_PER_TOKEN, assess_defend
    from purplerl.runs.checkpoints import latest_checkpoint
    from purplerl.train.sinks import read_jsonl

    run = subprocess.run([sys.executable, "-c", "from purplerl.cli import main; main()", "defend",
                          "--config", str(ROOT / "examples/configs/defend.yaml"), "--run.output_dir", str(tmp_path),
                          "--run.name", "defend", "--logging.progress", "false"],
                         capture_output=True, text=True, cwd=ROOT, timeout=1500)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "defense: objective met" in run.stdout, run.stdout
    run_dir = tmp_path / "defend"
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    objective = assess_defend(metrics, warmup=config["defend"]["noiser_warmup"], collapsed=False)
    assert objective.end < objective.start, objective
    assert objective.rose_at == (), objective
    assert objective.max_kl < MAX_KL_PER_TOKEN, objective
    assert any(m.get("train/noiser_step") for m in metrics)  # the noiser phase ran

    model = config["model"]["name"]
    base, defended = _utility(model, None), _utility(model, latest_checkpoint(run_dir))
    assert defended["benign_empty"]["point"] <= 0.05, defended
    for suite in ("arithmetic", "choice"):
        assert _within(defended[suite]["point"], base[suite]), (suite, base, defended)
