import pytest
import torch

from purplerl.algorithms.losses import LOSS_AGGREGATIONS, aggregate_loss, aggregate_token_mean
from purplerl.errors import ExperimentError, UserError

LOSS_NT = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
MASK_NT = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0], [1.0, 1.0, 1.0]])  # row 1 has no loss tokens
MODES = sorted(LOSS_AGGREGATIONS)


def agg(mode: str, loss_NT: torch.Tensor = LOSS_NT, mask_NT: torch.Tensor = MASK_NT, **kw: float) -> float:
    kw = {"total_tokens": 5.0, "total_sequences": 3, "length_norm": 4.0} | kw
    return aggregate_loss(loss_NT, mask_NT, mode, **kw).item()


def test_modes_by_hand() -> None:
    assert set(MODES) == {"token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"}
    # masked tokens 1, 2, 7, 8, 9: sum 27 over 5 tokens
    assert agg("token_mean") == pytest.approx(27 / 5)
    # row means 1.5, 0 (empty row), 8 -> 9.5 over 3 sequences
    assert agg("seq_mean_token_mean") == pytest.approx(9.5 / 3)
    # row sums 3, 0, 24 -> 27 / length_norm 4 / 3 sequences
    assert agg("seq_mean_token_sum_norm") == pytest.approx(27 / 4 / 3)


def test_token_mean_is_aggregate_token_mean() -> None:
    assert agg("token_mean") == pytest.approx(aggregate_token_mean(LOSS_NT, MASK_NT, 5.0).item())


def test_sum_norm_uses_the_constant_not_the_length() -> None:
    # Dr. GRPO: two rows of per-token loss 1 with 1 and 3 tokens. Per-row means weigh both rows 1;
    # the constant norm weighs them by length (1/8 and 3/8).
    loss_NT, mask_NT = torch.ones(2, 3), torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    kw = {"total_tokens": 4.0, "total_sequences": 2, "length_norm": 4.0}
    assert agg("seq_mean_token_mean", loss_NT, mask_NT, **kw) == pytest.approx(1.0)
    assert agg("seq_mean_token_sum_norm", loss_NT, mask_NT, **kw) == pytest.approx(4 / 4 / 2)


@pytest.mark.parametrize("mode", MODES)
def test_off_mask_junk_is_ignored(mode: str) -> None:
    loss_NT = LOSS_NT.clone()
    loss_NT[MASK_NT == 0] = float("inf")
    assert agg(mode, loss_NT) == pytest.approx(agg(mode))


@pytest.mark.parametrize("mode", MODES)
def test_micro_batches_sum_to_full_batch(mode: str) -> None:
    gen = torch.Generator().manual_seed(0)
    theta_NT = torch.randn(5, 4, generator=gen)
    weights_NT = torch.randn(5, 4, generator=gen)
    mask_NT = torch.tensor([[0, 1, 1, 1], [0, 1, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1], [0, 1, 1, 0]]).float()
    totals = {"total_tokens": float(mask_NT.sum()), "total_sequences": 5, "length_norm": 6.0}

    def run(splits: list[slice]) -> tuple[float, torch.Tensor]:
        theta = theta_NT.clone().requires_grad_()
        value = 0.0
        for rows in splits:
            loss_NT = weights_NT[rows] * theta[rows] ** 2
            part = aggregate_loss(loss_NT, mask_NT[rows], mode, **totals)
            part.backward()
            value += part.item()
        return value, theta.grad

    full_value, full_grad = run([slice(0, 5)])
    for splits in ([slice(0, 2), slice(2, 5)], [slice(0, 1), slice(1, 3), slice(3, 4), slice(4, 5)]):
        value, grad = run(splits)
        # The parts add the same float32 terms in another order (3.5e-8 apart here; the bound is eps times the
        # sum of |terms|, ~6e-7), so the value gets 1e-5. Each gradient entry depends on its own term only.
        assert value == pytest.approx(full_value, abs=1e-5)
        assert torch.allclose(grad, full_grad, atol=1e-6)


def test_unknown_mode_and_shape() -> None:
    with pytest.raises(UserError, match=r"unknown loss aggregation 'sum' \(known: seq_mean_token_mean, "
                                        r"seq_mean_token_sum_norm, token_mean\)"):
        agg("sum")
    with pytest.raises(ExperimentError, match="same \\[N, T\\] shape"):
        aggregate_loss(LOSS_NT, MASK_NT[:, :2], "token_mean", total_tokens=5.0, total_sequences=3)


def test_length_norm_required_for_sum_norm() -> None:
    for bad in (None, 0.0, -1.0):
        with pytest.raises(UserError, match="length_norm must be a constant > 0"):
            aggregate_loss(LOSS_NT, MASK_NT, "seq_mean_token_sum_norm", total_tokens=5.0, total_sequences=3,
                           length_norm=bad)
    # the other modes do not use it
    value = aggregate_loss(LOSS_NT, MASK_NT, "token_mean", total_tokens=5.0, total_sequences=3)
    assert value.item() == pytest.approx(5.4)


def test_totals_must_cover_the_full_batch() -> None:
    with pytest.raises(ExperimentError, match="normalizer must be > 0"):
        agg("token_mean", total_tokens=0.0)
    with pytest.raises(ExperimentError, match="micro-batch has 5.0 loss tokens but total_tokens is 4.0"):
        agg("token_mean", total_tokens=4.0)
    for mode in ("seq_mean_token_mean", "seq_mean_token_sum_norm"):
        with pytest.raises(ExperimentError, match="total_sequences must be >= 1"):
            agg(mode, total_sequences=0)
        with pytest.raises(ExperimentError, match="micro-batch has 3 rows but total_sequences is 2"):
            agg(mode, total_sequences=2)
