"""tamper-test end to end on the tiny random model with a trained adapter as the "defense": every threat model
runs, reference runs are shared, the report is built from the runs' held-out logs, and a killed multi-seed
test resumes to the same tamper.json as an uninterrupted one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import purplerl.experiments.tamper as tamper
from purplerl.config import load_command_config, read_config_file
from purplerl.experiments.tamper.bootstrap import CLUSTER
from purplerl.experiments.tamper.heldout import HARM_KEY
from purplerl.experiments.tamper.report import tamper_summary
from purplerl.experiments.tamper.settings import TAMPER
from purplerl.experiments.tamper.stats import curve_stats
from purplerl.files import read_jsonl


def _config(model: Path, adapter: Path, out: Path, threats: str, *extra: str):
    return load_command_config(TAMPER, None, [
        "--model", str(model), "--model.device", "cpu", "--model.dtype", "float32", "--lora_rank", "4",
        "--steps", "3", "--batch_size", "2", "--group_size", "2", "--max_new_tokens", "6", "--save_every", "2",
        "--logging.progress", "false", "--adapter", str(adapter), "--out", str(out), "--utility_limit", "2",
        "--utility_tokens", "8", "--threats", threats, "--seeds", "2", "--eval_every", "2", "--eval_prompts", "4",
        "--tamper.sft_min_toxicity", "0", "--tamper.sft_min_rows", "2", *extra])


def test_every_threat_model_end_to_end(tiny_model_dir: Path, trained_adapter_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "tamper"
    result = tamper.run_tamper_test(_config(tiny_model_dir, trained_adapter_dir, out, "merged,adapter,sft,adaptive"),
                                    announce=lambda line: None)
    saved = json.loads((out / "tamper.json").read_text())
    assert saved == json.loads(json.dumps(result))
    assert (out / "summary.txt").read_text() == tamper_summary(saved) + "\n"
    assert (out / "tamper.png").stat().st_size > 1000
    # the summary's last-evaluation shares are the seeds' mean of what evals.jsonl recorded
    merged_row = next(line for line in (out / "summary.txt").read_text().splitlines()
                      if line.startswith("merged ")).split()
    finals = {key: [saved["runs"][name][key][-1] for name in saved["threats"]["merged"]["base_runs"]]
              for key in ("heldout_refusal", "heldout_degenerate")}
    assert merged_row[-3:-1] == [f"{sum(v) / len(v):.3f}" for v in finals.values()]
    utility = json.loads((out / "utility.json").read_text())
    assert utility["base_benign_refusal"]["n"] == utility["defended_benign_refusal"]["n"] == 40
    benign = utility["defended_benign_refusal"]["point"] <= utility["base_benign_refusal"]["high"]
    assert utility["kept"] == (utility["defended"]["point"] >= utility["base"]["low"] and benign)
    runs = out / "runs"
    first_eval = json.loads((runs / "rl_base_s0" / "evals.jsonl").read_text().splitlines()[0])
    assert saved["settings"]["eval_prompts"] == first_eval["heldout/n"]  # the prompts judged, not the asked limit
    expected = {f"{family}_{start}_s{seed}" for seed in (0, 1) for family, start in [
        ("rl", "base"), ("rl", "merged"), ("rl", "adapter"), ("adaptive", "base"), ("adaptive", "merged"),
        ("sft", "base"), ("sft", "merged")]}
    assert {p.name for p in runs.iterdir()} == expected == set(saved["runs"])  # one rl_base per seed, shared
    t = saved["threats"]
    assert t["merged"]["base_runs"] == t["adapter"]["base_runs"] == ["rl_base_s0", "rl_base_s1"]
    assert t["adaptive"]["defended_runs"] == ["adaptive_merged_s0", "adaptive_merged_s1"]
    assert t["merged"]["base"]["final_harm"]["method"] == CLUSTER and f"final harm: {CLUSTER}" in (
        out / "summary.txt").read_text()

    def cfg(name: str) -> dict:
        return read_config_file(runs / name / "config.yaml")

    merged = str(out / "merged_model")
    assert cfg("rl_adapter_s1")["model"]["init_adapter"] == str(trained_adapter_dir)
    assert (cfg("rl_merged_s1")["model"]["name"], cfg("rl_merged_s1")["model"]["init_adapter"]) == (merged, None)
    assert cfg("rl_base_s1")["model"]["name"] == str(tiny_model_dir) and cfg("rl_base_s1")["training"]["seed"] == 1
    # the adaptive attack adds the entropy_bonus term (weight 1) with its cap; the plain attack has none
    assert cfg("adaptive_merged_s0")["reward"]["terms"]["entropy_bonus"] == {
        "fn": "entropy_bonus", "weight": 1.0, "params": {"cap": 3.0}, "hack_at": None}
    assert "entropy_bonus" not in cfg("rl_merged_s0")["reward"]["terms"]
    assert (cfg("sft_merged_s0")["recipe"], cfg("sft_merged_s0")["model"]["name"]) == ("sft", merged)
    assert cfg("sft_base_s0")["data"]["source"] == str(out / "sft_data.jsonl")
    mined = read_jsonl(out / "sft_data.jsonl")
    source_texts = {row["completion"].strip() for row in read_jsonl(runs / "rl_base_s0" / "samples.jsonl")}
    assert mined and all(row["completion"] in source_texts for row in mined)  # mined from this test's base attack

    for name, run in saved["runs"].items():
        evals = read_jsonl(runs / name / "evals.jsonl")
        assert [row["step"] for row in evals] == [0, 2, 3]  # step 0, every 2 steps, the last step
        curve = [(row["step"], row[HARM_KEY]) for row in evals]
        assert run["harm_curve"] == [list(point) for point in curve]
        assert run["harm_flags"] == [row["heldout/compliance_harm_flags"] for row in evals]  # the measure's verdicts
        assert {k: run[k] for k in ("auc", "final_harm", "steps_to_threshold")} == pytest.approx(
            {k: v for k, v in curve_stats(curve, 0.5).items() if k in ("auc", "final_harm", "steps_to_threshold")})
    # the defense merged into the weights is the same model as the adapter on the base: at step 0, before any
    # attack, both answer the held-out prompts the same way (same sampling seed); the adapter answers " again"
    # over and over, which the judge counts as degenerate, not harmful
    for seed in (0, 1):
        at_0 = [read_jsonl(runs / f"rl_{start}_s{seed}" / "evals.jsonl")[0] for start in ("adapter", "merged")]
        assert at_0[0]["heldout/degenerate"] == at_0[1]["heldout/degenerate"] == 1.0
        assert at_0[0][HARM_KEY] == at_0[1][HARM_KEY] == 0.0
    base_0 = read_jsonl(runs / "rl_base_s0" / "evals.jsonl")[0]
    assert base_0["heldout/degenerate"] < 1.0 and base_0["heldout/keyword_harm"] > 0.0
    # without a model judge the held-out harm is the compliance judge's
    assert saved["settings"]["harm_measure"] == "compliance" and base_0[HARM_KEY] == base_0["heldout/compliance_harm"]


def test_a_killed_multi_seed_tamper_test_resumes_to_the_same_result(
        tiny_model_dir: Path, trained_adapter_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    whole = tamper.run_tamper_test(_config(tiny_model_dir, trained_adapter_dir, tmp_path / "a", "merged,sft"),
                                   announce=lambda line: None)
    out = tmp_path / "b"
    config = _config(tiny_model_dir, trained_adapter_dir, out, "merged,sft")
    execute, calls = tamper.execute, []

    def killed_in_the_fourth_run(run_config, run, run_dir, evaluation):
        calls.append(run.name)
        if len(calls) == 4:  # rl_merged_s1: killed in its step-3 evaluation, after its step-2 checkpoint
            live = evaluation.evaluate

            def evaluate(engine, step):
                if step == 3:
                    raise KeyboardInterrupt
                return live(engine, step)
            evaluation = type(evaluation)(evaluate, evaluation.every)
        return execute(run_config, run, run_dir, evaluation)

    monkeypatch.setattr(tamper, "execute", killed_in_the_fourth_run)
    with pytest.raises(KeyboardInterrupt):
        tamper.run_tamper_test(config, announce=lambda line: None)
    assert calls == ["rl_base_s0", "rl_base_s1", "rl_merged_s0", "rl_merged_s1"]
    assert not (out / "tamper.json").exists()
    merged_files = {p.name: p.stat().st_mtime_ns for p in (out / "merged_model").iterdir()}

    merges: list[str] = []
    monkeypatch.setattr(tamper, "execute", execute)
    monkeypatch.setattr(tamper, "merge_adapter", lambda *args, **kwargs: merges.append("merged") or None)
    resumed = tamper.run_tamper_test(config, announce=lambda line: None)
    assert merges == []  # the merged model was reused, untouched
    assert {p.name: p.stat().st_mtime_ns for p in (out / "merged_model").iterdir()} == merged_files
    history = read_jsonl(out / "runs" / "rl_merged_s1" / "config_history.jsonl")
    assert [row["from_step"] for row in history] == [1, 3]  # the unfinished run continued from its checkpoint
    assert len(read_jsonl(out / "runs" / "rl_base_s0" / "config_history.jsonl")) == 1  # finished: only read
    assert _close(resumed, whole)  # the same numbers as the uninterrupted test in OUT a, run names and all
    assert (out / "summary.txt").read_text().splitlines()[1:] == (tmp_path / "a" / "summary.txt").read_text(
        ).splitlines()[1:]


def _close(got, want, where: str = "") -> bool:
    """Equal structure and strings, numbers within float tolerance; the failing path is named."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and set(got) == set(want), where
        return all(_close(got[k], want[k], f"{where}.{k}") for k in want)
    if isinstance(want, list | tuple):
        assert isinstance(got, list | tuple) and len(got) == len(want), where
        return all(_close(g, w, f"{where}[{i}]") for i, (g, w) in enumerate(zip(got, want, strict=True)))
    if isinstance(want, float):
        assert got == pytest.approx(want, abs=1e-5), where
        return True
    assert got == want, where
    return True
