"""Streamed data (purplerl.data.stream): rows read lazily from JSONL and parquet, a bounded seeded shuffle buffer,
each data-parallel rank's share of one global order, and a position from which the stream goes on exactly."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from purplerl.config import SFTDataConfig
from purplerl.data.sources import read_rows
from purplerl.data.stream import ExampleStream, shuffled, stream_rows
from purplerl.errors import UserError


def jsonl(path: Path, rows: list[dict], tail: str = "") -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + tail)
    return path


def ids(rows) -> list:
    return [row["id"] for row in rows]


def test_a_jsonl_file_is_read_one_line_at_a_time(tmp_path: Path) -> None:
    data = jsonl(tmp_path / "rows.jsonl", [{"id": i} for i in range(40)], tail="not json\n")
    rows = stream_rows(SFTDataConfig(source=str(data)))
    assert [next(rows)["id"] for _ in range(3)] == [0, 1, 2]  # read before the bad line is reached
    with pytest.raises(UserError, match=f"^{data}:41: invalid JSON"):
        list(rows)


def test_a_parquet_file_is_read_one_record_batch_at_a_time(tmp_path: Path, monkeypatch) -> None:
    from purplerl.data import stream

    path = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"id": list(range(10)), "split": ["train", "test"] * 5}), path, row_group_size=3)
    monkeypatch.setattr(stream, "PARQUET_BATCH_ROWS", 2)
    assert ids(stream_rows(SFTDataConfig(source=str(path)))) == [0, 2, 4, 6, 8]  # the train split
    prepared = tmp_path / "prepared"
    prepared.mkdir()
    pq.write_table(pa.table({"id": [7, 8]}), prepared / "test.parquet")
    assert ids(stream_rows(SFTDataConfig(source=str(prepared), split="test"))) == [7, 8]
    with pytest.raises(UserError, match="reads a dir's train.parquet"):
        next(stream_rows(SFTDataConfig(source=str(prepared))))


def test_split_filters_and_limit_apply_row_by_row(tmp_path: Path) -> None:
    rows = [{"id": 0, "kind": "a"}, {"id": 1, "kind": "b", "split": "train"}, {"id": 2, "kind": "a", "split": "test"},
            {"id": 3, "kind": "a"}, {"id": 4}, {"id": 5, "kind": "a"}]
    data = str(jsonl(tmp_path / "rows.jsonl", rows))
    assert ids(stream_rows(SFTDataConfig(source=data))) == [0, 1, 3, 4, 5]  # a row naming no split is kept
    assert ids(stream_rows(SFTDataConfig(source=data, filters={"kind": "a"}))) == [0, 3, 5]
    assert ids(stream_rows(SFTDataConfig(source=data, filters={"kind": "a"}, limit=2))) == [0, 3]
    builtin = SFTDataConfig(source="builtin:stories")  # the rows the whole-file reader gives, one at a time
    assert list(stream_rows(builtin)) == read_rows(builtin)[0]


def test_the_shuffle_buffer_is_seeded_and_moves_an_item_at_most_size_minus_1_places_earlier() -> None:
    items = list(range(50))
    out = list(shuffled(items, 4, random.Random(3)))
    assert sorted(out) == items and out != items
    assert out == list(shuffled(items, 4, random.Random(3))) != list(shuffled(items, 4, random.Random(4)))
    assert all(out.index(i) >= i - 3 for i in items)
    assert list(shuffled(items, 1, random.Random(3))) == items
    assert sorted(shuffled(items[:3], 10, random.Random(0))) == items[:3]  # fewer items than the buffer holds


def _stream(count: int = 6, rank: int = 0, world: int = 1) -> ExampleStream[int]:
    return ExampleStream(lambda: iter(range(count)), 3, seed=7, what="six numbers", rank=rank, world=world)


def test_the_stream_runs_over_epochs_each_in_its_own_order() -> None:
    stream = _stream()
    first, second = stream.take(6), stream.take(6)
    assert sorted(first) == sorted(second) == list(range(6)) and first != second
    assert stream.position() == {"consumed": 12} and stream.epoch == 1


def test_ranks_share_one_global_order_every_world_th_item_each() -> None:
    alone = _stream()
    ranks = [_stream(rank=r, world=2) for r in range(2)]
    for _ in range(5):
        together = alone.take(4)
        zero, one = (stream.take(4) for stream in ranks)
        assert zero == together[0::2] and one == together[1::2]


def test_a_stream_sought_to_a_position_goes_on_with_the_exact_next_item() -> None:
    uninterrupted = _stream()
    whole = [uninterrupted.take(4) for _ in range(5)]
    stopped = _stream()
    before = [stopped.take(4) for _ in range(2)]
    resumed = _stream()
    resumed.seek(stopped.position())
    assert before + [resumed.take(4) for _ in range(3)] == whole
    with pytest.raises(UserError, match="must hold 'consumed'"):
        resumed.seek({"consumed": -1})


def test_an_empty_source_is_one_line() -> None:
    with pytest.raises(UserError, match="^no examples in six numbers$"):
        _stream(count=0).take(1)
