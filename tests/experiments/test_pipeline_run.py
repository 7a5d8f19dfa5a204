"""`purplerl pipeline` end to end on the tiny random model with a tiny eval: stages run in order from the last
passing model, history.json records configs, metrics, gates and decisions, a stage that breaks the model is rolled
back, a killed pipeline resumes at its stage, a reward-model stage judges later ones, and the report renders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

import purplerl.experiments.pipeline.run as pipeline_run
from purplerl.cli import app
from purplerl.experiments.pipeline import read_pipeline, run_pipeline
from purplerl.experiments.pipeline.report import is_pipeline_dir
from purplerl.files import read_jsonl
from purplerl.rewards.embedding import embedding_available
from purplerl.train.steps import Evaluation

PROMPTS = ["hello", "Tell me a joke", "The quick brown fox", "I hate Mondays", "system user", "Roast my friend",
           "please sorry", "good morning"]
# the tiny eval: three requests of each kind answered greedily, two arithmetic and two multiple-choice questions,
# judged by the compliance judge where its embedding is installed
EVAL = {"limit": 3, "modes": ["greedy"], "max_new_tokens": 6, "utility_limit": 2, "utility_tokens": 8,
        "choice_limit": 2, "device": "cpu", "dtype": "float32", "compliance": embedding_available()}
QUIET = {"model": {"lora_rank": 4, "dtype": "float32", "device": "cpu"}, "logging": {"progress": False},
         "training": {"batch_size": 2, "steps": 2}}


@pytest.fixture
def data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PURPLERL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    root = tmp_path / "data"
    root.mkdir()
    rows = {"sft.jsonl": [{"prompt": p, "completion": "thanks again"} for p in PROMPTS],
            "pairs.jsonl": [{"prompt": p, "chosen": "thanks again", "rejected": "go away"} for p in PROMPTS],
            # a constant answer learnt at a learning rate that is far too high: every prompt gets it
            "break.jsonl": [{"prompt": p, "completion": " again" * 8} for p in PROMPTS]}
    for name, content in rows.items():
        (root / name).write_text("".join(json.dumps(row) + "\n" for row in content))
    return root


def _sft(name: str, data: Path, source: str = "sft.jsonl", **config) -> dict:
    return {"name": name, "kind": "sft", "config": {"data": {"source": str(data / source)},
                                                    "sft": {"eval_fraction": 0.0}, **config}}


def _pipeline(model: Path, out: Path, stages: list, **extra) -> dict:
    return {"out": str(out), "model": str(model), "shared": QUIET, "eval": EVAL,
            "gates": [{"metric": "validator/degenerate", "max": 0}], "stages": stages, **extra}


def _config(out: Path, stage: str) -> dict:
    return yaml.safe_load((out / "runs" / stage / "config.yaml").read_text())


def test_a_pipeline_runs_end_to_end_and_reports(tiny_model_dir: Path, data: Path, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "out"
    stages = [_sft("sft", data),
              {"name": "dpo", "kind": "prefs", "config": {"data": {"source": str(data / "pairs.jsonl")},
                                                          "prefs": {"eval_fraction": 0.0}}},
              {"name": "final", "kind": "eval", "config": {"limit": 4},
               "gates": [{"metric": "refusal/harmful/greedy", "max": 1.0}]}]
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(_pipeline(tiny_model_dir, tmp_path / "elsewhere", stages)))
    result = CliRunner().invoke(app, ["pipeline", str(path), "--out", str(out)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert f"final model: {out.resolve() / 'models' / 'dpo'}" in result.output

    history = json.loads((out / "history.json").read_text())
    assert history["start"]["model"] == str(tiny_model_dir)
    assert [(e["name"], e["decision"]) for e in history["stages"]] == [
        ("sft", "passed"), ("dpo", "passed"), ("final", "passed")]
    sft, dpo, final = history["stages"]
    models = out.resolve() / "models"
    # each policy stage trains from the last passing model: dpo's base (and reference) is sft's merged model
    assert (sft["model_in"], dpo["model_in"], final["model_in"]) == (str(tiny_model_dir), str(models / "sft"),
                                                                      str(models / "dpo"))
    assert _config(out, "dpo")["model"]["name"] == dpo["config"]["model"]["name"] == str(models / "sft")
    assert (models / "sft" / "config.json").is_file() and history["final_model"] == str(models / "dpo")
    # each entry: its config, the run's summary, its metrics with CIs and the validator's, its gates
    assert sft["config"]["recipe"] == "sft" and sft["config"]["training"]["steps"] == 2
    assert sft["summary"]["last_step"] == 2 and sft["summary"]["stop_reason"] == "completed all steps"
    for entry in (sft, dpo, final):
        metrics = entry["metrics"]
        assert metrics["refusal/harmful/greedy"]["n"] == (4 if entry is final else 3)
        assert {"low", "high"} <= set(metrics["utility/arithmetic"]) and metrics["utility/choice"]["n"] == 2
        assert {"validator/nll", "validator/degenerate", "validator/top_share", "validator/repetition"} <= set(metrics)
        if embedding_available():
            assert metrics["compliance/benign/greedy"]["n"] == metrics["refusal/benign/greedy"]["n"]
        assert "judge/win_rate" not in metrics  # no judge named
    assert [g["metric"] for g in final["gates"]] == ["validator/degenerate", "refusal/harmful/greedy"]
    assert all(g["passed"] for e in history["stages"] for g in e["gates"])
    assert json.loads((out / "evals" / "final.json").read_text())["answers"]["benign/greedy"][0]["prompt"]

    # a rerun finds every stage decided and trains nothing
    monkeypatch.setattr(pipeline_run, "run_recipe", lambda *a, **k: pytest.fail("a decided stage ran again"))
    again = run_pipeline(read_pipeline(yaml.safe_load(path.read_text()), ["--out", str(out)]), announce=lambda _: None)
    assert again["stages"] == history["stages"]

    assert is_pipeline_dir(out) and not is_pipeline_dir(out / "runs" / "sft")
    result = CliRunner().invoke(app, ["report", str(out)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    page = (out / "report.html").read_text()
    assert "Stage dpo (prefs): passed" in page and "refusal/harmful/greedy" in page and "<script" not in page
    assert (out / "plots" / "gate_validator-degenerate.png").stat().st_size > 1000


def test_a_stage_that_breaks_the_model_is_rolled_back(tiny_model_dir: Path, data: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "out"
    broken = _sft("broken", data, "break.jsonl", training={"lr": 0.05, "steps": 10},
                  model={"lora_targets": "q_proj,v_proj,lm_head"})
    stages = [_sft("good", data), broken, _sft("collapsing", data), _sft("after", data)]
    train = pipeline_run.train

    def collapses(stage, config, run_dir, announce):  # as the RL loop's collapse stop ends a run
        if stage.name == "collapsing":
            return {"last_step": 1, "stop_reason": "collapsed: 100% of the completions are empty (bound 25%)"}
        return train(stage, config, run_dir, announce)

    monkeypatch.setattr(pipeline_run, "train", collapses)
    history = run_pipeline(read_pipeline(_pipeline(tiny_model_dir, out, stages)), announce=lambda _: None)
    good, broke, collapsing, after = history["stages"]
    good_model = str(out.resolve() / "models" / "good")
    assert (good["decision"], broke["decision"], collapsing["decision"], after["decision"]) == (
        "passed", "rolled back", "rolled back", "passed")
    # the broken stage answers every prompt alike; its gate says which bound it crossed, with the value
    (failed,) = [g for g in broke["gates"] if g["passed"] is False]
    assert (failed["metric"], failed["value"], failed["upper"]) == ("validator/degenerate", 1.0, 0.0)
    assert broke["metrics"]["validator/top_share"]["mean"] == 1.0
    assert broke["reasons"] == ["validator/degenerate 1.000 > 0.000 (max 0)"]
    assert broke["model_after"] == good_model and broke["model_out"] == str(out.resolve() / "models" / "broken")
    assert collapsing["reasons"] == ["training collapsed: 100% of the completions are empty (bound 25%)"]
    # the next stages start from the last passing model
    assert broke["model_in"] == collapsing["model_in"] == after["model_in"] == good_model
    assert _config(out, "after")["model"]["name"] == good_model
    assert history["final_model"] == str(out.resolve() / "models" / "after")


def test_a_killed_pipeline_resumes_at_its_stage(tiny_model_dir: Path, data: Path, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "out"
    settings = read_pipeline(_pipeline(tiny_model_dir, out, [
        _sft("a", data), _sft("b", data, training={"steps": 3}, run={"save_every": 1}), _sft("c", data)]))
    real, calls = pipeline_run.run_recipe, []

    def killed_in_b(recipe, config, resume_dir=None, **kwargs):
        calls.append((config.run.name, resume_dir))
        if config.run.name == "b" and resume_dir is None:  # killed in step 2, after step 1's checkpoint
            def evaluate(engine, step):
                if step == 2:
                    raise KeyboardInterrupt
                return {}
            kwargs["evaluation"] = Evaluation(evaluate, 1)
        return real(recipe, config, resume_dir=resume_dir, **kwargs)

    monkeypatch.setattr(pipeline_run, "run_recipe", killed_in_b)
    with pytest.raises(KeyboardInterrupt):
        run_pipeline(settings, announce=lambda _: None)
    history = json.loads((out / "history.json").read_text())
    assert [e["name"] for e in history["stages"]] == ["a"]  # b has a run dir but no decision
    assert (out / "runs" / "b" / "config.yaml").is_file() and not (out / "runs" / "c").exists()

    history = run_pipeline(settings, announce=lambda _: None)
    run_b = out.resolve() / "runs" / "b"
    # a is not run again; b resumes from its run dir; c starts fresh
    assert calls == [("a", None), ("b", None), ("b", run_b), ("c", None)]
    assert [(e["name"], e["decision"]) for e in history["stages"]] == [("a", "passed"), ("b", "passed"),
                                                                       ("c", "passed")]
    segments = read_jsonl(run_b / "config_history.jsonl")
    assert [s["from_step"] for s in segments] == [1, 2]
    assert [row["step"] for row in read_jsonl(run_b / "metrics.jsonl")] == [1, 2, 3]
    assert history["stages"][1]["summary"]["last_step"] == 3
    assert history["stages"][2]["model_in"] == str(out.resolve() / "models" / "b")


def test_a_changed_decided_stage_is_refused_on_rerun(tiny_model_dir: Path, data: Path, tmp_path: Path) -> None:
    from purplerl.errors import UserError

    out = tmp_path / "out"
    run_pipeline(read_pipeline(_pipeline(tiny_model_dir, out, [_sft("a", data)])), announce=lambda _: None)
    changed = _pipeline(tiny_model_dir, out, [_sft("a", data, training={"steps": 3})])
    with pytest.raises(UserError, match=r"stage 'a' changed since it was decided: use another --out"):
        run_pipeline(read_pipeline(changed), announce=lambda _: None)
    with pytest.raises(UserError, match=r"the pipeline's eval changed since stage 'a' was decided"):
        run_pipeline(read_pipeline(_pipeline(tiny_model_dir, out, [_sft("a", data)]) | {"eval": {**EVAL, "limit": 4}}),
                     announce=lambda _: None)
    # a stage added after the decided ones is fine: the pipeline goes on from where it stood
    more = run_pipeline(read_pipeline(_pipeline(tiny_model_dir, out, [_sft("a", data), _sft("b", data)])),
                        announce=lambda _: None)
    assert [e["name"] for e in more["stages"]] == ["a", "b"]


def test_a_reward_model_stage_judges_the_later_stages(tiny_model_dir: Path, data: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    grpo = {"name": "grpo", "kind": "attack", "config": {
        "reward": {"terms": {"reward_model": 1.0}, "reward_model": {"run": "${stages.rm}"}},
        "sampling": {"group_size": 2, "max_new_tokens": 4}}}
    # PPO's checkpoint holds the policy and its critic: the policy is what is merged
    ppo = {"name": "ppo", "kind": "ppo", "config": {**grpo["config"], "training": {"ppo_epochs": 1}}}
    stages = [_sft("before", data),
              {"name": "rm", "kind": "reward-model", "config": {"data": {"source": str(data / "pairs.jsonl")},
                                                               "reward_model": {"eval_fraction": 0.0}}},
              _sft("sft", data), grpo, ppo]
    settings = read_pipeline(_pipeline(tiny_model_dir, out, stages, judge="rm",
                                       gates=[{"metric": "judge/win_rate", "min": 0.0}]))
    history = run_pipeline(settings, announce=lambda _: None)
    before, rm, sft, attack, critic = history["stages"]
    # the reward model trains on the current model; the policy stays where it was
    before_model = str(out.resolve() / "models" / "before")
    assert (rm["decision"], rm["model_in"], rm["model_after"], sft["model_in"]) == ("done", *[before_model] * 3)
    assert _config(out, "rm")["model"]["name"] == before_model
    rm_run = str(out.resolve() / "runs" / "rm")
    assert _config(out, "grpo")["reward"]["terms"]["reward_model"]["params"]["run"] == rm_run
    # before the reward model exists there is no judge: the gate is skipped, saying why
    assert "judge/win_rate" not in before["metrics"]
    assert (before["gates"][0]["passed"], before["gates"][0]["reason"]) == (None, "not measured")
    assert [e["decision"] for e in (sft, attack, critic)] == ["passed"] * 3
    assert critic["model_in"] == str(out.resolve() / "models" / "grpo")
    for entry in (sft, attack, critic):
        win = entry["metrics"]["judge/win_rate"]
        assert 0.0 <= win["low"] <= win["mean"] <= win["high"] <= 1.0 and win["n"] == 3
        assert entry["gates"][0]["passed"] is True
    # the reward/judge check reads the training samples of a stage trained on a reward
    assert "validator/high_reward_low_judge" not in sft["metrics"]
    for entry in (attack, critic):
        assert 0.0 <= entry["metrics"]["validator/high_reward_low_judge"]["mean"] <= 1.0


def test_a_process_reward_model_stage_judges_with_its_own_term(tiny_model_dir: Path, data: Path, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A prm stage is a scorer as a reward-model stage is: the judge scores with the `prm` term (its steps'
    probabilities), not by reading its head as an outcome reward model's."""
    from purplerl.runs.process_reward import ProcessRewardScorer

    judged: list[int] = []
    score = ProcessRewardScorer.score
    monkeypatch.setattr(ProcessRewardScorer, "score", lambda self, texts, prompts=None: judged.append(len(texts))
                        or score(self, texts, prompts))
    steps = data / "steps.jsonl"
    steps.write_text("".join(json.dumps({"prompt": p, "completions": ["thanks", "again"], "labels": [True, False]})
                             + "\n" for p in PROMPTS))
    out = tmp_path / "out"
    stages = [{"name": "prm", "kind": "prm", "config": {"data": {"source": str(steps)}, "prm": {"eval_fraction": 0.0}}},
              _sft("sft", data)]
    history = run_pipeline(read_pipeline(_pipeline(tiny_model_dir, out, stages, judge="prm")), announce=lambda _: None)
    prm, sft = history["stages"]
    assert prm["decision"] == "done" and sft["decision"] == "passed"
    win = sft["metrics"]["judge/win_rate"]
    assert 0.0 <= win["low"] <= win["mean"] <= win["high"] <= 1.0 and win["n"] == 3
    assert judged  # the prm term's scorer judged the answers


def test_a_refine_stage_writes_the_next_stages_sft_data(tiny_model_dir: Path, data: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    refine = {"name": "ref", "kind": "refine", "config": {
        "data": {"source": str(data / "sft.jsonl"), "limit": 2}, "rounds": 1, "max_new_tokens": 4, "batch_size": 2,
        "max_context_tokens": 256, "policy": {"device": "cpu", "dtype": "float32"}}}
    stages = [_sft("sft", data), refine,
              {"name": "again", "kind": "sft", "config": {"data": {"source": "${stages.ref}"},
                                                          "sft": {"eval_fraction": 0.0}}}]
    history = run_pipeline(read_pipeline(_pipeline(tiny_model_dir, out, stages)), announce=lambda _: None)
    target = out.resolve() / "refine" / "ref"
    assert [(e["name"], e["decision"]) for e in history["stages"]] == [("sft", "passed"), ("ref", "done"),
                                                                       ("again", "passed")]
    ref = history["stages"][1]
    # the refiner's policy is the current model; its SFT file is what ${stages.ref} named
    assert ref["model_in"] == ref["model_after"] == str(out.resolve() / "models" / "sft")
    assert json.loads((target / "refine.json").read_text())["policy"] == ref["model_in"]
    assert ref["output"] == str(target / "sft.jsonl") == _config(out, "again")["data"]["source"]
    assert len(read_jsonl(target / "revisions.jsonl")) == 2
