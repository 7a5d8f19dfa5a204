"""`purplerl report PIPELINE_DIR`: the stages side by side, from history.json.

OUT/report.html holds the decisions, every metric of every evaluated model in one table (start model first), a
plot per gated metric across the stages with its bounds (OUT/plots/gate_<metric>.png), and per stage its gates, its
run's summary and its config. Built from the eval report's blocks (purplerl.eval.report): one self-contained
page, every text escaped.
"""

from __future__ import annotations

import io
import json
import math
from pathlib import Path
from typing import Any

from purplerl.errors import UserError
from purplerl.eval.report import details, image, render_report, table
from purplerl.experiments.pipeline.history import HISTORY_FILE, VERSION
from purplerl.files import read_json_object, safe_file_stem
from purplerl.runs.layout import METRICS_FILE, PLOTS_DIR, REPORT_FILE


def is_pipeline_dir(path: str | Path) -> bool:
    """A pipeline's dir (history.json), not a run's (metrics.jsonl)."""
    path = Path(path)
    return (path / HISTORY_FILE).is_file() and not (path / METRICS_FILE).is_file()


def _cell(metric: dict[str, Any] | None) -> str:
    if metric is None:
        return ""
    mean = f"{metric['mean']:.3f}"
    return f"{mean} [{metric['low']:.3f}, {metric['high']:.3f}]" if "low" in metric else mean


def _evaluated(history: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(label, metrics) of the start model and of every stage that was measured, in order."""
    found = [("start", history["start"]["metrics"])] if history.get("start") else []
    return found + [(entry["name"], entry["metrics"]) for entry in history["stages"] if entry.get("metrics")]


def decisions_table(history: dict[str, Any]) -> str:
    rows = [[e["name"], e["kind"], e["decision"], e.get("model_in"), e.get("model_after"), "; ".join(e["reasons"])]
            for e in history["stages"]]
    return table(["stage", "kind", "decision", "started from", "model after", "why"], rows)


def metrics_table(history: dict[str, Any]) -> str:
    evaluated = _evaluated(history)
    names = list(dict.fromkeys(name for _, metrics in evaluated for name in metrics))
    rows = [[name, *(_cell(metrics.get(name)) for _, metrics in evaluated)] for name in names]
    return table(["metric", *(label for label, _ in evaluated)], rows)


def gate_plot_png(metric: str, labels: list[str], points: list[dict[str, Any] | None],
                  bounds: list[tuple[float | None, float | None, bool | None]]) -> bytes:
    """The metric's value with its 95% interval at each evaluated stage, each stage's resolved bounds as short
    bars (min below, max above), failed gates in red."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(4.0, 1.2 * len(labels)), 3.5))
    for x, (point, (lower, upper, passed)) in enumerate(zip(points, bounds, strict=True)):
        if point is not None:
            low, high = point.get("low", point["mean"]), point.get("high", point["mean"])
            color = "tab:red" if passed is False else "tab:blue"
            ax.errorbar([x], [point["mean"]], yerr=[[point["mean"] - low], [high - point["mean"]]], fmt="o",
                        color=color, capsize=4)
        for value, style in ((lower, "v"), (upper, "^")):
            if value is not None and math.isfinite(value):
                ax.hlines(value, x - 0.3, x + 0.3, colors="black", linestyles="dashed")
                ax.plot([x], [value], style, color="black", markersize=4)
    ax.set_xticks(range(len(labels)), labels, rotation=20)
    ax.set(title=metric, ylabel="value (dashed: gate bounds)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    plt.close(fig)
    return buffer.getvalue()


def gate_plots(history: dict[str, Any], plots_dir: Path) -> list[str]:
    evaluated = _evaluated(history)
    labels = [label for label, _ in evaluated]
    gated = list(dict.fromkeys(g["metric"] for e in history["stages"] for g in e.get("gates", [])))
    images = []
    for metric in gated:
        results = {e["name"]: next((g for g in e.get("gates", []) if g["metric"] == metric), None)
                   for e in history["stages"]}
        bounds = [(r["lower"], r["upper"], r["passed"]) if (r := results.get(label)) else (None, None, None)
                  for label in labels]
        png = gate_plot_png(metric, labels, [metrics.get(metric) for _, metrics in evaluated], bounds)
        (plots_dir / f"{safe_file_stem('gate_' + metric.replace('/', '-'))}.png").write_bytes(png)
        images.append(image(png, f"{metric} across the stages"))
    return images


def stage_section(entry: dict[str, Any]) -> tuple[str, str]:
    gates = table(["metric", "gate", "value", "min", "max", "passed", "why"],
                  [[g["metric"], g["bound"], g["value"], g["lower"], g["upper"], g["passed"], g["reason"]]
                   for g in entry.get("gates", [])]) if entry.get("gates") else "<p>no gates</p>"
    summary = entry.get("summary") or {}
    rows = [[key, value if isinstance(value, int | float | str) else json.dumps(value)]
            for key, value in summary.items()]
    body = (table(["field", "value"], [["decision", entry["decision"]], ["started from", entry.get("model_in")],
                                       ["model", entry.get("model_out") or entry.get("output")],
                                       ["run dir", entry.get("run_dir")]])
            + gates + (table(["summary", "value"], rows) if rows else "")
            + (details("config", json.dumps(entry["config"], indent=1)) if entry.get("config") else ""))
    return f"Stage {entry['name']} ({entry['kind']}): {entry['decision']}", body


def pipeline_report(out: Path) -> Path:
    """Write OUT/report.html and OUT/plots/gate_*.png from OUT/history.json."""
    out = Path(out)
    history = read_json_object(out / HISTORY_FILE)
    if history.get("pipeline") != VERSION or not isinstance(history.get("stages"), list):
        raise UserError(f"{out / HISTORY_FILE} is not the history of a purplerl pipeline")
    plots_dir = out / PLOTS_DIR
    plots_dir.mkdir(exist_ok=True)
    overview = table(["field", "value"], [["start model", (history.get("start") or {}).get("model")],
                                          ["final model", history.get("final_model") or "(not finished)"],
                                          ["stages decided", len(history["stages"])]])
    sections = [
        ("Pipeline", overview + decisions_table(history)),
        ("Metrics by stage (mean [95% CI])", metrics_table(history)),
        ("Gate metrics across the stages", '<div class="plots">' + "".join(gate_plots(history, plots_dir)) + "</div>"),
        *(stage_section(entry) for entry in history["stages"]),
        ("Settings", details("pipeline settings", json.dumps(history.get("settings"), indent=1))),
    ]
    path = out / REPORT_FILE
    path.write_text(render_report(f"Pipeline {out.resolve().name}", sections), encoding="utf-8")
    return path


def pipeline_summary(history: dict[str, Any]) -> str:
    """What a finished pipeline prints: each stage's decision and why, and the model it ends with."""
    lines = [f"{'stage':16} {'kind':14} {'decision':12} why"]
    for entry in history["stages"]:
        lines.append(f"{entry['name']:16} {entry['kind']:14} {entry['decision']:12} {'; '.join(entry['reasons'])}")
    lines.append(f"final model: {history.get('final_model')}")
    return "\n".join(lines)
