"""The behaviour every engine must show, parametrized over engine factories: a new engine adds a factory here.

- its own scoring reproduces the logprobs it recorded while sampling;
- training changes the active LoRA adapter and nothing else (full-parameter: every weight may change, and
  does after an optimizer step);
- save/load round-trips adapters, optimizer state and the next update;
- every registered loss's gradient equals a hand-worked dloss/dlogprobs, read through the public API: a
  forward_backward_custom whose loss is sum(g_hand * logprobs) has gradient J^T g_hand, and an Adam step with
  eps far above |g| (and beta1 = 0) moves each weight by lr * g / eps, so the two updates must match;
- named adapters: a second adapter trains alone, the reference is the base with every adapter off, both
  survive save/load (full-parameter engines refuse named adapters with one line instead);
- the side channels the loop reads: `world` (the processes the engine spans) and `sample_metrics` (what the last
  `sample` call reports about the sampler: finite numbers, named as the factory says, none for most engines).

A remote engine (the Tinker API) shows no weights: there, what an adapter holds is read through the
logprobs it gives a fixed batch (two states are equal iff they score it equally; an update that reads out
the gradient moves them by J g, so equal gradients give equal logprobs).

The data-parallel local engine runs this file in each of 2 torchrun processes (tests/engines/test_contract_ddp.py
sets PURPLERL_CONTRACT_DDP): every rank then trains on rank 0's batch, so its global gradient is the one the
hand-worked formulas give, and saves and loads rank 0's checkpoint dir.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest
import torch

from purplerl.algorithms.pairwise import DPOParams, KTOParams, ORPOParams, SimPOParams
from purplerl.algorithms.registry import (
    LOSS_REGISTRY,
    CrossEntropyParams,
    CustomLoss,
    Loss,
    PolicyGradientParams,
    TokenNoiserParams,
)
from purplerl.config import EngineConfig, ModelConfig
from purplerl.engines import EngineSettings, make_engine
from purplerl.engines.distributed import SINGLE, World
from purplerl.errors import ExperimentError
from purplerl.train.batch import sequence_tensors
from purplerl.types import AdamParams, SamplingParams, TrainBatch
from tests import tinker_server as _tinker
from tests.conftest import make_tiny_model_dir
from tests.tolerances import rounding_atol

# an Adam step that reads out the gradient: update = lr * g / (|g| + eps) ~ g when |g| << eps = lr
READOUT = AdamParams(lr=1e4, beta1=0.0, beta2=0.0, eps=1e4, weight_decay=0.0, max_grad_norm=0.0)

tinker_server = _tinker.tinker_server  # the fixture the tinker factory asks for


@dataclass(frozen=True)
class Factory:
    name: str
    dtype: str
    logprob_tol: float  # sampling logprobs vs the engine's own scoring
    grad_rtol: float  # registered loss vs hand-worked gradient
    finetune: str = "lora"
    url: str | None = None  # a remote engine's service and the model it serves (set by the `factory` fixture)
    served: Path | None = None
    state_atol: float = 1e-6  # the next update after save/load, compared in the engine's observable state
    same_tol: float = 0.0  # the same weights scored twice (a service may batch the two calls differently)
    engine: str = "local"
    procs: int = 1  # data parallel under torchrun
    sampler_report: tuple[str, ...] = ()  # the keys of `sample_metrics` after a sample() call
    made: list = field(default_factory=list, init=False, repr=False, compare=False)  # closed by the `factory` fixture

    @property
    def remote(self) -> bool:
        return self.name.startswith("tinker")

    def make(self, model_dir: Path, micro_batch_size: int = 64):
        engine = self._build(model_dir, micro_batch_size)
        self.made.append(engine)
        return engine

    def _build(self, model_dir: Path, micro_batch_size: int):
        if self.remote:  # the service's LoRA covers every linear layer; its sequence-mean reduction is SkyRL's
            cfg = ModelConfig(name=str(self.served), lora_rank=4)
            engine = EngineConfig(kind="tinker", tinker_url=self.url, tinker_timeout_s=300,
                                  tinker_loss_reduction="sequence_mean")
            return make_engine(cfg, engine=engine, seed=3)
        if self.engine == "vllm":  # vLLM's CPU attention needs heads of 32 or more: the same model, wider
            model_dir = model_dir.parent / "wide_heads"
            if not (model_dir / "config.json").is_file():
                make_tiny_model_dir(model_dir, hidden_size=128)
        lora = {} if self.full else {"lora_rank": 4, "lora_alpha": 8.0, "lora_targets": "q_proj,v_proj,down_proj"}
        cfg = ModelConfig(name=str(model_dir), dtype=self.dtype, device="cpu", finetune=self.finetune, **lora)
        # vLLM: its own logprobs are the sampling logprobs (the IS correction would record the trainer's)
        engine = EngineConfig(kind=self.engine, **({"vllm_is_correction": False} if self.engine == "vllm" else {}))
        world = _world() if self.procs > 1 else None
        return make_engine(cfg, engine=engine, seed=3, settings=EngineSettings(micro_batch_size=micro_batch_size),
                           **({"world": world} if world else {}))

    @property
    def full(self) -> bool:
        return self.finetune == "full"


FACTORIES = [Factory("local-fp32", "float32", 1e-4, 1e-4), Factory("local-bf16", "bfloat16", 8e-2, 2e-2),
             Factory("local-full", "float32", 1e-4, 1e-4, finetune="full"),
             Factory("local-full-bf16", "bfloat16", 8e-2, 2e-2, finetune="full"),
             # SkyRL's server on CPU (fp32 JAX): sampler and trainer agree to float rounding
             Factory("tinker", "float32", 1e-4, 2e-3, state_atol=1e-4, same_tol=1e-4),
             Factory("vllm-fp32", "float32", 1e-4, 1e-4, engine="vllm",
                     sampler_report=("rollout/lp_diff_max", "rollout/lp_diff_mean"))]
DDP = bool(os.environ.get("PURPLERL_CONTRACT_DDP"))
if DDP:  # under torchrun: the data-parallel engine only
    FACTORIES = [Factory("local-ddp", "float32", 1e-4, 1e-4, procs=2)]


def _world():
    from purplerl.engines.distributed import join_world

    return join_world(int(os.environ["WORLD_SIZE"]), torch.device("cpu"))


@pytest.fixture(scope="session", autouse=True)
def _leave_together():
    """Under torchrun, both ranks finish their cases before the process group is torn down."""
    yield
    if DDP:
        _world().leave()


@pytest.fixture
def tmp_path(tmp_path: Path) -> Path:
    """Under torchrun, rank 0's dir on every rank: the data-parallel engine's checkpoints are written by rank 0."""
    return Path(_world().agree(str(tmp_path))) if DDP else tmp_path


def _marks(f: Factory) -> list:
    """Engines with their own install run under their own marker (make test-tinker, make test-vllm): plain
    `make test` never builds them."""
    return [pytest.mark.tinker] if f.remote else [pytest.mark.vllm] if f.engine == "vllm" else []


@pytest.fixture(params=[pytest.param(f, marks=_marks(f)) for f in FACTORIES], ids=[f.name for f in FACTORIES])
def factory(request) -> Iterator[Factory]:
    """The test's own copy of the factory (its own `made`); every engine it made is closed after the test, as a
    run closes its engine: vLLM's engine process stopped, not killed at the interpreter's exit."""
    factory = replace(request.param)  # `made` is not copied: a new empty list
    if factory.remote:
        url, served, _ = request.getfixturevalue("tinker_server")
        factory = replace(factory, url=url, served=served)
    yield factory
    for engine in factory.made:
        engine.close()


def _batch(engine, n: int = 2, seed: int = 0) -> tuple[TrainBatch, list]:
    prompts = [engine.tokenizer.encode("Tell me a joke about cats"), engine.tokenizer.encode("hello world")]
    groups = engine.sample(prompts, n, SamplingParams(max_new_tokens=6, seed=seed))
    completions = [c for g in groups for c in g]
    tensors = sequence_tensors(completions, int(engine.tokenizer.pad_token_id))
    if DDP:  # rank 0's batch on every rank (see the module docstring)
        return _world().agree((TrainBatch(**tensors), completions))
    return TrainBatch(**tensors), completions


def _trains(engine, name: str) -> bool:
    """Whether parameter `name` belongs to what the engine trains: a LoRA adapter, or every weight when full."""
    return engine.cfg.finetune == "full" or "lora_" in name


def _adapter_state(engine, probe: TrainBatch) -> dict[str, torch.Tensor]:
    """What the active adapter holds: its weights, or on a remote engine the logprobs it gives `probe`."""
    if getattr(engine, "model", None) is None:
        return {"logprobs": engine.logprobs(probe.input_ids_NT, probe.attention_mask_NT, targets_NT=probe.loss_mask_NT)}
    return {n: p.detach().float().clone() for n, p in engine.model.named_parameters() if _trains(engine, n)}


def _delta(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([(after[k] - before[k]).flatten() for k in sorted(before)])


def _sampler_atol(factory: Factory, engine, ids_NT: torch.Tensor, attn_NT: torch.Tensor) -> float:
    """How far the sampler's logprobs may lie from the engine's scoring of the same tokens: the factory's
    `logprob_tol`, except on a local bf16 engine, where the two paths round to bf16 at different points (eager
    attention rounds its probabilities, the decoder's fused attention does not; the merged sampler rounds W + s B A):
    about 3 per layer, each moving a logit by a bf16 rounding of the logits' size, and a logprob by at most twice its
    logits' move, on each path (tests/tolerances.py). Scaled by the logits, not fixed: a full fine-tune's grow ~10x."""
    if factory.dtype != "bfloat16" or getattr(engine, "model", None) is None:
        return factory.logprob_tol
    with torch.no_grad():
        logits = engine.model(input_ids=ids_NT, attention_mask=attn_NT).logits
    return 2 * 2 * rounding_atol(torch.bfloat16, 3 * engine.model.config.num_hidden_layers,
                                 float(logits.float().abs().max()))


def _trained(engine, batch: TrainBatch, steps: int = 2) -> None:
    """Move the adapter off LoRA B = 0 so the policy differs from the base (an untrained adapter IS the base)."""
    n, t = batch.input_ids_NT.shape
    loss = Loss("importance_sampling", PolicyGradientParams(old_logprobs="current"))
    advantages = torch.linspace(-1, 1, n)[:, None] * batch.loss_mask_NT
    for _ in range(steps):
        engine.forward_backward(TrainBatch(**{**batch.__dict__, "advantages_NT": advantages}), loss)
        engine.optim_step(AdamParams(lr=5e-2))


def test_scoring_reproduces_sampling_logprobs(factory: Factory, tiny_model_dir: Path) -> None:
    engine = factory.make(tiny_model_dir)
    batch, _ = _batch(engine)
    _trained(engine, batch, steps=4)
    batch, completions = _batch(engine, seed=1)
    scored_NT = engine.logprobs(batch.input_ids_NT, batch.attention_mask_NT, targets_NT=batch.loss_mask_NT)
    mask = batch.loss_mask_NT.bool()
    assert mask.sum() > 6
    atol = _sampler_atol(factory, engine, batch.input_ids_NT, batch.attention_mask_NT)
    torch.testing.assert_close(scored_NT[mask], batch.sampling_logprobs_NT[mask], atol=atol, rtol=0)
    reference_NT = engine.logprobs(batch.input_ids_NT, batch.attention_mask_NT, reference=True,
                                   targets_NT=batch.loss_mask_NT)
    # the trained policy differs from the base by far more than scoring differs from sampling
    error = float((scored_NT[mask] - batch.sampling_logprobs_NT[mask]).abs().mean())
    assert float((reference_NT[mask] - scored_NT[mask]).abs().mean()) > 3 * error + 1e-3


def test_training_changes_only_the_active_adapter(factory: Factory, tiny_model_dir: Path) -> None:
    engine = factory.make(tiny_model_dir)
    batch, _ = _batch(engine)
    if factory.remote:  # the base is the service's: training moves the policy, and the reference stays put
        ref_before = engine.logprobs(batch.input_ids_NT, batch.attention_mask_NT, reference=True)
        before = _adapter_state(engine, batch)
        _trained(engine, batch)
        assert float(_delta(before, _adapter_state(engine, batch)).abs().max()) > 1e-3
        ref_after = engine.logprobs(batch.input_ids_NT, batch.attention_mask_NT, reference=True)
        torch.testing.assert_close(ref_after, ref_before, atol=factory.same_tol, rtol=0)
        return
    frozen = {n: p.detach().clone() for n, p in engine.model.named_parameters() if not _trains(engine, n)}
    before = _adapter_state(engine, batch)
    _trained(engine, batch)
    after = _adapter_state(engine, batch)
    assert all(not p.requires_grad for n, p in engine.model.named_parameters() if not _trains(engine, n))
    for name, value in frozen.items():
        assert torch.equal(dict(engine.model.named_parameters())[name], value), name
    assert float(_delta(before, after).abs().max()) > 1e-3
    if factory.full:  # every weight trains: each tensor of the model moved
        assert not frozen and len(before) == len(list(engine.model.parameters()))
        assert all(float((after[k] - before[k]).abs().max()) > 0 for k in before), \
            [k for k in before if torch.equal(after[k], before[k])]


def test_save_load_round_trip(factory: Factory, tiny_model_dir: Path, tmp_path: Path) -> None:
    engine = factory.make(tiny_model_dir)
    batch, _ = _batch(engine)
    _trained(engine, batch)
    engine.save(tmp_path)
    again = factory.make(tiny_model_dir)
    again.load(tmp_path)
    for a, b in ((engine, again),):
        la = a.logprobs(batch.input_ids_NT, batch.attention_mask_NT, targets_NT=batch.loss_mask_NT)
        lb = b.logprobs(batch.input_ids_NT, batch.attention_mask_NT, targets_NT=batch.loss_mask_NT)
        torch.testing.assert_close(la, lb, atol=factory.same_tol, rtol=0)
    _trained(engine, batch, steps=1)
    _trained(again, batch, steps=1)
    sa, sb = _adapter_state(engine, batch), _adapter_state(again, batch)
    for name in sa:  # same optimizer moments: the next update is the same
        torch.testing.assert_close(sa[name], sb[name], atol=factory.state_atol, rtol=1e-5, msg=name)


def _hand_gradients(batch: TrainBatch, lp_NT: torch.Tensor, ref_NT: torch.Tensor):
    """(Loss, dloss/dlogprobs [N, T] worked out by hand, extra batch fields) for every registered loss.
    M = loss tokens (token_mean); every formula is the derivative of the loss named beside it."""
    mask = batch.loss_mask_NT
    M = float(mask.sum())
    n = mask.shape[0]
    adv = torch.linspace(-1.0, 1.5, n)[:, None] * mask
    # behaviour logprobs 0.5 below the current ones on every other row: ratio e^0.5 = 1.65 > 1 + 0.2 there
    shift = torch.tensor([0.5 if i % 2 else 0.0 for i in range(n)])[:, None] * mask
    old = (lp_NT - shift) * mask
    ratio = torch.exp(lp_NT - old) * mask
    k3_grad = (1 - torch.exp(ref_NT - lp_NT)) * mask  # d/dlp [exp(ref - lp) - (ref - lp) - 1]
    clipped = (ratio > 1.2) & (adv > 0)  # min() takes the clipped, constant branch: no gradient
    cases = {
        "cross_entropy": (Loss("cross_entropy", CrossEntropyParams()), -mask / M, {}),
        "importance_sampling": (Loss("importance_sampling", PolicyGradientParams(kl_beta=0.3, kl_estimator="k3")),
                                (-adv * ratio + 0.3 * k3_grad) / M,
                                {"advantages_NT": adv, "sampling_logprobs_NT": old, "ref_logprobs_NT": ref_NT}),
        "ppo_clip": (Loss("ppo_clip", PolicyGradientParams(kl_beta=0.2, kl_estimator="k1")),
                     (torch.where(clipped, 0.0, -adv * ratio) + 0.2 * mask) / M,
                     {"advantages_NT": adv, "sampling_logprobs_NT": old, "ref_logprobs_NT": ref_NT}),
        "token_noiser": (Loss("token_noiser", TokenNoiserParams(epsilon=0.0)), -mask / M, {}),  # eps 0: the NLL
    }
    pairs = torch.tensor([[0, 1], [2, 3]])
    margin = ((lp_NT - ref_NT) * mask).sum(-1)
    z = 0.5 * (margin[pairs[:, 0]] - margin[pairs[:, 1]])
    weight = 0.5 * torch.sigmoid(-z) / len(pairs)  # d/dz of -logsigmoid(z) is -sigmoid(-z); mean over pairs
    dpo = torch.zeros_like(mask)
    for p, (c, r) in enumerate(pairs.tolist()):
        dpo[c] -= weight[p] * mask[c]
        dpo[r] += weight[p] * mask[r]
    cases["dpo"] = (Loss("dpo", DPOParams(beta=0.5)), dpo, {"ref_logprobs_NT": ref_NT, "pairs_P2": pairs})
    cases.update(_preference_gradients(mask, lp_NT, ref_NT, pairs))
    # without KL, with the sampler's logprobs as the ratio's denominator: a Tinker engine's built-in losses
    policy = {"advantages_NT": adv, "sampling_logprobs_NT": old}
    cases["importance_sampling without KL"] = (Loss("importance_sampling"), -adv * ratio / M, policy)
    cases["ppo_clip without KL"] = (Loss("ppo_clip"), torch.where(clipped, 0.0, -adv * ratio) / M, policy)
    return cases


def _preference_gradients(mask: torch.Tensor, lp_NT: torch.Tensor, ref_NT: torch.Tensor, pairs: torch.Tensor):
    """SimPO, KTO and ORPO's (Loss, dloss/dlogprobs, extra batch fields), from dloss/d(row sum) times the mask.
    a = row sum / loss-token count n; the averaged losses get d/d(sum) = d/da / n."""
    n = mask.sum(-1)
    a = (lp_NT * mask).sum(-1) / n
    h = ((lp_NT - ref_NT) * mask).sum(-1)
    c, r = pairs[:, 0], pairs[:, 1]
    P = len(pairs)

    def on_rows(d_sum: torch.Tensor) -> torch.Tensor:
        return d_sum[:, None] * mask

    # SimPO beta 2, gamma 0.5: z = 2 (a_c - a_r) - 0.5; d/da_c of -logsigmoid(z) = -2 sigmoid(-z)
    z = 2.0 * (a[c] - a[r]) - 0.5
    simpo = torch.zeros_like(n)
    simpo[c], simpo[r] = -2.0 * torch.sigmoid(-z) / P / n[c], 2.0 * torch.sigmoid(-z) / P / n[r]
    # KTO beta 0.5: row 0 desirable, row 1 undesirable, rows 2-3 KL rows with z0 = max(0, mean h) (no gradient)
    labels = torch.tensor([1, 0, -1, -1] + [-1] * (len(n) - 4))
    z0 = h[2:].mean().clamp(min=0.0)
    x, y = torch.sigmoid(0.5 * (h[0] - z0)), torch.sigmoid(0.5 * (z0 - h[1]))
    kto = torch.zeros_like(n)
    kto[0], kto[1] = -0.5 * x * (1 - x) / 2, 0.5 * y * (1 - y) / 2  # d(1 - sigmoid(.))/dh, mean over 2 rows
    # ORPO beta 0.5: log odds difference lo; d lo/da_c = 1 / (1 - e^a_c); NLL pooled over the chosen tokens
    log_odds = a - torch.log1p(-torch.exp(a))
    lo = log_odds[c] - log_odds[r]
    orpo = torch.zeros_like(n)
    orpo[c] = -1.0 / n[c].sum() - 0.5 / P * torch.sigmoid(-lo) / (1 - torch.exp(a[c])) / n[c]
    orpo[r] = 0.5 / P * torch.sigmoid(-lo) / (1 - torch.exp(a[r])) / n[r]
    kto_inputs = {"ref_logprobs_NT": ref_NT, "kto_labels_N": labels}
    return {"simpo": (Loss("simpo", SimPOParams(beta=2.0, gamma=0.5)), on_rows(simpo), {"pairs_P2": pairs}),
            "kto": (Loss("kto", KTOParams(beta=0.5)), on_rows(kto), kto_inputs),
            "orpo": (Loss("orpo", ORPOParams(beta=0.5)), on_rows(orpo), {"pairs_P2": pairs})}


def test_every_registered_loss_has_its_hand_worked_gradient(factory: Factory, tiny_model_dir: Path,
                                                            tmp_path: Path) -> None:
    engine = factory.make(tiny_model_dir, micro_batch_size=1)  # several micro-batches: accumulation counts too
    batch, _ = _batch(engine)
    _trained(engine, batch)
    engine.save(tmp_path)
    lp_NT = engine.logprobs(batch.input_ids_NT, batch.attention_mask_NT, targets_NT=batch.loss_mask_NT)
    ref_NT = engine.logprobs(batch.input_ids_NT, batch.attention_mask_NT, reference=True,
                             targets_NT=batch.loss_mask_NT)
    cases = _hand_gradients(batch, lp_NT, ref_NT)
    # a "values" loss reads a scalar head, no logprob: its gradient is tests/engines/test_scalar_heads.py's
    logprob_losses = {name for name, definition in LOSS_REGISTRY.items() if definition.consumes != "values"}
    assert {c[0].name for c in cases.values()} == logprob_losses, \
        "a registered loss has no hand-worked gradient in the contract"
    for name, (loss, grad_NT, extra) in cases.items():
        data = TrainBatch(**{**batch.__dict__, **extra})
        if factory.remote and loss.definition.consumes == "logits":
            with pytest.raises(ExperimentError, match="needs the full next-token logits"):
                engine.forward_backward(data, loss)  # the Tinker API returns no logits
            continue
        updates = []
        for run in ("registered", "hand"):
            engine.load(tmp_path)
            before = _adapter_state(engine, batch)
            if run == "registered":
                engine.forward_backward(data, loss)
            else:
                engine.forward_backward_custom(data, CustomLoss(lambda lp, _inputs, g=grad_NT: (lp * g).sum()))
            engine.optim_step(READOUT)
            updates.append(_delta(before, _adapter_state(engine, batch)))
        registered, hand = updates
        assert float(hand.abs().max()) > 1e-6, name
        scale = float(hand.abs().max())
        assert float((registered - hand).abs().max()) <= factory.grad_rtol * scale, \
            (name, float((registered - hand).abs().max()), scale)


def test_named_adapters_train_alone_on_one_base(factory: Factory, tiny_model_dir: Path, tmp_path: Path) -> None:
    if factory.full:
        pytest.skip("full-parameter engines have no named adapters (their refusal: test_full_finetune.py)")
    engine = factory.make(tiny_model_dir)
    batch, _ = _batch(engine)
    _trained(engine, batch)
    policy = engine.logprobs(batch.input_ids_NT, batch.attention_mask_NT, targets_NT=batch.loss_mask_NT)
    base = engine.logprobs(batch.input_ids_NT, batch.attention_mask_NT, reference=True, targets_NT=batch.loss_mask_NT)
    engine.create_adapter("forget")
    assert engine.adapters == ["default", "forget"] and engine.active_adapter == "default"
    engine.use_adapter("forget")
    fresh = engine.logprobs(batch.input_ids_NT, batch.attention_mask_NT, targets_NT=batch.loss_mask_NT)
    torch.testing.assert_close(fresh, base, atol=factory.logprob_tol, rtol=0)  # a fresh adapter starts as the base
    if factory.remote:  # "default" staying put is checked below through its logprobs
        _trained(engine, batch)
    else:
        default_before = {k: v for k, v in _adapter_state(engine, batch).items() if ".default." in k}
        _trained(engine, batch)
        state = _adapter_state(engine, batch)
        assert all(torch.equal(state[k], v) for k, v in default_before.items())  # only "forget" moved
        assert any(float((state[k] - 0).abs().max()) > 0 for k in state if ".forget." in k and "lora_B" in k)
    forget = engine.logprobs(batch.input_ids_NT, batch.attention_mask_NT, targets_NT=batch.loss_mask_NT)
    assert float((forget - base).abs().max()) > 1e-3  # "forget" trained away from the base
    reference = engine.logprobs(batch.input_ids_NT, batch.attention_mask_NT, reference=True,
                                targets_NT=batch.loss_mask_NT)
    # the reference is the base, whichever adapter is active
    torch.testing.assert_close(reference, base, atol=factory.same_tol, rtol=0)
    engine.use_adapter("default")
    torch.testing.assert_close(engine.logprobs(batch.input_ids_NT, batch.attention_mask_NT,
                                               targets_NT=batch.loss_mask_NT), policy, atol=factory.same_tol, rtol=0)
    engine.use_adapter("forget")
    engine.save(tmp_path)
    if factory.remote:  # the weights stay on the service; the checkpoint names both saved states
        assert set(json.loads((tmp_path / "tinker_state.json").read_text())["adapters"]) == {"default", "forget"}
    else:
        assert (tmp_path / "adapter_model.safetensors").is_file()
        assert (tmp_path / "forget" / "adapter_config.json").is_file()
    again = factory.make(tiny_model_dir)
    again.load(tmp_path)
    assert again.adapters == ["default", "forget"] and again.active_adapter == "forget"
    torch.testing.assert_close(again.logprobs(batch.input_ids_NT, batch.attention_mask_NT,
                                              targets_NT=batch.loss_mask_NT), forget, atol=factory.same_tol, rtol=0)
    # sampling follows the active adapter too (the merged sampler is rebuilt for it)
    prompts = [batch.input_ids_NT[0, :4].tolist()]
    for name in ("default", "forget"):
        again.use_adapter(name)
        drawn = again.sample(prompts, 1, SamplingParams(max_new_tokens=4, seed=5))[0][0]
        ids = torch.tensor([list(drawn.prompt_tokens) + list(drawn.tokens)])
        mask = torch.zeros_like(ids, dtype=torch.float32)
        mask[0, len(drawn.prompt_tokens):] = 1
        scored = again.logprobs(ids, torch.ones_like(ids), targets_NT=mask)[0, len(drawn.prompt_tokens):]
        atol = _sampler_atol(factory, again, ids, torch.ones_like(ids))
        torch.testing.assert_close(scored, drawn.logprobs_C, atol=atol, rtol=0)


def test_a_loss_without_its_inputs_is_one_line(factory: Factory, tiny_model_dir: Path) -> None:
    engine = factory.make(tiny_model_dir)
    batch, _ = _batch(engine)
    with pytest.raises(ExperimentError, match="loss 'ppo_clip' needs advantages_NT"):
        engine.forward_backward(TrainBatch(batch.input_ids_NT, batch.attention_mask_NT, batch.loss_mask_NT,
                                           sampling_logprobs_NT=batch.sampling_logprobs_NT), Loss("ppo_clip"))
    with_advantages = TrainBatch(**{**batch.__dict__, "advantages_NT": batch.loss_mask_NT})
    with pytest.raises(ExperimentError, match="needs ref_logprobs_NT"):
        engine.forward_backward(with_advantages, Loss("importance_sampling", PolicyGradientParams(kl_beta=0.1)))
    with pytest.raises(ExperimentError, match="one finite number"):
        engine.forward_backward_custom(batch, CustomLoss(lambda lp, _i: (lp * math.nan).sum()))


def test_world_and_sample_metrics_are_the_engines_own(factory: Factory, tiny_model_dir: Path) -> None:
    engine = factory.make(tiny_model_dir)
    world = engine.world
    assert isinstance(world, World) and world.size == factory.procs
    if factory.procs == 1:
        assert world == SINGLE and world.is_writer
    else:  # each torchrun process is its own rank of the one group
        assert world.rank == int(os.environ["RANK"]) and world.is_writer == (world.rank == 0)
    assert dict(engine.sample_metrics) == {}  # nothing sampled yet: nothing to report
    for seed in (0, 1):  # each call's report replaces the last
        _batch(engine, seed=seed)
        metrics = dict(engine.sample_metrics)
        assert sorted(metrics) == sorted(factory.sampler_report)
        assert all(isinstance(v, float) and math.isfinite(v) for v in metrics.values()), metrics
    if "rollout/lp_diff_max" in metrics:  # the sampler's logprobs vs the trainer's: the engine's own tolerance
        assert 0.0 <= metrics["rollout/lp_diff_mean"] <= metrics["rollout/lp_diff_max"] < factory.logprob_tol
