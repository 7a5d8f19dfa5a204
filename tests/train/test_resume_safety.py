"""`attack --resume` checks everything before it touches a run, never loses logged work, never runs code from
a checkpoint, and records every change of settings. In-process CLI calls on the tiny random model."""

from __future__ import annotations

import json
import os
import pickle
import warnings
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

from purplerl.cli import app
from purplerl.engines.loading import load_tensors
from purplerl.errors import UserError
from purplerl.runs.checkpoints import sha256_of as _sha256
from purplerl.runs.checkpoints import verify_checkpoint
from purplerl.runs.layout import CHECKPOINTS_DIR as CHECKPOINTS
from purplerl.runs.layout import MANIFEST_FILE
from purplerl.train.checkpoint import save_checkpoint

RUN_ARGS = ["--batch_size", "2", "--group_size", "2", "--max_new_tokens", "6", "--seed", "3", "--save_every", "2",
            "--logging.progress", "false"]


@pytest.fixture(autouse=True)
def _offline(monkeypatch, tmp_path_factory):
    monkeypatch.setenv("PURPLERL_CACHE", str(tmp_path_factory.mktemp("cache")))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def purplerl(*args: str | Path):
    return CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=False)


def one_error_line(result) -> str:
    """The CLI's error: one line on stderr (after any step lines the run printed), no traceback."""
    assert result.exit_code != 0, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip() and not line.startswith("step ")]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output
    return lines[0]


@pytest.fixture
def run(tiny_model_dir: Path, tmp_path: Path) -> Path:
    """A finished 4-step run with checkpoints at steps 2 and 4."""
    result = purplerl("attack", "--model", tiny_model_dir, "--steps", "4", *RUN_ARGS, "--output_dir", tmp_path,
                      "--name", "r")
    assert result.exit_code == 0, result.output
    return tmp_path / "r"


def snapshot(run_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


def steps_logged(run_dir: Path, name: str = "metrics.jsonl") -> list[int]:
    return [json.loads(line)["step"] for line in (run_dir / name).read_text().splitlines()]


class Boom:
    """A pickle whose loading would create a file: the proof that code ran."""

    marker = ""

    def __reduce__(self):
        return (Path(self.marker).touch, ())


def plant_pickle(path: Path, marker: Path) -> None:
    """Replace a checkpoint file with a code-running pickle and re-seal the manifest, as an attacker with write
    access to the run dir would: only the loader's own refusal stands between the file and the code."""
    Boom.marker = str(marker)
    path.write_bytes(pickle.dumps({"state": Boom()}))
    manifest_path = path.parent / MANIFEST_FILE
    manifest = json.loads(manifest_path.read_text())
    manifest["files"][path.name] = {"size": path.stat().st_size, "sha256": _sha256(path)}
    manifest_path.write_text(json.dumps(manifest))
    assert verify_checkpoint(path.parent) is None


@pytest.mark.parametrize("name", ["optimizer.pt", "rng_state.pt"])
def test_a_code_running_pickle_in_a_checkpoint_is_refused_unrun(run: Path, tmp_path: Path, name: str) -> None:
    marker = tmp_path / "pwned"
    plant_pickle(run / CHECKPOINTS / "step_000004" / name, marker)
    before = snapshot(run)
    line = one_error_line(purplerl("attack", "--resume", run, "--steps", "6"))
    assert name in line and "refused without unpickling" in line
    assert not marker.exists()
    assert snapshot(run) == before


def test_the_refusal_of_a_pickle_is_the_only_thing_said(tmp_path: Path) -> None:
    """A pickle torch.save did not write makes torch warn about its protocol first: the refusal says it all."""
    Boom.marker = str(tmp_path / "pwned")
    path = tmp_path / "optimizer.pt"
    path.write_bytes(pickle.dumps({"state": Boom()}))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(UserError, match="refused without unpickling"):
            load_tensors(path, torch.device("cpu"))
    assert [str(w.message) for w in caught] == []
    assert not (tmp_path / "pwned").exists()


def test_the_torch_torch_load_calls_of_purplerl_are_all_weights_only() -> None:
    import purplerl

    root = Path(purplerl.__file__).parent
    calls = [(p.name, line.strip()) for p in root.rglob("*.py") for line in p.read_text().splitlines()
             if "torch.load(" in line]
    assert calls and all("weights_only=True" in line for _, line in calls), calls


def test_a_damaged_newest_checkpoint_falls_back_with_one_warning(run: Path) -> None:
    (run / CHECKPOINTS / "step_000004" / "optimizer.pt").write_bytes(b"")
    result = purplerl("attack", "--resume", run, "--steps", "6")
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "step_000004: optimizer.pt is 0 bytes" in warnings[0]
    assert "resuming from step_000002" in warnings[0]
    assert steps_logged(run) == [1, 2, 3, 4, 5, 6]  # steps 3 and 4 were redone, not duplicated
    assert json.loads((run / "summary.json").read_text())["resumed_from"].endswith("step_000002")
    assert verify_checkpoint(run / CHECKPOINTS / "step_000004") is None  # rewritten intact


def test_no_intact_checkpoint_is_one_line_and_touches_nothing(run: Path) -> None:
    (run / CHECKPOINTS / "step_000004" / "adapter_model.safetensors").write_bytes(b"\0" * 7)
    (run / CHECKPOINTS / "step_000002" / "loop_state.json").write_text("garbage")
    before = snapshot(run)
    line = one_error_line(purplerl("attack", "--resume", run, "--steps", "6"))
    assert "no intact checkpoint" in line and "step_000004: adapter_model.safetensors is 7 bytes" in line
    assert "step_000002: loop_state.json is 7 bytes" in line and "--restart" in line
    assert snapshot(run) == before


def test_logs_without_checkpoints_are_refused_until_restart(run: Path) -> None:
    for checkpoint in (run / CHECKPOINTS).iterdir():
        for f in checkpoint.iterdir():
            f.unlink()
        checkpoint.rmdir()
    before = snapshot(run)
    line = one_error_line(purplerl("attack", "--resume", run))
    assert "has logs up to step 4 but no checkpoint" in line and f"--resume {run} --restart" in line
    assert snapshot(run) == before
    restarted = purplerl("attack", "--resume", run, "--restart")
    assert restarted.exit_code == 0, restarted.output
    assert steps_logged(run) == [1, 2, 3, 4]
    history = [json.loads(line) for line in (run / "config_history.jsonl").read_text().splitlines()]
    assert history[-1]["restarted"] and history[-1]["from_step"] == 1


def test_restart_refuses_to_throw_away_an_intact_checkpoint(run: Path) -> None:
    line = one_error_line(purplerl("attack", "--resume", run, "--restart", "--steps", "6"))
    assert "would throw away the intact checkpoint" in line


def test_a_missing_data_file_or_dead_reward_server_leaves_the_logs_alone(tiny_model_dir: Path, tmp_path: Path) -> None:
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"Insult number {i}."}) + "\n" for i in range(4)))
    first = purplerl("attack", "--model", tiny_model_dir, "--steps", "3", *RUN_ARGS, "--output_dir", tmp_path,
                     "--name", "d", "--data", data)
    assert first.exit_code == 0, first.output
    run = tmp_path / "d"
    # a torn last line, as a kill mid-write leaves it: the resume that fails must keep it, the one that runs drops it
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 4, "rew')
    before = snapshot(run)
    dead = purplerl("attack", "--resume", run, "--steps", "5", "--reward.terms.toxicity.params.url",
                    "http://127.0.0.1:9", "--reward.terms.toxicity.params.retries", "0")
    assert "reward server http://127.0.0.1:9" in one_error_line(dead)
    assert snapshot(run) == before
    data.rename(tmp_path / "moved.jsonl")
    assert "prompts.jsonl" in one_error_line(purplerl("attack", "--resume", run, "--steps", "5"))
    assert snapshot(run) == before
    (tmp_path / "moved.jsonl").rename(data)
    resumed = purplerl("attack", "--resume", run, "--steps", "5")
    assert resumed.exit_code == 0, resumed.output
    assert steps_logged(run) == [1, 2, 3, 4, 5]


@pytest.mark.parametrize(("option", "value"), [
    ("--lora_rank", "4"), ("--model.lora_targets", "q_proj"), ("--group_size", "3"), ("--seed", "9"),
    ("--model", "embedded:smollm2-135m-instruct"), ("--batch_size", "1"), ("--name", "other"),
    ("--model.finetune", "full"), ("--data.source", "prompts.jsonl"), ("--data.limit", "3"),
])
def test_overrides_that_change_the_experiment_are_refused(run: Path, option: str, value: str) -> None:
    before = snapshot(run)
    line = one_error_line(purplerl("attack", "--resume", run, "--steps", "6", option, value))
    assert "cannot change when resuming" in line
    assert snapshot(run) == before


def test_changed_settings_are_recorded_and_kept(run: Path) -> None:
    result = purplerl("attack", "--resume", run, "--steps", "6", "--lr", "0.0005")
    assert result.exit_code == 0, result.output
    text = (run / "config.yaml").read_text()
    assert "# from step 5 (resumed): training.lr 0.0001 -> 0.0005" in text
    assert "# from step 5 (resumed): training.steps 4 -> 6" in text
    config = yaml.safe_load(text)
    assert config["training"]["lr"] == 0.0005 and config["training"]["steps"] == 6
    history = [json.loads(line) for line in (run / "config_history.jsonl").read_text().splitlines()]
    assert [h["from_step"] for h in history] == [1, 5]
    assert history[0]["config"]["training"]["lr"] == 0.0001
    assert history[1]["changed"] == {"training.steps": [4, 6], "training.lr": [0.0001, 0.0005]}
    # a plain resume continues with what ran last, not the first segment's values
    again = purplerl("attack", "--resume", run, "--steps", "8")
    assert again.exit_code == 0, again.output
    history = [json.loads(line) for line in (run / "config_history.jsonl").read_text().splitlines()]
    assert history[-1]["changed"] == {"training.steps": [6, 8]}
    assert history[-1]["config"]["training"]["lr"] == 0.0005
    lrs = [json.loads(line)["train/lr"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert lrs == [0.0001] * 4 + [0.0005] * 4


def _edit_config(run: Path, section: str, field: str, value: object) -> None:
    """Edit one setting of the run's config.yaml by hand, keeping its comment header."""
    path = run / "config.yaml"
    text = path.read_text()
    config = yaml.safe_load(text)
    config[section][field] = value
    header = "".join(line + "\n" for line in text.splitlines() if line.startswith("#"))
    path.write_text(header + yaml.safe_dump(config, sort_keys=False))


@pytest.mark.parametrize(("section", "field", "value"), [
    ("sampling", "group_size", 3), ("training", "seed", 9), ("training", "batch_size", 1),
    ("data", "source", "prompts.jsonl"),
])
def test_a_fixed_setting_edited_in_config_yaml_is_refused(run: Path, section: str, field: str, value: object) -> None:
    _edit_config(run, section, field, value)
    before = snapshot(run)
    line = one_error_line(purplerl("attack", "--resume", run, "--steps", "6"))
    assert f"{section}.{field} was edited in {run / 'config.yaml'} and cannot change when resuming" in line
    assert snapshot(run) == before


def test_other_edits_of_config_yaml_are_recorded_like_options(run: Path) -> None:
    _edit_config(run, "training", "lr", 0.0005)
    result = purplerl("attack", "--resume", run, "--steps", "6")
    assert result.exit_code == 0, result.output
    text = (run / "config.yaml").read_text()
    assert "# from step 5 (edited in config.yaml): training.lr 0.0001 -> 0.0005" in text
    assert "# from step 5 (resumed): training.steps 4 -> 6" in text
    history = [json.loads(line) for line in (run / "config_history.jsonl").read_text().splitlines()]
    assert history[-1]["changed"] == {"training.steps": [4, 6], "training.lr": [0.0001, 0.0005]}
    assert history[-1]["edited"] == ["training.lr"]
    lrs = [json.loads(line)["train/lr"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert lrs == [0.0001] * 4 + [0.0005] * 2
    # an option given with the edit wins, and is an option's change
    _edit_config(run, "training", "lr", 0.002)
    again = purplerl("attack", "--resume", run, "--steps", "7", "--lr", "0.001")
    assert again.exit_code == 0, again.output
    history = [json.loads(line) for line in (run / "config_history.jsonl").read_text().splitlines()]
    assert history[-1]["changed"] == {"training.steps": [6, 7], "training.lr": [0.0005, 0.001]}
    assert "edited" not in history[-1]


def test_the_header_lists_every_resume_after_a_second_one(run: Path) -> None:
    assert purplerl("attack", "--resume", run, "--steps", "6", "--lr", "0.0005").exit_code == 0
    assert purplerl("attack", "--resume", run, "--steps", "8", "--max_grad_norm", "0.5").exit_code == 0
    header = [line for line in (run / "config.yaml").read_text().splitlines() if line.startswith("#")][:4]
    assert header == [
        "# the settings below are in force from the last resume on; every segment's full config is in "
        "config_history.jsonl",
        "# from step 5 (resumed): training.steps 4 -> 6",
        "# from step 5 (resumed): training.lr 0.0001 -> 0.0005",
        "# from step 7 (resumed): training.steps 6 -> 8",
    ]
    assert "# from step 7 (resumed): training.max_grad_norm 1.0 -> 0.5" in (run / "config.yaml").read_text()
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert (config["training"]["lr"], config["training"]["steps"], config["training"]["max_grad_norm"]) == \
        (0.0005, 8, 0.5)


def test_a_config_yaml_that_no_longer_parses_names_both_files(run: Path) -> None:
    (run / "config.yaml").write_text("training: {lr: [unclosed\n")
    before = snapshot(run)
    line = one_error_line(purplerl("attack", "--resume", run, "--steps", "6"))
    assert "config.yaml" in line and "config_history.jsonl" in line
    assert snapshot(run) == before


def test_a_config_yaml_of_another_run_is_refused_naming_both_files(run: Path) -> None:
    rows = [json.loads(line) for line in (run / "config_history.jsonl").read_text().splitlines()]
    rows[-1]["config"]["recipe"] = "defend"
    (run / "config_history.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    before = snapshot(run)
    line = one_error_line(purplerl("attack", "--resume", run, "--steps", "6"))
    assert "config.yaml does not match" in line and "config_history.jsonl" in line
    assert snapshot(run) == before


def test_stale_temporaries_are_removed_when_a_resume_starts(run: Path) -> None:
    stale = run / CHECKPOINTS / "step_000006.tmp"
    stale.mkdir()
    (stale / "optimizer.pt").write_bytes(b"x" * 1000)
    result = purplerl("attack", "--resume", run, "--steps", "5")
    assert result.exit_code == 0, result.output
    assert not stale.exists()


def test_a_full_disk_while_saving_is_one_line_and_resumable(run: Path, monkeypatch) -> None:
    from purplerl.engines.local import LocalEngine

    real_save = LocalEngine.save

    def save_onto_a_full_disk(self, path: Path) -> None:
        (Path(path) / "optimizer.pt").symlink_to("/dev/full")  # the kernel answers every write with ENOSPC
        real_save(self, path)

    monkeypatch.setattr(LocalEngine, "save", save_onto_a_full_disk)
    line = one_error_line(purplerl("attack", "--resume", run, "--steps", "6"))
    assert "step 6: cannot write a checkpoint" in line and "the disk is full" in line and "MiB free" in line
    assert "newest intact checkpoint step_000004 is kept" in line
    assert sorted(p.name for p in (run / CHECKPOINTS).iterdir()) == ["step_000002", "step_000004"]
    monkeypatch.setattr(LocalEngine, "save", real_save)
    resumed = purplerl("attack", "--resume", run, "--steps", "6")
    assert resumed.exit_code == 0, resumed.output
    assert steps_logged(run) == [1, 2, 3, 4, 5, 6]


def test_engine_load_refuses_another_lora_shape_in_one_line(run: Path, tiny_model_dir: Path) -> None:
    from purplerl.config import ModelConfig
    from purplerl.engines.local import LocalEngine
    from purplerl.errors import UserError

    engine = LocalEngine(ModelConfig(name=str(tiny_model_dir), lora_rank=4))
    with pytest.raises(UserError, match="does not match the model") as err:
        engine.load(run / CHECKPOINTS / "step_000004")
    assert "\n" not in str(err.value)


def test_a_checkpoint_saved_by_the_engine_loads_back_exactly(run: Path, tiny_model_dir: Path, tmp_path) -> None:
    from purplerl.config import ModelConfig
    from purplerl.engines.local import LocalEngine

    engine = LocalEngine(ModelConfig(name=str(tiny_model_dir)))
    engine.load(run / CHECKPOINTS / "step_000004")
    saved = save_checkpoint(tmp_path, 4, engine, {"finished": True}, keep_last=1)
    for name in ("optimizer.pt", "rng_state.pt"):
        a = torch.load(run / CHECKPOINTS / "step_000004" / name, weights_only=True)
        b = torch.load(saved / name, weights_only=True)
        assert repr(a) == repr(b), name
    assert os.path.getsize(saved / "adapter_model.safetensors") > 0
