"""`purplerl prm`: a tiny random model learns synthetic step labels (a step that says "cats" is correct, one that says
"dogs" is not), evaluates them on held-out prompts, resumes bit-identically and reports; the trained run then
scores as the `prm` reward term in process, through a reward server's app (in this process, on 127.0.0.1), and as
an RL recipe's reward."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import httpx
import pytest
import torch
import yaml
from conftest import invoke_cli
from safetensors.torch import load_file
from typer.testing import CliRunner

from purplerl.algorithms.process_reward import aggregate_steps
from purplerl.cli import app
from purplerl.config import RewardServerConfig, load_command_config
from purplerl.errors import UserError
from purplerl.launch import scorer_term
from purplerl.recipes import RECIPES
from purplerl.rewards.compose import Reward
from purplerl.rewards.named import TermSpec
from purplerl.rewards.registry import ScoringInput
from purplerl.rewards.served import make_server_scorer
from purplerl.rewards.server import create_app
from purplerl.runs.layout import CONFIG_FILE, METRICS_FILE
from purplerl.runs.process_reward import ProcessRewardParams, ProcessRewardScorer
from purplerl.runs.reward_model import record_checkpoint
from purplerl.train.runner import run_recipe
from tests.recipes.test_recipe_table import listed, reads  # noqa: F401 -- `reads` is a fixture
from tests.rewards.reward_servers import ThreadServer

WORDS = ["hello", "world", "pizza", "Monday", "fox", "joke", "friend", "class", "coworker", "genius", "internet",
         "morning"]
COMMON = ["--lora_rank", "4", "--dtype", "float32", "--device", "cpu", "--batch_size", "8", "--lr", "0.01",
          "--logging.progress", "false"]
TEXTS = ["cats cats cats\ndogs dogs dogs\n", "cats cats cats", "", "dogs dogs dogs\n\ncats cats cats\n"]
PROMPTS = ["Tell me about fox and joke 99", "Tell me about hello and class", "Tell me about Monday", "Tell me"]


def step_rows(count: int = 48) -> list[dict]:
    """Answers of two or three steps, each step correct where it says "cats" and wrong where it says "dogs". (A step
    that says more besides, "fox cats and joke", is learned too, but in more steps than a quick test takes: the
    tiny random model first has to learn to attend to the animal.)"""
    rng = random.Random(0)
    rows = []
    for i in range(count):
        a, b = rng.choice(WORDS), rng.choice(WORDS)
        animals = [rng.choice(["cats", "dogs"]) for _ in range(rng.choice([2, 3]))]
        rows.append({"prompt": f"Tell me about {a} and {b} {i}",
                     "completions": [f"{animal} {animal} {animal}" for animal in animals],
                     "labels": [animal == "cats" for animal in animals]})
    return rows


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _prm(*args) -> object:
    return CliRunner().invoke(app, ["prm", *map(str, args)], catch_exceptions=False)


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / METRICS_FILE).read_text().splitlines()]


@pytest.fixture(scope="module")
def prm_env(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("prm")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PURPLERL_CACHE", str(root / "cache"))
        patch.setenv("HF_HUB_OFFLINE", "1")
        yield root


@pytest.fixture(scope="module")
def trained(tiny_model_dir: Path, prm_env: Path) -> Path:
    """A process reward model trained 24 steps, with a held-out eval every 8."""
    data = write_rows(prm_env / "steps.jsonl", step_rows())
    result = _prm("--model", tiny_model_dir, "--data", data, *COMMON, "--steps", "24", "--prm.eval_fraction", "0.25",
                  "--prm.eval_every", "8", "--save_every", "12", "--output_dir", prm_env / "runs", "--name", "prm")
    assert result.exit_code == 0, result.output
    return prm_env / "runs" / "prm"


def test_a_prm_learns_held_out_step_labels_and_reports(trained: Path) -> None:
    metrics = _metrics(trained)
    assert [m["step"] for m in metrics] == list(range(1, 25))
    evals = [m for m in metrics if "eval/step_accuracy" in m]
    assert [m["step"] for m in evals] == [8, 16, 24]
    first = metrics[0]
    assert first["data/held_out_answers"] > 0 and first["data/answers"] + first["data/held_out_answers"] == 48
    assert first["data/steps_truncated"] == 0 and 0.3 < first["data/label_rate"] < 0.7
    # a model that learned nothing is right on about half the steps (the labels are near balanced)
    assert evals[-1]["eval/step_accuracy"] >= 0.9 and evals[-1]["eval/outcome_accuracy"] >= 0.8
    late = sum(m["train/loss"] for m in metrics[-6:]) / 6
    assert late < 0.5 * metrics[0]["train/loss"]
    checkpoint = trained / "checkpoints" / "step_000024"
    assert {"adapter_model.safetensors", "scalar_head.safetensors"} <= {p.name for p in (checkpoint / "prm").iterdir()}
    report = CliRunner().invoke(app, ["report", str(trained)], catch_exceptions=False)
    assert report.exit_code == 0, report.output
    assert "eval/step_accuracy" in (trained / "report.html").read_text()


def test_a_resumed_run_continues_bit_identically(tiny_model_dir: Path, prm_env: Path, tmp_path: Path) -> None:
    data = write_rows(tmp_path / "steps.jsonl", step_rows(24))
    common = ["--model", tiny_model_dir, "--data", data, *COMMON, "--save_every", "2", "--prm.eval_every", "2",
              "--prm.eval_fraction", "0.25", "--output_dir", tmp_path]
    whole = _prm(*common, "--steps", "4", "--name", "whole")
    assert whole.exit_code == 0, whole.output
    part = _prm(*common, "--steps", "2", "--name", "part")
    assert part.exit_code == 0, part.output
    resumed = _prm("--resume", tmp_path / "part", "--steps", "4")
    assert resumed.exit_code == 0, resumed.output
    final = Path("checkpoints") / "step_000004" / "prm"
    for name in ("adapter_model.safetensors", "scalar_head.safetensors"):
        a, b = load_file(str(tmp_path / "whole" / final / name)), load_file(str(tmp_path / "part" / final / name))
        assert a.keys() == b.keys()
        for key, tensor in a.items():
            assert torch.equal(b[key], tensor), f"{name}: {key}"
    strip = lambda rows: [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]  # noqa: E731
    assert strip(_metrics(tmp_path / "part")) == strip(_metrics(tmp_path / "whole"))
    changed = invoke_cli("prm", "--resume", tmp_path / "part", "--steps", "6", "--prm.separator", "|")
    assert changed.returncode == 2 and "--prm.separator cannot change when resuming" in changed.stderr


def test_the_term_and_the_served_scorer_score_each_answers_steps(trained: Path) -> None:
    """The scorer reads one logit per step, the registered term aggregates them as named (its step counts logged),
    and a reward server's app serving the term answers the same over HTTP."""
    scorer = ProcessRewardScorer(trained, device="cpu")
    logits = scorer.step_logits(TEXTS, PROMPTS)
    assert [len(steps) for steps in logits] == [2, 1, 1, 2]  # blank pieces are no steps; "" is one step
    cats_then_dogs = torch.sigmoid(logits[0])
    assert cats_then_dogs[0] > 0.5 > cats_then_dogs[1]  # new prompts: the label is learned
    for how in ("min", "last", "product", "mean"):
        want = torch.stack([aggregate_steps(steps, how) for steps in logits])
        reward = Reward({"prm": TermSpec(fn="prm", params={"run": str(trained), "device": "cpu",
                                                           "aggregation": how})})
        got = reward(ScoringInput(texts=TEXTS, prompts=PROMPTS))
        torch.testing.assert_close(got.total_N, want)
        torch.testing.assert_close(got.components["prm_steps"], torch.tensor([2.0, 1.0, 1.0, 2.0]))

    served = make_server_scorer("prm", {"run": str(trained), "device": "cpu", "aggregation": "last"})
    assert served.model == f"prm(run={trained}, aggregation=last, device=cpu)"
    server = ThreadServer(create_app(RewardServerConfig(), scorer=served.scorer, label=served.label,
                                     model=served.model))
    try:
        answer = httpx.post(f"{server.url}/score", json={"texts": TEXTS, "prompts": PROMPTS}, timeout=60).json()
        refused = httpx.post(f"{server.url}/score", json={"texts": TEXTS}, timeout=60)
    finally:
        server.stop()
    assert answer["scores"] == pytest.approx([float(torch.sigmoid(steps[-1])) for steps in logits], rel=1e-5)
    assert refused.status_code == 422  # an answer is scored against its prompt


def test_serve_reward_and_pipelines_take_the_term_from_the_run(trained: Path, tiny_model_dir: Path,
                                                               tmp_path: Path) -> None:
    """`serve-reward --model RUN_DIR` and a pipeline's judge serve a run with its recipe's term; another recipe's
    run, or a reward model's run given to the prm term, is refused in one line."""
    assert scorer_term(trained) == "prm" and scorer_term(trained / "checkpoints" / "step_000012") == "prm"
    policy = tmp_path / "policy"
    policy.mkdir()
    (policy / CONFIG_FILE).write_text(yaml.safe_dump({"recipe": "sft"}))
    with pytest.raises(UserError, match="is a run of sft, which makes a policy, not a scorer .*reward-model, prm"):
        scorer_term(policy)
    other = shutil.copytree(trained, tmp_path / "not_prm")
    config = yaml.safe_load((other / CONFIG_FILE).read_text())
    del config["prm"]
    (other / CONFIG_FILE).write_text(yaml.safe_dump(config))
    with pytest.raises(UserError, match=r"has no prm.separator: not the config of a prm run"):
        ProcessRewardScorer(other, device="cpu")


def test_an_rl_recipe_rewards_with_the_prm(trained: Path, tiny_model_dir: Path, tmp_path: Path) -> None:
    recipe = RECIPES["attack"]
    config = load_command_config(recipe.command(), None, [
        "--model", str(tiny_model_dir), "--steps", "2", "--batch_size", "2", "--group_size", "2",
        "--max_new_tokens", "4", "--output_dir", str(tmp_path), "--name", "rl", "--logging.progress", "false",
        "--reward.terms", "{prm: 1, repetition: 0}", "--reward.terms.prm.params.run", str(trained),
        "--reward.terms.prm.params.aggregation", "product", "--reward.terms.prm.params.device", "cpu"])
    run_recipe(recipe, config)
    metrics = _metrics(tmp_path / "rl")
    assert {"prm/mean", "prm_steps/mean"} <= set(metrics[-1]) and 0.0 <= metrics[-1]["prm/mean"] <= 1.0
    saved = (tmp_path / "rl" / CONFIG_FILE).read_text()
    assert f"checkpoint: {(trained / 'checkpoints' / 'step_000024').resolve()}" in saved  # the model that scored
    with pytest.raises(UserError, match="reward.terms.prm.params': run: name the process reward model's run"):
        load_command_config(recipe.command(), None, ["--reward.terms", "{prm: 1, repetition: 0}"])
    with pytest.raises(UserError, match="unknown step aggregation 'max'"):
        load_command_config(recipe.command(), None, ["--reward.terms", "{prm: 1}", "--reward.terms.prm.params.run",
                                                     str(trained), "--reward.terms.prm.params.aggregation", "max"])
    # a resumed run whose model changed since is refused: its rewards came from the recorded one
    older = ProcessRewardParams(run=str(trained), checkpoint=str(trained / "checkpoints" / "step_000012"))
    with pytest.raises(UserError, match="this run was scored by the reward model .*step_000012"):
        record_checkpoint(older, trained / "checkpoints" / "step_000024", "prm")


def test_bad_rows_and_settings_are_one_line(tiny_model_dir: Path, prm_env: Path, tmp_path: Path) -> None:
    def error(*args) -> str:
        result = _prm("--model", tiny_model_dir, "--device", "cpu", "--logging.progress", "false", "--output_dir",
                      tmp_path, *args)
        assert result.exit_code == 2, result.output
        lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
        assert len(lines) == 1, result.stderr
        return lines[0]

    good = step_rows(8)
    two = {"prompt": "Say two things", "completions": ["fox cats", "joke dogs"], "labels": [True, False]}
    assert "name the step-labelled answers: --data FILE" in error()
    for row, says in [({**two, "labels": [True]}, "2 steps in 'completions' but 1 'labels': give one label per step"),
                      ({**two, "completions": ["fine", " "]}, "'completions'[1] is an empty step"),
                      ({**two, "labels": [1, 0]}, "'labels'[0] must be true (a correct step) or false, got int 1"),
                      ({**two, "labels": ["true", False]},
                       "'labels'[0] must be true (a correct step) or false, got str 'true'")]:
        bad = write_rows(tmp_path / "bad.jsonl", [good[0], row, *good[2:]])
        assert error("--data", bad) == f"error: {bad}:2: {says}"
    data = write_rows(tmp_path / "good.jsonl", good)
    assert "prm.separator" in error("--data", data, "--prm.separator", "")
    assert "change prm.eval_fraction" in error("--data", write_rows(tmp_path / "one.jsonl", good[:1]))
    assert error("--data", data, "--model.finetune", "full").endswith(
        "model.finetune full trains no adapters over a frozen base: use model.finetune lora")
    assert "longer than data.max_answer_tokens=2 tokens" in error("--data", data, "--data.max_answer_tokens", "2",
                                                                 "--prm.eval_fraction", "0")
    assert not list(tmp_path.glob("prm_*"))  # nothing claimed a run dir


def test_every_listed_setting_is_read(tiny_model_dir: Path, prm_env: Path, tmp_path: Path,
                                      reads: set[tuple[type, str]]) -> None:  # noqa: F811
    recipe = RECIPES["prm"]
    data = write_rows(tmp_path / "steps.jsonl", step_rows(16))
    config = load_command_config(recipe.command(), None, [
        "--model", str(tiny_model_dir), "--data", str(data), "--output_dir", str(tmp_path / "runs"), "--steps", "2",
        "--batch_size", "2", "--save_every", "1", "--logging.progress", "false", "--prm.eval_every", "1",
        "--prm.eval_fraction", "0.25"])
    shown = listed(config)
    reads.clear()
    run_recipe(recipe, config)
    unread = sorted(f"{cls.__name__}.{field}" for cls, field in shown - reads if field != "recipe")
    assert not unread, f"prm lists settings nothing read: {unread}"
    assert len(shown) <= 45  # as SFT and reward-model


def test_the_cli_names_its_runs_by_what_they_vary(tiny_model_dir: Path) -> None:
    from purplerl.train.runner import run_dir_name

    recipe = RECIPES["prm"]
    config = load_command_config(recipe.command(), None, ["--model", str(tiny_model_dir), "--lr", "0.001"])
    assert run_dir_name(recipe, config) == f"prm_{tiny_model_dir.name.replace('_', '-')}_lr0.001_r16_B8_s0"
