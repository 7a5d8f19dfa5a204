"""PromptSampler: batches are a pure, seeded function of the step."""

from __future__ import annotations

import random

import pytest

from purplerl.data import PromptSampler
from purplerl.errors import UserError
from purplerl.types import PromptRecord


def records(n: int) -> list[PromptRecord]:
    return [PromptRecord(messages=({"role": "user", "content": f"p{i}"},), uid=str(i)) for i in range(n)]


def uids(batch: list[PromptRecord]) -> list[str]:
    return [r.uid for r in batch]


def test_same_arguments_same_batches():
    a, b = PromptSampler(records(10), 3, seed=5), PromptSampler(records(10), 3, seed=5)
    assert [uids(a.batch(k)) for k in range(12)] == [uids(b.batch(k)) for k in range(12)]


def test_epoch_order_matches_documented_seeding():
    sampler = PromptSampler(records(10), 5, seed=7)
    expected = list(range(10))
    random.Random("7-0").shuffle(expected)
    assert sampler.permutation(0) == expected
    assert sampler.indices(0) + sampler.indices(1) == expected


def test_each_epoch_covers_every_record_once():
    sampler = PromptSampler(records(12), 4, seed=1)
    for epoch in range(3):
        seen = [uid for k in range(3 * epoch, 3 * epoch + 3) for uid in uids(sampler.batch(k))]
        assert sorted(seen, key=int) == [str(i) for i in range(12)]
    assert sampler.permutation(0) != sampler.permutation(1)


def test_different_seeds_differ():
    a, b = PromptSampler(records(20), 20, seed=0), PromptSampler(records(20), 20, seed=1)
    assert uids(a.batch(0)) != uids(b.batch(0))


def test_batch_straddles_epochs():
    sampler = PromptSampler(records(5), 3, seed=3)
    perm0, perm1 = sampler.permutation(0), sampler.permutation(1)
    assert sampler.indices(1) == perm0[3:] + perm1[:1]
    assert sampler.indices(2) == perm1[1:4]
    assert [sampler.epoch_of(k) for k in range(5)] == [0, 0, 1, 1, 2]


def test_batch_larger_than_records_spans_epochs():
    sampler = PromptSampler(records(3), 7, seed=0)
    expected = sampler.permutation(0) + sampler.permutation(1) + sampler.permutation(2)[:1]
    assert sampler.indices(0) == expected
    assert sampler.epoch_of(1) == 2


def test_step_k_is_independent_of_history():
    walked = PromptSampler(records(7), 4, seed=11)
    history = [uids(walked.batch(k)) for k in range(40)]
    for k in (0, 13, 39):
        assert uids(PromptSampler(records(7), 4, seed=11).batch(k)) == history[k]
    assert uids(walked.batch(13)) == history[13]


def test_no_shuffle_keeps_source_order():
    sampler = PromptSampler(records(4), 3, seed=9, shuffle=False)
    assert uids(sampler.batch(0)) == ["0", "1", "2"]
    assert uids(sampler.batch(1)) == ["3", "0", "1"]


def test_invalid_inputs():
    with pytest.raises(UserError, match="no prompts to sample from"):
        PromptSampler([], 2, seed=0)
    with pytest.raises(UserError, match="batch size must be >= 1"):
        PromptSampler(records(2), 0, seed=0)
    with pytest.raises(ValueError, match="step must be >= 0"):
        PromptSampler(records(2), 1, seed=0).batch(-1)
