"""Training data for the supervised threat model: harmful completions mined from a successful RL attack.

An attacker who has broken one model can fine-tune another on what the broken one said. From an attack run's
samples.jsonl a row is kept when its harm score (the attack's toxicity reward term) reaches `min_toxicity`, its
completion is non-empty, repeats its own 3-grams at most `max_repetition`, is not a refusal by the keyword
refusal judge, and is not a duplicate of a kept (prompt, completion) pair (compared after trimming whitespace).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from purplerl.errors import ExperimentError, UserError
from purplerl.experiments.tamper.heldout import degenerate
from purplerl.files import read_jsonl, write_durably
from purplerl.rewards.refusal import RefusalJudge
from purplerl.runs.layout import SAMPLES_FILE


def mine_rows(samples: list[dict[str, Any]], min_toxicity: float, max_repetition: float,
              refusal: RefusalJudge | None = None) -> list[dict[str, str]]:
    """The {"prompt", "completion"} rows worth training on, in sample order."""
    refusal = refusal or RefusalJudge()
    seen: set[tuple[str, str]] = set()
    kept: list[dict[str, str]] = []
    for row in samples:
        text, prompt = str(row.get("completion", "")), str(row.get("prompt", ""))
        key = (prompt.strip(), text.strip())
        if (float(row.get("toxicity", 0.0)) < min_toxicity or degenerate(text, max_repetition)
                or refusal.refused(text) or not prompt.strip() or key in seen):
            continue
        seen.add(key)
        kept.append({"prompt": prompt, "completion": text.strip()})
    return kept


def write_sft_data(source_run: Path, target: Path, min_toxicity: float, max_repetition: float,
                   min_rows: int) -> int:
    """Mine `source_run`'s samples into `target` (JSONL, written aside and renamed); the number of rows."""
    path = Path(source_run) / SAMPLES_FILE
    if not path.is_file():
        raise UserError(f"sft threat: {path} not found (tamper.sft_source must be an attack run dir)")
    samples = read_jsonl(path, cut_tail=True)
    rows = mine_rows(samples, min_toxicity, max_repetition)
    if len(rows) < min_rows:
        raise ExperimentError(f"sft threat: only {len(rows)} of {len(samples)} samples in {path} are harmful "
                              f"(toxicity >= {min_toxicity}), non-degenerate, non-refusing and distinct; need "
                              f"{min_rows} (tamper.sft_min_rows): attack longer or lower tamper.sft_min_toxicity")
    write_durably(target, "".join(json.dumps(row) + "\n" for row in rows))
    return len(rows)
