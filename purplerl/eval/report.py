"""Self-contained HTML reports: a training run's curves and samples, and building blocks for eval results.

Everything a report shows is inline (CSS, PNGs as base64 data URIs) so a single file can be mailed or
attached to a review. Completions are untrusted model output: every piece of text goes through
`html.escape`, and the page carries no script at all.
"""

from __future__ import annotations

import base64
import html
import io
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from purplerl.errors import UserError
from purplerl.files import read_json_object, read_jsonl, read_text, safe_file_stem
from purplerl.runs.layout import CONFIG_FILE, METRICS_FILE, PLOTS_DIR, REPORT_FILE, SAMPLES_FILE, SUMMARY_FILE

# sample columns that describe a row rather than score it
SAMPLE_FIELDS = {"step", "uid", "category", "prompt", "completion", "finish_reason", "num_tokens", "advantage",
                 "reward"}
# metrics `<name>/mean` keys that are not reward components: the total and the policy's own entropy
NOT_COMPONENTS = {"reward", "entropy"}
SUMMARY_WINDOW = 5  # steps averaged at each end of the run for the first-vs-last table
MAX_SAMPLE_ROWS = 40  # split between the first and the last step; enough to read, small enough to scroll

CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1400px; padding: 0 1em; color: #222; }
h1 { font-size: 1.6em; } h2 { font-size: 1.25em; border-bottom: 1px solid #ddd; padding-bottom: .2em; }
table { border-collapse: collapse; margin: .5em 0 1.5em; font-size: .9em; }
th, td { border: 1px solid #ccc; padding: .3em .5em; vertical-align: top; text-align: left; }
th { background: #f3f0f7; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
td.text { white-space: pre-wrap; word-break: break-word; max-width: 40em; }
img { max-width: 100%; margin: .5em 0; }
pre { background: #f7f7f7; padding: .8em; overflow-x: auto; font-size: .85em; }
.columns { display: flex; gap: 1.5em; align-items: flex-start; }
.columns > div { flex: 1 1 0; min-width: 0; overflow-x: auto; }
.plots { display: flex; flex-wrap: wrap; gap: 1em; }
.plots img { width: calc(50% - .5em); min-width: 400px; margin: 0; }
"""


def _cell(value: Any) -> str:
    """One escaped table cell; numbers right-aligned with 4 significant digits, text kept verbatim."""
    if isinstance(value, bool) or value is None:
        return f"<td>{html.escape('' if value is None else str(value))}</td>"
    if isinstance(value, int):
        return f'<td class="num">{value}</td>'
    if isinstance(value, float):
        return f'<td class="num">{value:.4g}</td>'
    return f'<td class="text">{html.escape(str(value))}</td>'


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """An HTML table; every header and cell is escaped."""
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in headers)
    body = "".join("<tr>" + "".join(_cell(v) for v in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def image(png_bytes: bytes, alt: str) -> str:
    """A PNG embedded as a data URI, so the page needs no files beside it."""
    data = base64.b64encode(png_bytes).decode("ascii")
    return f'<img src="data:image/png;base64,{data}" alt="{html.escape(alt, quote=True)}">'


def samples_table(rows: Sequence[dict[str, Any]], score_keys: Sequence[str]) -> str:
    """Prompt, completion and one column per score; a row without a score shows an empty cell."""
    return table(["prompt", "completion", *score_keys],
                 [[r.get("prompt", ""), r.get("completion", ""), *(r.get(k) for k in score_keys)] for r in rows])


def side_by_side(columns: Sequence[tuple[str, str]]) -> str:
    """(heading, html) columns next to each other, e.g. one per checkpoint. Headings are escaped, bodies not."""
    cols = "".join(f"<div><h3>{html.escape(title)}</h3>{body}</div>" for title, body in columns)
    return f'<div class="columns">{cols}</div>'


def details(summary: str, text: str) -> str:
    """Collapsed preformatted text (a config file, a log)."""
    return f"<details><summary>{html.escape(summary)}</summary><pre>{html.escape(text)}</pre></details>"


def render_report(title: str, sections: Sequence[tuple[str, str]]) -> str:
    """A whole page: escaped title, then (heading, html) sections in order. Section bodies are HTML."""
    body = "".join(f"<section><h2>{html.escape(h)}</h2>{content}</section>" for h, content in sections)
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>{CSS}</style></head><body><h1>{html.escape(title)}</h1>{body}</body></html>\n")


def _number(value: Any) -> float | None:
    """Metric values as floats; the sinks write NaN/inf as strings, and those plot as gaps."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: an integer beyond float range
        return None
    return number if math.isfinite(number) else None


def components(metrics: list[dict[str, Any]], samples: list[dict[str, Any]]) -> list[str]:
    """Reward component names: samples' numeric score columns, else the metrics' `<name>/mean` keys."""
    if samples:
        keys = dict.fromkeys(k for row in samples for k, v in row.items()
                             if k not in SAMPLE_FIELDS and _number(v) is not None)
    else:
        keys = dict.fromkeys(k[:-5] for row in metrics for k in row
                             if k.endswith("/mean") and k.count("/") == 1 and k[:-5] not in NOT_COMPONENTS)
    return list(keys)


def metric_families(names: list[str]) -> dict[str, list[str]]:
    """Plot name -> metric keys drawn in it: one PNG for the total, one per component, then policy health."""
    families = {"reward": ["reward/mean", "reward_raw/mean"]}
    families.update({name: [f"{name}/mean"] for name in names if name != "reward_raw"})
    families.setdefault("kl", ["kl/mean"])
    families.setdefault("repetition", ["repetition/mean"])
    families["entropy"] = ["entropy/mean"]
    families["completion_length"] = ["completion/len_mean"]
    return families


def plot_png(steps: list[float | None], series: dict[str, list[float | None]], title: str) -> bytes:
    """A line plot of metric series over steps, as PNG bytes (matplotlib Agg: no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for label, values in series.items():
        xs = [math.nan if s is None else s for s in steps]
        ax.plot(xs, [math.nan if v is None else v for v in values], label=label, marker=".")
    ax.set(xlabel="step", title=title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    plt.close(fig)
    return buffer.getvalue()


def _mean(values: list[float | None]) -> float | None:
    finite = [v for v in values if v is not None]
    return sum(finite) / len(finite) if finite else None


def summary_rows(metrics: list[dict[str, Any]], names: list[str]) -> list[list[Any]]:
    """Per metric: mean of the first and the last SUMMARY_WINDOW steps, and the change between them."""
    rows = []
    for key in ["reward/mean", *(f"{n}/mean" for n in names), "entropy/mean", "completion/len_mean"]:
        values = [_number(m.get(key)) for m in metrics]
        if all(v is None for v in values):
            continue
        first, last = _mean(values[:SUMMARY_WINDOW]), _mean(values[-SUMMARY_WINDOW:])
        change = None if first is None or last is None else last - first
        rows.append([key, first, last, change])
    return rows


def _plots(run_dir: Path, metrics: list[dict[str, Any]], names: list[str]) -> list[str]:
    plots_dir = run_dir / PLOTS_DIR
    plots_dir.mkdir(exist_ok=True)
    # families are named by logged keys, which are data: a key like '../../x' must not name a path
    steps = [_number(m.get("step")) for m in metrics]
    images = []
    for family, keys in metric_families(names).items():
        series = {k: [_number(m.get(k)) for m in metrics] for k in keys}
        series = {k: v for k, v in series.items() if any(x is not None for x in v)}
        if not series:
            continue
        try:
            png = plot_png(steps, series, family)
        except (ValueError, OverflowError) as err:  # values near the float limits: matplotlib cannot lay out axes
            raise UserError(f"cannot plot '{family}' of {run_dir / METRICS_FILE}: {str(err).strip()[:200]} "
                            "(values out of plotting range?)") from None
        (plots_dir / f"{safe_file_stem(family)}.png").write_bytes(png)
        images.append(image(png, f"{family} over training steps"))
    return images


def _sample_sections(samples: list[dict[str, Any]], names: list[str]) -> list[tuple[str, str]]:
    steps = sorted({r["step"] for r in samples if isinstance(r.get("step"), int)})
    if not steps:
        return []
    shown = [steps[0]] if steps[0] == steps[-1] else [steps[0], steps[-1]]
    per_step = MAX_SAMPLE_ROWS // len(shown)
    keys = ["reward", *names, "advantage"]
    return [(f"Samples at step {step}", samples_table([r for r in samples if r.get("step") == step][:per_step], keys))
            for step in shown]


def training_report(run_dir: Path) -> Path:
    """Write RUN_DIR/plots/*.png and RUN_DIR/report.html from a run's metrics.jsonl and samples.jsonl."""
    run_dir = Path(run_dir)
    metrics_path = run_dir / METRICS_FILE
    if not metrics_path.is_file():
        raise UserError(f"{run_dir} is not a run dir (no {METRICS_FILE})")
    metrics = read_jsonl(metrics_path, cut_tail=True)
    if not metrics:
        raise UserError(f"{metrics_path} is empty: the run logged no step yet")
    samples_path = run_dir / SAMPLES_FILE
    samples = read_jsonl(samples_path, cut_tail=True) if samples_path.is_file() else []
    names = components(metrics, samples)

    overview = [["steps", len(metrics)], ["last step", metrics[-1].get("step")]]
    summary_path = run_dir / SUMMARY_FILE
    if summary_path.is_file():
        overview.append(["stop reason", read_json_object(summary_path).get("stop_reason")])
    config_path = run_dir / CONFIG_FILE
    config = details(CONFIG_FILE, read_text(config_path)) if config_path.is_file() else f"<p>no {CONFIG_FILE}</p>"

    sections = [
        ("Run", table(["field", "value"], overview) + config),
        (f"First {SUMMARY_WINDOW} vs last {SUMMARY_WINDOW} steps",
         table(["metric", "first mean", "last mean", "change"], summary_rows(metrics, names))),
        ("Curves", '<div class="plots">' + "".join(_plots(run_dir, metrics, names)) + "</div>"),
        *_sample_sections(samples, names),
    ]
    out = run_dir / REPORT_FILE
    out.write_text(render_report(f"Training run {run_dir.resolve().name}", sections), encoding="utf-8")
    return out
