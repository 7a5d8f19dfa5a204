"""The eval report: checkpoints side by side (metrics with CIs, a bar chart, per category, completions).

Builds on the escaped HTML blocks of purplerl.eval.report; every cell and completion is escaped there.
"""

from __future__ import annotations

import io
from typing import Any

from purplerl.eval.report import image, render_report, samples_table, side_by_side, table

MAX_COMPARED_PROMPTS = 12  # prompts whose completions are shown next to each other, one column per target


def _ci(ci: dict[str, float]) -> str:
    return f"{ci['point']:.3g} [{ci['low']:.3g}, {ci['high']:.3g}]"


def metric_rows(targets: dict[str, dict[str, Any]]) -> tuple[list[str], list[list[Any]]]:
    """One row per suite/metric, one column per target: 'point [low, high]'."""
    labels = list(targets)
    names: list[tuple[str, str]] = []
    for found in targets.values():
        for suite, result in found.items():
            for name in result.get("metrics", {}) if isinstance(result, dict) else {}:
                if (suite, name) not in names:
                    names.append((suite, name))
    rows = [[suite, name, *(_ci(targets[label][suite]["metrics"][name])
                            if name in targets[label].get(suite, {}).get("metrics", {}) else "" for label in labels)]
            for suite, name in names]
    return ["suite", "metric", *labels], rows


def category_rows(targets: dict[str, dict[str, Any]], metric: str) -> tuple[list[str], list[list[Any]]]:
    """Per harm category, one metric (e.g. mean toxicity) for every target."""
    labels = list(targets)
    cats = sorted({c for found in targets.values() for c in found.get("harm", {}).get("by_category", {})})
    rows = []
    for cat in cats:
        cells = []
        for label in labels:
            entry = targets[label].get("harm", {}).get("by_category", {}).get(cat, {})
            cells.append(_ci(entry["metrics"][metric]) if metric in entry.get("metrics", {}) else "")
        rows.append([cat, *cells])
    return ["category", *labels], rows


def harm_chart(targets: dict[str, dict[str, Any]]) -> bytes | None:
    """Bar chart of the harm metrics per target with 95% CI error bars (PNG), or None without harm results."""
    harm = {label: found["harm"]["metrics"] for label, found in targets.items() if "harm" in found}
    if not harm:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = sorted({n for metrics in harm.values() for n in metrics})
    fig, axes = plt.subplots(1, len(names), figsize=(3.2 * len(names), 3.2), squeeze=False)
    for ax, name in zip(axes[0], names, strict=True):
        labels = [label for label in harm if name in harm[label]]
        points = [harm[label][name]["point"] for label in labels]
        errors = [[p - harm[label][name]["low"] for label, p in zip(labels, points, strict=True)],
                  [harm[label][name]["high"] - p for label, p in zip(labels, points, strict=True)]]
        ax.bar(range(len(labels)), points, yerr=errors, capsize=4, color="#7b5ea7")
        ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right", fontsize=8)
        ax.set_title(name, fontsize=9)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()


def completions_side_by_side(samples: list[dict[str, Any]], score_keys: list[str]) -> str:
    """For the first prompts, each target's completions in its own column."""
    labels = list(dict.fromkeys(row["target"] for row in samples))
    uids = list(dict.fromkeys(row["uid"] for row in samples))[:MAX_COMPARED_PROMPTS]
    shown = [row for row in samples if row["uid"] in uids]
    return side_by_side([(label, samples_table([r for r in shown if r["target"] == label], score_keys))
                         for label in labels])


def _asked(row: dict[str, Any]) -> str:
    """The prompt a target answered; a learned attacker's (eval --attacker) after the goal it was written for."""
    return f"goal: {row['goal']} | attack: {row['prompt']}" if "goal" in row else row["prompt"]


def eval_report(result: dict[str, Any]) -> str:
    """The whole eval report as one self-contained HTML page."""
    targets, samples = result["targets"], result["samples"]
    headers, rows = metric_rows(targets)
    sections = [("Metrics, 95% bootstrap CI (one column per checkpoint)", table(headers, rows))]
    chart = harm_chart(targets)
    if chart is not None:
        sections.append(("Harm metrics", image(chart, "harm metrics per checkpoint with 95% CIs")))
    cat_headers, cat_rows = category_rows(targets, "mean_toxicity")
    if cat_rows:
        sections.append(("Mean toxicity by category", table(cat_headers, cat_rows)))
    div = [[label, *(found["diversity"].get(k) for k in ("unique_fraction", "mean_jaccard", "distinct_2",
                                                           "self_bleu", "embedding_similarity", "degenerate"))]
           for label, found in targets.items() if "diversity" in found]
    if div:
        sections.append(("Diversity", table(["target", "unique", "jaccard", "distinct-2", "self-BLEU",
                                             "embedding sim.", "degenerate"], div)))
    keys = [k for k in ("toxicity", "refused", "harm", "guard_unsafe", "strongreject")
            if any(k in row for row in samples)]
    if samples:
        sections.append(("Completions side by side", completions_side_by_side(samples, keys)))
        sections.append(("Every judged sample", samples_table(
            [{**row, "prompt": f"[{row['target']}] {_asked(row)}"} for row in samples], keys)))
    return render_report("purplerl eval", sections)
