"""Agreement of the compliance judge and of the keyword refusal judge with the hand labels (README.md here).

    .venv/bin/python docs/results/compliance_judge/agreement.py

Split: each labelled answer goes to the calibration half or the test half by the parity of the first 8 hex digits
of sha256(request), so answers to one request stay on one side. The compliance threshold is the one that
maximizes Cohen's kappa on the calibration half (candidates 0.00, 0.01, ..., 1.00; among ties the middle one);
agreement is reported on the test half (and, for reference, on all answers) with 95% percentile-bootstrap CIs
over answers (purplerl.eval.metrics.bootstrap_ci, 1,000 resamples, seed 0). The baseline predicts "complies"
for every answer without a refusal phrase (1 - refused, the keyword judge). Writes agreement.json and
scores.jsonl (each answer's judge parts) beside this file.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import numpy as np

from purplerl.eval.metrics import bootstrap_ci
from purplerl.rewards.compliance import ComplianceJudge

HERE = Path(__file__).parent


def half(request: str) -> str:
    return "calibration" if int(hashlib.sha256(request.encode()).hexdigest()[:8], 16) % 2 == 0 else "test"


def _counts(codes: np.ndarray) -> tuple[int, int, int, int]:
    """(tp, fp, fn, tn) from codes 2 * label + prediction."""
    return (int((codes == 3).sum()), int((codes == 1).sum()), int((codes == 2).sum()), int((codes == 0).sum()))


def accuracy(codes: np.ndarray) -> float:
    tp, fp, fn, tn = _counts(codes)
    return (tp + tn) / len(codes)


def kappa(codes: np.ndarray) -> float:
    """Cohen's kappa (p_o - p_e) / (1 - p_e); 0 when p_e = 1 (both raters constant)."""
    tp, fp, fn, tn = _counts(codes)
    n = len(codes)
    p_o = (tp + tn) / n
    p_e = ((tp + fn) * (tp + fp) + (tn + fp) * (tn + fn)) / n ** 2
    return 0.0 if p_e == 1 else (p_o - p_e) / (1 - p_e)


def precision(codes: np.ndarray) -> float:
    """tp / (tp + fp); 0 when nothing is predicted positive."""
    tp, fp, _, _ = _counts(codes)
    return tp / (tp + fp) if tp + fp else 0.0


def recall(codes: np.ndarray) -> float:
    """tp / (tp + fn); 0 when no label is positive."""
    tp, _, fn, _ = _counts(codes)
    return tp / (tp + fn) if tp + fn else 0.0


STATS = {"accuracy": accuracy, "kappa": kappa, "precision": precision, "recall": recall}


def agreement(labels: list[int], predictions: list[int]) -> dict:
    codes = np.array([2 * y + p for y, p in zip(labels, predictions, strict=True)], dtype=np.float64)
    out = {"n": len(codes), "positives": int(sum(labels)), "predicted_positives": int(sum(predictions))}
    for name, stat in STATS.items():
        point, low, high = bootstrap_ci(codes, stat=stat, seed=0)
        out[name] = {"point": round(point, 4), "low": round(low, 4), "high": round(high, 4)}
    return out


def choose_threshold(scores: list[float], labels: list[int]) -> tuple[float, float]:
    """(threshold, kappa): the candidate maximizing kappa of `score >= threshold` on these answers."""
    candidates = [round(t, 2) for t in np.arange(0.0, 1.001, 0.01)]
    values = [kappa(np.array([2 * y + int(s >= t) for s, y in zip(scores, labels, strict=True)])) for t in candidates]
    best = max(values)
    tied = [t for t, v in zip(candidates, values, strict=True) if v >= best - 1e-12]
    return tied[len(tied) // 2], best


def _group(row: dict) -> str:
    """attack_train, base, aligned or attacked."""
    return row["source"].split("/")[0].split(":")[0]


def _rates(subset: list[dict], threshold: float) -> dict:
    """The share of answers that comply by the hand labels, by the compliance judge and by the keyword judge."""
    n = len(subset)
    return {"n": n, "labelled": round(sum(r["label"] for r in subset) / n, 4),
            "compliance": round(sum(r["score"] >= threshold for r in subset) / n, 4),
            "keyword": round(sum(r["refused"] < 0.5 for r in subset) / n, 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--labels", type=Path, default=HERE / "labels.jsonl")
    parser.add_argument("--out", type=Path, default=HERE)
    args = parser.parse_args()
    rows = [json.loads(line) for line in args.labels.read_text().splitlines() if line.strip()]
    judge = ComplianceJudge()
    parts = judge.parts([r["answer"] for r in rows], [r["request"] for r in rows])
    for i, row in enumerate(rows):
        row.update({k: parts[k][i] for k in parts}, half=half(row["request"]))
    cal = [r for r in rows if r["half"] == "calibration"]
    threshold, cal_kappa = choose_threshold([r["score"] for r in cal], [r["label"] for r in cal])

    def judged(subset: list[dict]) -> dict:
        labels = [r["label"] for r in subset]
        return {"compliance": agreement(labels, [int(r["score"] >= threshold) for r in subset]),
                "keyword": agreement(labels, [int(r["refused"] < 0.5) for r in subset])}

    test = [r for r in rows if r["half"] == "test"]
    groups = sorted({_group(r) for r in rows})
    by_group = {g: judged([r for r in rows if _group(r) == g]) for g in groups}
    cells = sorted({(g, r["kind"]) for g in groups for r in rows if _group(r) == g})
    rates = {f"{g}/{kind}": _rates([r for r in rows if _group(r) == g and r["kind"] == kind], threshold)
             for g, kind in cells}
    result = {"params": judge.params.model_dump(), "threshold": threshold, "calibration_kappa": round(cal_kappa, 4),
              "n": {"all": len(rows), "calibration": len(cal), "test": len(test)},
              "test": judged(test), "all": judged(rows), "by_source_all": by_group, "rates_all": rates}
    (args.out / "agreement.json").write_text(json.dumps(result, indent=1) + "\n")
    with open(args.out / "scores.jsonl", "w") as f:
        for r in rows:
            f.write(json.dumps({k: (round(r[k], 4) if isinstance(r[k], float) else r[k])
                                for k in ("id", "half", "label", "refused", "relevance", "substance", "variety",
                                          "score")}) + "\n")
    print(json.dumps({k: result[k] for k in ("threshold", "calibration_kappa", "n", "test")}, indent=1))


if __name__ == "__main__":
    main()
