"""The sweep's summary written out: a text table (printed), summary.csv, summary.json and summary.html."""

from __future__ import annotations

import csv
import html
import io
import json
from pathlib import Path
from typing import Any

from purplerl.eval.report import render_report, table
from purplerl.files import write_durably

COLLAPSE = "TEMPLATE COLLAPSE"


def _interval(ci: dict[str, Any]) -> str:
    if ci["mean"] is None:
        return "-"
    if ci["low"] is None:
        return f"{ci['mean']:.3f} (1 seed)"
    return f"{ci['mean']:.3f} [{ci['low']:.3f}, {ci['high']:.3f}]"


def _collapse(row: dict[str, Any]) -> str:
    flagged, judged = row["collapse"]["runs"], row["collapse"]["judged"]
    if not judged:
        return "-"
    return f"{COLLAPSE} {flagged}/{judged}" if flagged else f"0/{judged}"


def _columns(summary: dict[str, Any]) -> list[str]:
    rows = summary["configurations"]
    return list(rows[0]["metrics"]) if rows else []


def text_table(summary: dict[str, Any]) -> str:
    """One line per configuration: runs finished, each metric's mean [95% interval], the collapse flag."""
    columns = _columns(summary)
    headers = ["configuration", "runs", *columns, "collapse"]
    body = [[row["configuration"], f"{row['finished']}/{row['finished'] + len(row['failed'])}",
             *(_interval(row["metrics"][key]) for key in columns), _collapse(row)]
            for row in summary["configurations"]]
    widths = [max(len(str(line[i])) for line in [headers, *body]) for i in range(len(headers))]
    lines = ["  ".join(str(cell).ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
             for line in [headers, *body]]
    failed = [run for run in summary["runs"] if run["status"] != "finished"]
    lines += [f"{run['name']}: {run['status']}" + (f": {run['error']}" if run.get("error") else "") for run in failed]
    return "\n".join([*lines, f"intervals: {summary['method']}", f"collapse: {summary['collapse_rule']}"])


def _value(value: Any) -> Any:
    """A swept value in a CSV cell: text and numbers as they are, anything else (a list, null) as JSON."""
    return value if isinstance(value, str | int | float) and not isinstance(value, bool) else json.dumps(value)


def csv_text(summary: dict[str, Any]) -> str:
    """summary.csv: one row per configuration; each swept setting a column, each metric its mean, low, high, n."""
    columns = _columns(summary)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["configuration", *summary["grid"], "finished", "failed",
                     *(f"{key}_{part}" for key in columns for part in ("mean", "low", "high", "n")),
                     "collapse_runs", "collapse_judged"])
    for row in summary["configurations"]:
        writer.writerow([row["configuration"], *(_value(row["point"].get(key)) for key in summary["grid"]),
                         row["finished"], len(row["failed"]),
                         *("" if row["metrics"][key][part] is None else row["metrics"][key][part]
                           for key in columns for part in ("mean", "low", "high", "n")),
                         row["collapse"]["runs"], row["collapse"]["judged"]])
    return out.getvalue()


def html_report(summary: dict[str, Any]) -> str:
    columns = _columns(summary)
    configs = table(["configuration", "runs", *columns, "collapse"], [
        [row["configuration"], f"{row['finished']}/{row['finished'] + len(row['failed'])}",
         *(_interval(row["metrics"][key]) for key in columns), _collapse(row)] for row in summary["configurations"]])
    runs = table(["run", "seed", "status", *summary["metrics"], "distinct-2", "base distinct-2", "degenerate",
                  "collapse", "error"], [
        [run["name"], run["seed"], run["status"], *(run["final"].get(key) for key in summary["metrics"]),
         *((run["diversity"]["distinct_2"], run["base_diversity"]["distinct_2"], run["diversity"]["degenerate"])
           if run["diversity"] else (None, None, None)), run.get("collapse"), run.get("error")]
        for run in summary["runs"]])
    method = (f"<p>Final value of a metric: the mean of a run's last logged steps. Intervals: "
              f"{html.escape(summary['method'])}.</p>"
              f"<p>Template collapse: {html.escape(summary['collapse_rule'])}.</p>")
    return render_report(f"sweep of {summary['recipe']}", [("Configurations", configs), ("Runs", runs),
                                                          ("Method", method)])


def write_summary(out: Path, summary: dict[str, Any]) -> list[Path]:
    """Write summary.csv, summary.json and summary.html into `out`; their paths."""
    paths = [out / "summary.csv", out / "summary.json", out / "summary.html"]
    for path, text in zip(paths, (csv_text(summary), json.dumps(summary, indent=1), html_report(summary)),
                          strict=True):
        write_durably(path, text)
    return paths
