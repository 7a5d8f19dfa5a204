"""What a data source holds, recorded with every segment of a run and checked when the run resumes.

A resume compares the data settings (`fixed_on_resume`), but a file edited in place, or a relative path resumed
from another working directory, keeps every setting and changes the data (issue 34, HIGH-1). So a run records
what its readers (purplerl.data.sources) read: the absolute path and the SHA-256 of the bytes of a file, of the
files of a directory (a dataset saved with save_to_disk, or veRL's per-split parquet files), of a built-in set's
packaged file. A hub dataset is recorded by the commit its loader resolved, the name of the cache directory its
rows were read from (the cache is immutable per commit, so bytes that datasets re-prepares after an upgrade do
not count as a change); a hub dataset held in memory has no commit, and its rows' SHA-256 is recorded instead.
Which rows are picked from the source (split, filters, limit) are settings and compared as settings.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

from purplerl.config.sections import RowSourceConfig
from purplerl.data.sources import BUILTIN_DIR, BUILTIN_SOURCES, is_saved_dataset
from purplerl.errors import UserError, first_line
from purplerl.files import looks_local

_COMMIT = re.compile(r"[0-9a-f]{40}")  # a hub commit: the cache dir datasets prepares one revision into


def file_sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def dir_sha256(path: Path, files: list[Path]) -> str:
    """One SHA-256 for `files` of the directory `path`: each file's path inside it and its bytes' SHA-256."""
    digest = hashlib.sha256()
    for file in files:
        digest.update(f"{file.relative_to(path).as_posix()}\0{file_sha256(file)}\n".encode())
    return digest.hexdigest()


def _local(path: Path) -> dict[str, Any]:
    """A file, or the files of a directory that the readers read: a saved dataset's files, or the top-level parquet
    files of a prepared dir (one per split)."""
    path = path.expanduser().absolute()
    if path.is_file():
        return {"path": str(path), "sha256": file_sha256(path)}
    if path.is_dir():
        files = sorted(p for p in (path.rglob("*") if is_saved_dataset(path) else path.glob("*.parquet"))
                       if p.is_file())
        return {"path": str(path), "sha256": dir_sha256(path, files)}
    raise UserError(f"data source not found: {path}")


def _hub(name: str, config: str | None, split: str) -> dict[str, Any]:
    import datasets  # deferred: importing datasets is slow and only hub sources need it

    try:  # the call the reader makes: it resolves the same revision, from the cache the reader then reads
        ds = datasets.load_dataset(name, config, split=split)
    except (OSError, ValueError) as err:
        raise UserError(f"cannot load HF dataset '{name}' (config {config}, split '{split}'): "
                        f"{first_line(err)}") from err
    dirs = {Path(f["filename"]).parent.name for f in ds.cache_files}
    commits = sorted(d for d in dirs if _COMMIT.fullmatch(d))
    if len(commits) == 1:
        return {"path": None, "revision": commits[0]}
    rows = hashlib.sha256()
    for row in ds:
        rows.update((json.dumps(row, sort_keys=True, default=str) + "\n").encode())
    return {"path": None, "sha256": rows.hexdigest()}


def source_content(data: RowSourceConfig) -> dict[str, Any] | None:
    """{"source", "path", "sha256" and/or "revision"} of `data.source` (None where no source is set: the recipe
    refuses that itself)."""
    source = data.source
    if source is None:
        return None
    if source.startswith("builtin:"):
        name = source.removeprefix("builtin:")
        if name not in BUILTIN_SOURCES:
            raise UserError(f"unknown built-in data source '{source}'")
        found = _local(BUILTIN_DIR / f"{name}.jsonl")
    elif source.startswith("hf:") and not looks_local(source.removeprefix("hf:")):
        found = _hub(source.removeprefix("hf:"), data.hf_config, data.split)
    else:
        found = _local(Path(source.removeprefix("hf:")))
    return {"source": source, **found}


def content_change(setting: str, recorded: dict[str, Any], now: dict[str, Any]) -> str | None:
    """Why the data of `setting` (e.g. "data.source") is not what a run recorded, in one line naming the file and
    both hashes; None when it is the same. The content is compared, not the path: a built-in set read from another
    install of purplerl is the same data."""
    if "revision" in recorded and "revision" in now:
        if recorded["revision"] == now["revision"]:
            return None
        return (f"{setting} {now['source']} is at revision {now['revision']} now, but the run read revision "
                f"{recorded['revision']}")
    old, new = recorded.get("sha256"), now.get("sha256")
    if old == new:
        return None
    then, where = recorded.get("path") or recorded.get("source"), now.get("path") or now["source"]
    if then != where:
        return f"{setting} reads {where} (sha256 {new}) now, but the run read {then} (sha256 {old})"
    return f"{where} changed since the run read it (sha256 {old} -> {new})"


def data_sources(config: Any) -> dict[str, dict[str, Any] | None]:
    """{"SECTION.source": its content} for every row-source section of a recipe's settings (every recipe reads
    its `data`), found by type so that a source section added later is recorded too."""
    found: dict[str, dict[str, Any] | None] = {}

    def walk(section: Any, prefix: str) -> None:
        for name in type(section).model_fields:
            value = getattr(section, name)
            if isinstance(value, RowSourceConfig):
                found[f"{prefix}{name}.source"] = source_content(value)
            elif hasattr(type(value), "model_fields"):
                walk(value, f"{prefix}{name}.")

    walk(config, "")
    return found
