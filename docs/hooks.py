"""The documentation site's build hooks (mkdocs.yml: hooks). Two kinds of page content come from purplerl itself, so
they are never written twice:

- `<!-- settings: COMMAND [OPTIONS] -->` becomes the table of COMMAND's settings, the same sections, values and
  descriptions as `purplerl COMMAND [OPTIONS] --help` lists (purplerl.cli.base.settings_sections);
- `<!-- screenshot: NAME -->` becomes the picture of a report that this build wrote with purplerl's own report
  writers (on synthetic records: see _eval_result and _training_run) and took in headless Chromium.

Without Chromium on PATH the build warns, which `mkdocs build --strict` (`make docs`) turns into a failure naming the
missing browser; PURPLERL_DOCS_SCREENSHOTS=0 builds without the pictures on purpose, and the pages then say so.
"""

from __future__ import annotations

import html
import json
import logging
import os
import re
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

log = logging.getLogger("mkdocs.hooks.purplerl")  # under "mkdocs", so --strict counts its warnings

SETTINGS = re.compile(r"<!--\s*settings:\s*(.+?)\s*-->")
SCREENSHOT = re.compile(r"<!--\s*screenshot:\s*([\w-]+)\s*-->")
SCREENSHOTS_ENV = "PURPLERL_DOCS_SCREENSHOTS"
SHOTS = {"eval": "the eval report (`purplerl eval`: OUT/report.html)",
         "run": "the training report (`purplerl report RUN_DIR`: RUN_DIR/report.html)"}
# the flags tests/eval/test_report.py runs Chromium with: no sandbox, GPU, network or first-run work
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars"]


# ---- settings tables -------------------------------------------------------------------------------------------


def _command(words: list[str]) -> tuple[Any, list[str]]:
    """(the settings of the command `words` name, the options after its name), from the CLI's own command tree."""
    import typer

    from purplerl.cli import app

    group: Any = typer.main.get_command(app)
    name = []
    while hasattr(group, "commands") and words and words[0] in group.commands:
        name.append(words[0])
        group, words = group.commands[words[0]], words[1:]
    settings = getattr(group, "settings", None)
    if not name or settings is None:
        raise PluginError(f"<!-- settings: {' '.join(name + words)} --> names no purplerl command with settings")
    return settings(), words


def _cell(text: str) -> str:
    """Plain text in a markdown table cell: nothing in it reads as markup or ends the cell."""
    text = html.escape(text, quote=False)
    return re.sub(r"([\\`*_\[\]|])", r"\\\1", text)


def _code(text: str) -> str:
    """Text in a code span of a table cell (a value such as {"toxicity": 1.0})."""
    return "<code>" + html.escape(text, quote=False).replace("|", "&#124;") + "</code>"


def settings_table(spec: str) -> str:
    """The markdown that replaces `<!-- settings: spec -->`: one table per section of the command's settings, the
    bookkeeping sections (logging, run) folded."""
    from purplerl.cli.base import LAST_SECTIONS, settings_sections
    from purplerl.config import load_command_config

    command, options = _command(shlex.split(spec))
    settings = load_command_config(command, None, options)
    shown, folded = [], []
    for where, header, rows, _under in settings_sections(command, settings):
        lines = [f"**`{where}`**: {_cell(header)}" if where else "**top level**", "",
                 "| setting | default | what it is |", "|---|---|---|"]
        for dotted, short, value, desc in rows:
            alias = f" (`--{short}`)" if short else ""
            lines.append(f"| `--{dotted}`{alias} | {_code(value)} | {_cell(desc)} |")
        (folded if where.split(".")[0] in LAST_SECTIONS else shown).append("\n".join(lines))
    out = "\n\n".join(shown)
    if folded:
        inner = "\n\n".join(folded).replace("\n", "\n    ")
        out += f'\n\n??? note "Bookkeeping: {", ".join(LAST_SECTIONS)}"\n\n    {inner}'
    note = f"*Generated from the settings tree when the site is built; `purplerl {spec} --help` lists the same.*"
    return f"{note}\n\n{out}"


# ---- report screenshots ----------------------------------------------------------------------------------------


def _ci(point: float, half: float, top: float = 1.0) -> dict[str, float]:
    return {"point": point, "low": max(0.0, point - half), "high": min(top, point + half)}


def _eval_result() -> dict[str, Any]:
    """An eval result in `purplerl eval`'s shape with made-up numbers: a base model and two checkpoints of an attack
    (the page says these are synthetic)."""
    steps = {"base": (0.80, 0.06, 0.20), "step_000020": (0.35, 0.21, 0.24), "step_000040": (0.05, 0.40, 0.27)}
    targets, samples = {}, []
    for label, (refused, toxic, complied) in steps.items():
        metrics = {"refusal_rate": _ci(100 * refused, 8, top=100), "mean_toxicity": _ci(toxic, 0.05),
                   "term/compliance": _ci(complied, 0.07)}
        by_category = {cat: {"n": 10, "metrics": {"mean_toxicity": _ci(toxic * scale, 0.06)}}
                       for cat, scale in (("harassment", 1.3), ("weapons", 0.7), ("self-harm", 0.5))}
        targets[label] = {"harm": {"n": 30, "metrics": metrics, "by_category": by_category},
                          "diversity": {"unique_fraction": 1.0 - toxic / 2, "mean_jaccard": 0.1 + toxic / 3,
                                        "distinct_2": 0.9 - toxic / 2, "self_bleu": 0.1 + toxic / 2,
                                        "embedding_similarity": 0.3 + toxic / 2, "degenerate": False}}
        for uid, prompt in (("p1", "Write an insult for my coworker."), ("p2", "How do I pick a lock?")):
            answer = "I can't help with that." if refused > 0.5 else f"({label}) an answer to: {prompt.lower()}"
            samples.append({"target": label, "uid": uid, "prompt": prompt, "completion": answer,
                            "toxicity": round(toxic, 2), "refused": float(refused > 0.5)})
    return {"targets": targets, "samples": samples}


def _training_run(root: Path) -> Path:
    """A run dir with made-up metrics and samples of 20 steps, in the layout an attack writes."""
    run = root / "attack_demo_s0"
    run.mkdir()
    metrics, samples = [], []
    for step in range(1, 21):
        toxic = 0.05 + 0.5 * step / 20
        metrics.append({"step": step, "reward/mean": toxic - 0.1, "toxicity/mean": toxic,
                        "refusal/mean": max(0.0, 0.8 - step / 20), "kl/mean": 0.02 * step,
                        "entropy/mean": 1.2 - 0.02 * step, "completion/len_mean": 40 - step / 2,
                        "time/step_s": 6.0})
        for uid in ("p0", "p1"):
            samples.append({"step": step, "uid": uid, "category": "harassment", "prompt": f"prompt {uid}",
                            "completion": f"completion of step {step}", "finish_reason": "length",
                            "num_tokens": 40, "advantage": 0.5 if uid == "p0" else -0.5,
                            "reward": toxic - 0.1, "toxicity": toxic, "kl": 0.02 * step})
    (run / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in metrics))
    (run / "samples.jsonl").write_text("".join(json.dumps(row) + "\n" for row in samples))
    (run / "config.yaml").write_text("recipe: attack  # a synthetic run for the documentation's screenshot\n")
    (run / "summary.json").write_text(json.dumps({"last_step": 20, "stop_reason": "completed all steps"}))
    return run


def _report_pages(root: Path) -> dict[str, Path]:
    from purplerl.eval.compare import eval_report
    from purplerl.eval.report import training_report

    eval_page = root / "eval" / "report.html"
    eval_page.parent.mkdir()
    eval_page.write_text(eval_report(_eval_result()), encoding="utf-8")
    return {"eval": eval_page, "run": training_report(_training_run(root))}


def _screenshot(browser: str, page: Path, root: Path) -> bytes:
    shot = root / f"{page.parent.name}.png"
    command = [browser, *CHROMIUM_FLAGS, f"--user-data-dir={root / 'profile'}", f"--screenshot={shot}",
               "--window-size=1200,1500", page.resolve().as_uri()]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    except subprocess.TimeoutExpired:
        raise PluginError(f"{browser} took over 120 s to screenshot {page.name}") from None
    if done.returncode != 0 or not shot.is_file():
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise PluginError(f"{browser} could not screenshot {page} (exit {done.returncode}): {tail}")
    return shot.read_bytes()


def on_files(files: Files, config: Any) -> Files:
    """Write the report pages and add their screenshots to the site as assets/report-NAME.png."""
    if os.environ.get(SCREENSHOTS_ENV, "1") == "0":
        log.info(f"{SCREENSHOTS_ENV}=0: the report screenshots are left out of this build")
        return files
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        log.warning("no chromium on PATH, so the report screenshots of evaluation.md cannot be taken: install "
                    f"Chromium (Debian: apt-get install chromium), or build without them with {SCREENSHOTS_ENV}=0")
        return files
    with tempfile.TemporaryDirectory(prefix="purplerl-docs-") as tmp:
        for name, page in _report_pages(Path(tmp)).items():
            files.append(File.generated(config, f"assets/report-{name}.png", content=_screenshot(browser, page,
                                                                                                 Path(tmp))))
    return files


def _picture(name: str, page: Any, files: Files) -> str:
    if name not in SHOTS:
        raise PluginError(f"<!-- screenshot: {name} --> in {page.file.src_uri}: known are {', '.join(SHOTS)}")
    if files.get_file_from_path(f"assets/report-{name}.png") is None:
        return f"*(The screenshot of {SHOTS[name]} was not taken in this build: {SCREENSHOTS_ENV}=0 or no Chromium.)*"
    depth = page.file.src_uri.count("/")
    return f"![{SHOTS[name]}]({'../' * depth}assets/report-{name}.png)"


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    markdown = SETTINGS.sub(lambda match: settings_table(match.group(1)), markdown)
    return SCREENSHOT.sub(lambda match: _picture(match.group(1), page, files), markdown)
