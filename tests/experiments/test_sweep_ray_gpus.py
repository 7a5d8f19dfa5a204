"""Fractional GPUs on a real local Ray cluster that declares one logical GPU (its own cluster, started for this
module): two runs of 0.5 GPU each run at the same time on the same device, as small runs share one GPU; at 1 GPU
each they take turns. The runs themselves train on the CPU (this machine has no CUDA): what is tested is Ray's
placement and the device each run is handed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ray_cluster import local_cluster

from purplerl.experiments.sweep.settings import load_sweep

pytestmark = pytest.mark.process


@pytest.fixture(scope="module")
def gpu_cluster(tmp_path_factory: pytest.TempPathFactory):
    yield from local_cluster(tmp_path_factory, num_cpus=2, num_gpus=1)


def _sweep(out: Path, model: Path, gpus: float) -> list[dict]:
    from purplerl.experiments.sweep.execute import run_sweep
    from purplerl.experiments.sweep.plan import plan_sweep

    settings = load_sweep(None, [
        "--recipe", "attack", "--out", str(out), "--seeds", "0,1", "--resources.cpus_per_run", "1",
        "--resources.gpus_per_run", str(gpus), "--eval.diversity", "false",
        "--fixed", f"model={model}", "data=builtin:redteam", "steps=2", "batch_size=2", "group_size=2",
        "max_new_tokens=8", "logging.progress=false"])
    runs = plan_sweep(settings)
    lines: list[str] = []
    run_sweep(settings, runs, announce=lines.append)
    assert f"2 runs queued on Ray (1 CPUs, {gpus:g} GPUs each)" in lines
    return [json.loads((out / "outcomes" / f"{run.name}.json").read_text()) for run in runs]


def _overlap(first: dict, second: dict) -> float:
    """Seconds during which both runs were training."""
    return min(first["trained_at"], second["trained_at"]) - max(first["started_at"], second["started_at"])


def test_half_gpu_runs_share_the_device_at_once_and_whole_gpu_runs_take_turns(gpu_cluster, tiny_model_dir: Path,
                                                                               tmp_path: Path) -> None:
    half = _sweep(tmp_path / "half", tiny_model_dir, 0.5)
    assert [o["status"] for o in half] == ["finished", "finished"]
    assert [(o["gpus"], o["devices"], o["threads"]) for o in half] == [(0.5, "0", 1), (0.5, "0", 1)]
    assert _overlap(*half) > 0

    whole = _sweep(tmp_path / "whole", tiny_model_dir, 1)
    assert [o["status"] for o in whole] == ["finished", "finished"]
    assert [(o["gpus"], o["devices"]) for o in whole] == [(1.0, "0"), (1.0, "0")]
    assert _overlap(*whole) < 0  # one GPU, two runs that each need all of it: the second waits for the first
