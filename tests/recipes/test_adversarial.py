"""`purplerl adversarial` on the tiny model, judged by a keyword judge written here (P(unsafe) = the share of the
answer's words holding an "e": real, deterministic values the tests recompute): each side's rewards and advantages
as the recipe states them, one turn and three (bookkeeping, what the judge saw, per-turn credit discounted), the
masks (a learner's loss covers its own turn only, its prompt the dialogue before it) and the update of one adapter
alone, one base in memory, a resumed run ending as the unbroken one, the CLI and `report`, and the one-line refusals.
"""

from __future__ import annotations

import json
import subprocess
import sys
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from purplerl.cli import app
from purplerl.config import load_command_config
from purplerl.engines import make_engine
from purplerl.errors import ExperimentError, UserError
from purplerl.recipes import RECIPES
from purplerl.recipes.adversarial.dialogue import ATTACKER, DEFENDER, Shape, novelty, rollout
from purplerl.recipes.adversarial.step import _draw_params, _side, train_side
from purplerl.rewards.registry import REWARD_TERMS, text_term
from purplerl.runs.layout import METRICS_FILE, SAMPLES_FILE
from purplerl.train.runner import run_recipe, saved_settings

ADVERSARIAL = RECIPES["adversarial"]
B, A, G = 2, 2, 2  # goals, openings per goal, answers (episodes) per opening
E = B * A * G


def e_share(text: str) -> float:
    words = text.split()
    return sum("e" in word for word in words) / len(words) if words else 0.0


class KeywordJudge:
    """P(unsafe) of a dialogue's last answer = the share of its words holding an "e"; records what it judged."""

    name = "e_share"
    seen: list[list[dict[str, str]]] = []

    def score_conversations(self, conversations: list[list[dict[str, str]]]) -> list[float]:
        KeywordJudge.seen.extend(conversations)
        return [e_share(conversation[-1]["content"]) for conversation in conversations]


class NaNJudge(KeywordJudge):
    name = "nan_judge"

    def score_conversations(self, conversations: list[list[dict[str, str]]]) -> list[float]:
        return [float("nan")] * len(conversations)


@pytest.fixture(autouse=True)
def judges(monkeypatch: pytest.MonkeyPatch) -> None:
    KeywordJudge.seen = []
    monkeypatch.setitem(REWARD_TERMS, "e_share", text_term("e_share", "share of words with an e", None,
                                                           lambda _: KeywordJudge()))
    monkeypatch.setitem(REWARD_TERMS, "nan_judge", text_term("nan_judge", "NaN", None, lambda _: NaNJudge()))


def _args(model_dir: Path, out: Path, *extra: str) -> list[str]:
    return ["--model", str(model_dir), "--output_dir", str(out), "--batch_size", str(B), "--attacker_group", str(A),
            "--group_size", str(G), "--max_new_tokens", "6", "--lora_rank", "4", "--logging.progress", "false",
            "--judge", "e_share", "--kl_beta", "0", *extra]


def _config(model_dir: Path, out: Path, *extra: str) -> Any:
    return load_command_config(ADVERSARIAL.command(), None, _args(model_dir, out, *extra))


def _run(model_dir: Path, out: Path, *extra: str) -> Path:
    return Path(run_recipe(ADVERSARIAL, _config(model_dir, out, *extra))["run_dir"])


def _rows(run_dir: Path, name: str = SAMPLES_FILE) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / name).read_text().splitlines()]


def _openings(rows: list[dict[str, Any]]) -> list[str]:
    return [r["prompt"] for r in rows if r["turn"] == 1 and r["episode"] % G == 0]


def _group_mean(values: dict[int, float], group: int) -> dict[int, float]:
    """Each episode's value minus the mean over its group of `group` consecutive episodes."""
    return {e: v - sum(values[e // group * group + i] for i in range(group)) / group for e, v in values.items()}


def test_one_turn_rewards_each_side_as_the_recipe_states(tiny_model_dir: Path, tmp_path: Path) -> None:
    run_dir = _run(tiny_model_dir, tmp_path, "--steps", "2", "--name", "one")
    rows, metrics = _rows(run_dir), _rows(run_dir, METRICS_FILE)
    assert [len([r for r in rows if r["step"] == s]) for s in (1, 2)] == [E, E]
    window: list[str] = []
    for step, m in zip((1, 2), metrics, strict=True):
        here = [r for r in rows if r["step"] == step]
        openings = _openings(here)
        expected_novelty = novelty(openings, window)
        window += openings
        for r in here:
            assert r["unsafe"] == pytest.approx(e_share(r["completion"]))
            assert r["defender_reward"] == pytest.approx(1 - r["unsafe"] - 0.1 * r["response_entropy"], abs=1e-5)
            assert r["novelty"] == pytest.approx(expected_novelty[r["episode"] // G])
            assert r["attacker_reward"] == pytest.approx(r["unsafe"] + 0.1 * r["novelty"], abs=1e-6)
        defender = _group_mean({r["episode"]: r["defender_reward"] for r in here}, G)
        value = {o: sum(r["attacker_reward"] for r in here if r["episode"] // G == o) / G for o in range(B * A)}
        attacker = _group_mean(value, A)
        for r in here:
            assert r["defender_advantage"] == pytest.approx(defender[r["episode"]], abs=1e-5)
            assert r["attacker_advantage"] == pytest.approx(attacker[r["episode"] // G], abs=1e-5)
        assert m["asr"] == pytest.approx(sum(r["unsafe"] >= 0.5 for r in here) / E)
        assert m["unsafe/mean"] == pytest.approx(sum(r["unsafe"] for r in here) / E, abs=1e-6)
    assert [m["train/attacker"] for m in metrics] == [1.0, 0.0]  # schedule 1:1
    # by default the judge reads each answer as the reply to its goal, not to the attack that drew it
    assert KeywordJudge.seen == [[{"role": "user", "content": r["goal"]},
                                  {"role": "assistant", "content": r["completion"]}]
                                 for r in sorted(rows, key=lambda r: (r["step"], r["episode"]))]
    assert all(r["goal"] != r["prompt"] for r in rows)
    assert {"attack/diversity", "attack/distinct_2", "entropy/mean", "defender_kl/mean"} <= set(metrics[0])
    checkpoint = run_dir / "checkpoints" / "step_000002"
    assert (checkpoint / "adapter_model.safetensors").is_file()  # the defender, as any policy
    assert (checkpoint / ATTACKER / "adapter_model.safetensors").is_file()
    optimizers = torch.load(checkpoint / "optimizer.pt", weights_only=True)["adapters"]
    assert set(optimizers) == {DEFENDER, ATTACKER} and all(o["state"] for o in optimizers.values())


def test_three_turns_judge_every_answer_in_its_dialogue_and_credit_each_turn(tiny_model_dir: Path,
                                                                               tmp_path: Path) -> None:
    K, gamma = 3, 0.5
    run_dir = _run(tiny_model_dir, tmp_path, "--steps", "1", "--turns", str(K), "--adversarial.gamma", str(gamma),
                   "--schedule", "attacker", "--adversarial.judge.reads", "dialogue", "--name", "three")
    rows = _rows(run_dir)
    at = {(r["episode"], r["turn"]): r for r in rows}
    assert sorted(at) == [(e, t) for e in range(E) for t in range(1, K + 1)]
    for e in range(E):  # an opening's G episodes share its first attack
        assert at[e, 1]["prompt"] == at[e // G * G, 1]["prompt"]
    # the judge saw each answer once, turn by turn, in the dialogue up to it
    expected = [[m for s in range(1, t + 1) for m in ({"role": "user", "content": at[e, s]["prompt"]},
                                                      {"role": "assistant", "content": at[e, s]["completion"]})]
                for t in range(1, K + 1) for e in range(E)]
    assert KeywordJudge.seen == expected
    for side, group in (("defender", G), ("attacker", A * G)):
        returns = {(e, t): sum(gamma ** (s - t) * at[e, s][f"{side}_reward"] for s in range(t, K + 1))
                   for e in range(E) for t in range(1, K + 1)}
        for t in range(2 if side == "attacker" else 1, K + 1):
            advantage = _group_mean({e: returns[e, t] for e in range(E)}, group)
            for e in range(E):
                assert at[e, t][f"{side}_advantage"] == pytest.approx(advantage[e], abs=1e-5), (side, e, t)
    value = {o: sum(returns[e, 1] for e in range(o * G, o * G + G)) / G for o in range(B * A)}  # attacker's, turn 1
    opening = _group_mean(value, A)
    assert [at[e, 1]["attacker_advantage"] for e in range(E)] == pytest.approx([opening[e // G] for e in range(E)],
                                                                               abs=1e-5)
    metrics = _rows(run_dir, METRICS_FILE)[0]
    assert metrics["unsafe/turn3"] == pytest.approx(sum(at[e, 3]["unsafe"] for e in range(E)) / E, abs=1e-6)
    assert metrics["asr/episode"] == sum(any(at[e, t]["unsafe"] >= 0.5 for t in (1, 2, 3)) for e in range(E)) / E


@pytest.fixture
def bound(tiny_model_dir: Path, tmp_path: Path):
    """A 2-turn adversarial engine, bound as a run binds it: (engine, its parts, config)."""
    config = _config(tiny_model_dir, tmp_path, "--turns", "2", "--lr", "5e-2", "--dtype", "float32")
    engine = make_engine(config.model, seed=config.training.seed)
    step_fn, _ = ADVERSARIAL.prepare(config)(engine, tmp_path / "run")
    return engine, step_fn, config


def _weights(engine: Any, name: str) -> list[torch.Tensor]:
    return [p.detach().clone() for n, p in engine.model.named_parameters() if f".{name}." in n and "lora_" in n]


def test_a_learners_loss_covers_its_own_turns_and_trains_its_adapter_alone(bound) -> None:
    engine, step_fn, config = bound
    parts = step_fn.keywords["parts"]
    goals = parts.sampler.batch(0)
    shape = Shape(len(goals), A, G, 2)
    rnd = rollout(engine, goals, shape, parts.prompter, partial(_draw_params, config, 1))
    dialogues = rnd.dialogues
    defender = _side(engine, [c for turn in rnd.replies for c in turn], config)
    attacker = _side(engine, [c for turn in rnd.attacks for c in turn], config)
    for side, completions, prompts in (
            (defender, defender.completions,
             [parts.prompter.defender(dialogues[e][:2 * t + 1]) for t in range(2) for e in range(E)]),
            (attacker, attacker.completions,
             [parts.prompter.attacker(goals[o // A].messages[-1]["content"], []) for o in range(B * A)]
             + [parts.prompter.attacker(goals[e // (A * G)].messages[-1]["content"], dialogues[e][:2])
                for e in range(E)])):
        ids, mask = side.tensors["input_ids_NT"], side.tensors["loss_mask_NT"]
        for i, (c, prompt) in enumerate(zip(completions, prompts, strict=True)):
            assert list(c.prompt_tokens) == prompt  # the dialogue before the turn, in this side's chat
            on = mask[i].nonzero().squeeze(-1)
            assert ids[i, on].tolist() == list(c.tokens)  # the loss covers the turn's own tokens, nothing else
            assert on.tolist() == list(range(len(prompt), len(prompt) + len(c.tokens)))
    before = {name: _weights(engine, name) for name in (ATTACKER, DEFENDER)}
    train_side(engine, DEFENDER, defender, torch.linspace(-1, 1, len(defender.completions)), config, 1)
    after = {name: _weights(engine, name) for name in (ATTACKER, DEFENDER)}
    assert all(torch.equal(a, b) for a, b in zip(before[ATTACKER], after[ATTACKER], strict=True))
    assert any(not torch.equal(a, b) for a, b in zip(before[DEFENDER], after[DEFENDER], strict=True))
    train_side(engine, ATTACKER, attacker, torch.linspace(-1, 1, len(attacker.completions)), config, 1)
    last = {name: _weights(engine, name) for name in (ATTACKER, DEFENDER)}
    assert all(torch.equal(a, b) for a, b in zip(after[DEFENDER], last[DEFENDER], strict=True))
    assert any(not torch.equal(a, b) for a, b in zip(after[ATTACKER], last[ATTACKER], strict=True))


def test_both_learners_share_one_base_and_the_reference_is_it(bound, tiny_model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    engine, step_fn, _ = bound
    base = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    base_count = sum(p.numel() for p in base.parameters())
    assert engine.adapters == [DEFENDER, ATTACKER]
    named = dict(engine.model.named_parameters())
    lora = {name: sum(p.numel() for n, p in named.items() if "lora_" in n and f".{name}." in n)
            for name in (DEFENDER, ATTACKER)}
    assert lora[ATTACKER] == lora[DEFENDER] > 0
    # one copy of the base's weights under both adapters: the model holds the base and two adapters, nothing more
    assert sum(p.numel() for n, p in named.items() if "lora_" not in n) == base_count
    assert sum(p.numel() for p in named.values()) == base_count + 2 * lora[DEFENDER]
    # the sampler's merged copy (engine.fast_paths, in every local run) is one, whichever adapter samples
    assert sum(p.numel() for p in engine.sampler.merged.parameters()) == base_count
    ids = torch.randint(3, 300, (2, 12), generator=torch.Generator().manual_seed(0))
    attn = torch.ones_like(ids)
    step_fn(1), step_fn(2)  # each side trained once: neither adapter is the base any more
    with torch.no_grad():
        plain = torch.log_softmax(base(input_ids=ids).logits[:, :-1].float(), -1).gather(-1, ids[:, 1:, None])
    reference = engine.logprobs(ids, attn, reference=True)
    torch.testing.assert_close(reference[:, 1:], plain.squeeze(-1), rtol=1e-4, atol=1e-5)
    for name in (ATTACKER, DEFENDER):
        engine.use_adapter(name)
        assert float((engine.logprobs(ids, attn) - reference).abs().max()) > 1e-4, name


def test_a_resumed_run_ends_as_the_unbroken_one(tiny_model_dir: Path, tmp_path: Path) -> None:
    common = ("--lr", "1e-2", "--save_every", "2", "--turns", "2", "--adversarial.novelty", "1")
    whole = _run(tiny_model_dir, tmp_path, "--steps", "4", "--name", "whole", *common)
    part = _run(tiny_model_dir, tmp_path, "--steps", "2", "--name", "part", *common)
    resumed = load_command_config(ADVERSARIAL.command(), None, ["--steps", "4"],
                                  saved=saved_settings(ADVERSARIAL, part))
    assert run_recipe(ADVERSARIAL, resumed, resume_dir=part)["last_step"] == 4
    final = "checkpoints/step_000004"
    for name in ("adapter_model.safetensors", f"{ATTACKER}/adapter_model.safetensors"):
        a, b = load_file(str(whole / final / name)), load_file(str(part / final / name))
        assert a.keys() == b.keys()
        for key, tensor in a.items():
            torch.testing.assert_close(b[key], tensor, rtol=1e-5, atol=1e-6, msg=f"{name}: {key}")
    keep = ("unsafe", "novelty", "defender_advantage", "attacker_advantage", "prompt", "completion")
    assert [{k: r[k] for k in keep} for r in _rows(part)] == [{k: r[k] for k in keep} for r in _rows(whole)]
    assert [m["train/attacker"] for m in _rows(part, METRICS_FILE)] == [1.0, 0.0, 1.0, 0.0]


def test_the_cli_runs_one_turn_and_three_and_report_reads_them(tiny_model_dir: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    for turns in ("1", "3"):
        result = runner.invoke(app, ["adversarial", *_args(tiny_model_dir, tmp_path, "--steps", "1", "--turns",
                                                            turns, "--name", f"k{turns}")])
        assert result.exit_code == 0, result.output
        assert "attack success rate" in result.output
        result = runner.invoke(app, ["report", str(tmp_path / f"k{turns}")])
        assert result.exit_code == 0, result.output
        html = (tmp_path / f"k{turns}" / "report.html").read_text()
        assert "defender_reward" in html and "unsafe" in html


@pytest.mark.parametrize("args, says", [
    (["--schedule", "both"], "unknown schedule 'both'"),
    (["--turns", "0"], "adversarial.turns"),
    (["--adversarial.gamma", "0.5"], "gamma is read only when adversarial.turns > 1"),
    (["--judge", "response_entropy"], "must be a text term"),
    (["--judge", "no_such_judge"], "unknown reward term 'no_such_judge'"),
    (["--judge", "compliance", "--adversarial.judge.params", "{model: x}"], "reward term 'compliance' parameter model"),
    (["--attacker_group", "1"], "adversarial.attacker_group 1"),
    (["--training.advantage", "reinforce_pp"], "takes a group estimator"),
    (["--training.advantage", "rloo", "--training.advantage_std", "true"], "removed: the estimator grpo_std"),
    (["--training.mini_batches", "5"], "exceeds the attacker's 4 turns"),
    (["--engine.procs", "2"], "one process"),
    (["--engine", "tinker"], "^recipe adversarial needs two learners' adapters switched on one base model held in "
                             "this process; engine.kind tinker does not have them: use engine.kind local$"),
    (["--engine", "vllm"], "engine.kind vllm does not have them: use engine.kind local$"),
])
def test_a_bad_config_is_one_line_before_the_model_loads(args: list[str], says: str, tiny_model_dir: Path,
                                                         tmp_path: Path) -> None:
    with pytest.raises(UserError, match=says) as err:
        run_recipe(ADVERSARIAL, _config(tiny_model_dir, tmp_path, *args))
    assert "\n" not in str(err.value)
    assert not list(tmp_path.iterdir())  # no run dir claimed


def test_a_nan_judgement_stops_the_run_naming_where(tiny_model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ExperimentError, match=r"step 1: judge 'nan_judge' gave P\(unsafe\) nan for episode 0, "
                                              r"turn 1") as err:
        _run(tiny_model_dir, tmp_path, "--judge", "nan_judge", "--steps", "1")
    assert "\n" not in str(err.value)


@pytest.mark.process
def test_the_command_line_refuses_in_one_line(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "purplerl", "adversarial", "--schedule", "3:x", "--output_dir",
                           str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "unknown schedule '3:x'" in done.stderr


def test_the_guard_judge_scores_every_turn_in_its_dialogue(tiny_model_dir: Path, tmp_path: Path) -> None:
    """The registered guard term as the judge (a Llama-Guard-style causal LM: here the tiny model itself): each
    row's P(unsafe) is the next-token probability of "unsafe"'s first token after its dialogue up to that turn, in
    the guard's chat template, computed here without the judge."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run_dir = _run(tiny_model_dir, tmp_path, "--steps", "1", "--turns", "2", "--judge", "guard", "--name", "guard",
                   "--adversarial.judge.params", f"{{model: {tiny_model_dir}, device: cpu}}",
                   "--adversarial.judge.reads", "dialogue")
    saved = saved_settings(ADVERSARIAL, run_dir)["adversarial"]["judge"]["params"]
    assert saved == {"model": str(tiny_model_dir), "unsafe_token": "unsafe", "device": "cpu", "batch_size": 8}
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    unsafe_id = tokenizer.encode("unsafe", add_special_tokens=False)[0]
    rows = _rows(run_dir)
    at = {(r["episode"], r["turn"]): r for r in rows}
    for r in rows:
        dialogue = [m for t in range(1, r["turn"] + 1) for m in (
            {"role": "user", "content": at[r["episode"], t]["prompt"]},
            {"role": "assistant", "content": at[r["episode"], t]["completion"]})]
        text = tokenizer.apply_chat_template(dialogue, tokenize=False, add_generation_prompt=True)
        ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])
        with torch.no_grad():
            expected = float(torch.softmax(model(input_ids=ids).logits[0, -1].float(), dim=-1)[unsafe_id])
        assert r["unsafe"] == pytest.approx(expected, abs=1e-5)
    assert len({round(r["unsafe"], 6) for r in rows}) > 1


def test_a_served_judge_scores_through_the_reward_client(tiny_model_dir: Path, tmp_path: Path) -> None:
    """The guard hosted by the reward server (in a thread, on 127.0.0.1) judges through the HTTP client: the
    toxicity term with a url, each dialogue read as its last answer with the history as the prompt."""
    from purplerl.config import RewardServerConfig
    from purplerl.rewards.conversation import LastTurnScorer
    from purplerl.rewards.judges import CausalGuardJudge
    from purplerl.rewards.served import make_server_scorer
    from purplerl.rewards.server import create_app
    from tests.rewards.reward_servers import ThreadServer

    served = make_server_scorer("guard", {"model": str(tiny_model_dir)})
    server = ThreadServer(create_app(RewardServerConfig(), served.scorer, served.label, served.model))
    try:
        run_dir = _run(tiny_model_dir, tmp_path, "--steps", "1", "--turns", "2", "--judge", "toxicity",
                       "--adversarial.judge.params", f"{{url: '{server.url}', retries: 0}}",
                       "--adversarial.judge.reads", "dialogue", "--name", "served")
    finally:
        server.stop()
    rows = _rows(run_dir)
    at = {(r["episode"], r["turn"]): r for r in rows}
    dialogues = [[m for t in range(1, r["turn"] + 1) for m in (
        {"role": "user", "content": at[r["episode"], t]["prompt"]},
        {"role": "assistant", "content": at[r["episode"], t]["completion"]})] for r in rows]
    expected = LastTurnScorer(CausalGuardJudge(str(tiny_model_dir))).score_conversations(dialogues)
    assert [r["unsafe"] for r in rows] == pytest.approx(expected, abs=1e-5)


def _saved_adapters(engine: Any, where: Path) -> dict[str, dict[str, torch.Tensor]]:
    engine.save(where)
    return {name: load_file(str(where / sub / "adapter_model.safetensors"))
            for name, sub in ((DEFENDER, ""), (ATTACKER, ATTACKER))}


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_each_learner_starts_from_the_adapter_it_is_given(tiny_model_dir: Path, tmp_path: Path) -> None:
    """--attacker_init: an attacker SFT run dir (its newest checkpoint) or an adversarial run's checkpoint (its
    attacker adapter); --init_adapter starts the defender. A run dir without a checkpoint is refused in one line."""
    sft = RECIPES["sft"]
    data = tmp_path / "attacks.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"goal {i}", "completion": f"attack {i}"}) + "\n" for i in range(4)))
    run_recipe(sft, load_command_config(sft.command(), None, [
        "--model", str(tiny_model_dir), "--output_dir", str(tmp_path), "--name", "sft", "--data", str(data),
        "--steps", "1", "--batch_size", "2", "--lora_rank", "4", "--lr", "5e-2", "--logging.progress", "false"]))
    sft_adapter = load_file(str(tmp_path / "sft/checkpoints/step_000001/adapter_model.safetensors"))
    earlier = _run(tiny_model_dir, tmp_path, "--steps", "1", "--lr", "5e-2", "--name", "earlier")
    earlier_attacker = load_file(str(earlier / "checkpoints/step_000001" / ATTACKER / "adapter_model.safetensors"))

    for init, expected in ((tmp_path / "sft", sft_adapter), (earlier / "checkpoints/step_000001", earlier_attacker)):
        config = _config(tiny_model_dir, tmp_path, "--attacker_init", str(init),
                         "--init_adapter", str(tmp_path / "sft/checkpoints/step_000001"))
        engine = make_engine(config.model, seed=config.training.seed)
        ADVERSARIAL.prepare(config)(engine, tmp_path / "unused")
        saved = _saved_adapters(engine, tmp_path / f"saved_{init.name}")
        assert _same(saved[ATTACKER], expected) and _same(saved[DEFENDER], sft_adapter)
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "config.yaml").write_text("recipe: sft\n")
    with pytest.raises(UserError, match="is a run dir without an intact checkpoint") as err:
        ADVERSARIAL.prepare(_config(tiny_model_dir, tmp_path, "--attacker_init", str(tmp_path / "empty")))
    assert "\n" not in str(err.value)
