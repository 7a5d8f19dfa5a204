"""purplerl.eval.alignment at a size the caller sets: the held-out requests (the alignment data's, or a prompt
file's) and one loaded model's refusal, utility and multiple-choice numbers with every answer kept."""

from __future__ import annotations

import json
from pathlib import Path

from purplerl.config import ModelConfig
from purplerl.data.alignment import alignment_examples
from purplerl.engines import make_engine
from purplerl.eval.alignment import EvalSize, held_out_requests, measure


def test_held_out_requests_spread_over_the_test_split_or_come_from_a_file(tmp_path: Path) -> None:
    examples = alignment_examples("test", "harmful")
    records = held_out_requests("harmful", 4)
    step = len(examples) // 4
    assert [r.uid for r in records] == [examples[i * step].uid for i in range(4)]
    path = tmp_path / "benign.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"question {i}"}) + "\n" for i in range(5)))
    assert [r.messages[-1]["content"] for r in held_out_requests("benign", 3, str(path))] == [
        "question 0", "question 1", "question 2"]


def test_measure_at_a_small_size_keeps_every_answer(tiny_model_dir: Path) -> None:
    engine = make_engine(ModelConfig(name=str(tiny_model_dir), device="cpu", dtype="float32"))
    size = EvalSize(limit=3, max_new_tokens=4, utility_limit=2, utility_tokens=8, choice=False, modes=("sampled",),
                    seed=1)
    requests = {kind: held_out_requests(kind, 3) for kind in ("harmful", "benign")}
    result = measure(engine, size, requests, "tiny", notify=lambda _: None, answers=True)
    assert sorted(k for k in result if "/" in k) == ["refusal/benign/sampled", "refusal/harmful/sampled",
                                                     "utility/arithmetic"]
    assert result["utility/arithmetic"]["n"] == 2 and result["refusal/benign/sampled"]["n"] == 3
    rows = result["answers"]["benign/sampled"]
    assert [r["prompt"] for r in rows] == [r.messages[-1]["content"] for r in requests["benign"]]
    assert result["samples"]["benign/sampled"] == rows[:5]
    again = measure(engine, size, requests, "tiny", notify=lambda _: None, answers=True)
    assert again["answers"] == result["answers"]  # seeded
