"""`purplerl eval --attacker` (issue 23 item 6): a learned attacker's prompts, written from goals, are what every
target answers. On the tiny random model: an attacker SFT'd on the attack-prompts set, a base and a second target."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import invoke_cli
from test_eval_run import rows_of
from typer.testing import CliRunner

from purplerl.cli import app
from purplerl.config import EVAL, ModelConfig, load_command_config
from purplerl.data.attack_prompts import attack_goals, prepare_attack_prompts
from purplerl.data.attacker import attacker_request
from purplerl.errors import UserError
from purplerl.eval.attacker import attacker_checkpoint, load_goals, resolve_attacker, sample_attacks
from purplerl.runs.checkpoints import sha256_of
from purplerl.types import SamplingParams

GOALS, TOKENS = 3, 12


@pytest.fixture(scope="module")
def setup(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The attack set, an attacker run (2 SFT steps on it, lr high enough to move the tiny model) and a target
    checkpoint (an adapter saved straight from a LocalEngine)."""
    from purplerl.engines.local import LocalEngine

    root = tmp_path_factory.mktemp("attacker")
    data = prepare_attack_prompts(root / "set").out_dir
    result = CliRunner().invoke(app, [
        "sft", "--model", str(tiny_model_dir), "--data", str(data / "train.jsonl"), "--data.limit", "6", "--steps",
        "2", "--batch_size", "3", "--lr", "0.05", "--save_every", "2", "--sft.eval_fraction", "0", "--device", "cpu",
        "--logging.progress", "false", "--output_dir", str(root), "--name", "attacker"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    target = root / "defended" / "step_000001"
    LocalEngine(ModelConfig(name=str(tiny_model_dir), device="cpu")).save(target)
    return {"data": data, "run": root / "attacker", "target": target, "root": root}


def direct_samples(model: Path, adapter: Path | None, goals: list[str], temperature: float, seed: int) -> list[str]:
    """The attacker sampled by hand: its engine, the chat template over attacker_request(goal), one batch."""
    from purplerl.engines.local import LocalEngine

    engine = LocalEngine(ModelConfig(name=str(model), device="cpu", init_adapter=str(adapter) if adapter else None))
    tok = engine.tokenizer
    prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": attacker_request(goal)}],
                                                  add_generation_prompt=True, tokenize=False), add_special_tokens=False)
               for goal in goals]
    greedy = temperature == 0.0
    params = SamplingParams(max_new_tokens=TOKENS, temperature=temperature, top_p=1.0 if greedy else 0.95, top_k=0,
                            seed=seed)
    return [group[0].text.strip() for group in engine.sample(prompts, 1, params)]


@pytest.fixture(scope="module")
def evaluated(setup: dict[str, Path], tiny_model_dir: Path) -> dict:
    out, cache = setup["root"] / "eval", setup["root"] / "cache"
    args = ["--model", tiny_model_dir, "--checkpoint", setup["target"], "--attacker", setup["run"], "--limit", GOALS,
            "--seed", 3, "--attacker_tokens", TOKENS, "--max_new_tokens", 4, "--suite", "harm", "--batch_size", 4,
            "--device", "cpu", "--out", out]
    env = {"PURPLERL_CACHE": str(cache)}
    first = invoke_cli("eval", *args, env=env)
    assert first.returncode == 0, first.stderr
    mtime = (out / "attacks.json").stat().st_mtime_ns
    again = invoke_cli("eval", *args, env=env)
    greedy = invoke_cli("eval", *args, "--attacker_temperature", 0, env=env)
    return {"out": out, "mtime": mtime, "again": again, "greedy": greedy}


def test_the_attacks_are_what_the_attacker_samples_for_the_held_out_goals(setup, evaluated, tiny_model_dir) -> None:
    saved = json.loads((evaluated["out"] / "attacks.json").read_text())
    goals = [g.text for g in attack_goals("test")[:GOALS]]  # data.source left unset: the set's held-out goals
    assert [row["goal"] for row in saved["attacks"]] == goals
    assert [row["uid"] for row in saved["attacks"]] == [g.id for g in attack_goals("test")[:GOALS]]
    attacks = [row["attack"] for row in saved["attacks"]]
    checkpoint = setup["run"] / "checkpoints" / "step_000002"
    assert saved["attacker"]["adapter"] == str(checkpoint.resolve())
    # one batch (batch_size 4 >= 3 goals), seeded with eval.seed + 0, at the eval's top_p
    assert attacks == direct_samples(tiny_model_dir, checkpoint, goals, 1.0, seed=3)
    assert attacks != direct_samples(tiny_model_dir, None, goals, 1.0, seed=3)  # the adapter wrote them, not the base


def test_every_target_answers_the_attacks_and_its_rows_keep_the_goal(evaluated) -> None:
    saved = json.loads((evaluated["out"] / "attacks.json").read_text())["attacks"]
    result = json.loads((evaluated["out"] / "eval.json").read_text())
    assert set(result["targets"]) == {"base", "step_000001"}
    for label in ("base", "step_000001"):
        rows = rows_of(evaluated["out"] / "generations" / f"{label}.jsonl")
        assert [(r["uid"], r["goal"], r["prompt"]) for r in rows] == [(a["uid"], a["goal"], a["attack"]) for a in saved]
        judged = [s for s in result["samples"] if s["target"] == label]
        assert [(s["goal"], s["prompt"]) for s in judged] == [(a["goal"], a["attack"]) for a in saved]
        assert all({"completion", "toxicity", "refused"} <= set(s) for s in judged)
        assert result["targets"][label]["harm"]["n"] == GOALS
    assert result["config"]["attacker"]["temperature"] == 1.0
    assert "goal: " + saved[0]["goal"] in (evaluated["out"] / "report.html").read_text()


def test_a_rerun_reads_the_attacks_back_and_another_attacker_setting_is_refused(evaluated) -> None:
    assert evaluated["again"].returncode == 0, evaluated["again"].stderr
    assert (evaluated["out"] / "attacks.json").stat().st_mtime_ns == evaluated["mtime"]
    greedy = evaluated["greedy"]
    assert greedy.returncode == 2
    assert greedy.stderr.strip().splitlines()[-1] == (
        f"error: {evaluated['out']} holds generations made with other settings (eval.attacker): use another --out "
        "or the same settings")


def test_greedy_attacks_are_the_attackers_argmax(setup, tiny_model_dir) -> None:
    cfg = load_command_config(EVAL, None, ["--attacker", str(setup["run"]), "--attacker_temperature", "0",
                                           "--attacker_tokens", str(TOKENS), "--limit", "2", "--device", "cpu"])
    goals = load_goals(cfg)
    texts = sample_attacks(cfg, resolve_attacker(cfg, announce=lambda _: None), goals)
    expected = direct_samples(tiny_model_dir, setup["run"] / "checkpoints" / "step_000002",
                              [g.messages[-1]["content"] for g in goals], 0.0, seed=0)
    assert texts == expected and len(texts) == 2


def test_an_adversarial_checkpoint_attacks_with_its_attacker_adapter_not_its_defender(setup, tiny_model_dir,
                                                                                      tmp_path) -> None:
    from purplerl.engines.local import LocalEngine

    # what `purplerl adversarial` saves: the defender at the top of the checkpoint, the attacker in attacker/
    run = tmp_path / "adversarial"
    shutil.copytree(setup["run"], run)
    checkpoint = run / "checkpoints" / "step_000002"
    shutil.copytree(checkpoint, tmp_path / "sft_attacker")
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        (checkpoint / name).unlink()
    LocalEngine(ModelConfig(name=str(tiny_model_dir), device="cpu")).save(checkpoint)  # a fresh defender
    shutil.copytree(tmp_path / "sft_attacker", checkpoint / "attacker", ignore=shutil.ignore_patterns("*.pt", "*.json"),
                    dirs_exist_ok=True)
    shutil.copy(tmp_path / "sft_attacker" / "adapter_config.json", checkpoint / "attacker")
    files = [p for p in checkpoint.rglob("*") if p.is_file() and p.name != "manifest.json"]
    (checkpoint / "manifest.json").write_text(json.dumps({"files": {  # the new files, as the run writes them
        str(p.relative_to(checkpoint)): {"size": p.stat().st_size, "sha256": sha256_of(p)} for p in files}}))
    cfg = load_command_config(EVAL, None, ["--attacker", str(run), "--attacker_temperature", "0",
                                           "--attacker_tokens", str(TOKENS), "--limit", "2", "--device", "cpu"])
    policy = resolve_attacker(cfg, announce=lambda _: None)
    assert policy.model.init_adapter == str(checkpoint / "attacker")
    goals = load_goals(cfg)
    expected = direct_samples(tiny_model_dir, tmp_path / "sft_attacker", [g.messages[-1]["content"] for g in goals],
                              0.0, seed=0)
    assert sample_attacks(cfg, policy, goals) == expected
    assert expected != direct_samples(tiny_model_dir, checkpoint, [g.messages[-1]["content"] for g in goals], 0.0,
                                      seed=0)  # the defender writes other attacks: the test tells them apart


def test_goals_from_a_file_of_goals(setup) -> None:
    # the held-out split's file: one goal per distinct goal text, in file order ("goal" is a known prompt field)
    cfg = load_command_config(EVAL, None, ["--attacker", str(setup["run"]), "--prompts",
                                           str(setup["data"] / "test.jsonl"), "--limit", "4"])
    goals = load_goals(cfg)
    assert [g.messages[-1]["content"] for g in goals] == [g.text for g in attack_goals("test")[:4]]
    assert [g.category for g in goals] == [g.category for g in attack_goals("test")[:4]]


def test_attacker_mistakes_are_one_line(setup, tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no such directory"):
        attacker_checkpoint(str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="is neither a checkpoint .* nor a run dir with an intact checkpoint"):
        attacker_checkpoint(str(tmp_path / "empty"))
    assert attacker_checkpoint(str(setup["run"])) == setup["run"] / "checkpoints" / "step_000002"
    cfg = load_command_config(EVAL, None, ["--attacker", str(setup["run"]), "--data.filters", "{category: insult}"])
    with pytest.raises(UserError, match="the attack-prompts goals take none"):
        load_goals(cfg)
    cfg = load_command_config(EVAL, None, ["--attacker", str(setup["run"]), "--split", "validation"])
    with pytest.raises(UserError, match="unknown attack-prompts split 'validation'"):
        load_goals(cfg)
