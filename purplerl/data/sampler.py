"""Deterministic prompt batches: the batch of RL step k is a pure function of (records, size, seed, k).

The data stream is the concatenation of epochs, epoch e being a permutation of the records seeded by
(seed, e). Step k takes stream positions [k*B, (k+1)*B), so a batch may straddle two epochs and a
resumed run sees exactly the prompts an uninterrupted run would have seen, without saving any state.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from purplerl.errors import UserError
from purplerl.types import PromptRecord

_CACHED_EPOCHS = 8  # permutations kept; a batch rarely spans more than two epochs


class PromptSampler:
    """Batches of prompts per RL step, in a seeded order that never depends on earlier calls."""

    def __init__(self, records: Sequence[PromptRecord], batch_size: int, seed: int, shuffle: bool = True) -> None:
        if len(records) == 0:
            raise UserError("no prompts to sample from: the data source gave an empty list")
        if batch_size < 1:
            raise UserError(f"batch size must be >= 1, got {batch_size}")
        self.records: tuple[PromptRecord, ...] = tuple(records)
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        # A cache only: permutation(e) is recomputed identically on a miss, so it holds no state.
        self._permutations: dict[int, list[int]] = {}

    def __len__(self) -> int:
        return len(self.records)

    def permutation(self, epoch: int) -> list[int]:
        """Record indices in the order epoch `epoch` visits them."""
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        return list(self._order(epoch))

    def indices(self, step: int) -> list[int]:
        """Record indices of the batch of RL step `step` (0-based)."""
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        n = len(self.records)
        out = []
        for position in range(step * self.batch_size, (step + 1) * self.batch_size):
            epoch, offset = divmod(position, n)
            out.append(self._order(epoch)[offset])
        return out

    def batch(self, step: int) -> list[PromptRecord]:
        """The prompts of RL step `step` (0-based)."""
        return [self.records[i] for i in self.indices(step)]

    def epoch_of(self, step: int) -> int:
        """The epoch that the first prompt of step `step` belongs to."""
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        return step * self.batch_size // len(self.records)

    def _order(self, epoch: int) -> Sequence[int]:
        if not self.shuffle:
            return range(len(self.records))
        order = self._permutations.get(epoch)
        if order is None:
            order = list(range(len(self.records)))
            # A string seed is hashed with SHA-512 by `random`, so the order is the same in every process.
            random.Random(f"{self.seed}-{epoch}").shuffle(order)
            if len(self._permutations) >= _CACHED_EPOCHS:
                self._permutations.clear()
            self._permutations[epoch] = order
        return order
