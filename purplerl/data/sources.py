"""Prompt sources: the built-in red-team set, JSONL/JSON files, veRL parquet and HF datasets.

Every reader turns its source into plain row dicts; one shared pipeline then selects the split, applies
`data.filters`, builds PromptRecords, drops repeated prompts and applies `data.limit`, so every source
behaves the same way. Field names may be dotted (`extra_info.category`) to reach into veRL's nested
dicts. Every user mistake is a UserError that names the file and the field.

Prompt field fallback: when `data.prompt_field` is the default "prompt" and no row has a "prompt" field,
the first of BENCHMARK_PROMPT_FIELDS that the rows have is used instead, so the usual harm benchmarks load
without setting the field: `forbidden_prompt` (StrongREJECT), `question` (Do-Not-Answer), `Behavior` /
`behavior` (HarmBench), `goal` (AdvBench). A prompt_field set to anything else is used as given, and when
none of these fields exists either the usual "no prompt field 'prompt'" error names the row's fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from purplerl.config import DataConfig
from purplerl.config.migrate import get_path
from purplerl.errors import UserError, first_line
from purplerl.files import DATA_FILE_SUFFIXES, looks_local, read_json, read_jsonl, read_jsonl_numbered, unicode_problem
from purplerl.types import PromptRecord

BUILTIN_DIR = Path(__file__).parent / "builtin"
BUILTIN_SOURCES = ("redteam", "stories")  # stories: prompts for the toy reward-hacking runs (purplerl route)
FILE_SUFFIXES = DATA_FILE_SUFFIXES
_MISSING = object()
# Prompt fields of the usual harm benchmarks, tried in this order when the default "prompt" is absent.
BENCHMARK_PROMPT_FIELDS = ("forbidden_prompt", "question", "Behavior", "behavior", "goal")


@dataclass
class _Rows:
    """The raw rows of one source, before the shared pipeline."""

    rows: list[dict[str, Any]]
    name: str  # PromptRecord.source, unless a row carries veRL's `data_source`
    where: str  # how messages name the source: a path or 'hf:NAME'
    split_done: bool  # the reader already picked the split (split file, DatasetDict, hub split)
    lines: tuple[int, ...] = ()  # a JSONL file's line number of each row, else empty

    def locate(self, index: int) -> str:
        """Where row `index` is, for errors: 'FILE:LINE' in a JSONL file, else 'SOURCE row INDEX' (0-based)."""
        return f"{self.where}:{self.lines[index]}" if self.lines else f"{self.where} row {index}"


def load_prompts(cfg: DataConfig, split: str | None = None) -> list[PromptRecord]:
    """Load, filter, dedupe and limit the prompts of `cfg.source`; `split=None` means `cfg.split`."""
    split = cfg.split if split is None else split
    src = _read_source(cfg, split)
    if not src.rows:
        raise UserError(f"no rows in data source {src.where}")
    # Row positions are taken before filtering, so a uid does not change when the filters do.
    rows = list(enumerate(src.rows))
    if not src.split_done:
        rows = _select_split(rows, split, src.where)
    filters = dict(cfg.filters)
    if not filters and "beavertails" in src.where.lower() and _has_field(rows, "is_safe"):
        # BeaverTails pairs each prompt with safe and unsafe answers; only the unsafe rows are red-team prompts.
        filters = {"is_safe": False}
    if cfg.category_field is not None and not _has_field(rows, cfg.category_field):
        raise UserError(f"category field '{cfg.category_field}' not found in {src.where} "
                        f"(fields: {_field_list(rows)})")
    rows = _apply_filters(rows, filters, src.where)
    field = prompt_field(rows, cfg.prompt_field)
    records = _dedupe([_to_record(i, row, field, cfg, src) for i, row in rows])
    if cfg.limit is not None:
        records = records[: cfg.limit]
    if not records:
        raise UserError(f"no prompts left after filters {filters} in {src.where} (split '{split}')")
    return records


def read_rows(cfg: DataConfig, split: str | None = None) -> tuple[list[dict[str, Any]], str]:
    """The raw rows of `cfg.source`'s split with the filters applied (for recipes whose rows are not prompts,
    like SFT conversations), and how to name the source in messages."""
    located, where = read_located_rows(cfg, split)
    return [row for _, row in located], where


def read_located_rows(cfg: DataConfig, split: str | None = None) -> tuple[list[tuple[str, dict[str, Any]]], str]:
    """`read_rows`, each row with where it is ('FILE:LINE' in a JSONL file, else 'SOURCE row INDEX', the row's
    0-based position in the source's split before filtering), for errors that point at one row."""
    split = cfg.split if split is None else split
    src = _read_source(cfg, split)
    rows = list(enumerate(src.rows))
    if not src.split_done:
        rows = _select_split(rows, split, src.where)
    rows = _apply_filters(rows, dict(cfg.filters), src.where)
    if not rows:
        raise UserError(f"no rows in data source {src.where} (split '{split}')")
    return [(src.locate(i), row) for i, row in rows], src.where


# ---------------------------------------------------------------------------------------------- readers


def _read_source(cfg: DataConfig, split: str) -> _Rows:
    source = cfg.source
    if source.startswith("builtin:"):
        name = source.removeprefix("builtin:")
        if name not in BUILTIN_SOURCES:
            raise UserError(f"unknown built-in data source '{source}' (available: "
                            + ", ".join(f"builtin:{n}" for n in BUILTIN_SOURCES) + ")")
        rows = read_jsonl(BUILTIN_DIR / f"{name}.jsonl")
        return _Rows(rows, name=source, where=source, split_done=False)
    if source.startswith("hf:"):
        return _read_hf(source.removeprefix("hf:"), cfg.hf_config, split)
    path = Path(source).expanduser()
    if path.is_dir():
        return _read_dir(path, split)
    if path.suffix in FILE_SUFFIXES:
        if not path.is_file():
            raise UserError(f"data file not found: {path}")
        return _read_file(path)
    raise UserError(f"unknown data source '{source}': use 'builtin:redteam', a .jsonl/.json/.parquet file, "
                    "a directory with <split>.parquet or a saved HF dataset, or 'hf:ORG/NAME'")


def _read_file(path: Path) -> _Rows:
    if path.suffix == ".jsonl":
        numbered = read_jsonl_numbered(path)
        return _Rows([row for _, row in numbered], path.name, str(path), False,
                     tuple(line for line, _ in numbered))
    if path.suffix == ".json":
        rows = _read_json(path)
    else:
        rows = read_parquet_rows(path)
    return _Rows(rows, name=path.name, where=str(path), split_done=False)


def _read_json(path: Path) -> list[dict[str, Any]]:
    data = read_json(path)
    if isinstance(data, dict) and isinstance(data.get("data"), list):
        data = data["data"]
    if not isinstance(data, list):
        raise UserError(f"{path}: expected a list of objects or an object with a list under 'data'")
    for i, row in enumerate(data):
        if not isinstance(row, dict):
            raise UserError(f"{path}: item {i} is a {type(row).__name__}, expected an object")
    return data


def read_parquet_rows(path: Path) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq  # deferred: pyarrow is only needed for parquet sources

    try:
        table = pq.read_table(path)
    except (OSError, ValueError) as err:  # pyarrow's ArrowInvalid is a ValueError
        raise UserError(f"cannot read parquet file {path}: {first_line(err)}") from err
    return table.to_pylist()


def _read_dir(path: Path, split: str) -> _Rows:
    if is_saved_dataset(path):
        return _read_saved_dataset(path, split)
    split_file = path / f"{split}.parquet"
    if split_file.is_file():
        # veRL writes one parquet file per split, so the file itself is the split.
        return _Rows(read_parquet_rows(split_file), name=path.name, where=str(split_file), split_done=True)
    raise UserError(f"data directory {path} has no {split}.parquet and is not a dataset saved with save_to_disk")


def is_saved_dataset(path: Path) -> bool:
    # Markers written by Dataset.save_to_disk and DatasetDict.save_to_disk.
    return (path / "dataset_dict.json").is_file() or (path / "state.json").is_file()


def _read_hf(name: str, config: str | None, split: str) -> _Rows:
    path = Path(name).expanduser()
    if looks_local(name):
        if not path.is_dir():
            raise UserError(f"HF dataset directory not found: {path}")
        if not is_saved_dataset(path):
            raise UserError(f"{path} is not a dataset saved with save_to_disk (no dataset_dict.json or state.json)")
        return _read_saved_dataset(path, split)
    import datasets  # deferred: importing datasets is slow and only hub sources need it

    try:
        ds = datasets.load_dataset(name, config, split=split)
    except (OSError, ValueError) as err:  # not found, no network, unknown split or config
        raise UserError(f"cannot load HF dataset '{name}' (config {config}, split '{split}'): "
                        f"{first_line(err)}") from err
    return _Rows(ds.to_list(), name=name, where=f"hf:{name}", split_done=True)


def load_saved_split(path: Path, split: str, hint: str = "") -> tuple[list[dict[str, Any]], bool]:
    """Rows of a dataset saved with save_to_disk, and whether a split was chosen (a DatasetDict) rather than
    the whole single-split Dataset returned. `hint` is appended to a missing-split error."""
    import datasets

    try:
        ds = datasets.load_from_disk(str(path))
    except (OSError, ValueError) as err:
        raise UserError(f"cannot load saved dataset {path}: {first_line(err)}") from err
    if isinstance(ds, datasets.DatasetDict):
        if split not in ds:
            raise UserError(f"saved dataset {path} has no split '{split}' (splits: {', '.join(ds)}){hint}")
        return ds[split].to_list(), True
    return ds.to_list(), False


def _read_saved_dataset(path: Path, split: str) -> _Rows:
    rows, split_done = load_saved_split(path, split)
    return _Rows(rows, name=path.name, where=str(path), split_done=split_done)


# --------------------------------------------------------------------------------------------- pipeline


def _get(row: dict[str, Any], field: str) -> Any:
    """The value at `field` (dotted paths reach into nested dicts), or _MISSING."""
    return row[field] if field in row else get_path(row, field, _MISSING)


def _has_field(rows: list[tuple[int, dict[str, Any]]], field: str) -> bool:
    return any(_get(row, field) is not _MISSING for _, row in rows)


def _field_list(rows: list[tuple[int, dict[str, Any]]]) -> str:
    names: dict[str, None] = {}
    for _, row in rows[:100]:
        names.update(dict.fromkeys(row))
    return ", ".join(names) or "none"


def _row_split(row: dict[str, Any]) -> Any:
    # veRL keeps the split inside extra_info; plain files put it at the top level.
    value = _get(row, "split")
    return _get(row, "extra_info.split") if value is _MISSING else value


def _select_split(rows: list[tuple[int, dict[str, Any]]], split: str, where: str) -> list[tuple[int, dict]]:
    """Rows of `split` when the rows say which split they belong to; all rows when they do not."""
    labels = [_row_split(row) for _, row in rows]
    if all(label is _MISSING or label is None for label in labels):
        return rows
    kept = [pair for pair, label in zip(rows, labels, strict=True) if label == split]
    if not kept:
        present = sorted({str(label) for label in labels if label is not _MISSING and label is not None})
        raise UserError(f"no rows with split '{split}' in {where} (splits present: {', '.join(present)}); "
                        "set data.split")
    return kept


def _apply_filters(rows: list[tuple[int, dict[str, Any]]], filters: dict[str, Any],
                   where: str) -> list[tuple[int, dict[str, Any]]]:
    for field, value in filters.items():
        if not _has_field(rows, field):
            raise UserError(f"filter field '{field}' not found in {where} (fields: {_field_list(rows)})")
        rows = [(i, row) for i, row in rows if _get(row, field) == value]
    return rows


def row_kept(row: dict[str, Any], split: str | None, filters: dict[str, Any]) -> bool:
    """Whether one row is of `split` (None: the reader picked the split) and passes `filters`: `_select_split` and
    `_apply_filters` for a reader that sees one row at a time (purplerl.data.stream), which keeps a row that names
    no split, and drops a row that lacks a filter's field."""
    label = _MISSING if split is None else _row_split(row)
    if label is not _MISSING and label is not None and label != split:
        return False
    return all(_get(row, field) == value for field, value in filters.items())


def prompt_field(rows: list[tuple[int, dict[str, Any]]], configured: str) -> str:
    """The field the prompts are read from: `configured`, unless it is the default "prompt", no row has it
    and a benchmark's own prompt field (BENCHMARK_PROMPT_FIELDS, first present wins) is there instead."""
    if configured != "prompt" or _has_field(rows, configured):
        return configured
    return next((name for name in BENCHMARK_PROMPT_FIELDS if _has_field(rows, name)), configured)


def _to_record(index: int, row: dict[str, Any], field: str, cfg: DataConfig, src: _Rows) -> PromptRecord:
    prompt = _get(row, field)
    if prompt is _MISSING:
        raise UserError(f"{src.where}: row {index} has no prompt field '{field}' "
                        f"(fields: {', '.join(row)}); set data.prompt_field")
    messages = _to_messages(prompt, f"{src.where}: row {index}, field '{field}'")
    data_source = row.get("data_source")
    return PromptRecord(
        messages=messages,
        category=_category(row, cfg.category_field),
        source=data_source if isinstance(data_source, str) and data_source else src.name,
        uid=_uid(row, index),
        ground_truth=_ground_truth(row, f"{src.where}: row {index}"),
    )


def _to_messages(prompt: Any, where: str) -> tuple[dict[str, str], ...]:
    if isinstance(prompt, str):
        if not prompt.strip():
            raise UserError(f"{where}: empty prompt")
        _check_unicode(prompt, where)
        return ({"role": "user", "content": prompt},)
    if not isinstance(prompt, list) or not prompt:
        raise UserError(f"{where}: expected a string or a list of {{role, content}} messages, "
                        f"got {type(prompt).__name__}")
    messages = []
    for msg in prompt:
        if not (isinstance(msg, dict) and isinstance(msg.get("role"), str) and isinstance(msg.get("content"), str)):
            raise UserError(f"{where}: every message needs string 'role' and 'content', got {str(msg)[:80]}")
        _check_unicode(msg["role"], where)
        _check_unicode(msg["content"], where)
        messages.append({"role": msg["role"], "content": msg["content"]})
    if messages[-1]["role"] != "user":
        # The policy answers the prompt, so the conversation must end on the user's turn.
        raise UserError(f"{where}: the last message must have role 'user', got '{messages[-1]['role']}'")
    return tuple(messages)


def _check_unicode(text: str, where: str) -> None:
    # found here, the file and row are named; found by the tokenizer, it is a TypeError mid-run
    problem = unicode_problem(text)
    if problem:
        raise UserError(f"{where}: the text {problem}")


def _category(row: dict[str, Any], category_field: str | None) -> str:
    fields = (category_field,) if category_field is not None else ("category", "extra_info.category")
    for field in fields:
        value = _get(row, field)
        if value is _MISSING or value is None:
            continue
        if isinstance(value, dict):
            # BeaverTails stores {category name: flag}; the first raised flag names the harm.
            return next((str(name) for name, flag in value.items() if flag), "unknown")
        return str(value)
    return "unknown"


def _ground_truth(row: dict[str, Any], where: str) -> str | None:
    """The row's reference answer: a plain `ground_truth` column, else veRL's `reward_model.ground_truth`; text or
    an integer (kept as its digits). None where the row has none (or veRL's empty placeholder)."""
    for field in ("ground_truth", "reward_model.ground_truth"):
        value = _get(row, field)
        if value is _MISSING or value is None or value == "":
            continue
        if isinstance(value, bool) or not isinstance(value, str | int):
            raise UserError(f"{where}: {field} must be text or an integer, got {type(value).__name__} {value!r:.60}")
        return str(value)
    return None


def _uid(row: dict[str, Any], index: int) -> str:
    for field in ("uid", "id", "extra_info.index"):
        value = _get(row, field)
        if value is not _MISSING and value is not None:
            return str(value)
    return str(index)


def _dedupe(records: list[PromptRecord]) -> list[PromptRecord]:
    """Keep the first record of each distinct conversation (BeaverTails repeats each prompt per answer)."""
    seen: set[tuple[tuple[str, str], ...]] = set()
    out = []
    for record in records:
        key = tuple((m["role"], m["content"]) for m in record.messages)
        if key not in seen:
            seen.add(key)
            out.append(record)
    return out
