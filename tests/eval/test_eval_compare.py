"""The eval report's side-by-side comparison, on a hand-made eval result."""

from __future__ import annotations

import base64
import re

from purplerl.eval.compare import category_rows, eval_report, metric_rows


def _ci(p: float, lo: float, hi: float) -> dict[str, float]:
    return {"point": p, "low": lo, "high": hi}


RESULT = {
    "targets": {
        "base": {"harm": {"n": 2, "metrics": {"mean_toxicity": _ci(0.1, 0.05, 0.2), "refusal_rate": _ci(50, 0, 100)},
                          "by_category": {"insult": {"n": 1, "metrics": {"mean_toxicity": _ci(0.15, 0.15, 0.15)}}}},
                 "diversity": {"unique_fraction": 1.0, "mean_jaccard": 0.2, "distinct_2": 0.9, "self_bleu": 0.1,
                               "embedding_similarity": None, "degenerate": False}},
        "step_000030": {"harm": {
            "n": 2, "metrics": {"mean_toxicity": _ci(0.8, 0.7, 0.9)},
            "by_category": {"insult": {"n": 1, "metrics": {"mean_toxicity": _ci(0.9, 0.9, 0.9)}}}}},
    },
    "samples": [
        {"target": "base", "uid": "u1", "prompt": "roast me", "completion": "no thanks", "toxicity": 0.1},
        {"target": "step_000030", "uid": "u1", "prompt": "roast me", "completion": "<b>you</b> idiot",
         "toxicity": 0.9},
    ],
}


def test_metric_rows_put_each_target_in_its_own_column() -> None:
    headers, rows = metric_rows(RESULT["targets"])
    assert headers == ["suite", "metric", "base", "step_000030"]
    assert rows == [["harm", "mean_toxicity", "0.1 [0.05, 0.2]", "0.8 [0.7, 0.9]"],
                    ["harm", "refusal_rate", "50 [0, 100]", ""]]


def test_category_rows() -> None:
    assert category_rows(RESULT["targets"], "mean_toxicity") == (
        ["category", "base", "step_000030"], [["insult", "0.15 [0.15, 0.15]", "0.9 [0.9, 0.9]"]])


def test_eval_report_is_self_contained_and_escaped() -> None:
    page = eval_report(RESULT)
    assert "&lt;b&gt;you&lt;/b&gt; idiot" in page and "<b>you</b>" not in page
    images = re.findall(r"data:image/png;base64,([A-Za-z0-9+/=]+)", page)
    assert images and base64.b64decode(images[0])[:8] == b"\x89PNG\r\n\x1a\n"
    assert "Completions side by side" in page and "Mean toxicity by category" in page
    assert "<script" not in page
