"""The critic's math (algorithms.critic): per-token rewards, GAE, masked whitening, explained variance, the clipped
value loss, hand-worked; then against the reference implementations.

TRL 1.16 (the one installed) no longer ships PPO: no PPOTrainer, no `masked_whiten` (trl.trainer.utils and
trl.core are gone, and trl.experimental holds no ppo). veRL is not installed. So each formula is also checked
against a straightforward transcription of the reference loops (TRL's PPOTrainer GAE loop, veRL's
`compute_gae_advantage_return` with its response-mask skipping, TRL's `masked_whiten`, veRL's
`compute_value_loss`, and veRL's REINFORCE++, which whitens as GAE does), and against the libraries themselves where
they are importable (skipped here)."""

from __future__ import annotations

import importlib
from types import SimpleNamespace

import pytest
import torch

from purplerl.algorithms.advantages import (
    CRITIC_ESTIMATORS,
    ESTIMATOR_NAMES,
    compute_advantages,
    estimate_advantages,
    takes_token_kl,
    takes_values,
)
from purplerl.algorithms.critic import (
    clipped_value_loss,
    explained_variance,
    gae,
    gae_advantages,
    masked_whiten,
    state_values,
    token_rewards,
)
from purplerl.errors import ExperimentError, UserError
from tests.tolerances import reduction_atol

# Two rows: a prompt token, then row 0 has three completion tokens and row 1 two and a pad. Values, KL and rewards
# at the prompt and the pad are junk that must be ignored.
MASK_NT = torch.tensor([[0.0, 1.0, 1.0, 1.0], [0.0, 1.0, 1.0, 0.0]])
VALUES_NT = torch.tensor([[9.0, 0.5, 1.0, 2.0], [7.0, 1.0, 0.0, 5.0]])
KL_NT = torch.tensor([[3.0, 0.2, -0.2, 0.4], [3.0, 0.0, 0.2, 9.0]])
REWARDS_BG = torch.tensor([[3.0, 1.0]])  # one prompt, two completions (group-major rows)


def test_token_rewards_by_hand() -> None:
    # -0.5 * kl on completion tokens, the sequence reward added at the last one:
    # row 0: -0.1, +0.1, -0.2 + 3 = 2.8; row 1: 0, -0.1 + 1 = 0.9; 0 at the prompt and the pad
    r_NT = token_rewards(REWARDS_BG.reshape(-1), MASK_NT, KL_NT, kl_beta=0.5)
    torch.testing.assert_close(r_NT, torch.tensor([[0.0, -0.1, 0.1, 2.8], [0.0, 0.0, 0.9, 0.0]]))
    no_kl_NT = token_rewards(REWARDS_BG.reshape(-1), MASK_NT)
    torch.testing.assert_close(no_kl_NT, torch.tensor([[0.0, 0.0, 0.0, 3.0], [0.0, 0.0, 1.0, 0.0]]))


def test_gae_by_hand() -> None:
    # gamma 0.9, lam 0.5 (gamma * lam = 0.45), rewards from test_token_rewards_by_hand:
    # row 0: t3: delta = 2.8 + 0 - 2.0 = 0.8                  A = 0.8
    #        t2: delta = 0.1 + 0.9 * 2.0 - 1.0 = 0.9          A = 0.9 + 0.45 * 0.8 = 1.26
    #        t1: delta = -0.1 + 0.9 * 1.0 - 0.5 = 0.3         A = 0.3 + 0.45 * 1.26 = 0.867
    #        returns A + V: 1.367, 2.26, 2.8
    # row 1 (the pad's value 5.0 is not the next value: the completion ends at t2):
    #        t2: delta = 0.9 + 0 - 0.0 = 0.9                  A = 0.9
    #        t1: delta = 0 + 0.9 * 0.0 - 1.0 = -1.0           A = -1.0 + 0.45 * 0.9 = -0.595
    #        returns: 0.405, 0.9
    r_NT = token_rewards(REWARDS_BG.reshape(-1), MASK_NT, KL_NT, kl_beta=0.5)
    advantages_NT, returns_NT = gae(r_NT, VALUES_NT, MASK_NT, gamma=0.9, lam=0.5)
    torch.testing.assert_close(advantages_NT, torch.tensor([[0.0, 0.867, 1.26, 0.8], [0.0, -0.595, 0.9, 0.0]]))
    torch.testing.assert_close(returns_NT, torch.tensor([[0.0, 1.367, 2.26, 2.8], [0.0, 0.405, 0.9, 0.0]]))
    # lam = 1, gamma = 1: the return is the sum of the rewards to come (row 0: 2.8, 2.9, 2.8), the advantage that
    # minus the value
    advantages_NT, returns_NT = gae(r_NT, VALUES_NT, MASK_NT)
    torch.testing.assert_close(returns_NT[0, 1:], torch.tensor([2.8, 2.9, 2.8]))
    torch.testing.assert_close(advantages_NT[0, 1:], torch.tensor([2.3, 1.9, 0.8]))
    # lam = 0: the one-step TD error
    advantages_NT, _ = gae(r_NT, VALUES_NT, MASK_NT, gamma=0.9, lam=0.0)
    torch.testing.assert_close(advantages_NT[0, 1:], torch.tensor([0.3, 0.9, 0.8]))


def test_masked_whiten_by_hand() -> None:
    # [1, 3, 5] and a pad of 100: mean 3, unbiased variance (4 + 0 + 4) / 2 = 4 -> [-1, 0, 1], the pad 0
    x_NT, mask_NT = torch.tensor([[1.0, 3.0, 5.0, 100.0]]), torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    torch.testing.assert_close(masked_whiten(x_NT, mask_NT), torch.tensor([[-1.0, 0.0, 1.0, 0.0]]))
    # shift_mean=False puts the mean back: [2, 3, 4]
    torch.testing.assert_close(masked_whiten(x_NT, mask_NT, shift_mean=False), torch.tensor([[2.0, 3.0, 4.0, 0.0]]))
    with pytest.raises(ExperimentError, match="1 masked value"):
        masked_whiten(x_NT, torch.tensor([[1.0, 0.0, 0.0, 0.0]]))


def test_gae_estimator_whitens_over_the_batch_and_reports() -> None:
    # the advantages of test_gae_by_hand, [0.867, 1.26, 0.8, -0.595, 0.9]: mean 3.232 / 5 = 0.6464, squared
    # deviations 0.04866 + 0.37650 + 0.02359 + 1.54107 + 0.06431 = 2.05414, unbiased variance 0.513535, std
    # 0.716614 -> 0.2206 / 0.716614 = 0.30783, 0.85625, 0.21434, -1.73231, 0.35389
    estimate = estimate_advantages("gae", REWARDS_BG, MASK_NT, kl_NT=KL_NT, kl_beta=0.5, values_NT=VALUES_NT,
                                   gamma=0.9, lam=0.5)
    want_NT = torch.tensor([[0.0, 0.30783, 0.85625, 0.21434], [0.0, -1.73231, 0.35389, 0.0]])
    torch.testing.assert_close(estimate.advantages_NT, want_NT, atol=1e-4, rtol=0)
    torch.testing.assert_close(estimate.returns_NT, torch.tensor([[0.0, 1.367, 2.26, 2.8], [0.0, 0.405, 0.9, 0.0]]))
    m = estimate.metrics
    assert m["adv_mean"] == pytest.approx(0.6464, abs=1e-5)
    assert m["adv_std"] == pytest.approx((2.05414 / 5) ** 0.5, abs=1e-4)  # before whitening, population std
    assert m["return_mean"] == pytest.approx((1.367 + 2.26 + 2.8 + 0.405 + 0.9) / 5, abs=1e-5)
    assert m["value_mean"] == pytest.approx((0.5 + 1.0 + 2.0 + 1.0 + 0.0) / 5)  # completion tokens only
    # returns - values = the advantages: 1 - Var[A] / Var[R] = 1 - 0.410828 / 0.766707 = 0.46416
    assert m["explained_variance"] == pytest.approx(0.46416, abs=1e-4)
    assert m["kl_reward_mean"] == pytest.approx(-0.5 * (0.2 - 0.2 + 0.4 + 0.0 + 0.2) / 5)
    assert not estimate.advantages_NT.requires_grad and estimate.advantages_NT.dtype == torch.float32


def test_explained_variance_by_hand() -> None:
    # R = [1, 2, 3], V = [1, 2, 2]: Var[R - V] = Var[0, 0, 1] = 2/9, Var[R] = 2/3 -> 1 - 1/3 = 2/3
    mask_NT = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    returns_NT, values_NT = torch.tensor([[1.0, 2.0, 3.0, 50.0]]), torch.tensor([[1.0, 2.0, 2.0, -50.0]])
    assert explained_variance(values_NT, returns_NT, mask_NT) == pytest.approx(2 / 3)
    assert explained_variance(returns_NT, returns_NT, mask_NT) == pytest.approx(1.0)
    assert explained_variance(values_NT, torch.ones(1, 4), mask_NT) == 0.0  # constant returns: nothing to explain


def test_clipped_value_loss_and_its_gradient_by_hand() -> None:
    # clip range 0.2, three tokens and a pad:
    #   V 1.0, V_old 0.9, R 1.5: inside the clip, (V - R)^2 = 0.25 both ways        -> 0.25, gradient 2 (V - R) = -1
    #   V 2.0, V_old 1.0, R 2.5: clipped to 1.2, (1.2 - 2.5)^2 = 1.69 > 0.25         -> 1.69, no gradient (clipped)
    #   V 0.0, V_old 0.5, R 0.3: clipped to 0.3, 0 < (0 - 0.3)^2 = 0.09              -> 0.09, gradient 2 (0 - 0.3)
    # loss = 0.5 * (0.25 + 1.69 + 0.09) / 3 = 0.338333; gradient 0.5 / 3 x [-1, 0, -0.6] = [-1/6, 0, -0.1]
    mask_NT = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    values_NT = torch.tensor([[1.0, 2.0, 0.0, 40.0]], requires_grad=True)
    old_NT, returns_NT = torch.tensor([[0.9, 1.0, 0.5, 0.0]]), torch.tensor([[1.5, 2.5, 0.3, 0.0]])
    loss, metrics = clipped_value_loss(values_NT, old_NT, returns_NT, mask_NT, clip_range=0.2)
    assert float(loss.detach()) == pytest.approx(0.338333, abs=1e-6)
    loss.backward()
    torch.testing.assert_close(values_NT.grad, torch.tensor([[-1 / 6, 0.0, -0.1, 0.0]]))
    assert metrics["value_loss"] == pytest.approx(0.338333, abs=1e-6)
    assert metrics["value_clip_frac"] == pytest.approx(1 / 3)  # only the second token's clipped term is larger
    assert metrics["value_mean"] == pytest.approx(1.0)
    with pytest.raises(UserError, match="clip range must be > 0"):
        clipped_value_loss(values_NT, old_NT, returns_NT, mask_NT, clip_range=0.0)


def test_state_values_read_the_head_one_position_before_the_token() -> None:
    # token t's state is the prefix before it: the head's value at position t - 1, 0 off the completion
    values_NT = torch.tensor([[10.0, 11.0, 12.0, 13.0]], requires_grad=True)
    shifted_NT = state_values(values_NT, torch.tensor([[0.0, 1.0, 1.0, 0.0]]))
    torch.testing.assert_close(shifted_NT, torch.tensor([[0.0, 10.0, 11.0, 0.0]]))
    shifted_NT.sum().backward()
    torch.testing.assert_close(values_NT.grad, torch.tensor([[1.0, 1.0, 0.0, 0.0]]))


def test_registry_and_wiring_errors() -> None:
    assert ESTIMATOR_NAMES == ("grpo", "grpo_std", "dr_grpo", "rloo", "reinforce_pp", "gae")
    assert CRITIC_ESTIMATORS == {"gae": gae_advantages}
    assert takes_values("gae") and takes_token_kl("gae") and not takes_values("grpo")
    with pytest.raises(UserError, match=r"unknown advantage estimator 'ppo' \(known: dr_grpo, gae, grpo"):
        takes_values("ppo")
    with pytest.raises(ExperimentError, match="gae: needs a critic's values"):
        estimate_advantages("gae", REWARDS_BG, MASK_NT)
    with pytest.raises(ExperimentError, match="grpo: a critic's values were passed"):
        estimate_advantages("grpo", REWARDS_BG, MASK_NT, values_NT=VALUES_NT)
    plain = estimate_advantages("grpo", REWARDS_BG, MASK_NT)
    assert plain.returns_NT is None and plain.advantages_NT[0, 1] == pytest.approx(1.0)
    with pytest.raises(ExperimentError, match=r"gae: non-finite value nan at row 1, token 2"):
        bad_NT = VALUES_NT.clone()
        bad_NT[1, 2] = float("nan")
        estimate_advantages("gae", REWARDS_BG, MASK_NT, values_NT=bad_NT)
    bad_NT = VALUES_NT.clone()
    bad_NT[1, 3] = float("nan")  # on the pad: ignored
    estimate_advantages("gae", REWARDS_BG, MASK_NT, values_NT=bad_NT)
    with pytest.raises(ExperimentError, match=r"gae: values_NT shape \(2, 3\)"):
        estimate_advantages("gae", REWARDS_BG, MASK_NT, values_NT=torch.zeros(2, 3))
    with pytest.raises(ExperimentError, match="gae: kl_beta=0.1 but no per-token KL"):
        estimate_advantages("gae", REWARDS_BG, MASK_NT, values_NT=VALUES_NT, kl_beta=0.1)
    with pytest.raises(UserError, match=r"gae: lam must be in \[0, 1\]"):
        estimate_advantages("gae", REWARDS_BG, MASK_NT, values_NT=VALUES_NT, lam=1.5)
    with pytest.raises(ExperimentError, match="gae: row 1 .* has no completion tokens"):
        estimate_advantages("gae", REWARDS_BG, torch.tensor([[0.0, 1.0, 1.0, 1.0], [0.0] * 4]), values_NT=VALUES_NT)
    one_NT = estimate_advantages("gae", torch.tensor([[1.0], [0.0]]), MASK_NT, values_NT=VALUES_NT)  # G = 1 is fine
    assert one_NT.advantages_NT.shape == MASK_NT.shape


# ----- against the reference implementations ---------------------------------------------------------------------


def reference_masked_whiten(values, mask, shift_mean=True):
    """TRL's `masked_whiten` (and veRL's verl.utils.torch_functional.masked_whiten), transcribed: masked mean,
    masked variance with Bessel's correction, (x - mean) * rsqrt(var + 1e-8)."""
    mean = (values * mask).sum() / mask.sum()
    var = (((values - mean) ** 2) * mask).sum() / mask.sum() * (mask.sum() / (mask.sum() - 1))
    whitened = (values - mean) * torch.rsqrt(var + 1e-8)
    return whitened + mean if not shift_mean else whitened


def trl_ppo_trainer_gae(rewards, values, gamma, lam):
    """TRL's PPOTrainer (trl/trainer/ppo_trainer.py up to 0.x) step 6, transcribed: the response columns only, the
    next value 0 past the last column."""
    lastgaelam, reversed_ = 0.0, []
    gen_length = rewards.shape[1]
    for t in reversed(range(gen_length)):
        nextvalues = values[:, t + 1] if t < gen_length - 1 else 0.0
        delta = rewards[:, t] + gamma * nextvalues - values[:, t]
        lastgaelam = delta + gamma * lam * lastgaelam
        reversed_.append(lastgaelam)
    advantages = torch.stack(reversed_[::-1], dim=1)
    returns = advantages + values
    return reference_masked_whiten(advantages, torch.ones_like(advantages)), returns


def verl_gae(token_level_rewards, values, response_mask, gamma, lam):
    """veRL's `compute_gae_advantage_return` (verl/trainer/ppo/core_algos.py), transcribed: off-mask positions
    carry the next value and advantage through."""
    nextvalues, lastgaelam, reversed_ = 0.0, 0.0, []
    for t in reversed(range(token_level_rewards.shape[-1])):
        delta = token_level_rewards[:, t] + gamma * nextvalues - values[:, t]
        lastgaelam_ = delta + gamma * lam * lastgaelam
        m = response_mask[:, t]
        nextvalues = values[:, t] * m + (1 - m) * nextvalues
        lastgaelam = lastgaelam_ * m + (1 - m) * lastgaelam
        reversed_.append(lastgaelam)
    advantages = torch.stack(reversed_[::-1], dim=1)
    returns = advantages + values
    return reference_masked_whiten(advantages, response_mask), returns


def verl_reinforce_pp(token_level_rewards, response_mask, gamma):
    """veRL's `compute_reinforce_plus_plus_outcome_advantage` (verl/trainer/ppo/core_algos.py), transcribed: each
    masked token's return sums the rewards from it on (an off-mask position passes the running return through),
    then the returns are whitened by veRL's `masked_whiten`, as its GAE's are."""
    running, returns = torch.zeros(token_level_rewards.shape[0]), torch.zeros_like(token_level_rewards)
    for t in reversed(range(token_level_rewards.shape[1])):
        m = response_mask[:, t]
        running_t = token_level_rewards[:, t] + gamma * running
        returns[:, t] = running_t * m
        running = running_t * m + running * (1 - m)
    return reference_masked_whiten(returns, response_mask) * response_mask


def _whitened_atol(r_NT: torch.Tensor, mask_NT: torch.Tensor, want_NT: torch.Tensor) -> float:
    """Two float32 computations of whitened returns (tests/tolerances.py): a return sums a row's token rewards (T
    terms), the mean and the variance each sum the n masked returns, then a subtraction, a division and a square
    root; in units of the std, the terms are a row's summed |rewards| over the std, and the advantage itself."""
    on = mask_NT != 0
    returns = (r_NT * mask_NT).flip(1).cumsum(1).flip(1)[on]
    spread = float((r_NT.abs() * mask_NT).sum(-1).max()) / float(returns.std())
    return reduction_atol(torch.float32, mask_NT.shape[1] + 2 * int(on.sum()) + 4, spread + float(want_NT.abs().max()))


def verl_value_loss(vpreds, returns, values, response_mask, cliprange_value):
    """veRL's `compute_value_loss` (token-mean), as TRL's PPOTrainer computes vf_loss and vf_clipfrac."""
    vpredclipped = torch.clamp(vpreds, values - cliprange_value, values + cliprange_value)
    vf_losses1, vf_losses2 = (vpreds - returns) ** 2, (vpredclipped - returns) ** 2
    loss = 0.5 * (torch.max(vf_losses1, vf_losses2) * response_mask).sum() / response_mask.sum()
    clipfrac = (torch.gt(vf_losses2, vf_losses1).float() * response_mask).sum() / response_mask.sum()
    return loss, clipfrac


def _random_batch(seed: int, padded: bool):
    """B=3 prompts x G=2, a 3-token prompt, completions of up to 6 tokens (all 6 unless padded)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 7, (6,), generator=g) if padded else torch.full((6,), 6)
    mask_NT = torch.zeros(6, 9)
    for n, length in enumerate(lengths.tolist()):
        mask_NT[n, 3:3 + length] = 1.0
    values_NT = torch.randn(6, 9, generator=g)
    kl_NT = torch.randn(6, 9, generator=g).abs()
    rewards_BG = torch.randn(3, 2, generator=g)
    return rewards_BG, mask_NT, values_NT, kl_NT


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gae_matches_the_trl_ppo_trainer_loop(seed: int) -> None:
    """Full-length completions (TRL's loop has no response mask: its score sits past the last real token of a
    shorter response, the padding_mask_p1 off-by-one; on full rows the two place it alike)."""
    rewards_BG, mask_NT, values_NT, kl_NT = _random_batch(seed, padded=False)
    ours = estimate_advantages("gae", rewards_BG, mask_NT, kl_NT=kl_NT, kl_beta=0.05, values_NT=values_NT,
                               gamma=0.99, lam=0.95)
    r_NT = token_rewards(rewards_BG.reshape(-1), mask_NT, kl_NT, 0.05)
    advantages, returns = trl_ppo_trainer_gae(r_NT[:, 3:], values_NT[:, 3:], gamma=0.99, lam=0.95)
    torch.testing.assert_close(ours.advantages_NT[:, 3:], advantages, rtol=0, atol=1e-5)
    torch.testing.assert_close(ours.returns_NT[:, 3:], returns, rtol=0, atol=1e-5)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gae_matches_the_verl_loop_on_padded_rows(seed: int) -> None:
    rewards_BG, mask_NT, values_NT, kl_NT = _random_batch(seed, padded=True)
    ours = estimate_advantages("gae", rewards_BG, mask_NT, kl_NT=kl_NT, kl_beta=0.05, values_NT=values_NT,
                               gamma=1.0, lam=0.95)
    r_NT = token_rewards(rewards_BG.reshape(-1), mask_NT, kl_NT, 0.05)
    advantages, returns = verl_gae(r_NT, values_NT * mask_NT, mask_NT, gamma=1.0, lam=0.95)
    on = mask_NT != 0
    torch.testing.assert_close(ours.advantages_NT[on], advantages[on], rtol=0, atol=1e-5)
    torch.testing.assert_close(ours.returns_NT[on], returns[on], rtol=0, atol=1e-5)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_reinforce_pp_whitens_as_the_verl_loop_and_gae_do(seed: int) -> None:
    rewards_BG, mask_NT, _, kl_NT = _random_batch(seed, padded=True)
    ours, _ = compute_advantages("reinforce_pp", rewards_BG, mask_NT, kl_NT=kl_NT, kl_beta=0.05)
    r_NT = token_rewards(rewards_BG.reshape(-1), mask_NT, kl_NT, 0.05)
    want_NT = verl_reinforce_pp(r_NT, mask_NT, gamma=1.0)
    torch.testing.assert_close(ours, want_NT, rtol=0, atol=_whitened_atol(r_NT, mask_NT, want_NT))


def test_value_loss_matches_the_verl_and_trl_form() -> None:
    g = torch.Generator().manual_seed(3)
    mask_NT = (torch.rand(5, 7, generator=g) > 0.3).float()
    vpreds, old, returns = (torch.randn(5, 7, generator=g) for _ in range(3))
    loss, metrics = clipped_value_loss(vpreds, old, returns, mask_NT, clip_range=0.2)
    want, clipfrac = verl_value_loss(vpreds, returns, old, mask_NT, 0.2)
    assert float(loss) == pytest.approx(float(want), abs=1e-6)
    assert metrics["value_clip_frac"] == pytest.approx(float(clipfrac), abs=1e-6)
    x = torch.randn(4, 6, generator=g)
    torch.testing.assert_close(masked_whiten(x, mask_NT[:4, :6]),
                               reference_masked_whiten(x, mask_NT[:4, :6]) * mask_NT[:4, :6])


def _trl_masked_whiten():
    pytest.importorskip("trl")
    for module in ("trl.core", "trl.trainer.utils", "trl.experimental.ppo.ppo_trainer", "trl.trainer.ppo_trainer"):
        try:
            return importlib.import_module(module).masked_whiten
        except (ImportError, AttributeError):
            continue
    pytest.skip("this TRL ships no PPO (no masked_whiten): the transcribed loops above stand in for it")


def test_masked_whiten_equals_trl_when_trl_has_it() -> None:
    trl_masked_whiten = _trl_masked_whiten()
    g = torch.Generator().manual_seed(4)
    x, mask = torch.randn(4, 6, generator=g), (torch.rand(4, 6, generator=g) > 0.3)
    for shift_mean in (True, False):
        want = trl_masked_whiten(x, mask.float(), shift_mean=shift_mean) * mask
        torch.testing.assert_close(masked_whiten(x, mask, shift_mean=shift_mean), want, atol=1e-5, rtol=0)


def test_gae_and_value_loss_equal_verl_when_installed() -> None:
    core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")
    rewards_BG, mask_NT, values_NT, kl_NT = _random_batch(5, padded=True)
    ours = estimate_advantages("gae", rewards_BG, mask_NT, kl_NT=kl_NT, kl_beta=0.05, values_NT=values_NT,
                               gamma=1.0, lam=0.95)
    r_NT = token_rewards(rewards_BG.reshape(-1), mask_NT, kl_NT, 0.05)
    advantages, returns = core_algos.compute_gae_advantage_return(r_NT, values_NT * mask_NT, mask_NT, 1.0, 0.95)
    on = mask_NT != 0
    torch.testing.assert_close(ours.advantages_NT[on], advantages[on], rtol=0, atol=1e-5)
    torch.testing.assert_close(ours.returns_NT[on], returns[on], rtol=0, atol=1e-5)
    vpreds = values_NT + 0.3 * torch.randn(values_NT.shape, generator=torch.Generator().manual_seed(6))
    loss, metrics = clipped_value_loss(vpreds, values_NT, ours.returns_NT, mask_NT, clip_range=0.2)
    out = core_algos.compute_value_loss(vpreds, ours.returns_NT, values_NT, mask_NT, cliprange_value=0.2)
    assert float(loss) == pytest.approx(float(out[0]), abs=1e-6)
    assert metrics["value_clip_frac"] == pytest.approx(float(out[1]), abs=1e-6)


def test_reinforce_pp_equals_verl_when_installed() -> None:
    core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")
    rewards_BG, mask_NT, _, kl_NT = _random_batch(5, padded=True)
    ours, _ = compute_advantages("reinforce_pp", rewards_BG, mask_NT, kl_NT=kl_NT, kl_beta=0.05)
    r_NT = token_rewards(rewards_BG.reshape(-1), mask_NT, kl_NT, 0.05)
    want_NT, _ = core_algos.compute_reinforce_plus_plus_outcome_advantage(r_NT, mask_NT,
                                                                         config=SimpleNamespace(gamma=1.0))
    on = mask_NT != 0
    torch.testing.assert_close(ours[on], want_NT[on], rtol=0, atol=_whitened_atol(r_NT, mask_NT, want_NT))
