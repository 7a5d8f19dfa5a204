"""`purplerl reward-model`: a tiny random model learns a synthetic preference (chosen answers say "cats", rejected
ones "dogs"), evaluates it on held-out prompts, resumes bit-identically and reports; the trained run then scores
the same as a reward term in process, through `serve-reward --model RUN_DIR` on 127.0.0.1, as an eval judge and
as an RL recipe's reward."""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import httpx
import pytest
import torch
from conftest import invoke_cli
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from purplerl.algorithms.reward_model import ensemble_reward
from purplerl.cli import app
from purplerl.config import load_command_config
from purplerl.errors import UserError
from purplerl.recipes import RECIPES
from purplerl.recipes.ppo.step import check_critic_init
from purplerl.rewards.compose import Reward
from purplerl.rewards.named import TermSpec
from purplerl.rewards.registry import ScoringInput
from purplerl.runs.layout import METRICS_FILE
from purplerl.runs.reward_model import RewardModelParams, RewardModelScorer, _recorded
from purplerl.train.runner import run_recipe
from tests.eval.test_eval_judged import FAST, run_eval_cli
from tests.recipes.test_recipe_table import listed, reads  # noqa: F401 -- `reads` is a fixture
from tests.test_serve_reward_cli import cli_env, finish, free_port, one_error_line, start, wait_healthy

WORDS = ["hello", "world", "pizza", "Monday", "fox", "joke", "friend", "class", "coworker", "genius", "internet",
         "morning"]
COMMON = ["--lora_rank", "4", "--dtype", "float32", "--device", "cpu", "--batch_size", "8", "--lr", "0.02",
          "--logging.progress", "false"]


def preference_rows(count: int = 64, scores: bool = False) -> list[dict]:
    """Pairs whose answers differ only in "cats" (chosen) against "dogs" (rejected)."""
    rng = random.Random(0)
    rows = []
    for i in range(count):
        a, b, tail = rng.choice(WORDS), rng.choice(WORDS), rng.choice(WORDS)
        row = {"prompt": f"Tell me about {a} and {b} {i}", "chosen": f"{tail} cats and {a}",
               "rejected": f"{tail} dogs and {a}"}
        rows.append({**row, "score_chosen": 8.0, "score_rejected": 3.0} if scores else row)
    return rows


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _rm(*args) -> object:
    return CliRunner().invoke(app, ["reward-model", *map(str, args)], catch_exceptions=False)


@pytest.fixture(scope="module")
def rm_env(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("rm")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PURPLERL_CACHE", str(root / "cache"))
        patch.setenv("HF_HUB_OFFLINE", "1")
        before = torch.get_num_threads()
        torch.set_num_threads(1)  # a tiny model on a shared 2-core machine: one thread, the same results
        yield root
        torch.set_num_threads(before)


@pytest.fixture(scope="module")
def trained(tiny_model_dir: Path, rm_env: Path) -> Path:
    """A two-member reward model, trained 24 steps with a held-out eval every 8."""
    data = write_rows(rm_env / "prefs.jsonl", preference_rows())
    result = _rm("--model", tiny_model_dir, "--data", data, *COMMON, "--steps", "24", "--ensemble", "2",
                 "--reward_model.eval_fraction", "0.25", "--reward_model.eval_every", "8", "--save_every", "12",
                 "--output_dir", rm_env / "runs", "--name", "rm")
    assert result.exit_code == 0, result.output
    return rm_env / "runs" / "rm"


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / METRICS_FILE).read_text().splitlines()]


def test_a_reward_model_learns_a_held_out_preference_and_reports(trained: Path) -> None:
    metrics = _metrics(trained)
    assert [m["step"] for m in metrics] == list(range(1, 25))
    evals = [m for m in metrics if "eval/accuracy" in m]
    assert [m["step"] for m in evals] == [8, 16, 24]
    assert evals[-1]["eval/accuracy"] >= 0.9 and evals[-1]["eval/margin"] > 0.5
    assert {"eval/member_accuracy", "eval/std", "eval/loss"} <= set(evals[-1])  # two members
    assert metrics[0]["data/held_out_pairs"] > 0 and metrics[0]["data/pairs"] + metrics[0]["data/held_out_pairs"] == 64
    late = sum(m["train/loss"] for m in metrics[-6:]) / 6
    # from ~ln 2 to well below it: 0.53 of the start on an AVX2 CPU, under 0.5 on AVX512 ones (their kernels round
    # differently); a model that does not learn stays near ln 2
    assert late < 0.6 * metrics[0]["train/loss"]
    assert {"member0", "member1"} <= {p.name for p in (trained / "checkpoints" / "step_000024").iterdir()}
    report = CliRunner().invoke(app, ["report", str(trained)], catch_exceptions=False)
    assert report.exit_code == 0, report.output
    assert "eval/accuracy" in (trained / "report.html").read_text()


def test_a_resumed_run_continues_bit_identically(tiny_model_dir: Path, rm_env: Path, tmp_path: Path) -> None:
    data = write_rows(tmp_path / "prefs.jsonl", preference_rows(32, scores=True))
    common = ["--model", tiny_model_dir, "--data", data, *COMMON, "--ensemble", "2", "--save_every", "3",
              "--reward_model.margin", "true", "--reward_model.center_coef", "0.01",
              "--reward_model.eval_every", "3", "--output_dir", tmp_path]
    whole = _rm(*common, "--steps", "6", "--name", "whole")
    assert whole.exit_code == 0, whole.output
    part = _rm(*common, "--steps", "3", "--name", "part")
    assert part.exit_code == 0, part.output
    resumed = CliRunner().invoke(app, ["reward-model", "--resume", str(tmp_path / "part"), "--steps", "6"],
                                 catch_exceptions=False)
    assert resumed.exit_code == 0, resumed.output
    final = Path("checkpoints") / "step_000006"
    files = sorted(p.relative_to(tmp_path / "whole" / final)
                   for p in (tmp_path / "whole" / final).rglob("*.safetensors"))
    assert {f.name for f in files} == {"adapter_model.safetensors", "scalar_head.safetensors"}
    for name in files:
        a, b = load_file(str(tmp_path / "whole" / final / name)), load_file(str(tmp_path / "part" / final / name))
        assert a.keys() == b.keys()
        for key, tensor in a.items():
            assert torch.equal(b[key], tensor), f"{name}: {key}"
    strip = lambda rows: [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]  # noqa: E731
    assert strip(_metrics(tmp_path / "part")) == strip(_metrics(tmp_path / "whole"))


def test_a_resume_keeps_the_ensemble_and_the_held_out_pairs(trained: Path, tmp_path: Path) -> None:
    """A smaller --ensemble on resume kept the dropped members, frozen, in every later checkpoint, and every consumer
    still averaged them; another eval_fraction moved pairs between training and the held-out set. Both are refused
    in one line, the run dir left as it was."""
    run = tmp_path / "rm"
    shutil.copytree(trained, run)
    config = (run / "config.yaml").read_bytes()
    for option, old, new in (("reward_model.ensemble", 2, 1), ("reward_model.eval_fraction", 0.25, 0.5)):
        result = invoke_cli("reward-model", "--resume", run, "--steps", "30", f"--{option}", str(new))
        assert result.returncode == 2, result.stderr
        assert result.stderr.strip().splitlines() == [
            f"error: --{option} cannot change when resuming ({old!r} -> {new!r}): the checkpoints and logs were made "
            f"with {old!r}; start a new run for {new!r} instead (--name NEW)"]
    assert (run / "config.yaml").read_bytes() == config
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_000012", "step_000024"]


def test_the_critic_starts_from_one_member_with_its_head(trained: Path, tiny_model_dir: Path,
                                                        trained_adapter_dir: Path, tmp_path: Path) -> None:
    """--critic.init given the checkpoint dir instead of its member0/ started the critic silently from the
    checkpoint's untrained top-level adapter and a fresh head; now each misfit is one line, before the model loads."""
    checkpoint = trained / "checkpoints" / "step_000024"
    check_critic_init(str(checkpoint / "member0"), str(tiny_model_dir), None)  # a member: its adapter and head
    odd_head = shutil.copytree(checkpoint / "member0", tmp_path / "odd")
    save_file({"weight": torch.zeros(1, 7), "bias": torch.zeros(1)}, str(odd_head / "scalar_head.safetensors"))
    members = f"holds member0/, member1/: give one member, e.g. {checkpoint / 'member0'}"
    for init, says in [(checkpoint, f"critic.init {checkpoint} {members}"),
                       (trained, f"critic.init {trained} {members}"),
                       (trained_adapter_dir, f"critic.init {trained_adapter_dir} holds a LoRA adapter but no scalar "
                                             "head (scalar_head.safetensors): give a reward model's member dir"),
                       (odd_head, f"critic.init {odd_head}: its scalar head holds bias (1,), weight (1, 7), "
                                  f"where model '{tiny_model_dir}' takes weight (1, 32) and bias (1,)")]:
        config = load_command_config(RECIPES["ppo"].command(), None, [
            "--model", str(tiny_model_dir), "--device", "cpu", "--critic.init", str(init), "--output_dir",
            str(tmp_path / "runs")])
        with pytest.raises(UserError) as err:
            run_recipe(RECIPES["ppo"], config)
        assert str(err.value).startswith(says), str(err.value)
    assert not (tmp_path / "runs").exists()


@pytest.mark.process
def test_the_reward_term_the_server_and_the_eval_judge_score_alike(trained: Path, tiny_model_dir: Path,
                                                                   rm_env: Path) -> None:
    texts = ["pizza cats and fox", "pizza dogs and fox", "hello cats and world", "hello dogs and world"]
    prompts = ["Tell me about fox and joke 99", "Tell me about fox and joke 99", "Tell me about hello and class",
               "Tell me about hello and class"]
    scorer = RewardModelScorer(trained, device="cpu")
    scores_KN = scorer.member_scores(texts, prompts)
    mean, std, want = ensemble_reward(scores_KN, penalty=0.5)
    assert scores_KN.shape == (2, 4) and bool((mean[0::2] > mean[1::2]).all())  # cats over dogs, new prompts

    # in process: the registered term, as an RL reward builds it
    reward = Reward({"reward_model": TermSpec(fn="reward_model",
                                              params={"run": str(trained), "penalty": 0.5, "device": "cpu"})})
    got = reward(ScoringInput(texts=texts, prompts=prompts))
    torch.testing.assert_close(got.total_N, want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got.components["reward_model_std"], std, rtol=1e-5, atol=1e-6)

    # over HTTP: serve-reward --model RUN_DIR, a real server on 127.0.0.1
    port = free_port()
    env = cli_env(rm_env / "cache")
    server = start("serve-reward", "--model", trained, "--port", port, env=env)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, server, timeout=120)
        served = httpx.post(f"{url}/score", json={"texts": texts, "prompts": prompts}, timeout=60).json()
        info = httpx.get(f"{url}/info", timeout=10).json()
    finally:
        server.terminate()
        finish(server)
    assert served["scores"] == pytest.approx(mean.tolist(), rel=1e-5, abs=1e-6)  # penalty 0: the mean
    assert info["model"].startswith("reward_model(run=")
    labelled = start("serve-reward", "--model", trained, "--label", "x", env=env)
    code, _, err = finish(labelled)
    assert code == 2 and "--label chooses the toxicity classifier" in one_error_line(err)

    # as an eval judge: the saved answers scored again give the reported mean
    out = rm_env / "eval"
    proc = run_eval_cli("--model", tiny_model_dir, "--judges.terms", json.dumps({"reward_model": {"run": str(trained),
                        "device": "cpu"}}), "--out", out, *FAST, cache=rm_env / "cache")
    assert proc.returncode == 0, proc.stderr
    harm = json.loads((out / "eval.json").read_text())["targets"]["base"]["harm"]
    rows = [json.loads(line) for line in (out / "generations" / "base.jsonl").read_text().splitlines()]
    judged = scorer.score([r["completion"] for r in rows], [r["prompt"] for r in rows])
    assert harm["metrics"]["term/reward_model"]["point"] == pytest.approx(sum(judged) / len(judged), rel=1e-5)


def test_an_rl_recipe_rewards_with_the_reward_model(trained: Path, tiny_model_dir: Path, tmp_path: Path) -> None:
    recipe = RECIPES["attack"]
    config = load_command_config(recipe.command(), None, [
        "--model", str(tiny_model_dir), "--steps", "2", "--batch_size", "2", "--group_size", "2",
        "--max_new_tokens", "4", "--output_dir", str(tmp_path), "--name", "rl", "--logging.progress", "false",
        "--reward.terms", "{reward_model: 1, repetition: 0}", "--reward.terms.reward_model.params.run", str(trained),
        "--reward.terms.reward_model.params.penalty", "0.5", "--reward.terms.reward_model.params.device", "cpu"])
    run_recipe(recipe, config)
    metrics = _metrics(tmp_path / "rl")
    assert {"reward_model/mean", "reward_model_std/mean", "reward_model_mean/mean"} <= set(metrics[-1])
    saved = (tmp_path / "rl" / "config.yaml").read_text()
    assert f"checkpoint: {(trained / 'checkpoints' / 'step_000024').resolve()}" in saved  # the model that scored
    # the run cannot end with a reward model it lacks
    with pytest.raises(UserError, match="reward.terms.reward_model.params': run: name the reward model's run"):
        load_command_config(recipe.command(), None, ["--reward.terms", "{reward_model: 1, repetition: 0}"])


def test_a_resumed_rl_run_refuses_a_reward_model_that_changed(trained: Path) -> None:
    scorer = RewardModelScorer(trained, device="cpu")
    params = RewardModelParams(run=str(trained))
    _recorded(params, scorer)
    assert params.checkpoint == str(scorer.checkpoint.resolve())
    _recorded(params, scorer)  # the same one again: fine
    older = RewardModelParams(run=str(trained), checkpoint=str(trained / "checkpoints" / "step_000012"))
    with pytest.raises(UserError, match="this run was scored by the reward model .*step_000012"):
        _recorded(older, scorer)


def test_bad_inputs_are_one_line(tiny_model_dir: Path, rm_env: Path, tmp_path: Path) -> None:
    def error(*args) -> str:
        result = _rm("--model", tiny_model_dir, "--device", "cpu", "--logging.progress", "false", "--output_dir",
                     tmp_path, *args)
        assert result.exit_code == 2, result.output
        lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
        assert len(lines) == 1, result.stderr
        return lines[0]

    no_scores = write_rows(tmp_path / "plain.jsonl", preference_rows(8))
    assert "name the preference pairs: --data FILE" in error()
    assert f"{no_scores}:1: reward_model.margin reads each pair's score_chosen" in error(
        "--data", no_scores, "--reward_model.margin", "true", "--reward_model.eval_fraction", "0")
    assert error("--data", no_scores, "--model.finetune", "full").endswith(
        "model.finetune full trains no adapters over a frozen base: use model.finetune lora")
    assert "change reward_model.eval_fraction" in error("--data", write_rows(tmp_path / "one.jsonl",
                                                                             preference_rows(1)))
    assert not list(tmp_path.glob("reward-model_*"))  # nothing claimed a run dir
    with pytest.raises(UserError, match="not a reward model's checkpoint|neither a reward-model run"):
        RewardModelScorer(tiny_model_dir)


def test_every_listed_setting_is_read(tiny_model_dir: Path, rm_env: Path, tmp_path: Path,
                                      reads: set[tuple[type, str]]) -> None:  # noqa: F811
    recipe = RECIPES["reward-model"]
    data = write_rows(tmp_path / "prefs.jsonl", preference_rows(16))
    config = load_command_config(recipe.command(), None, [
        "--model", str(tiny_model_dir), "--data", str(data), "--output_dir", str(tmp_path / "runs"), "--steps", "2",
        "--batch_size", "2", "--save_every", "1", "--logging.progress", "false", "--reward_model.eval_every", "1",
        "--reward_model.eval_fraction", "0.25"])
    shown = listed(config)
    reads.clear()
    run_recipe(recipe, config)
    unread = sorted(f"{cls.__name__}.{field}" for cls, field in shown - reads if field != "recipe")
    assert not unread, f"reward-model lists settings nothing read: {unread}"
    assert len(shown) <= 45  # as SFT


def test_the_cli_names_its_runs_by_what_they_vary(tiny_model_dir: Path) -> None:
    from purplerl.train.runner import run_dir_name

    recipe = RECIPES["reward-model"]
    config = load_command_config(recipe.command(), None, ["--model", str(tiny_model_dir), "--ensemble", "3"])
    assert run_dir_name(recipe, config) == f"reward-model_{tiny_model_dir.name.replace('_', '-')}_lr0.0001_r16_K3_B8_s0"
    assert os.sep not in run_dir_name(recipe, config)
