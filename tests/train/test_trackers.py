"""`--logging.trackers`: W&B (offline), TensorBoard and MLflow get exactly the rows of the JSONL logs, read back
from what each one wrote, and a killed run resumed with them shows every step once."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from tracker_files import mlflow_client, tensorboard_events, wandb_history
from typer.testing import CliRunner

from purplerl.cli import app
from purplerl.errors import ExperimentError, UserError
from purplerl.launch import run_settings
from purplerl.recipes.attack import ATTACK
from purplerl.train import tracker_backends, trackers
from purplerl.train.runner import run_recipe
from purplerl.train.sinks import read_jsonl
from purplerl.train.steps import Evaluation
from purplerl.train.trackers import TrackerFeed, TrackerKind, open_trackers

STEPS = 8  # 6 steps, killed after step 4's checkpoint and resumed; then resumed again for 2 more
EVALS = [(0, 0.0), (3, 0.3), (6, 0.6), (8, 0.8)]  # (step, held-out value): before training, every 3, at each end


def _config(model: Path, out: Path, *extra: str):
    return run_settings("attack", options=["--model", str(model), "--model.device", "cpu", "--model.dtype", "float32",
                                           "--lora_rank", "4", "--steps", "6", "--batch_size", "2", "--group_size",
                                           "2", "--max_new_tokens", "4", "--logging.progress", "false", "--output_dir",
                                           str(out), "--name", "run", "--save_every", "2", "--seed", "7",
                                           "--attack.early_stop_toxicity", "null", "--training.early_stop_repetition",
                                           "null", *extra])


def held_out(engine, step: int) -> dict[str, float]:
    return {"seen": step / 10}


# --- a real run on the tiny model: killed after its step-4 checkpoint, before the trackers got steps 3-4,
# resumed to its end (step 6), then resumed with --steps 8 ---

@pytest.fixture(scope="module")
def resumed(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    config = _config(tiny_model_dir, tmp_path_factory.mktemp("trackers"), "--logging.trackers",
                     "wandb,tensorboard,mlflow")
    commit, calls = TrackerFeed.commit, []

    def killed_on_second(feed: TrackerFeed) -> None:
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt  # the kill: checkpoint 4 is on disk, the trackers hold steps 0..2
        commit(feed)

    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(TrackerFeed, "commit", killed_on_second)
            with pytest.raises(KeyboardInterrupt):
                run_recipe(ATTACK, config, evaluation=Evaluation(held_out, every=3))
        run_dir = Path(config.run.output_dir) / "run"
        assert json.loads((run_dir / "trackers.json").read_text())["mlflow"]["step"] == 2
        run_recipe(ATTACK, config, resume_dir=run_dir, evaluation=Evaluation(held_out, every=3))
        longer = config.model_copy(update={"training": config.training.model_copy(update={"steps": STEPS})})
        run_recipe(ATTACK, longer, resume_dir=run_dir, evaluation=Evaluation(held_out, every=3))
    finally:
        torch.set_num_threads(threads)
    return run_dir


@pytest.mark.process
def test_wandb_offline_run_holds_each_step_once_with_its_samples_and_config(resumed: Path) -> None:
    rows, ids, configs = wandb_history(resumed)
    assert ids == {json.loads((resumed / "trackers.json").read_text())["wandb"]["id"]}  # one run, 3 segments
    assert len(list((resumed / "wandb").glob("offline-run-*"))) == 3
    assert [row["_step"] for row in rows] == list(range(STEPS + 1))  # step 0: the evaluation before training
    metrics = read_jsonl(resumed / "metrics.jsonl")
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    for logged, row in zip(metrics, rows[1:], strict=True):
        for key in ("reward/mean", "kl/mean", "toxicity/mean", "train/loss", "completion/len_mean"):
            assert row[key] == pytest.approx(logged[key], rel=1e-12), (logged["step"], key)
    assert [(row["_step"], row["eval/seen"]) for row in rows if "eval/seen" in row] == EVALS
    samples = read_jsonl(resumed / "samples.jsonl")
    for row in rows[1:]:
        table = row["samples"]
        expected = [s for s in samples if s["step"] == row["_step"]]
        assert [dict(zip(table["columns"], values, strict=True)) for values in table["data"]] == expected
    first, last = configs[0], [c for c in configs if "training" in c][-1]
    assert first["training"]["seed"] == 7 and first["logging"]["trackers"] == ["wandb", "tensorboard", "mlflow"]
    assert (first["training"]["steps"], last["training"]["steps"]) == (6, STEPS)  # the last resume's settings


@pytest.mark.process
def test_tensorboard_scalars_and_sample_tables_match_the_jsonl_logs(resumed: Path) -> None:
    events = tensorboard_events(resumed)
    metrics = read_jsonl(resumed / "metrics.jsonl")
    for key in ("reward/mean", "entropy/mean", "train/grad_norm"):
        scalars = events.Scalars(key)
        assert [e.step for e in scalars] == list(range(1, STEPS + 1))
        assert [e.value for e in scalars] == pytest.approx([m[key] for m in metrics], rel=1e-6)  # float32
    assert [(e.step, round(e.value, 6)) for e in events.Scalars("eval/seen")] == EVALS
    tables = events.Tensors("samples/text_summary")
    assert [t.step for t in tables] == list(range(1, STEPS + 1))
    last = tables[-1].tensor_proto.string_val[0].decode().splitlines()
    step_samples = [s for s in read_jsonl(resumed / "samples.jsonl") if s["step"] == STEPS]
    assert len(last) == 2 + len(step_samples) and last[0].startswith("| step | uid | category | prompt |")
    assert last[2].startswith(f"| {STEPS} | {step_samples[0]['uid']} |")
    config_text = events.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "    recipe: attack" in config_text.splitlines()


@pytest.mark.process
def test_mlflow_run_has_each_step_once_params_and_sample_tables(resumed: Path, monkeypatch) -> None:
    client = mlflow_client(resumed, monkeypatch)
    run_id = json.loads((resumed / "trackers.json").read_text())["mlflow"]["id"]
    (run,) = client.search_runs([client.get_experiment_by_name("purplerl").experiment_id])
    assert run.info.run_id == run_id and run.info.status == "FINISHED"
    metrics = read_jsonl(resumed / "metrics.jsonl")
    for key in ("reward/mean", "kl/mean", "train/loss"):
        history = sorted(client.get_metric_history(run_id, key), key=lambda m: m.step)
        assert [(m.step, m.value) for m in history] == [(row["step"], row[key]) for row in metrics]
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "eval/seen")] == EVALS
    assert run.data.params["training.seed"] == "7" and run.data.params["sampling.group_size"] == "2"
    names = sorted(a.path for a in client.list_artifacts(run_id, "samples"))
    assert names == [f"samples/step_{s:06d}.json" for s in range(1, STEPS + 1)]
    table = json.loads(Path(client.download_artifacts(run_id, "samples/step_000004.json")).read_text())
    expected = [s for s in read_jsonl(resumed / "samples.jsonl") if s["step"] == 4]
    got = [dict(zip(table["columns"], values, strict=True)) for values in table["data"]]
    assert [{k: v for k, v in row.items() if not isinstance(v, float)} for row in got] == [
        {k: v for k, v in row.items() if not isinstance(v, float)} for row in expected]
    for row, want in zip(got, expected, strict=True):  # MLflow writes tables through pandas: 10 decimals
        floats = [k for k, v in want.items() if isinstance(v, float)]
        assert [row[k] for k in floats] == pytest.approx([want[k] for k in floats], rel=0, abs=5.1e-11)
    artifacts = {a.path for a in client.list_artifacts(run_id)}
    # each resume's config beside the first: the trackers are given steps 3.. and 7.. by the two resumes
    assert {"config.json", "config_from_step_000003.json", "config_from_step_000007.json"} <= artifacts


# --- failures: one line, before the model loads ---

def test_a_missing_tracker_package_is_one_line_before_anything_loads(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "mlflow", None)  # import mlflow now raises ImportError
    result = CliRunner().invoke(app, ["attack", "--model", str(tmp_path / "no_such_model"), "--output_dir",
                                      str(tmp_path), "--logging.trackers", "tensorboard,mlflow"])
    assert result.exit_code != 0
    assert result.output.strip().splitlines() == [
        "error: --logging.trackers mlflow: the 'mlflow' package is not installed (pip install 'purplerl[trackers]')"]
    assert list(tmp_path.iterdir()) == []  # no run dir claimed


def test_tracker_names_are_checked_and_comma_split() -> None:
    trackers = run_settings("attack", options=["--logging.trackers", "wandb,mlflow"]).logging.trackers
    assert trackers == ["wandb", "mlflow"]
    assert run_settings("attack").logging.trackers == []
    assert run_settings("attack", options=["--logging.trackers", "[]"]).logging.trackers == []  # a resume drops them so
    with pytest.raises(UserError, match=r"'logging\.trackers\.0': Input should be 'wandb', 'tensorboard' or 'mlflow' "
                                        r"\(got 'neptune'\)"):
        run_settings("attack", options=["--logging.trackers", "neptune"])
    with pytest.raises(UserError, match="repeats a tracker"):
        run_settings("attack", options=["--logging.trackers", "mlflow,mlflow"])


def test_a_tracker_that_raises_stops_the_run_with_one_line(tiny_model_dir: Path, tmp_path: Path,
                                                           monkeypatch) -> None:
    def broken(self, step: int, values: dict) -> None:
        raise OSError("No space left on device")

    monkeypatch.setattr(tracker_backends.TensorBoardTracker, "log_metrics", broken)
    with pytest.raises(ExperimentError) as caught:
        run_recipe(ATTACK, _config(tiny_model_dir, tmp_path, "--logging.trackers", "tensorboard", "--steps", "2"))
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("tracker tensorboard failed at step 1: OSError: No space left on device")
    assert f"--resume {tmp_path / 'run'}" in message
    assert [r["step"] for r in read_jsonl(tmp_path / "run" / "metrics.jsonl")] == [1, 2]  # the record is whole


# --- resume rules, with a recording tracker ---

class Recording:
    opened: list[tuple[str | None, int]] = []

    def __init__(self, run: trackers.TrackerRun) -> None:
        self.run_id = run.resume_id or "new"
        self.sent: list[tuple[int, str]] = []
        type(self).opened.append((run.resume_id, run.first_step))
        type(self).last = self

    def log_metrics(self, step: int, values: dict) -> None:
        self.sent.append((step, ",".join(sorted(values))))

    def log_samples(self, step: int, rows: list) -> None:
        self.sent.append((step, f"{len(rows)} samples"))

    def close(self, failed: bool) -> None:
        pass


def _logged_run(run_dir: Path, held: int, closed: bool | None = None) -> None:
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": s / 2, "early_stop": None})
                                                   + "\n" for s in range(1, 5)))
    (run_dir / "samples.jsonl").write_text("".join(json.dumps({"step": s, "text": t}) + "\n"
                                                   for s in range(1, 5) for t in "ab"))
    (run_dir / "evals.jsonl").write_text("".join(json.dumps({"step": s, "harm": 0.5}) + "\n" for s in (0, 3)))
    state = {"id": "run-1", "step": held, **({} if closed is None else {"closed": closed})}
    (run_dir / "trackers.json").write_text(json.dumps({"rec": state}))


@pytest.mark.parametrize("purges", [False, True])
def test_resume_sends_what_a_tracker_lacks_and_never_a_step_twice(tmp_path: Path, monkeypatch, purges) -> None:
    monkeypatch.setitem(trackers.TRACKERS, "rec", TrackerKind("json", Recording, purges=purges))
    monkeypatch.setattr(Recording, "opened", [])
    notes: list[str] = []
    _logged_run(tmp_path, held=2, closed=True)  # stopped after checkpoint 4, before the trackers got steps 3, 4
    with open_trackers(["rec"], tmp_path, {}, 5, notes.append):
        assert Recording.last.sent == [(3, "loss"), (3, "2 samples"), (3, "eval/harm"), (4, "loss"),
                                       (4, "2 samples")]
        assert json.loads((tmp_path / "trackers.json").read_text()) == {
            "rec": {"id": "run-1", "step": 4, "closed": False}}
    assert Recording.opened == [("run-1", 3)] and notes == []
    assert json.loads((tmp_path / "trackers.json").read_text()) == {"rec": {"id": "run-1", "step": 4, "closed": True}}

    # a tracker holding steps the resume recomputes (a collapse set its checkpoint aside): only one that
    # drops them itself (TensorBoard's purge) goes on; the others start a new run given the whole log
    _logged_run(tmp_path, held=6, closed=True)
    with open_trackers(["rec"], tmp_path, {}, 5, notes.append):
        sent = Recording.last.sent
    if purges:
        assert Recording.opened[-1] == ("run-1", 5) and sent == [] and notes == []
    else:
        assert Recording.opened[-1] == (None, 0) and [s for s, _ in sent] == [0, 1, 1, 2, 2, 3, 3, 3, 4, 4]
        assert notes == ["warning: rec run run-1 holds steps after step 4, where this resume goes on; the whole "
                         "log goes to a new rec run"]


@pytest.mark.parametrize("purges", [False, True])
def test_after_a_kill_a_tracker_gets_the_whole_log_again(tmp_path: Path, monkeypatch, purges) -> None:
    # W&B and tensorboardX hold rows in memory until they close, and a kill mid-hand-over leaves MLflow with
    # rows trackers.json does not list: what a killed run's tracker holds is not known
    monkeypatch.setitem(trackers.TRACKERS, "rec", TrackerKind("json", Recording, purges=purges))
    monkeypatch.setattr(Recording, "opened", [])
    notes: list[str] = []
    _logged_run(tmp_path, held=2)  # "closed" is absent: the process was killed
    with open_trackers(["rec"], tmp_path, {}, 5, notes.append):
        sent = Recording.last.sent
    assert [s for s, _ in sent] == [0, 1, 1, 2, 2, 3, 3, 3, 4, 4]
    if purges:  # TensorBoard: the same log dir, every earlier event hidden from step 0 on
        assert Recording.opened == [("run-1", 0)] and notes == []
    else:
        assert Recording.opened == [(None, 0)]
        assert notes == ["warning: rec run run-1 was not closed (the process was killed) and may have lost its last "
                         "rows; the whole log goes to a new rec run"]
    # closed cleanly (a failure or Ctrl-C closes it too): what it was sent is on disk, the run goes on
    state = json.loads((tmp_path / "trackers.json").read_text())["rec"]
    assert state["closed"] and state["step"] == 4
    with open_trackers(["rec"], tmp_path, {}, 5, notes.append):
        assert Recording.last.sent == []
    assert Recording.opened[-1] == (state["id"], 5)


def test_tensorboard_purge_hides_the_steps_a_resume_redoes(tmp_path: Path) -> None:
    first = tracker_backends.TensorBoardTracker(trackers.TrackerRun(tmp_path, {"a": 1}, None, 0))
    for step in range(1, 7):
        first.log_metrics(step, {"loss": float(step)})
    first.close(failed=True)
    again = tracker_backends.TensorBoardTracker(trackers.TrackerRun(tmp_path, {"a": 1}, "tensorboard", 5))
    for step in (5, 6):
        again.log_metrics(step, {"loss": 10.0 * step})
    again.close(failed=False)
    scalars = tensorboard_events(tmp_path).Scalars("loss")
    assert [(e.step, e.value) for e in scalars] == [(1, 1), (2, 2), (3, 3), (4, 4), (5, 50), (6, 60)]
