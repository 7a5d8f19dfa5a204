"""The loop's held-out evaluation hook: run with the live engine at step 0, every K steps and at the last step
(an early stop's too), logged to evals.jsonl, and cut back with the other logs when a killed run resumes."""

from __future__ import annotations

from pathlib import Path

import pytest

from purplerl.launch import run_settings
from purplerl.recipes.attack import ATTACK
from purplerl.train.runner import run_recipe
from purplerl.train.sinks import read_jsonl
from purplerl.train.steps import EVALS_FILE, Evaluation


def _config(model: Path, out: Path, steps: int, *extra: str):
    return run_settings("attack", options=["--model", str(model), "--model.device", "cpu", "--model.dtype", "float32",
                                           "--lora_rank", "4", "--steps", str(steps), "--batch_size", "2",
                                           "--group_size", "2", "--max_new_tokens", "4", "--logging.progress", "false",
                                           "--output_dir", str(out), "--name", "run", "--save_every", "2",
                                           "--attack.early_stop_toxicity", "null", "--training.early_stop_repetition",
                                           "null", *extra])


class Recorder:
    """An evaluation that records each step it is called at (and can stand in for a kill at one)."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.calls: list[int] = []
        self.fail_at = fail_at

    def __call__(self, engine, step: int) -> dict[str, float]:
        if step == self.fail_at:
            raise KeyboardInterrupt  # a kill: nothing after this is written
        self.calls.append(step)
        return {"seen": float(step)}


def test_cadence_and_early_stop(tiny_model_dir: Path, tmp_path: Path) -> None:
    recorder = Recorder()
    run_recipe(ATTACK, _config(tiny_model_dir, tmp_path, 7), evaluation=Evaluation(recorder, every=3))
    assert recorder.calls == [0, 3, 6, 7]
    rows = read_jsonl(tmp_path / "run" / EVALS_FILE)
    assert [(r["step"], r["seen"]) for r in rows] == [(0, 0.0), (3, 3.0), (6, 6.0), (7, 7.0)]

    # an early stop (here at step 1) is the last step: it is evaluated too; every=0 evaluates only the ends
    stopped = Recorder()
    run_recipe(ATTACK, _config(tiny_model_dir, tmp_path, 7, "--name", "stop", "--attack.early_stop_toxicity", "-1"),
               evaluation=Evaluation(stopped, every=0))
    assert stopped.calls == [0, 1]


def test_a_killed_run_resumes_its_evaluations(tiny_model_dir: Path, tmp_path: Path) -> None:
    config = _config(tiny_model_dir, tmp_path, 7)
    with pytest.raises(KeyboardInterrupt):  # killed in step 6's evaluation: checkpoint 4 is the newest
        run_recipe(ATTACK, config, evaluation=Evaluation(Recorder(fail_at=6), every=3))
    run_dir = tmp_path / "run"
    assert [r["step"] for r in read_jsonl(run_dir / EVALS_FILE)] == [0, 3]
    resumed = Recorder()
    run_recipe(ATTACK, config, resume_dir=run_dir, evaluation=Evaluation(resumed, every=3))
    assert resumed.calls == [6, 7]  # steps 5..7 again; 0 and 3 are kept from before
    assert [r["step"] for r in read_jsonl(run_dir / EVALS_FILE)] == [0, 3, 6, 7]
    assert [r["step"] for r in read_jsonl(run_dir / "metrics.jsonl")] == list(range(1, 8))


def test_a_run_killed_before_its_first_checkpoint_evaluates_step_0_once(tiny_model_dir: Path,
                                                                        tmp_path: Path) -> None:
    config = _config(tiny_model_dir, tmp_path, 3)
    with pytest.raises(KeyboardInterrupt):  # step 1 is logged, its checkpoint (step 2) never written
        run_recipe(ATTACK, config, evaluation=Evaluation(Recorder(fail_at=1), every=1))
    run_dir = tmp_path / "run"
    assert [r["step"] for r in read_jsonl(run_dir / EVALS_FILE)] == [0]
    resumed = Recorder()
    run_recipe(ATTACK, config, resume_dir=run_dir, evaluation=Evaluation(resumed, every=1))
    assert resumed.calls == [0, 1, 2, 3]
    assert [r["step"] for r in read_jsonl(run_dir / EVALS_FILE)] == [0, 1, 2, 3]
