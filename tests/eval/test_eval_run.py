"""`purplerl eval` end to end on the tiny random model, in this process, plus its resume logic; its one-line errors in
real processes too (the process tier)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from purplerl.config import EVAL, EvalCommandConfig, load_command_config
from purplerl.errors import UserError
from purplerl.eval.run import SUITE_RUNS, read_generations, validate
from purplerl.eval.suites import SUITES, table
from purplerl.files import safe_file_stem
from purplerl.types import PromptRecord
from tests.conftest import invoke_cli

LIMIT, N = 4, 2
FAST = ["--limit", str(LIMIT), "--n", str(N), "--max-new-tokens", "6", "--batch-size", "2", "--utility-limit", "3",
        "--device", "cpu"]


def env(cache: Path) -> dict[str, str]:
    return {**os.environ, "PURPLERL_CACHE": str(cache), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1"}


def start(*args: str | Path, cache: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "purplerl.cli", "eval", *map(str, args)], env=env(cache),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen, timeout: float = 120) -> subprocess.CompletedProcess:
    out, err = proc.communicate(timeout=timeout)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def rows_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def adapter(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A PEFT adapter saved straight from a LocalEngine, as a run's checkpoint dir would hold one."""
    from purplerl.config import ModelConfig
    from purplerl.engines.local import LocalEngine

    path = tmp_path_factory.mktemp("run") / "step_000001"
    LocalEngine(ModelConfig(name=str(tiny_model_dir), device="cpu")).save(path)
    return path


def run_eval(*args: str | Path, cache: Path) -> subprocess.CompletedProcess:
    return invoke_cli("eval", *args, env={"PURPLERL_CACHE": str(cache)})


@pytest.fixture(scope="module")
def evaluated(tiny_model_dir: Path, adapter: Path, tmp_path_factory: pytest.TempPathFactory):
    """One full eval (base + adapter, all suites), a rerun into the same out, and a resumed one from a hand-cut
    generations file."""
    root = tmp_path_factory.mktemp("eval")
    cache, out, partial = root / "cache", root / "out", root / "partial"
    (partial / "generations").mkdir(parents=True)
    # prompt 0 whole (kept), prompt 1 half written, then a line cut by a kill: both dropped and redone
    first = run_eval("--model", tiny_model_dir, "--checkpoint", adapter, "--out", out, *FAST, cache=cache)
    assert first.returncode == 0, first.stderr
    handmade = rows_of(out / "generations" / "base.jsonl")[:N + 1]
    for row in handmade[:N]:
        row["completion"] = "HANDWRITTEN"
    lines = [json.dumps(row) for row in handmade] + ['{"uid": "cut']  # a kill leaves no newline after a cut line
    (partial / "generations" / "base.jsonl").write_text("\n".join(lines))
    mtimes = {p.name: p.stat().st_mtime_ns for p in (out / "generations").iterdir()}
    again = run_eval("--model", tiny_model_dir, "--checkpoint", adapter, "--out", out, *FAST, cache=cache)
    resumed = run_eval("--model", tiny_model_dir, "--suite", "diversity", "--out", partial, *FAST, cache=cache)
    return {"out": out, "first": first, "again": again, "mtimes": mtimes, "partial": partial, "resumed": resumed,
            "adapter": adapter}


def test_eval_writes_every_suite_for_every_target(evaluated) -> None:
    result = json.loads((evaluated["out"] / "eval.json").read_text())
    assert set(result["targets"]) == {"base", "step_000001"}
    assert result["config"]["targets"] == {"base": None, "step_000001": str(evaluated["adapter"])}
    for label, suites in result["targets"].items():
        assert set(suites) == {"harm", "utility", "diversity"}, label
        harm = suites["harm"]
        assert harm["n"] == LIMIT * N
        assert set(harm["metrics"]) == {"refusal_rate", "keyword_asr", "mean_toxicity"}
        for name, ci in harm["metrics"].items():
            top = 1.0 if name == "mean_toxicity" else 100.0
            assert 0.0 <= ci["low"] <= ci["point"] <= ci["high"] <= top, (label, name, ci)
        assert harm["by_category"] and sum(c["n"] for c in harm["by_category"].values()) == LIMIT * N
        utility = suites["utility"]
        assert utility["n"] == 3 and len(utility["items"]) == 3
        assert 0.0 <= utility["metrics"]["exact_match"]["point"] <= 1.0
        assert suites["diversity"]["n"] == LIMIT * N and 0.0 <= suites["diversity"]["unique_fraction"] <= 1.0
    samples = result["samples"]
    assert len(samples) == 2 * LIMIT * N
    for row in samples:
        assert {"target", "uid", "category", "prompt", "completion", "toxicity", "refused"} <= set(row)
        assert 0.0 <= row["toxicity"] <= 1.0 and row["refused"] in (0.0, 1.0)
    assert "base" in evaluated["first"].stdout and "mean_toxicity" in evaluated["first"].stdout
    page = (evaluated["out"] / "report.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and "step_000001" in page and "mean_toxicity" in page


def test_generation_files_hold_every_sample_in_order(evaluated) -> None:
    for name in ("base.jsonl", "step_000001.jsonl"):
        rows = rows_of(evaluated["out"] / "generations" / name)
        assert [(r["prompt_index"], r["sample"]) for r in rows] == [(i, k) for i in range(LIMIT) for k in range(N)]


def test_rerun_into_the_same_out_does_not_regenerate(evaluated) -> None:
    assert evaluated["again"].returncode == 0, evaluated["again"].stderr
    now = {p.name: p.stat().st_mtime_ns for p in (evaluated["out"] / "generations").iterdir()}
    assert now == evaluated["mtimes"]
    assert json.loads((evaluated["out"] / "eval.json").read_text())["targets"]["base"]["harm"]["n"] == LIMIT * N


def test_a_killed_generation_resumes_after_its_last_whole_prompt(evaluated) -> None:
    assert evaluated["resumed"].returncode == 0, evaluated["resumed"].stderr
    rows = rows_of(evaluated["partial"] / "generations" / "base.jsonl")
    assert len(rows) == LIMIT * N
    assert [r["completion"] for r in rows[:N]] == ["HANDWRITTEN"] * N  # kept, not regenerated
    assert all(r["completion"] != "HANDWRITTEN" for r in rows[N:])
    assert [(r["prompt_index"], r["sample"]) for r in rows] == [(i, k) for i in range(LIMIT) for k in range(N)]
    result = json.loads((evaluated["partial"] / "eval.json").read_text())
    assert set(result["targets"]["base"]) == {"diversity"}


@pytest.mark.parametrize(("args", "needle"), [
    (["--suite", "harm,speed"], "unknown suite 'speed'"),
    (["--checkpoint", "/nonexistent/step_000001"], "checkpoint dir not found"),
    (["--prompts", "/nonexistent/prompts.jsonl"], "/nonexistent/prompts.jsonl"),
    (["--harm-model", "some/classifier"], "harm_model and harm_label go together"),
    (["--guard-model", "some/guard", "--suite", "diversity"], "add harm to eval.suites"),
    (["--n", "0"], "config field 'eval.n': Input should be greater than or equal to 1"),
])
def test_user_mistakes_are_one_line_errors_with_exit_2(tiny_model_dir: Path, tmp_path: Path, args, needle) -> None:
    proc = run_eval("--model", tiny_model_dir, "--out", tmp_path / "out", *args, cache=tmp_path / "cache")
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], proc.stderr


def _one_line_error(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), proc.stderr
    return lines[0]


@pytest.mark.process
def test_bad_input_is_one_line_and_writes_nothing_into_out(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Each mistake is found before anything is written, so the corrected rerun into the same --out runs."""
    latin1 = tmp_path / "latin1.jsonl"
    latin1.write_bytes(b'{"prompt": "one"}\n{"prompt": "two"}\n\xff\xfe{"prompt": "three"}\n')
    adapters = {"invalid-json": b'{"peft_type": "LORA", "r": 8', "wrong-type": b'{"peft_type": "LORA", "r": true}'}
    for name, config in adapters.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "adapter_config.json").write_bytes(config)
        (tmp_path / name / "adapter_model.safetensors").write_bytes(b"")
    cases = {
        "device": (["--device", "tpu"], "config field 'model.device': Input should be 'auto', 'cpu' or 'cuda'"),
        "prompts": (["--prompts", latin1], f"{latin1}:3: line 3 is not UTF-8"),
        "invalid-json": (["--checkpoint", tmp_path / "invalid-json"], "adapter_config.json:1: invalid JSON"),
        "wrong-type": (["--checkpoint", tmp_path / "wrong-type"], "field 'r' must be a positive integer, got true"),
        "model": (["--model", tmp_path / "no-such-model"], "no-such-model"),
    }
    outs = {name: tmp_path / f"out-{name}" for name in cases}
    procs = {name: start(*(["--model", tiny_model_dir] if name != "model" else []), "--out", outs[name], *FAST,
                         *args, cache=tmp_path / "cache") for name, (args, _) in cases.items()}
    for name, proc in procs.items():
        line = _one_line_error(finish(proc))
        assert cases[name][1] in line, (name, line)
        assert not outs[name].exists(), (name, sorted(outs[name].rglob("*")))
    fixed = finish(start("--model", tiny_model_dir, "--out", outs["device"], "--suite", "diversity", "--limit", "2",
                         "--n", "1", "--max-new-tokens", "4", "--device", "cpu", cache=tmp_path / "cache"))
    assert fixed.returncode == 0, fixed.stderr
    assert json.loads((outs["device"] / "generation.json").read_text())["data.limit"] == 2
    assert len(rows_of(outs["device"] / "generations" / "base.jsonl")) == 2


def test_read_generations_drops_a_cut_tail_and_refuses_other_prompts(tmp_path: Path) -> None:
    prompts = [PromptRecord(messages=({"role": "user", "content": f"p{i}"},), uid=f"u{i}") for i in range(3)]
    path = tmp_path / "g.jsonl"
    whole = [{"uid": "u0", "prompt_index": 0, "sample": 0}, {"uid": "u0", "prompt_index": 0, "sample": 1}]
    path.write_text("".join(json.dumps(r) + "\n" for r in whole) + json.dumps(whole[0] | {"uid": "u1",
                    "prompt_index": 1}) + "\n" + '{"uid"')
    assert read_generations(path, prompts, 2) == whole
    assert read_generations(tmp_path / "missing.jsonl", prompts, 2) == []
    with pytest.raises(UserError, match="line 1 is not sample 0 of prompt 'other'"):
        read_generations(path, [PromptRecord(messages=(), uid="other")] + prompts, 2)
    path.write_text(json.dumps(whole[0]) + "\n[1, 2]\n" + json.dumps(whole[1]) + "\n")
    with pytest.raises(UserError, match="g.jsonl:2: expected a JSON object, got an array"):
        read_generations(path, prompts, 2)


def _eval(*args: str | Path, model: str | Path = "m") -> EvalCommandConfig:
    return load_command_config(EVAL, None, ["--model", str(model), *map(str, args)])


def _targets(cfg: EvalCommandConfig) -> dict[str, str | None]:
    return {label: policy.model.init_adapter for label, policy in validate(cfg, announce=lambda _: None).items()}


def test_validate_labels_targets_and_refuses_bad_settings(adapter: Path, tiny_model_dir: Path,
                                                          tmp_path: Path) -> None:
    # validate checks each adapter against the model's config: the model is a real one here
    assert _targets(_eval("--checkpoint", adapter, model=tiny_model_dir)) == {"base": None,
                                                                            "step_000001": str(adapter)}
    twin = tmp_path / "other" / "step_000001"
    shutil.copytree(adapter, twin)
    assert list(_targets(_eval("--checkpoint", adapter, "--checkpoint", twin, model=tiny_model_dir))) == [
        "base", "step_000001", "other-step_000001"]
    # the final checkpoints of several runs share their step: the run's name tells them apart
    runs = [tmp_path / "runs" / name / "checkpoints" / "step_000001" for name in ("seed0", "seed1")]
    for path in runs:
        shutil.copytree(adapter, path)
    assert list(_targets(_eval("--checkpoint", runs[0], "--checkpoint", runs[1], "--checkpoint", twin,
                               model=tiny_model_dir))) == ["base", "step_000001", "seed1-step_000001",
                                                           "other-step_000001"]
    # labels name generations/<label>.jsonl, so a dir name that is no safe file name is made one
    odd = tmp_path / "run; rm -rf ~" / "..step 1"
    shutil.copytree(adapter, odd)
    label = list(_targets(_eval("--checkpoint", odd, model=tiny_model_dir)))[1]
    assert label == safe_file_stem("..step 1") and "/" not in label and not label.startswith(".")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no adapter_config.json"):
        validate(_eval("--checkpoint", tmp_path / "empty"))


@pytest.mark.parametrize(("args", "needle"), [
    (["--top_p", "0"], "config field 'sampling.top_p': Input should be greater than 0"),
    (["--temperature", ".inf"], "config field 'sampling.temperature': Input should be a finite number"),
    (["--temperature", ".nan"], "config field 'sampling.temperature': Input should be a finite number"),
    (["--device", "tpu"], "config field 'model.device'"),
    (["--suite", "harm,harm"], "config field 'eval.suites': repeats a suite: harm,harm"),
    (["--suite", "harm,speed"], "config field 'eval.suites.1': unknown suite 'speed' (choose from harm, utility, "
                                "diversity)"),
    (["--training.steps", "3"], "config field 'training': unknown field"),
    (["--lr", "0.1"], "unknown option --lr"),
])
def test_bad_settings_name_the_field(args: list[str], needle: str) -> None:
    with pytest.raises(UserError) as info:
        _eval(*args)
    assert needle in str(info.value) and "\n" not in str(info.value), str(info.value)


def test_suites_parse_in_order_and_every_registered_suite_runs() -> None:
    assert _eval("--suite", "utility, harm").eval.suites == ["utility", "harm"]
    assert _eval("--suite", "diversity", "--suite", "harm").eval.suites == ["diversity", "harm"]
    assert EvalCommandConfig().eval.suites == list(SUITES)
    assert set(SUITE_RUNS) == set(SUITES)


def test_table_prints_point_and_interval() -> None:
    text = table({"base": {"harm": {"metrics": {"refusal_rate": {"point": 12.5, "low": 0.0, "high": 37.5}}}}})
    assert "12.500 [0.000, 37.500]" in text and text.splitlines()[1].startswith("base")
