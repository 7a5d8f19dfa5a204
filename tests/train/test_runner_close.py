"""The runner closes its engine however the run ends: vLLM's engine process is stopped by the run, not killed at
the interpreter's exit (purplerl.engines.base.Engine.close)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from purplerl.config import load_command_config
from purplerl.config.sections import RunSettings
from purplerl.errors import ExperimentError
from purplerl.train import runner
from purplerl.train.recipe import Recipe, recipe_field


class Closes:
    """The local engine, counting its close() calls."""

    def __init__(self, engine: Any) -> None:
        self.engine, self.closed = engine, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    def close(self) -> None:
        self.closed += 1
        self.engine.close()



class ClosingSettings(RunSettings):
    recipe: str = recipe_field("closing")

def _recipe(fail_at: int | None) -> Recipe:
    def prepare(config: Any):
        def bind(engine: Any, run_dir: Path):
            def step(step: int) -> tuple[dict[str, float], list[dict[str, Any]]]:
                if step == fail_at:
                    raise ExperimentError(f"step {step} failed")
                return {"step_seen": float(step)}, []
            return step, lambda metrics: None
        return bind

    return Recipe(name="closing", settings=ClosingSettings, help="Close the engine.",
                  prepare=prepare, defaults={"training": {"steps": 2}})


@pytest.fixture
def engines(monkeypatch) -> list[Closes]:
    made: list[Closes] = []
    real = runner.make_engine

    def make(*args: Any, **kwargs: Any) -> Closes:
        made.append(Closes(real(*args, **kwargs)))
        return made[-1]

    monkeypatch.setattr(runner, "make_engine", make)
    return made


@pytest.mark.parametrize("fail_at", [None, 1, 2])
def test_the_engine_is_closed_once_however_the_run_ends(tiny_model_dir: Path, tmp_path: Path,
                                                        engines: list[Closes], fail_at: int | None) -> None:
    recipe = _recipe(fail_at)
    config = load_command_config(recipe.command(), None, ["--model.name", str(tiny_model_dir), "--run.output_dir",
                                                          str(tmp_path), "--logging.progress", "false"])
    if fail_at is None:
        assert runner.run_recipe(recipe, config)["last_step"] == 2
    else:
        with pytest.raises(ExperimentError, match=f"step {fail_at} failed"):
            runner.run_recipe(recipe, config)
    assert [engine.closed for engine in engines] == [1]
