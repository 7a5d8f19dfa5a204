"""`purplerl data prepare safety-prefs`: refusal vs harmful answer for harmful requests, own answer vs needless
refusal for benign ones, split as the alignment data is; the model's answers from a stand-in (hand-checked rows)
and from the tiny model (greedy, through the CLI)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from purplerl.config import PREPARE, RowSourceConfig, load_command_config
from purplerl.data.alignment import AlignExample, alignment_examples
from purplerl.data.alignment.refusals import build_refusal
from purplerl.data.preference import load_pairs
from purplerl.data.prepare import check_options
from purplerl.errors import ExperimentError, UserError
from purplerl.experiments import safety_prefs as sp
from purplerl.rewards.refusal import RefusalJudge


def complying(examples: Sequence[AlignExample]) -> list[str]:
    """A model that answers every request with two plain sentences."""
    return [f"Here is a careful answer about {ex.topic_id}. It has two sentences." for ex in examples]


def read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def by_uid(kind: str) -> dict[str, tuple[str, AlignExample]]:
    return {ex.uid: (split, ex) for split in ("train", "test") for ex in alignment_examples(split, kind)}


def test_pairs_from_the_models_answers_by_hand(tmp_path) -> None:
    result = sp.prepare_safety_prefs(tmp_path / "out", complying, limit=3)
    assert result.rows == {"train": 6, "test": 6} and result.left_out == {}
    assert result.describe() == (f"wrote {tmp_path / 'out' / 'train.jsonl'} (6 pairs), "
                                 f"{tmp_path / 'out' / 'test.jsonl'} (6 pairs)")
    harmful, benign, judge = by_uid("harmful"), by_uid("benign"), RefusalJudge()
    for split in ("train", "test"):
        rows = read_rows(tmp_path / "out" / f"{split}.jsonl")
        assert [r["kind"] for r in rows] == ["benign"] * 3 + ["harmful"] * 3
        for row in rows:
            side, ex = (harmful if row["kind"] == "harmful" else benign)[row["uid"]]
            assert side == split and row["prompt"] == ex.prompt
            if row["kind"] == "harmful":  # the alignment refusal over the model's compliance
                assert (row["chosen"], row["rejected"]) == (ex.refusal, complying([ex])[0])
                assert (row["chosen_from"], row["rejected_from"]) == ("refusal", "model")
            else:  # the model's own answer over a needless refusal
                assert (row["chosen"], row["rejected"]) == (complying([ex])[0], sp.needless_refusal(ex))
                assert judge.refused(row["rejected"]) and not judge.refused(row["chosen"])
        pairs = load_pairs(RowSourceConfig(source=str(tmp_path / "out" / f"{split}.jsonl"))).items
        assert [p.chosen for p in pairs] == [r["chosen"] for r in rows]
    # held out as the alignment data is: no test template and no test topic is in train
    train, test = (read_rows(tmp_path / "out" / f"{s}.jsonl") for s in ("train", "test"))
    assert not {r["template_id"] for r in train} & {r["template_id"] for r in test}
    assert not {r["topic_id"] for r in train} & {r["topic_id"] for r in test}
    again = sp.prepare_safety_prefs(tmp_path / "again", complying, limit=3)
    assert again.rows == result.rows
    for split in ("train", "test"):
        assert (tmp_path / "again" / f"{split}.jsonl").read_bytes() == (tmp_path / "out" / f"{split}.jsonl"
                                                                          ).read_bytes()


def test_needless_refusals_are_drawn_by_uid() -> None:
    benign = alignment_examples("train", "benign")
    refusals = [sp.needless_refusal(ex) for ex in benign]
    assert refusals == [sp.needless_refusal(ex) for ex in benign] and len(set(refusals)) > 20
    assert all(RefusalJudge().refused(text) for text in refusals)


def test_refused_empty_and_degenerate_answers_get_no_pair(tmp_path) -> None:
    def mixed(examples: Sequence[AlignExample]) -> list[str]:
        answers = complying(examples)
        answers[0], answers[1], answers[2] = "I'm sorry, but I can't help with that.", "", "go go go go go go go go"
        return answers

    result = sp.prepare_safety_prefs(tmp_path / "out", mixed, limit=4)
    # the first four requests of each kind are the train split's
    assert result.left_out == {"benign requests refused by the model": 1, "benign requests empty or degenerate "
                               "answers": 2, "harmful requests refused by the model": 1,
                               "harmful requests empty or degenerate answers": 2}
    assert result.rows == {"train": 2, "test": 8}


def test_no_pair_left_in_a_split_is_one_line(tmp_path) -> None:
    with pytest.raises(ExperimentError, match="^safety-prefs: no pairs left for the train split \\(left out: "
                                              "\\{'benign requests empty or degenerate answers': 6"):
        sp.prepare_safety_prefs(tmp_path / "out", lambda examples: [""] * len(examples), limit=3)


def write_samples(run: Path, rows: list[dict]) -> Path:
    run.mkdir()
    (run / "samples.jsonl").write_text("".join(json.dumps({"step": 1, **row}) + "\n" for row in rows))
    return run


def test_an_attack_runs_mined_completions_are_the_rejected_answers(tmp_path) -> None:
    train_ex, test_ex = alignment_examples("train", "harmful")[0], alignment_examples("test", "harmful")[0]
    insult = "Write the most savage insult you can about my coworker's stupidity."
    run = write_samples(tmp_path / "attack", [
        {"uid": "a", "category": train_ex.category, "prompt": train_ex.prompt, "completion": "Sure. Step one is easy.",
         "toxicity": 0.9},
        {"uid": "b", "category": test_ex.category, "prompt": test_ex.prompt, "completion": "Of course. Do it at night.",
         "toxicity": 0.7},
        {"uid": "c", "category": "insult", "prompt": insult, "completion": "Your coworker is a clueless fool.",
         "toxicity": 0.95},
        {"uid": "d", "category": "insult", "prompt": insult, "completion": "A mild remark.", "toxicity": 0.1},
        {"uid": "e", "category": "insult", "prompt": insult, "completion": "I can't help with that.", "toxicity": 0.9},
        {"uid": "f", "category": "gardening", "prompt": "Prune my roses", "completion": "Cut them low, harshly.",
         "toxicity": 0.8},
    ])
    result = sp.prepare_safety_prefs(tmp_path / "out", complying, attack_run=run, limit=2)
    assert result.left_out == {"mined completions whose category has no refusal": 1}
    harmful = [{**r, "split": s} for s in ("train", "test") for r in read_rows(tmp_path / "out" / f"{s}.jsonl")
               if r["kind"] == "harmful"]
    got = {r["rejected"]: (r["split"], r["chosen"], r["chosen_from"], r["rejected_from"]) for r in harmful}
    uid = harmful[[r["rejected"] for r in harmful].index("Your coworker is a clueless fool.")]["uid"]
    insult_split = got["Your coworker is a clueless fool."][0]
    assert got == {
        "Sure. Step one is easy.": ("train", train_ex.refusal, "refusal", "attack"),
        "Of course. Do it at night.": ("test", test_ex.refusal, "refusal", "attack"),
        "Your coworker is a clueless fool.": (insult_split, build_refusal(uid, "insult", "question"),
                                              "composed refusal", "attack"),
    }
    # two benign requests and one mined alignment request per split, and the insult on its hashed side
    assert result.rows == {"train": 3 + (insult_split == "train"), "test": 3 + (insult_split == "test")}


def test_a_run_dir_without_samples_fails_before_the_model_answers(tmp_path) -> None:
    def never(examples: Sequence[AlignExample]) -> list[str]:
        raise AssertionError("the model was asked")

    (tmp_path / "run").mkdir()
    with pytest.raises(UserError, match="^--attack_run .*run: no samples.jsonl \\(it must be an attack run dir\\)$"):
        sp.prepare_safety_prefs(tmp_path / "out", never, attack_run=tmp_path / "run")


@pytest.mark.parametrize(("args", "message"), [
    (["gsm8k", "--model", "m"], "--model does not apply to 'gsm8k' (only to safety-prefs)"),
    (["merge", "--attack-run", "r"], "--attack_run does not apply to 'merge' (only to safety-prefs)"),
    (["safety-prefs", "--template", "base"], "--template does not apply to 'safety-prefs'"),
    (["safety-prefs", "--seed", "1"], "--seed does not apply to 'safety-prefs'"),
])
def test_options_safety_prefs_does_not_use_are_refused(args, message) -> None:
    with pytest.raises(UserError) as info:
        check_options(load_command_config(PREPARE, None, args).prepare)
    assert message in str(info.value)


def test_the_output_dir_is_checked_before_the_model_loads(tmp_path) -> None:
    (tmp_path / "file").write_text("x")
    cfg = load_command_config(PREPARE, None, ["safety-prefs", "--model", "no/such-model", "--out",
                                              str(tmp_path / "file")]).prepare
    with pytest.raises(UserError, match=f"^--out {tmp_path / 'file'} "):
        sp.prepare_command(cfg)


def test_the_tiny_models_sampled_answers_are_seeded(monkeypatch, tiny_model_dir) -> None:
    monkeypatch.setattr(sp, "ANSWER_TOKENS", 12)
    examples = alignment_examples("train", "benign")[:3]
    answer = sp.model_answerer(str(tiny_model_dir), notify=lambda line: None)
    first = answer(examples)
    assert len(first) == 3 and first == answer(examples)  # seeded sampling: the same answers every time
    assert all(text == "" or text.endswith((".", "!", "?")) for text in first)  # cut ones keep whole sentences


@pytest.mark.process
def test_cli_runs_the_model_and_says_what_it_left_out(tiny_model_dir, tmp_path) -> None:
    """The random tiny model's sampled answers: its benign ones never finish a sentence (left out, counted), its
    harmful ones are random text that is no refusal, so they stand as the rejected side of a pair. Where the CPU's
    kernels round differently (AVX2 against AVX512), the seeded draws differ, and the harmful answers can be empty
    too: then no pair is left, and the CLI says so in one line, naming everything it left out."""
    proc = subprocess.run([sys.executable, "-m", "purplerl.cli", "data", "prepare", "safety-prefs", "--model",
                           str(tiny_model_dir), "--limit", "1", "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})  # a tiny model runs fastest on one thread
    assert proc.stderr.count("safety-prefs: answered 2/2 requests") == 2  # benign, then harmful: one per split each
    out = tmp_path / "out"
    if proc.returncode != 0:
        assert proc.returncode == 1 and proc.stderr.strip().splitlines()[-1] == (
            "error: safety-prefs: no pairs left for the train split (left out: {'benign requests empty or degenerate "
            "answers': 2, 'harmful requests empty or degenerate answers': 2})"), proc.stderr
        assert not (out / "train.jsonl").exists()
        return
    assert proc.stdout.strip().splitlines()[-1] == (
        f"wrote {out / 'train.jsonl'} (1 pairs), {out / 'test.jsonl'} (1 pairs); left out: 2 benign requests empty "
        "or degenerate answers")
    for split in ("train", "test"):
        (row,) = [json.loads(line) for line in (out / f"{split}.jsonl").read_text().splitlines()]
        assert (row["kind"], row["chosen_from"], row["rejected_from"]) == ("harmful", "refusal", "model")
        assert row["rejected"].strip() and row["chosen"] != row["rejected"]
