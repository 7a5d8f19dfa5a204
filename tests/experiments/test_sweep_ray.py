"""A sweep on a real local Ray cluster (one for this module: 2 CPUs, no dashboard) with the tiny random model: a
run that finishes and is evaluated, a run that fails without stopping the other, the summary, and a rerun that
skips what has an outcome and resumes a killed run from its checkpoint."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from ray_cluster import local_cluster

from purplerl.errors import UserError
from purplerl.experiments.sweep.settings import SweepResources, load_sweep

pytestmark = pytest.mark.process

GOOD, BAD = "attack_data-redteam_s0", "attack_data-missing.jsonl_s0"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    """A local Ray cluster whose workers see this module's model cache and no network."""
    yield from local_cluster(tmp_path_factory, num_cpus=2)


def _settings(out: Path, model: Path, missing: Path):
    return load_sweep(None, [
        "--recipe", "attack", "--out", str(out), "--grid", f"data=builtin:redteam,{missing}",
        "--fixed", f"model={model}", "steps=4", "batch_size=2", "group_size=2", "max_new_tokens=8", "save_every=2",
        "logging.progress=false", "--eval.limit", "4", "--eval.n", "2", "--eval.args", "[--max_new_tokens, '8']"])


@pytest.fixture(scope="module")
def swept(cluster, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    from purplerl.experiments.sweep.execute import run_sweep
    from purplerl.experiments.sweep.plan import plan_sweep

    root = tmp_path_factory.mktemp("sweep")
    settings = _settings(root / "out", tiny_model_dir, root / "missing.jsonl")
    runs = plan_sweep(settings)
    lines: list[str] = []
    summary = run_sweep(settings, runs, announce=lines.append)
    return settings, runs, summary, lines, root / "out"


def test_a_failed_run_is_recorded_and_the_other_finishes_with_its_thread_budget(swept) -> None:
    _, runs, _, lines, out = swept
    assert [run.name for run in runs] == [GOOD, BAD]
    good = json.loads((out / "outcomes" / f"{GOOD}.json").read_text())
    bad = json.loads((out / "outcomes" / f"{BAD}.json").read_text())
    assert good["status"] == "finished" and good["threads"] == 1 and good["resumed"] is False
    assert good["checkpoint"].endswith("step_000004") and (out / "evals" / GOOD / "eval.json").is_file()
    assert (bad["status"], bad["stage"], bad["returncode"]) == ("failed", "train", 2)
    assert "missing.jsonl" in bad["error"] and "missing.jsonl" in (out / "logs" / f"{BAD}.log").read_text()
    assert not (out / "evals" / BAD).exists()
    assert any(line.startswith("[2/2]") for line in lines) and any(f"{BAD} failed in its train" in line
                                                                    for line in lines)


def test_the_summary_has_each_configurations_metrics_and_diversity(swept) -> None:
    _, _, summary, _, out = swept
    good, bad = summary["configurations"]
    assert (good["configuration"], good["finished"], bad["finished"], bad["failed"]) == (
        "attack_data-redteam", 1, 0, [BAD])
    assert summary["metrics"] == ["toxicity/mean", "refusal/mean", "reward/mean"]
    (run,) = [r for r in summary["runs"] if r["name"] == GOOD]
    metrics = [json.loads(line) for line in (out / "runs" / GOOD / "metrics.jsonl").read_text().splitlines()]
    # the final value: the mean of the last 5 logged steps, here all 4
    assert run["final"]["reward/mean"] == pytest.approx(sum(m["reward/mean"] for m in metrics) / 4)
    assert good["metrics"]["reward/mean"]["mean"] == run["final"]["reward/mean"]
    eval_json = json.loads((out / "evals" / GOOD / "eval.json").read_text())
    assert run["diversity"]["distinct_2"] == eval_json["targets"]["step_000004"]["diversity"]["distinct_2"]
    assert run["base_diversity"]["distinct_2"] == eval_json["targets"]["base"]["diversity"]["distinct_2"]
    assert run["collapse"] in (True, False)  # one run: its reward is the median; its diversity decides
    for name in ("summary.csv", "summary.json", "summary.html"):
        assert (out / name).is_file()
    assert json.loads((out / "summary.json").read_text())["configurations"][0]["configuration"] == "attack_data-redteam"


def test_a_rerun_skips_recorded_runs_and_resumes_a_killed_one_from_its_checkpoint(swept) -> None:
    from purplerl.experiments.sweep.execute import run_sweep

    settings, runs, _, _, out = swept
    run_dir = out / "runs" / GOOD
    # what a kill during the run's last steps leaves: no outcome, no summary, no eval, the step-2 checkpoint
    for gone in (out / "outcomes" / f"{GOOD}.json", run_dir / "summary.json"):
        gone.unlink()
    shutil.rmtree(out / "evals" / GOOD)
    shutil.rmtree(run_dir / "checkpoints" / "step_000004")
    bad_log = (out / "logs" / f"{BAD}.log").read_text()
    lines: list[str] = []
    summary = run_sweep(settings, runs, announce=lines.append)
    assert lines[0] == f"1 of 2 runs already have an outcome in {out}: skipped"
    assert (out / "logs" / f"{BAD}.log").read_text() == bad_log  # the failed run was not started again
    outcome = json.loads((out / "outcomes" / f"{GOOD}.json").read_text())
    assert outcome["status"] == "finished" and outcome["resumed"] is True
    assert json.loads((run_dir / "summary.json").read_text())["resumed_from"].endswith("step_000002")
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]
    assert summary["configurations"][0]["finished"] == 1


def test_a_run_no_node_can_hold_is_refused_before_it_waits_forever(cluster) -> None:
    from purplerl.experiments.sweep.execute import check_fits

    check_fits(cluster, SweepResources(cpus_per_run=2))
    with pytest.raises(UserError, match="no node of the Ray cluster has 3 CPUs and 0 GPUs for a run \\(the cluster: "
                                        "2 CPUs, 0 GPUs\\)"):
        check_fits(cluster, SweepResources(cpus_per_run=3))
    with pytest.raises(UserError, match="has 1 CPUs and 0.5 GPUs"):
        check_fits(cluster, SweepResources(gpus_per_run=0.5))


def test_a_task_that_raises_is_a_failed_run_named_by_its_cause(cluster, tmp_path: Path) -> None:
    from purplerl.experiments.sweep.execute import _collect
    from purplerl.experiments.sweep.plan import PlannedRun
    from purplerl.experiments.sweep.task import RunSpec, ray_task

    spec = RunSpec("r", "attack", str(tmp_path / "r.yaml"), str(tmp_path / "runs" / "r"), str(tmp_path / "r.log"),
                   None, cwd=str(tmp_path / "no_such_dir"))
    task = cluster.remote(ray_task).options(num_cpus=1, max_retries=0)
    lines: list[str] = []
    _collect(cluster, {task.remote(spec): PlannedRun("r", "r", {}, 0, None)}, tmp_path, 1, lines.append)
    outcome = json.loads((tmp_path / "outcomes" / "r.json").read_text())
    assert (outcome["status"], outcome["stage"]) == ("failed", "ray")
    assert "No such file or directory" in outcome["error"] and "no_such_dir" in outcome["error"]
    assert lines == [f"[1/1] r failed in its ray: {outcome['error']} (log: {tmp_path / 'logs' / 'r.log'})"]
