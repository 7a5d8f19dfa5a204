"""Data parallel: 2 torchrun processes (gloo on 127.0.0.1) reach the single-process update of the same global
batch; the pieces (sharding, counts, seeds, merged step results) by hand."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import ddp_accumulate_worker
import ddp_worker
import pytest
import torch
from transformers import AutoConfig, AutoTokenizer

from purplerl.algorithms.registry import Loss
from purplerl.engines.data_parallel import normalizer_count, rank_seed
from purplerl.engines.distributed import SINGLE, World, join_world
from purplerl.errors import UserError
from purplerl.train.loop import step_metrics
from purplerl.train.shards import StepShard, merge_shards
from purplerl.types import Completion, PromptRecord, RewardBreakdown, TrainBatch
from tests.tolerances import gamma, gradient_atol

WORKER = Path(ddp_worker.__file__)
REPO = WORKER.parents[2]  # the checkout under test, first on the workers' path


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def _grad_rtol(model_dir: Path, positions: int, tokens: int) -> float:
    """Normwise, relative to its size: the fp32 bound between one gradient summed on two ranks and in one process
    (other orders, other kernel shapes; other CPUs' kernels), 2 gamma_n of its reduction chain (tests/tolerances.py)."""
    return gradient_atol(torch.float32, AutoConfig.from_pretrained(model_dir), positions, tokens, 1.0)


@pytest.mark.process
def test_two_processes_reach_the_single_process_update(tiny_model_dir: Path, tmp_path: Path):
    out = tmp_path / "dp.pt"
    paths = [str(REPO), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           str(WORKER), str(tiny_model_dir), str(out)], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    parallel = torch.load(out)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    positions = max(len(tokenizer.encode(p)) for p in ddp_worker.PROMPTS) + 12  # fixed_batch's max_new_tokens
    grad_rtol = _grad_rtol(tiny_model_dir, positions, len(ddp_worker.PROMPTS) * ddp_worker.GROUP * positions)
    for aggregation in ddp_worker.AGGREGATIONS:
        weights, grads, metrics = parallel[aggregation]
        ref_weights, ref_grads, ref_metrics = ddp_worker.train(str(tiny_model_dir), SINGLE, aggregation)
        for step, (grad, ref_grad) in enumerate(zip(grads, ref_grads, strict=True)):
            assert _rel(grad, ref_grad) < grad_rtol, (aggregation, step)
        assert _rel(weights, ref_weights) < 1e-5, aggregation
        for got, want in zip(metrics, ref_metrics, strict=True):
            assert got["tokens"] == want["tokens"]
            assert got["loss"] == pytest.approx(want["loss"], rel=1e-5)
            # |‖g‖ - ‖g'‖| <= ‖g - g'‖ (the reverse triangle inequality): the gradients' bound, plus each norm's own
            # rounding (a sum of squares over every gradient entry)
            norm_rtol = grad_rtol + 2 * gamma(torch.float32, grads[0].numel())
            assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=norm_rtol)
            assert got["clip_frac"] == pytest.approx(want["clip_frac"], abs=1e-6)
        # the update is real, and not one that per-rank means would also give: the halves hold unequal tokens
        assert metrics[1]["grad_norm"] > 0.1


def _torchrun(worker: Path, model_dir: Path, out: Path) -> None:
    paths = [str(REPO), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           str(worker), str(model_dir), str(out)], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.process
def test_ranks_with_their_own_batches_accumulate_two_calls_and_a_custom_loss_as_one_process(
        tiny_model_dir: Path, tmp_path: Path):
    # Each rank builds its own batches (its rows of two global batches, trimmed to its own width) with unequal
    # token counts; two forward_backward calls accumulate before one step, then a custom loss of whole sequences.
    # One process running the same calls on the full global batches is the reference, to float tolerance.
    out = tmp_path / "dp_accumulate.pt"
    _torchrun(Path(ddp_accumulate_worker.__file__), tiny_model_dir, out)
    parallel = torch.load(out)
    reference = ddp_accumulate_worker.run(str(tiny_model_dir), SINGLE)
    assert parallel["rank_tokens"] == [(5, 18), (20, 3)]  # loss tokens of (A, B) on rank 0 and on rank 1
    assert reference["tokens"] == (25, 21)
    positions = ddp_accumulate_worker.PROMPT_TOKENS + max(max(c) for c in ddp_accumulate_worker.COMPLETIONS.values())
    grad_rtol = _grad_rtol(tiny_model_dir, positions, 2 * 4 * positions)  # two calls of four rows
    for call, (grad, ref_grad) in enumerate(zip(parallel["grads"], reference["grads"], strict=True)):
        assert ref_grad.norm() > 0 and _rel(grad, ref_grad) < grad_rtol, call
    # the second call added to the first call's gradient, it did not replace or double it
    assert _rel(reference["grads"][1], reference["grads"][0]) > 0.1
    for step, (weights, ref_weights) in enumerate(zip(parallel["weights"], reference["weights"], strict=True)):
        assert _rel(weights, ref_weights) < 1e-5, step
    assert torch.equal(parallel["rank_weights"][0], parallel["rank_weights"][1])  # every rank holds the same weights
    for got, want in zip(parallel["metrics"], reference["metrics"], strict=True):
        assert set(got) == set(want)
        for key, value in want.items():
            assert got[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key


def test_the_fixed_batch_puts_unequal_token_counts_on_the_ranks(tiny_model_dir: Path):
    from purplerl.config import ModelConfig
    from purplerl.engines.local import LocalEngine

    engine = LocalEngine(ModelConfig(name=str(tiny_model_dir), device="cpu", lora_rank=4, dtype="float32"))
    mask_NT = ddp_worker.fixed_batch(engine).loss_mask_NT
    half = mask_NT.shape[0] // 2
    assert mask_NT[:half].sum() < mask_NT[half:].sum() / 2


def test_shard_takes_contiguous_whole_shares():
    items = list("abcdef")
    assert World(0, 2).shard(items) == ["a", "b", "c"]
    assert World(1, 2).shard(items) == ["d", "e", "f"]
    assert World(2, 3).shard(items) == ["e", "f"]
    assert SINGLE.shard(items) == items
    with pytest.raises(UserError, match=r"training.batch_size=6 does not divide by the 4 data-parallel processes"):
        World(1, 4).shard(items)


def _batch(mask_rows: list[list[float]]) -> TrainBatch:
    mask_NT = torch.tensor(mask_rows)
    ids_NT = torch.ones_like(mask_NT, dtype=torch.long)
    return TrainBatch(ids_NT, ids_NT, mask_NT, torch.zeros_like(mask_NT), torch.zeros_like(mask_NT))


def test_a_rank_is_weighed_by_the_count_its_loss_divides_by():
    batch = _batch([[0, 1, 1, 1], [0, 1, 0, 0]])  # 2 sequences, 4 loss tokens
    assert normalizer_count(batch, Loss("ppo_clip", aggregation="token_mean")) == 4
    assert normalizer_count(batch, Loss("ppo_clip", aggregation="seq_mean_token_mean")) == 2
    assert normalizer_count(batch, Loss("ppo_clip", aggregation="seq_mean_token_sum_norm", length_norm=8.0)) == 2
    assert normalizer_count(batch, None) == 2  # a custom loss of whole sequences


def test_rank_zero_keeps_the_single_process_seed():
    assert rank_seed(42, 0) == 42
    assert len({rank_seed(42, r) for r in range(8)}) == 8
    assert rank_seed(42, 1) == (42 * 1_000_003 + 7_919) % (2**63 - 1)


def test_procs_without_torchrun_is_one_line(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    assert join_world(1, torch.device("cpu")) is SINGLE
    with pytest.raises(UserError, match="engine.procs=2 needs torchrun"):
        join_world(2, torch.device("cpu"))
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(UserError, match="engine.procs=2 but torchrun started 3 processes"):
        join_world(2, torch.device("cpu"))


class _TwoRanks(World):
    """Rank 0 of two, whose peer's step results are given: `gather` without processes."""

    def __init__(self, peer: StepShard) -> None:
        super().__init__(0, 2)
        object.__setattr__(self, "peer", peer)

    def gather(self, obj):
        return [obj, self.peer]


def _shard(texts: list[str], rewards: list[float], lengths: list[int], adv_abs_mean: float) -> StepShard:
    completions = [Completion((1,), tuple(range(n)), torch.zeros(n), torch.full((n,), 0.5), t, "stop")
                   for t, n in zip(texts, lengths, strict=True)]
    width = max(lengths)
    mask_NT = torch.tensor([[1.0] * n + [0.0] * (width - n) for n in lengths])
    total_N = torch.tensor(rewards)
    return StepShard([PromptRecord(({"role": "user", "content": "q"},))] * len(texts), completions,
                     RewardBreakdown(total_N, {"toxicity": total_N * 2}), torch.zeros(len(texts)), mask_NT,
                     {"adv_abs_mean": adv_abs_mean}, torch.zeros(len(texts)))


def test_step_metrics_of_merged_shards_are_the_global_batch_s():
    mine = _shard(["a", "a"], [0.0, 1.0], [2, 4], 0.2)
    peer = _shard(["a", "b"], [3.0, 4.0], [1, 1], 0.6)
    merged = merge_shards(_TwoRanks(peer), mine)
    metrics = step_metrics(merged.completions, merged.rewards, merged.kl_N, merged.mask_NT, merged.adv_metrics,
                           {"loss": 0.0}, [0.0] * 5)
    # rewards 0, 1, 3, 4: mean 2, population std sqrt(2.5); not the mean of the two halves' stds (0.5)
    assert metrics["reward/mean"] == pytest.approx(2.0)
    assert metrics["reward/std"] == pytest.approx(2.5 ** 0.5)
    assert metrics["toxicity/mean"] == pytest.approx(4.0)
    assert metrics["completion/len_mean"] == pytest.approx(2.0)  # (2 + 4 + 1 + 1) / 4
    assert metrics["completion/top_share"] == pytest.approx(0.75)  # "a" three times of four
    assert metrics["tokens/completion"] == 8.0
    assert metrics["adv/adv_abs_mean"] == pytest.approx(0.4)
    assert merged.mask_NT.shape == (4, 4)
    assert merge_shards(SINGLE, mine) is mine
