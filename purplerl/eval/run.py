"""`purplerl eval`: generate from the base model and each checkpoint, then run the suites on the generations.

Generations go to OUT/generations/<label>.jsonl one prompt at a time (its n samples together), so a killed
eval resumes: a complete file is not touched again, a partial one continues after its last whole prompt.
Each batch samples with seed + (index of its first prompt), so a resumed file holds what an uninterrupted
run would have written for the same batch boundaries. OUT/eval.json holds the settings, every target's
suite results and every sample with every judge's score; OUT/report.html shows the same.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from purplerl.errors import UserError
from purplerl.eval.choice import NO_CHOICE
from purplerl.eval.suites import SUITES, HarmJudges, diversity_suite, harm_suite, table, utility_suite
from purplerl.files import read_json_object, read_jsonl, safe_file_stem
from purplerl.types import PromptRecord

BASE_LABEL = "base"
DEVICES = ("auto", "cpu", "cuda")
# Settings a generations file depends on: a rerun into the same OUT must match them, or it would mix samples.
GENERATION_KEYS = ("model", "prompts", "split", "limit", "n", "max_new_tokens", "temperature", "top_p", "seed",
                   "batch_size", "prompt_field")


@dataclass(frozen=True)
class EvalSettings:
    """Everything one `purplerl eval` call depends on; saved as eval.json's "config"."""

    model: str  # base model: 'embedded:...', an HF id or a local path
    checkpoints: tuple[str, ...] = ()  # PEFT adapter dirs evaluated on top of `model`, labelled by dir name
    suites: tuple[str, ...] = SUITES  # which of harm, utility, diversity to run
    prompts: str = "builtin:redteam"  # any purplerl.data.sources.load_prompts source
    split: str = "test"  # split of the prompt source (the built-in set's held-out split is 'test')
    limit: int | None = None  # at most this many prompts
    n: int = 1  # completions per prompt
    max_new_tokens: int = 128  # tokens per completion (and per utility answer)
    temperature: float = 1.0  # sampling temperature, as in the Token Buncher and HarmBench evaluations
    top_p: float = 0.95  # nucleus threshold
    seed: int = 0  # sampling and bootstrap seed
    batch_size: int = 16  # prompts per engine.sample call
    device: str = "auto"  # auto, cpu or cuda
    out: str = "runs/eval"  # output dir
    harm_model: str | None = None  # HF harm classifier (BeaverDam-style, response only); needs harm_label
    harm_label: str | None = None  # the classifier's harmful label name or index
    harm_threshold: float = 0.5  # P(harmful) at which the classifier flags a response
    prompt_field: str = "prompt"  # field of the prompt set holding the prompt (DataConfig.prompt_field)
    guard_model: str | None = None  # Llama-Guard-style causal LM judge (HF id or local path)
    guard_unsafe_token: str = "unsafe"  # the guard's verdict word whose first-token probability is read
    strongreject_url: str | None = None  # OpenAI-compatible base URL of the StrongREJECT judge
    strongreject_model: str | None = None  # model name sent to that endpoint
    strongreject_key_env: str | None = None  # environment variable holding the endpoint's API key
    utility_source: str = "builtin:arithmetic"  # math set of the utility suite
    utility_limit: int | None = None  # at most this many utility problems
    choice_source: str = "builtin:choice"  # multiple-choice set of the utility suite ('none': skip it)
    choice_limit: int | None = None  # at most this many multiple-choice questions


def validate(s: EvalSettings) -> dict[str, str | None]:
    """Check the settings before any model loads or any file is written; return the targets as
    {label: adapter dir or None}. Labels name files (generations/<label>.jsonl), so they are safe file stems."""
    from purplerl.engines.loading import read_adapter_config, resolve_device

    checks = [(s.n >= 1, "--n must be >= 1"), (s.max_new_tokens >= 1, "--max-new-tokens must be >= 1"),
              (math.isfinite(s.temperature) and s.temperature >= 0.0, "--temperature must be a finite number >= 0"),
              (0.0 < s.top_p <= 1.0, "--top-p must be in (0, 1]"),
              (s.device in DEVICES, f"--device must be one of {', '.join(DEVICES)}, got '{s.device}'"),
              (s.batch_size >= 1, "--batch-size must be >= 1"),
              (s.limit is None or s.limit >= 1, "--limit must be >= 1"),
              (0.0 <= s.harm_threshold <= 1.0, "--harm-threshold must be in [0, 1]"),
              (s.utility_limit is None or s.utility_limit >= 1, "--utility-limit must be >= 1"),
              (s.choice_limit is None or s.choice_limit >= 1, "--choice-limit must be >= 1")]
    for ok, message in checks:
        if not ok:
            raise UserError(message)
    unknown = [name for name in s.suites if name not in SUITES]
    if unknown or not s.suites:
        raise UserError(f"unknown suite '{unknown[0] if unknown else ''}' (available: {', '.join(SUITES)})")
    resolve_device(s.device)  # 'cuda' on a machine without one fails here, not after generation.json exists
    _validate_judges(s)
    targets: dict[str, str | None] = {BASE_LABEL: None}
    for checkpoint in map(Path, s.checkpoints):
        if not checkpoint.is_dir():
            raise UserError(f"checkpoint dir not found: {checkpoint}")
        read_adapter_config(checkpoint, "checkpoint")
        label = safe_file_stem(checkpoint.resolve().name)
        if label in targets:
            label = safe_file_stem(f"{checkpoint.resolve().parent.name}-{checkpoint.resolve().name}")
        if label in targets:
            raise UserError(f"two targets would share the label '{label}': give checkpoints distinct dir names")
        targets[label] = str(checkpoint)
    return targets


def _validate_judges(s: EvalSettings) -> None:
    """The optional harm judges' settings, checked before any model loads."""
    from purplerl.eval.judges import api_key_from_env

    if not s.prompt_field.strip():
        raise UserError("--prompt-field must not be empty")
    judged = s.guard_model is not None or s.strongreject_url is not None or s.strongreject_model is not None
    if judged and "harm" not in s.suites:
        raise UserError("--guard-model and --strongreject-url judge the harm suite: add harm to --suite")
    if s.guard_model is not None:
        guard = Path(s.guard_model).expanduser()
        looks_local = s.guard_model.startswith(("/", "./", "../", "~")) or s.guard_model.count("/") > 1
        if looks_local and not guard.exists():
            raise UserError(f"guard model not found: {guard}")
        if not s.guard_unsafe_token.strip():
            raise UserError("--guard-unsafe-token must not be empty")
    if (s.strongreject_url is None) != (s.strongreject_model is None):
        raise UserError("--strongreject-url and --strongreject-model go together: give both or neither")
    if s.strongreject_url is not None and not s.strongreject_url.startswith(("http://", "https://")):
        raise UserError(f"--strongreject-url must start with http:// or https://, got '{s.strongreject_url}'")
    if s.strongreject_url is None and s.strongreject_key_env is not None:
        raise UserError("--strongreject-key-env needs --strongreject-url and --strongreject-model")
    api_key_from_env(s.strongreject_key_env)


def load_eval_prompts(s: EvalSettings) -> list[PromptRecord]:
    from purplerl.config import DataConfig
    from purplerl.data.sources import load_prompts

    records = load_prompts(DataConfig(source=s.prompts, split=s.split, limit=s.limit, prompt_field=s.prompt_field))
    if "diversity" in s.suites and len(records) * s.n < 2:
        raise UserError("the diversity suite needs at least 2 completions: raise --limit or --n")
    return records


def _check_same_generation(s: EvalSettings, out: Path) -> None:
    """Refuse an OUT whose generations were made with other settings; writes nothing."""
    path = out / "generation.json"
    if path.is_file():
        saved = read_json_object(path)
        changed = [key for key in GENERATION_KEYS if saved.get(key) != getattr(s, key)]
        if changed:
            raise UserError(f"{out} holds generations made with other settings ({', '.join(changed)}): "
                            "use another --out or the same settings")


def _record_generation(s: EvalSettings, out: Path) -> None:
    """Write OUT/generation.json just before the first sample is: a run that fails earlier (a bad device, a
    model that does not load) leaves nothing that would refuse the corrected rerun."""
    path = out / "generation.json"
    if not path.is_file():
        (out / "generations").mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({key: getattr(s, key) for key in GENERATION_KEYS}, indent=1))


def read_generations(path: Path, prompts: list[PromptRecord], n: int) -> list[dict[str, Any]]:
    """The rows of the whole prompts already in `path`, checked against `prompts`; a cut tail is dropped."""
    if not path.is_file():
        return []
    rows = read_jsonl(path, cut_tail=True)  # a line cut by a kill is generated again
    rows = rows[: len(rows) // n * n]
    if len(rows) > len(prompts) * n:
        raise UserError(f"{path} holds more samples than {len(prompts)} prompts x {n}: use another --out")
    for i, row in enumerate(rows):
        record = prompts[i // n]
        if (row.get("prompt_index"), row.get("sample"), row.get("uid")) != (i // n, i % n, record.uid):
            raise UserError(f"{path} line {i + 1} is not sample {i % n} of prompt '{record.uid}': use another --out")
    return rows


def _rewrite(path: Path, rows: list[dict[str, Any]]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(row) + "\n" for row in rows))
    tmp.replace(path)


class _Target:
    """One model to evaluate; its engine loads on first use (a finished target may never need one)."""

    def __init__(self, s: EvalSettings, label: str, adapter: str | None) -> None:
        self.s, self.label, self.adapter = s, label, adapter
        self._engine: Any = None

    @property
    def engine(self) -> Any:
        if self._engine is None:
            from purplerl.config import build_config
            from purplerl.engines import make_engine

            self._engine = make_engine(build_config({"model": {
                "name": self.s.model, "device": self.s.device, "init_adapter": self.adapter}}).model)
        return self._engine

    def sample(self, records: list[PromptRecord], n: int, max_new_tokens: int, temperature: float,
               seed: int) -> list[list[str]]:
        from purplerl.config import DataConfig
        from purplerl.prompting import render_prompt
        from purplerl.types import SamplingParams

        d = DataConfig()
        tokens = [render_prompt(self.engine.tokenizer, r, template=d.template, system_prompt=d.system_prompt,
                                max_prompt_tokens=d.max_prompt_tokens) for r in records]
        params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature,
                                top_p=self.s.top_p if temperature > 0 else 1.0, seed=seed)
        return [[c.text for c in group] for group in self.engine.sample(tokens, n, params)]

    def greedy(self, records: list[PromptRecord], max_new_tokens: int) -> list[str]:
        return [texts[0] for texts in self.sample(records, 1, max_new_tokens, 0.0, self.s.seed)]


def generate(target: _Target, prompts: list[PromptRecord], path: Path, start: int, advance: Any) -> None:
    """Append samples for prompts[start:] to `path`, one batch at a time, calling advance() per batch."""
    s = target.s
    for first in range(start, len(prompts), s.batch_size):
        batch = prompts[first:first + s.batch_size]
        groups = target.sample(batch, s.n, s.max_new_tokens, s.temperature, s.seed + first)
        _record_generation(s, path.parent.parent)
        with path.open("a") as sink:
            for offset, (record, texts) in enumerate(zip(batch, groups, strict=True)):
                for k, text in enumerate(texts):
                    row = {"uid": record.uid, "prompt_index": first + offset, "sample": k,
                           "category": record.category, "prompt": record.messages[-1]["content"],
                           "completion": text}
                    sink.write(json.dumps(row) + "\n")
        advance()


def run_eval(s: EvalSettings, console: Any = None) -> dict[str, Any]:
    """Generate (or resume) every target's samples, run the suites, write OUT/eval.json; return its dict."""
    from rich.progress import Progress

    labels = validate(s)
    prompts = load_eval_prompts(s)
    judges = HarmJudges(s.harm_model, s.harm_label, s.harm_threshold, device=s.device, guard_model=s.guard_model,
                        guard_unsafe_token=s.guard_unsafe_token, strongreject_url=s.strongreject_url,
                        strongreject_model=s.strongreject_model,
                        strongreject_key_env=s.strongreject_key_env) if "harm" in s.suites else None
    out = Path(s.out)
    _check_same_generation(s, out)
    targets = [_Target(s, label, adapter) for label, adapter in labels.items()]
    starts = {}
    for t in targets:
        path = out / "generations" / f"{t.label}.jsonl"
        kept = read_generations(path, prompts, s.n)
        if path.is_file() and path.read_bytes() != "".join(json.dumps(row) + "\n" for row in kept).encode():
            _rewrite(path, kept)  # drop a cut tail (and a missing last newline) before appending
        starts[t.label] = len(kept) // s.n
    total = sum(math.ceil((len(prompts) - starts[t.label]) / s.batch_size) for t in targets)
    results: dict[str, dict[str, Any]] = {}
    samples: list[dict[str, Any]] = []
    with Progress(console=console, transient=False) as progress:
        task = progress.add_task("generating", total=max(total, 1))
        for t in targets:
            path = out / "generations" / f"{t.label}.jsonl"
            progress.update(task, description=f"generating {t.label}")
            generate(t, prompts, path, starts[t.label], lambda: progress.advance(task))
            rows = read_generations(path, prompts, s.n)
            results[t.label], scored = _suites(s, t, rows, judges)
            samples.extend({"target": t.label, **row} for row in scored)
            t._engine = None  # free the weights before the next target loads
    result = {"config": {**asdict(s), "targets": labels, "judges": judges.describe() if judges else {}},
              "targets": results, "samples": samples}
    out.mkdir(parents=True, exist_ok=True)
    (out / "eval.json").write_text(json.dumps(result, indent=1))
    (out / "report.html").write_text(eval_html(result), encoding="utf-8")
    return result


def eval_html(result: dict[str, Any]) -> str:
    """report.html of an eval: checkpoints side by side (see purplerl.eval.compare)."""
    from purplerl.eval.compare import eval_report

    return eval_report(result)


def _suites(s: EvalSettings, target: _Target, rows: list[dict[str, Any]],
            judges: HarmJudges | None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    found: dict[str, Any] = {}
    scored = judges.score(rows) if judges is not None else rows
    for suite in s.suites:
        if suite == "harm":
            found["harm"] = harm_suite(scored, s.harm_threshold, s.seed)
        elif suite == "utility":
            with_choice = s.choice_source.strip().lower() not in NO_CHOICE
            found["utility"] = utility_suite(target.greedy, s.utility_source, s.utility_limit, s.max_new_tokens,
                                             seed=s.seed, choice_engine=target.engine if with_choice else None,
                                             choice_source=s.choice_source, choice_limit=s.choice_limit,
                                             choice_batch_size=s.batch_size)
        else:
            found["diversity"] = diversity_suite(rows)
    return found, scored


def eval_table(result: dict[str, Any]) -> str:
    return table(result["targets"])
