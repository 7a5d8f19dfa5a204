"""Streamed data (`data.streaming`): rows read lazily from a JSONL or parquet file, shuffled in a bounded buffer and
shared out among data-parallel ranks, with a position a resumed run continues from.

- Reading: a JSONL file line by line (purplerl.files.iter_jsonl_numbered), a parquet file one record batch at a time
  (pyarrow), a built-in set from its packaged JSONL, a prepared dir from its <split>.parquet. The split, the
  filters and the limit apply row by row (purplerl.data.sources.row_kept); memory holds the shuffle buffer, not the
  data.
- Shuffling: a buffer of `size` items; once full, each new item replaces a uniformly drawn one, which is emitted
  (the shuffle buffer of tf.data and of HF `IterableDataset.shuffle`). An item moves at most size - 1 places
  earlier; size 1 keeps the file's order. Each epoch draws from its own generator, seeded by (seed, epoch).
- Sharding: the shuffled items of all epochs form one global sequence, the same on every rank; item i goes to rank
  i mod world. A step takes the next batch_size items of it, so each rank trains on batch_size / world of them and
  together they train on exactly the items one process would, in the same order, whatever the number of ranks.
- Resuming: the position is the number of global items taken. `seek` replays the sequence to it (reading and
  shuffling, no tokenizing): the resumed run continues at the exact next item, bit for bit.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Generic, TypeVar

from purplerl.config import SFTDataConfig
from purplerl.data.sources import BUILTIN_DIR, BUILTIN_SOURCES, is_saved_dataset, row_kept
from purplerl.errors import UserError, first_line
from purplerl.files import iter_jsonl_numbered

T = TypeVar("T")
PARQUET_BATCH_ROWS = 1024  # rows decoded at a time from a parquet file


def _parquet_rows(path: Path) -> Iterator[dict[str, Any]]:
    import pyarrow.parquet as pq  # deferred: pyarrow is only needed for parquet sources

    try:
        for batch in pq.ParquetFile(path).iter_batches(batch_size=PARQUET_BATCH_ROWS):
            yield from batch.to_pylist()
    except (OSError, ValueError) as err:  # pyarrow's ArrowInvalid is a ValueError
        raise UserError(f"cannot read parquet file {path}: {first_line(err)}") from err


def _jsonl_rows(path: Path) -> Iterator[dict[str, Any]]:
    return (row for _, row in iter_jsonl_numbered(path))  # a bad line's error names its line


def _reader(source: str, split: str) -> tuple[Iterator[dict[str, Any]], bool]:
    """The lazy rows of a source, and whether the reader picked the split itself (a dir's <split>.parquet)."""
    if source.startswith("builtin:"):
        name = source.removeprefix("builtin:")
        if name not in BUILTIN_SOURCES:
            raise UserError(f"unknown built-in data source '{source}' (available: "
                            + ", ".join(f"builtin:{n}" for n in BUILTIN_SOURCES) + ")")
        return _jsonl_rows(BUILTIN_DIR / f"{name}.jsonl"), False
    path = Path(source).expanduser()
    if path.is_dir():
        if is_saved_dataset(path) or not (path / f"{split}.parquet").is_file():
            raise UserError(f"data.streaming reads a dir's {split}.parquet, which {path} does not have")
        return _parquet_rows(path / f"{split}.parquet"), True
    if not path.is_file():
        raise UserError(f"data file not found: {path}")
    if path.suffix == ".parquet":
        return _parquet_rows(path), False
    if path.suffix == ".jsonl":
        return _jsonl_rows(path), False
    raise UserError(f"data.streaming reads .jsonl and .parquet files, not {path}")


def stream_rows(data: SFTDataConfig, split: str | None = None) -> Iterator[dict[str, Any]]:
    """The rows of the source's split, read lazily: those the split and filters keep, at most data.limit."""
    split = data.split if split is None else split
    rows, split_done = _reader(data.source, split)
    kept = 0
    for row in rows:
        if data.limit is not None and kept >= data.limit:
            return
        if row_kept(row, None if split_done else split, dict(data.filters)):
            kept += 1
            yield row


def shuffled(items: Iterable[T], size: int, rng: random.Random) -> Iterator[T]:
    """`items` in the order of a shuffle buffer of `size` (see the module docstring)."""
    buffer: list[T] = []
    for item in items:
        if len(buffer) < size:
            buffer.append(item)
            continue
        slot = rng.randrange(size)
        yield buffer[slot]
        buffer[slot] = item
    rng.shuffle(buffer)
    yield from buffer


class ExampleStream(Generic[T]):
    """The global sequence of shuffled items over epochs, and this rank's share of it (module docstring).
    `epoch_items()` reads the source once more from its start; `what` names it in the error of an empty source."""

    def __init__(self, epoch_items: Callable[[], Iterable[T]], buffer: int, seed: int, what: str,
                 rank: int = 0, world: int = 1) -> None:
        if not 0 <= rank < world:
            raise ValueError(f"rank {rank} is not one of {world} ranks")
        self.epoch_items, self.buffer, self.seed, self.what = epoch_items, buffer, seed, what
        self.rank, self.world = rank, world
        self.consumed, self.epoch = 0, 0
        self._items = self._global()

    def _global(self) -> Iterator[T]:
        epoch = 0
        while True:
            self.epoch = epoch
            rng = random.Random(self.seed * 1_000_003 + epoch)
            empty = True
            for item in shuffled(self.epoch_items(), self.buffer, rng):
                empty = False
                yield item
            if empty:
                raise UserError(f"no examples in {self.what}")
            epoch += 1

    def take(self, count: int) -> list[T]:
        """This rank's items among the next `count` of the global sequence: those at i = rank (mod world)."""
        start = self.consumed
        items = [next(self._items) for _ in range(count)]
        self.consumed += count
        return [item for i, item in enumerate(items, start) if i % self.world == self.rank]

    def position(self) -> dict[str, Any]:
        return {"consumed": self.consumed}

    def seek(self, position: dict[str, Any]) -> None:
        """Go to a position `position()` gave, replaying the sequence from its start."""
        consumed = position.get("consumed")
        if isinstance(consumed, bool) or not isinstance(consumed, int) or consumed < 0:
            raise UserError(f"a stream position must hold 'consumed', a count of examples >= 0, got {position}")
        self.consumed, self._items = 0, self._global()
        for _ in range(consumed):
            next(self._items)
        self.consumed = consumed
