"""`purplerl route` on the tiny model: a routed run end to end from the CLI (both adapters in its checkpoints, the
routing evaluation per adapter mode, the hack share it routed), its checkpoint loaded in sample and eval in each
adapter mode (retain_only is exactly the retain adapter alone, forget_only the forget adapter alone), a resumed run
ending as the unbroken one, the baseline's one adapter of both ranks, and what routing refuses before any model
loads."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from purplerl.config import load_command_config
from purplerl.config.commands import EVAL
from purplerl.engines import make_engine
from purplerl.errors import UserError
from purplerl.recipes import RECIPES
from purplerl.runs.layout import METRICS_FILE
from purplerl.runs.policy import FORGET, RETAIN, resolve_policy
from purplerl.train.runner import run_recipe, saved_settings
from purplerl.types import TrainBatch

ROUTE = RECIPES["route"]
# the task: how many "e" the answer holds (at most 8); the detector: 3 or more "e" is a hack. A tiny random model
# writes both kinds of answer from the start.
TERMS = ("{e_count: {fn: regex_count, weight: 1, params: {pattern: e, max_count: 8}}, "
         "many_e: {fn: regex_count, weight: 0, params: {pattern: e}, hack_at: 3}}")
REWARDS_FILE = """\
e_count: {fn: regex_count, params: {pattern: e, max_count: 8}}
many_e: {fn: regex_count, params: {pattern: e}, hack_at: 3}
toy: {terms: {e_count: 1.0}, detector: many_e}
"""
MODES = ("both", "retain_only", "forget_only")


def _args(model_dir: Path, out: Path, *extra: str) -> list[str]:
    return ["--model", str(model_dir), "--output_dir", str(out), "--batch_size", "2", "--group_size", "4",
            "--max_new_tokens", "8", "--lora_rank", "4", "--forget_rank", "2", "--logging.progress", "false",
            "--reward.terms", TERMS, "--task_term", "e_count", "--route.eval_prompts", "2", "--route.eval_n", "2",
            *extra]


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / METRICS_FILE).read_text().splitlines()]


def _run(model_dir: Path, out: Path, *extra: str) -> Path:
    return Path(run_recipe(ROUTE, load_command_config(ROUTE.command(), None, _args(model_dir, out, *extra)))["run_dir"])


@pytest.fixture(scope="module")
def trained(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A routed run whose adapters moved (LoRA on lm_head at a high rate: the tiny model's hidden layers barely
    move its logits), 3 steps; returns its last checkpoint."""
    torch.set_num_threads(1)
    run_dir = _run(tiny_model_dir, tmp_path_factory.mktemp("trained"), "--steps", "3", "--lr", "5e-2",
                   "--model.lora_targets", "lm_head", "--name", "trained")
    return run_dir / "checkpoints" / "step_000003"


@pytest.mark.process
def test_a_routed_run_from_the_cli(tiny_model_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "rewards.yaml").write_text(REWARDS_FILE)
    args = [a for a in _args(tiny_model_dir, tmp_path, "--steps", "2", "--route.eval_every", "1", "--name", "cli")
            if a != TERMS and a != "--reward.terms"]
    done = subprocess.run([sys.executable, "-m", "purplerl", "route", *args, "--reward", "toy", "--rewards-file",
                           str(tmp_path / "rewards.yaml")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    run_dir = tmp_path / "cli"
    checkpoint = run_dir / "checkpoints" / "step_000002"
    assert json.loads((checkpoint / "adapter_config.json").read_text())["r"] == 4  # the retain adapter
    assert json.loads((checkpoint / FORGET / "adapter_config.json").read_text())["r"] == 2
    metrics = _metrics(run_dir)
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        assert {f"route/{mode}/{what}" for mode in MODES for what in ("task", "hack")} <= set(m)
        assert m["train/routed_frac"] == pytest.approx(m["rh/rate"])  # every labelled row was routed
    assert 0 < sum(m["rh/rate"] for m in metrics) < 2  # both kinds of rows were trained on
    done = subprocess.run([sys.executable, "-m", "purplerl", "sample", "--checkpoint", str(checkpoint), "--prompt",
                           "hello", "--max_new_tokens", "4", "--sample.adapters", "retain_only"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip(), done.stderr[-2000:]


def _ids() -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(3, 300, (3, 10), generator=torch.Generator().manual_seed(0))
    return ids, torch.ones_like(ids)


def test_each_adapter_mode_is_its_adapters_at_their_scales(trained: Path) -> None:
    policy = resolve_policy(trained, *_formats())
    assert policy.mode == "both"
    ids, attn = _ids()
    scored = {mode: policy.with_mode(mode).load().logprobs(ids, attn) for mode in MODES}
    # the retain adapter alone: the checkpoint's policy adapter loaded as any one-adapter checkpoint is
    retain = make_engine(policy.model)
    assert retain.adapters == [RETAIN]
    assert torch.equal(scored["retain_only"], retain.logprobs(ids, attn))
    retain.create_adapter(FORGET, init=trained / FORGET)
    retain.use_adapter(FORGET)
    assert torch.equal(scored["forget_only"], retain.logprobs(ids, attn))
    assert float((scored["both"] - scored["retain_only"]).abs().max()) > 1e-3
    assert float((scored["both"] - scored["forget_only"]).abs().max()) > 1e-3


def _formats():
    from purplerl.config import ModelLoadConfig, PromptFormatConfig

    return ModelLoadConfig(device="cpu"), PromptFormatConfig()


def test_sample_and_eval_take_the_adapter_modes(trained: Path, tmp_path: Path) -> None:
    from purplerl.config import SampleCommandConfig
    from purplerl.eval.run import validate
    from purplerl.runs.sample import generate

    texts = {}
    for mode in MODES:
        cfg = SampleCommandConfig.model_validate({"sample": {"prompts": ["hello there"], "checkpoint": str(trained),
                                                             "adapters": mode},
                                                  "sampling": {"temperature": 0, "max_new_tokens": 6}})
        texts[mode] = generate(cfg, announce=lambda _: None)[0][0]
    assert len(set(texts.values())) > 1, texts  # the modes are different models

    cfg = load_command_config(EVAL, None, ["--checkpoint", str(trained), "--eval.adapters", "retain_only,both",
                                           "--out", str(tmp_path / "eval"), "--suite", "harm"])
    targets = validate(cfg, announce=lambda _: None)
    assert {label: p.mode for label, p in targets.items()} == {
        "base": None, "step_000003-retain_only": "retain_only", "step_000003": "both"}
    with pytest.raises(UserError, match="has no forget adapter"):
        resolve_policy(trained / FORGET, *_formats()).with_mode("retain_only")


def test_a_resumed_run_ends_as_the_unbroken_one(tiny_model_dir: Path, tmp_path: Path) -> None:
    common = ("--lr", "1e-2", "--save_every", "2", "--route.eval_every", "2", "--training.mini_batches", "2")
    whole = _run(tiny_model_dir, tmp_path, "--steps", "4", "--name", "whole", *common)
    part = _run(tiny_model_dir, tmp_path, "--steps", "2", "--name", "part", *common)
    resumed = load_command_config(ROUTE.command(), None, ["--steps", "4"], saved=saved_settings(ROUTE, part))
    run_recipe(ROUTE, resumed, resume_dir=part)
    final = "checkpoints/step_000004"
    for name in ("adapter_model.safetensors", f"{FORGET}/adapter_model.safetensors"):
        a, b = load_file(str(whole / final / name)), load_file(str(part / final / name))
        assert a.keys() == b.keys()
        for key, tensor in a.items():
            torch.testing.assert_close(b[key], tensor, rtol=1e-5, atol=1e-6, msg=f"{name}: {key}")
    keys = ("reward/mean", "rh/rate", "route/retain_only/task", "route/forget_only/hack")
    def logged(run_dir: Path) -> list[tuple[int, str, float]]:
        return [(m["step"], k, m[k]) for m in _metrics(run_dir) for k in keys if k in m]

    assert [row[:2] for row in logged(part)] == [row[:2] for row in logged(whole)]
    assert len(logged(whole)) == 4 * 2 + 2 * 2  # the routing evaluation at steps 2 and 4
    assert [row[2] for row in logged(part)] == pytest.approx([row[2] for row in logged(whole)], rel=1e-4, abs=1e-6)


def test_the_baseline_is_one_adapter_of_both_ranks(tiny_model_dir: Path, tmp_path: Path) -> None:
    run_dir = _run(tiny_model_dir, tmp_path, "--steps", "2", "--route.mode", "baseline", "--route.eval_every", "2",
                   "--name", "baseline")
    checkpoint = run_dir / "checkpoints" / "step_000002"
    assert json.loads((checkpoint / "adapter_config.json").read_text())["r"] == 4 + 2
    assert not (checkpoint / FORGET).exists()
    metrics = _metrics(run_dir)
    assert "train/routed_frac" not in metrics[0] and "rh/rate" in metrics[0]  # labelled, not routed
    assert {k for k in metrics[1] if k.startswith("route/")} == {"route/both/task", "route/both/hack"}
    with pytest.raises(UserError, match="--route.mode cannot change when resuming"):  # nor continues as routed
        resumed = load_command_config(ROUTE.command(), None, ["--steps", "3", "--route.mode", "route"],
                                      saved=saved_settings(ROUTE, run_dir))
        run_recipe(ROUTE, resumed, resume_dir=run_dir)


@pytest.mark.parametrize("args, says", [
    (["--reward.terms", "{e_count: {fn: regex_count, params: {pattern: e}}}"], "route needs a reward-hacking detector"),
    (["--task_term", "length"], "route.task_term 'length' is not in reward.terms"),
    (["--engine", "vllm"], r"^recipe route needs adapters acting together or of another rank \(gradient routing\); "
                           "engine.kind vllm does not have them: use engine.kind local$"),
    (["--engine.procs", "2"], "engine.procs 2 runs data parallel, which does not: use engine.procs 1$"),
])
def test_routing_refuses_in_one_line_before_the_model_loads(args: list[str], says: str, tiny_model_dir: Path,
                                                            tmp_path: Path) -> None:
    config = load_command_config(ROUTE.command(), None, [*_args(tiny_model_dir, tmp_path), *args])
    with pytest.raises(UserError, match=says) as err:
        run_recipe(ROUTE, config)
    assert "\n" not in str(err.value)
    assert not list(tmp_path.iterdir())  # no run dir claimed


def test_the_label_rides_with_the_batch() -> None:
    ids = torch.ones((3, 4), dtype=torch.long)
    batch = TrainBatch(ids, ids, ids.float(), is_rh_N=torch.tensor([True, False, True]))
    assert batch.select(torch.tensor([2, 1])).is_rh_N.tolist() == [True, False]
    with pytest.raises(ValueError, match="is_rh_N must be bool"):
        TrainBatch(ids, ids, ids.float(), is_rh_N=torch.tensor([1, 0, 1]))


def test_one_adapter_commands_take_the_retain_adapter_and_say_so(trained: Path, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from purplerl.cli import app

    result = CliRunner().invoke(app, ["export", "--merge", str(trained), "--out", str(tmp_path / "merged")])
    assert result.exit_code == 0, result.output
    assert f"note: {trained} is a gradient-routing checkpoint: its retain adapter is used" in result.output
    info = json.loads((tmp_path / "merged" / "purplerl_export.json").read_text())
    assert info["adapters"] == "retain_only"
    # the merged model computes what the retain adapter alone computes (PEFT's load of the checkpoint's top adapter)
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = json.loads((trained / "adapter_config.json").read_text())["base_model_name_or_path"]
    ids = torch.tensor([[1, 5, 9, 3]])
    with torch.no_grad():
        got = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()(ids).logits
        retain = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), str(trained)).eval()
        want = retain(ids).logits
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
