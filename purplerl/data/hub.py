"""Raw rows of one split of a hub dataset, from the Hugging Face Hub or from a local copy of it.

`purplerl data prepare` reads BeaverTails, WMDP and GSM8K through here. Without `--source` the split comes
from `datasets.load_dataset(hub_id, config, split=...)`. With `--source PATH` it comes from a local copy
with the hub's split names, so the same code runs offline:

- a directory written by `DatasetDict.save_to_disk` (its splits named as on the hub, e.g. `30k_train`);
- a directory written by `Dataset.save_to_disk`, or one `.parquet`/`.jsonl` file, for a dataset with a
  single split (WMDP's `test`);
- a directory of per-split files: `<split>.parquet`, `<split>.jsonl` or hub shards `<split>-*.parquet`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from purplerl.data.sources import is_saved_dataset, load_saved_split, read_parquet_rows
from purplerl.errors import UserError, first_line
from purplerl.files import read_jsonl

Rows = list[dict[str, Any]]


@dataclass(frozen=True)
class HubSpec:
    """Where a dataset lives on the hub and which of its splits we read."""

    hub_id: str  # e.g. "openai/gsm8k"
    config: str | None  # the hub config ("main", "wmdp-bio"), None for the default one
    splits: tuple[str, ...]  # hub split names, e.g. ("30k_train", "30k_test")


def load_split(spec: HubSpec, split: str, source: Path | None) -> Rows:
    """The rows of hub split `split` of `spec`, from the hub (`source=None`) or the local copy `source`."""
    if split not in spec.splits:
        raise ValueError(f"split '{split}' is not one of {spec.splits} of {spec.hub_id}")
    rows = _from_hub(spec, split) if source is None else _from_local(spec, split, source.expanduser())
    if not rows:
        raise UserError(f"split '{split}' of {spec.hub_id} is empty" + (f" in {source}" if source else ""))
    return rows


def _from_hub(spec: HubSpec, split: str) -> Rows:
    import datasets  # deferred: importing datasets is slow and only hub loading needs it

    try:
        ds = datasets.load_dataset(spec.hub_id, spec.config, split=split)
    except (OSError, ValueError) as err:  # offline, unreachable, gated, unknown config or split
        raise UserError(f"cannot load '{spec.hub_id}' (config {spec.config}, split '{split}') from the hub: "
                        f"{first_line(err)}; pass --source PATH to use a local copy") from err
    return ds.to_list()


def _from_local(spec: HubSpec, split: str, path: Path) -> Rows:
    if not path.exists():
        raise UserError(f"source not found: {path}")
    if path.is_file():
        _require_single_split(spec, path)
        return _read_file(path)
    if is_saved_dataset(path):
        return _from_saved(spec, split, path)
    files = _split_files(path, split)
    if not files:
        raise UserError(f"{path} has no {split}.parquet, {split}.jsonl or {split}-*.parquet and is not a dataset "
                        "saved with save_to_disk")
    return [row for file in files for row in _read_file(file)]


def _from_saved(spec: HubSpec, split: str, path: Path) -> Rows:
    rows, split_done = load_saved_split(path, split, hint=f"; {spec.hub_id} needs {', '.join(spec.splits)}")
    if not split_done:
        _require_single_split(spec, path)
    return rows


def _require_single_split(spec: HubSpec, path: Path) -> None:
    # One file or one saved Dataset cannot say which split it is, so it only stands for single-split data.
    if len(spec.splits) > 1:
        raise UserError(f"{path} holds a single split, but {spec.hub_id} needs splits {', '.join(spec.splits)}: "
                        "pass a DatasetDict saved with save_to_disk or a directory of per-split files")


def _split_files(path: Path, split: str) -> list[Path]:
    for name in (f"{split}.parquet", f"{split}.jsonl"):
        if (path / name).is_file():
            return [path / name]
    # A hub snapshot stores large splits as shards, e.g. test-00000-of-00001.parquet.
    return sorted(path.glob(f"{split}-*.parquet"))


def _read_file(path: Path) -> Rows:
    if path.suffix == ".parquet":
        return read_parquet_rows(path)
    if path.suffix == ".jsonl":
        return read_jsonl(path)
    raise UserError(f"unsupported source file {path}: use .parquet or .jsonl")
