"""Readers of what each experiment tracker wrote, parsed with the trackers' own formats and loaders, independently
of purplerl's tracker code (tests/train/test_trackers.py, tests/train/test_trackers_sigkill.py)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest


def wandb_records(path: Path) -> list:
    """The protobuf records of a W&B `.wandb` file (a LevelDB-style log: 32 KiB blocks of chunked records)."""
    from wandb.proto import wandb_internal_pb2

    data, block, pos, chunk, records = path.read_bytes(), 32768, 7, b"", []
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        room = block - pos % block
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7]) if room >= 7 else (0, 0, 0)
        if kind == 0:  # a block's zero padding
            pos += room
            continue
        chunk += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a whole record, or the last chunk of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunk)
            records.append(record)
            chunk = b""
    return records


def wandb_history(run_dir: Path, run_id: str = "") -> tuple[list[dict], set[str], list[dict]]:
    """History rows of every offline segment (of run `run_id`, if given) in order ({'_step', key: value,
    'samples': table rows}), the run ids, and the config updates in order."""
    rows, ids, configs = [], set(), []
    for segment in sorted((run_dir / "wandb").glob(f"offline-run-*{run_id}")):
        for record in wandb_records(next(segment.glob("*.wandb"))):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                ids.add(record.run.run_id)
            updates = record.run.config.update if kind == "run" else record.config.update if kind == "config" else []
            if updates:
                configs.append({u.key: json.loads(u.value_json) for u in updates})
            if kind != "history":
                continue
            row = {"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in record.history.item}
            if "samples/path" in row:
                row["samples"] = json.loads((segment / "files" / row["samples/path"]).read_text())
            rows.append(row)
    return rows, ids, configs


def tensorboard_events(run_dir: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    return events


def mlflow_client(run_dir: Path, monkeypatch: pytest.MonkeyPatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    return MlflowClient(tracking_uri=(run_dir / "mlruns").as_uri())
