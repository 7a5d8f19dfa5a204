"""LocalEngine on the tiny random Llama from conftest: sampling, scoring, training and state round trips.

Reference values are recomputed by hand from plain forward passes (`torch.log_softmax` over the logits),
never through the engine's own helpers.
"""

from __future__ import annotations

import dataclasses
import re
import socket
from pathlib import Path

import pytest
import torch

from purplerl.algorithms.registry import Loss, PolicyGradientParams
from purplerl.config import ModelConfig
from purplerl.engines.loading import find_embedded_gguf, load_tokenizer, resolve_model_path
from purplerl.engines.local import LocalEngine
from purplerl.engines.local_training import OPTIMIZER_FILE
from purplerl.errors import ExperimentError, UserError
from purplerl.train.batch import build_train_batch, sequence_tensors
from purplerl.types import AdamParams, Completion, SamplingParams, TrainBatch
from tests.tolerances import gradient_atol, logprob_atol

# Three prompts of different lengths, so the sampler left-pads two of them.
PROMPTS = [[1, 10, 20, 30, 40, 50, 60], [1, 11], [1, 12, 22, 32]]
PAD = 2  # the tiny tokenizer's pad == eos == <|im_end|>



def _engine(model_dir: Path, seed: int = 0) -> LocalEngine:
    return LocalEngine(ModelConfig(name=str(model_dir), device="cpu", lora_rank=4, dtype="float32"), seed=seed)


def _flat(groups: list[list[Completion]]) -> list[Completion]:
    return [c for group in groups for c in group]


def _manual_logits(model: torch.nn.Module, ids_NT: torch.Tensor, attn_NT: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids_NT, attention_mask=attn_NT).logits.float()


def _manual_logprobs(model: torch.nn.Module, ids_NT: torch.Tensor, attn_NT: torch.Tensor,
                     temperature: float = 1.0) -> torch.Tensor:
    """log p(token t | tokens < t) at every position t >= 1 (entry 0 is 0), masked by attention."""
    logits_NTV = _manual_logits(model, ids_NT, attn_NT)
    logp_NTV = torch.log_softmax(logits_NTV[:, :-1] / temperature, dim=-1)
    picked_NT = logp_NTV.gather(-1, ids_NT[:, 1:, None])[..., 0]
    return torch.nn.functional.pad(picked_NT, (1, 0)) * attn_NT


def _lp_atol(model: torch.nn.Module, ids_NT: torch.Tensor, values: torch.Tensor) -> float:
    """Logprobs (or entropies) of one model along two fp32 paths, the engine's sampler or scorer and a plain forward
    here: the bound of their reductions over these sequences (tests/tolerances.py)."""
    return logprob_atol(torch.float32, model.config, ids_NT.shape[-1], float(values.abs().max()))


def _fresh_base(model_dir: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()


def _sampled_batch(engine: LocalEngine, seed: int = 0, max_new_tokens: int = 6) -> tuple[list[Completion], dict]:
    comps = _flat(engine.sample(PROMPTS, 2, SamplingParams(max_new_tokens=max_new_tokens, seed=seed)))
    return comps, sequence_tensors(comps, PAD)


ADVANTAGES_N = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, -2.0])


def _train_step(engine: LocalEngine, loss: str, seed: int, lr: float = 1e-2) -> None:
    _, tensors = _sampled_batch(engine, seed=seed)
    engine.forward_backward(build_train_batch(tensors, ADVANTAGES_N), Loss(loss))
    engine.optim_step(AdamParams(lr=lr))


# ----- sampling ---------------------------------------------------------------------------------------


def test_sample_shapes_and_finish_reasons(tiny_model_dir: Path) -> None:
    engine = _engine(tiny_model_dir)
    # An eighth of the vocabulary ends a completion, so both finish reasons occur within 8 tokens.
    engine.stop_ids = list(range(0, 400, 8))
    groups = engine.sample(PROMPTS, 4, SamplingParams(max_new_tokens=8, seed=3))
    assert len(groups) == 3 and all(len(g) == 4 for g in groups)
    reasons = set()
    for prompt, group in zip(PROMPTS, groups, strict=True):
        for c in group:
            reasons.add(c.finish_reason)
            assert c.prompt_tokens == tuple(prompt)
            assert 1 <= len(c.tokens) <= 8
            assert c.logprobs_C.shape == c.entropies_C.shape == (len(c.tokens),)
            assert c.logprobs_C.dtype == torch.float32
            assert bool((c.logprobs_C <= 0).all()) and bool((c.entropies_C > 0).all())
            # no stop token before the last position: decoding stopped at the first one drawn
            assert not any(t in engine.stop_ids for t in c.tokens[:-1])
            if c.finish_reason == "stop":
                assert c.tokens[-1] in engine.stop_ids
            else:
                assert len(c.tokens) == 8 and c.tokens[-1] not in engine.stop_ids
            assert c.text == engine.tokenizer.decode(list(c.tokens), skip_special_tokens=True)
    assert reasons == {"stop", "length"}


def test_sample_is_a_function_of_the_seed(tiny_model_dir: Path) -> None:
    engine = _engine(tiny_model_dir)
    params = SamplingParams(max_new_tokens=10, seed=7)
    first, again = _flat(engine.sample(PROMPTS, 2, params)), _flat(engine.sample(PROMPTS, 2, params))
    other = _flat(engine.sample(PROMPTS, 2, SamplingParams(max_new_tokens=10, seed=8)))
    assert [c.tokens for c in first] == [c.tokens for c in again]
    assert all(torch.equal(a.logprobs_C, b.logprobs_C) for a, b in zip(first, again, strict=True))
    assert [c.tokens for c in first] != [c.tokens for c in other]
    # the two completions of one prompt are different draws, not copies
    assert first[0].tokens != first[1].tokens


# Two code paths (the engine's padded, cached decode and a plain forward) agree on a logit to ~1e-6 in
# float32; the tiny random model has top-2 logit gaps down to 3e-5, so a token is only required to be the
# argmax where the gap is far above that noise, and elsewhere to be within the noise of the top logit.
LOGIT_NOISE = 1e-4
CLEAR_GAP = 1e-3


def _greedy_steps(model: torch.nn.Module, prompt: list[int], tokens: list[int]) -> list[tuple[int, float, float]]:
    """For each generated token along the engine's own path: (manual argmax, top-2 logit gap, how far the
    token's logit is below the top one), from one plain forward over prompt + tokens."""
    ids = torch.tensor([prompt + tokens])
    logits_TV = _manual_logits(model, ids, torch.ones_like(ids))[0, len(prompt) - 1:-1]
    top_T2 = logits_TV.topk(2, dim=-1).values
    chosen_T = logits_TV.gather(-1, torch.tensor(tokens)[:, None])[:, 0]
    return [(int(row.argmax()), float(top[0] - top[1]), float(top[0] - pick))
            for row, top, pick in zip(logits_TV, top_T2, chosen_T, strict=True)]


def test_greedy_is_deterministic_and_matches_manual_argmax(tiny_model_dir: Path) -> None:
    engine = _engine(tiny_model_dir)
    params = SamplingParams(max_new_tokens=6, temperature=0.0, seed=1)
    greedy = _flat(engine.sample(PROMPTS, 2, params))
    again = _flat(engine.sample(PROMPTS, 2, SamplingParams(max_new_tokens=6, temperature=0.0, seed=99)))
    assert [c.tokens for c in greedy] == [c.tokens for c in again]
    base = _fresh_base(tiny_model_dir)  # the fresh adapter (B = 0) is the identity, so base == policy
    clear = 0
    for i, prompt in enumerate(PROMPTS):
        assert greedy[2 * i].tokens == greedy[2 * i + 1].tokens
        tokens = list(greedy[2 * i].tokens)
        for token, (argmax, gap, below_top) in zip(tokens, _greedy_steps(base, prompt, tokens), strict=True):
            assert below_top <= LOGIT_NOISE
            if gap > CLEAR_GAP:
                assert token == argmax
                clear += 1
    assert clear >= 12  # most steps have a clear winner (17 of 18 here), so the argmax check has teeth
    # greedy reports temperature-1 logprobs
    tensors = sequence_tensors(greedy, PAD)
    recomputed = engine.logprobs(tensors["input_ids_NT"], tensors["attention_mask_NT"], temperature=1.0)
    atol = _lp_atol(engine.model, tensors["input_ids_NT"], recomputed)
    assert torch.allclose(recomputed * tensors["loss_mask_NT"], tensors["sampling_logprobs_NT"], rtol=0, atol=atol)


@pytest.mark.parametrize("truncation", [{"top_k": 1}, {"top_p": 1e-6}])
def test_top_k_1_and_tiny_top_p_are_greedy(tiny_model_dir: Path, truncation: dict) -> None:
    engine = _engine(tiny_model_dir)
    greedy = _flat(engine.sample(PROMPTS, 1, SamplingParams(max_new_tokens=6, temperature=0.0)))
    truncated = _flat(engine.sample(PROMPTS, 1, SamplingParams(max_new_tokens=6, seed=5, **truncation)))
    assert [c.tokens for c in truncated] == [c.tokens for c in greedy]
    # the recorded logprob is of the untruncated distribution, so it is well below 0
    assert all(bool((c.logprobs_C < -1.0).all()) for c in truncated)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampling_logprobs_and_entropies_match_a_full_forward(tiny_model_dir: Path, temperature: float) -> None:
    engine = _engine(tiny_model_dir)
    _train_step(engine, "importance_sampling", seed=11)  # a nonzero adapter, so the policy is not the base
    comps = _flat(engine.sample(PROMPTS, 2, SamplingParams(max_new_tokens=8, temperature=temperature, seed=4)))
    tensors = sequence_tensors(comps, PAD)
    ids, attn, mask = tensors["input_ids_NT"], tensors["attention_mask_NT"], tensors["loss_mask_NT"]
    recomputed = engine.logprobs(ids, attn, temperature=temperature)
    assert recomputed.shape == ids.shape
    assert float(mask.sum()) == sum(len(c.tokens) for c in comps)
    drift = ((recomputed - tensors["sampling_logprobs_NT"]) * mask).abs().max()
    assert float(drift) <= _lp_atol(engine.model, ids, recomputed * mask)

    logits_NTV = _manual_logits(engine.model, ids, attn)
    logp_NTV = torch.log_softmax(logits_NTV / temperature, dim=-1)
    entropy_NT = -(logp_NTV.exp() * logp_NTV).sum(-1)
    for i, c in enumerate(comps):
        P, C = len(c.prompt_tokens), len(c.tokens)
        # the distribution of target t comes from the logits at position t - 1
        want = entropy_NT[i, P - 1:P + C - 1]
        assert torch.allclose(c.entropies_C, want, rtol=0, atol=_lp_atol(engine.model, ids, want))
        manual_lp = logp_NTV[i, P - 1:P + C - 1].gather(-1, torch.tensor(c.tokens)[:, None])[:, 0]
        assert torch.allclose(c.logprobs_C, manual_lp, rtol=0, atol=_lp_atol(engine.model, ids, manual_lp))


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_one_nonfinite_logit_in_one_row_fails_sampling(tiny_model_dir: Path, bad: float) -> None:
    """The decode loop's finite check reads each row's entropy: one bad logit of one row at one token is enough."""
    engine = _engine(tiny_model_dir)
    calls = []

    def poison(_module, _inputs, logits):
        calls.append(logits.shape)
        if len(calls) == 2:  # the first decode step after the prefill
            logits = logits.clone()
            logits[1, -1, 7] = bad
        return logits

    engine.sampler.decoding_model().get_output_embeddings().register_forward_hook(poison)
    with pytest.raises(ExperimentError, match="sampling produced non-finite logits"):
        engine.sample(PROMPTS, 1, SamplingParams(max_new_tokens=4))
    assert len(calls) == 2  # it stopped at the poisoned token


def test_sample_rejects_empty_input(tiny_model_dir: Path) -> None:
    engine = _engine(tiny_model_dir)
    with pytest.raises(ExperimentError, match="nothing to sample"):
        engine.sample([], 2, SamplingParams(max_new_tokens=2))
    with pytest.raises(ExperimentError, match="nothing to sample"):
        engine.sample(PROMPTS, 0, SamplingParams(max_new_tokens=2))
    with pytest.raises(ExperimentError, match="empty prompt"):
        engine.sample([[1, 2], []], 1, SamplingParams(max_new_tokens=2))


def test_nan_weights_fail_sampling_and_policy_logprobs(tiny_model_dir: Path) -> None:
    engine = _engine(tiny_model_dir)
    with torch.no_grad():
        for name, param in engine.model.named_parameters():
            if "lora_B" in name:
                param.fill_(float("nan"))
    with pytest.raises(ExperimentError, match="sampling produced non-finite logits"):
        engine.sample(PROMPTS, 1, SamplingParams(max_new_tokens=3))
    ids, attn = torch.tensor([[1, 10, 20]]), torch.ones((1, 3), dtype=torch.long)
    with pytest.raises(ExperimentError, match="non-finite policy logprobs"):
        engine.logprobs(ids, attn)
    # the frozen base runs with the adapter disabled, so it is untouched by the NaN
    assert torch.isfinite(engine.logprobs(ids, attn, reference=True)).all()


# ----- reference model --------------------------------------------------------------------------------


def test_reference_logprobs_are_the_base_model_before_and_after_training(tiny_model_dir: Path) -> None:
    engine = _engine(tiny_model_dir)
    base = _fresh_base(tiny_model_dir)
    _, tensors = _sampled_batch(engine, seed=2)
    ids, attn = tensors["input_ids_NT"], tensors["attention_mask_NT"]
    expected = _manual_logprobs(base, ids, attn, temperature=0.7)
    atol = _lp_atol(base, ids, expected)
    assert torch.allclose(engine.logprobs(ids, attn, reference=True, temperature=0.7), expected, rtol=0, atol=atol)
    # a fresh adapter has B = 0: the policy is the base
    assert torch.allclose(engine.logprobs(ids, attn, temperature=0.7), expected, rtol=0, atol=atol)

    for step, loss in enumerate(["importance_sampling", "ppo_clip", "importance_sampling"]):
        _train_step(engine, loss, seed=20 + step)
    policy = engine.logprobs(ids, attn, temperature=0.7)
    engine.settings = dataclasses.replace(engine.settings, micro_batch_size=2)
    reference = engine.logprobs(ids, attn, reference=True, temperature=0.7)
    assert torch.allclose(reference, expected, rtol=0, atol=atol)
    assert float((policy - reference).abs().max()) > 1e-2


# ----- training ---------------------------------------------------------------------------------------


def test_training_moves_every_lora_b_and_no_base_weight(tiny_model_dir: Path) -> None:
    engine = _engine(tiny_model_dir)
    lora_b = {n: p for n, p in engine.model.named_parameters() if "lora_B" in n}
    assert len(lora_b) == 14  # q,k,v,o,gate,up,down in each of the 2 layers
    assert all(bool((p == 0).all()) for p in lora_b.values())
    base_before = {k: v.clone() for k, v in engine.model.state_dict().items() if "lora_" not in k}
    lora_a_before = {n: p.detach().clone() for n, p in engine.model.named_parameters() if "lora_A" in n}

    for step, loss in enumerate(["importance_sampling", "ppo_clip", "importance_sampling"]):
        _, tensors = _sampled_batch(engine, seed=step)
        metrics = engine.forward_backward(build_train_batch(tensors, ADVANTAGES_N), Loss(loss))
        assert metrics["tokens"] == float(tensors["loss_mask_NT"].sum())
        assert abs(metrics["ratio_mean"] - 1.0) < 1e-4  # on-policy
        if loss == "ppo_clip":
            assert metrics["clip_frac"] == 0.0
        opt = engine.optim_step(AdamParams(lr=1e-2))
        assert opt["grad_norm"] > 0 and opt["lr"] == 1e-2
        assert all(p.grad is None for p in engine.trainable)  # gradients cleared

    for name, p in lora_b.items():
        assert float(p.detach().abs().min()) > 0, f"{name} has entries that never moved"
    assert any(not torch.equal(p, lora_a_before[n]) for n, p in engine.model.named_parameters() if "lora_A" in n)
    after = engine.model.state_dict()
    assert set(base_before) == {k for k in after if "lora_" not in k}
    for key, value in base_before.items():
        assert torch.equal(after[key], value), f"base weight {key} changed"


def _varied_batch(engine: LocalEngine) -> TrainBatch:
    engine.stop_ids = list(range(0, 400, 5))  # completions of varied lengths
    comps = _flat(engine.sample(PROMPTS, 2, SamplingParams(max_new_tokens=8, seed=13)))
    engine.stop_ids = [PAD]
    assert len({len(c.prompt_tokens) + len(c.tokens) for c in comps}) >= 4
    return build_train_batch(sequence_tensors(comps, PAD), ADVANTAGES_N)


@pytest.mark.parametrize("loss", ["importance_sampling", "ppo_clip"])
def test_micro_batches_accumulate_the_full_batch_gradient(tiny_model_dir: Path, loss: str) -> None:
    engine = _engine(tiny_model_dir)
    _train_step(engine, "importance_sampling", seed=30)  # B != 0, so lora_A gets gradients too
    batch = _varied_batch(engine)
    grads, totals = {}, {}
    for mbs in (2, 4, batch.num_sequences):
        engine.settings = dataclasses.replace(engine.settings, micro_batch_size=mbs)
        totals[mbs] = engine.forward_backward(batch, Loss(loss))
        grads[mbs] = [p.grad.clone() for p in engine.trainable]
        engine.optimizer.zero_grad(set_to_none=True)
    full = batch.num_sequences
    assert all(float(g.abs().max()) > 0 for g in grads[full])
    # the micro-batches sum the gradient in another order through kernels of other shapes (tests/tolerances.py)
    atol = gradient_atol(torch.float32, engine.model.config, batch.input_ids_NT.shape[1],
                         int(batch.attention_mask_NT.sum()), max(float(g.abs().max()) for g in grads[full]))
    for mbs in (2, 4):
        for a, b in zip(grads[mbs], grads[full], strict=True):
            assert torch.allclose(a, b, rtol=0, atol=atol)
        # every metric, not only the loss: a loss's metrics are summed over micro-batches by token share
        assert set(totals[mbs]) == set(totals[full])
        for key, value in totals[full].items():
            assert totals[mbs][key] == pytest.approx(value, abs=1e-5), (mbs, key)


def test_the_heap_is_trimmed_between_micro_batches_not_after_the_last(tiny_model_dir: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The trim keeps one pass from mapping pages beside the last one's free heap; after the last pass the next
    phase reuses those pages, and handing them back would make it fault them in again (engines/host_memory.py)."""
    import purplerl.engines.local_training as local_training

    engine = _engine(tiny_model_dir)
    batch = _varied_batch(engine)
    trims = []
    monkeypatch.setattr(local_training, "release_free_memory", lambda: trims.append(1))
    for mbs, passes in ((batch.num_sequences, 1), (2, -(-batch.num_sequences // 2))):
        engine.settings = dataclasses.replace(engine.settings, micro_batch_size=mbs)
        trims.clear()
        engine.forward_backward(batch, Loss("ppo_clip"))
        assert len(trims) == passes - 1, (mbs, passes)
        engine.optimizer.zero_grad(set_to_none=True)


def test_in_loss_kl_needs_reference_logprobs(tiny_model_dir: Path) -> None:
    engine = _engine(tiny_model_dir)
    _, tensors = _sampled_batch(engine)
    batch = build_train_batch(tensors, ADVANTAGES_N)
    with pytest.raises(ExperimentError, match="ref_logprobs_NT"):
        engine.forward_backward(batch, Loss("importance_sampling", PolicyGradientParams(kl_beta=0.1)))


def test_forward_backward_rejects_empty_batches_and_unknown_losses(tiny_model_dir: Path) -> None:
    engine = _engine(tiny_model_dir)
    empty = TrainBatch(*(torch.zeros((0, 4)) for _ in range(5)))
    with pytest.raises(ExperimentError, match="empty batch"):
        engine.forward_backward(empty, Loss("importance_sampling"))
    _, tensors = _sampled_batch(engine)
    no_targets = build_train_batch({**tensors, "loss_mask_NT": torch.zeros_like(tensors["loss_mask_NT"])},
                                   ADVANTAGES_N)
    with pytest.raises(ExperimentError, match="empty batch"):
        engine.forward_backward(no_targets, Loss("importance_sampling"))
    with pytest.raises(UserError, match="unknown loss 'reinforce_pp'"):
        engine.forward_backward(build_train_batch(tensors, ADVANTAGES_N), Loss("reinforce_pp"))
    assert all(p.grad is None for p in engine.trainable)


# ----- state --------------------------------------------------------------------------------------------


def test_save_then_load_restores_adapter_and_optimizer(tiny_model_dir: Path, tmp_path: Path) -> None:
    from peft import PeftModel

    trained = _engine(tiny_model_dir)
    for step in range(2):
        _train_step(trained, "importance_sampling", seed=40 + step)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    trained.save(ckpt)
    assert {"adapter_config.json", "adapter_model.safetensors", OPTIMIZER_FILE} <= {p.name for p in ckpt.iterdir()}

    _, tensors = _sampled_batch(trained, seed=50)
    ids, attn = tensors["input_ids_NT"], tensors["attention_mask_NT"]
    expected = trained.logprobs(ids, attn)

    restored = _engine(tiny_model_dir, seed=1)  # other LoRA A init: load must overwrite everything
    assert not torch.allclose(restored.logprobs(ids, attn), expected, atol=1e-4)
    restored.load(ckpt)
    assert torch.equal(restored.logprobs(ids, attn), expected)
    state_a, state_b = trained.optimizer.state_dict(), restored.optimizer.state_dict()
    assert state_a["state"].keys() == state_b["state"].keys() and len(state_a["state"]) == len(trained.trainable)
    for idx, slots in state_a["state"].items():
        assert slots.keys() == state_b["state"][idx].keys()
        for key, value in slots.items():
            assert torch.equal(value, state_b["state"][idx][key]), (idx, key)
    assert float(state_b["state"][0]["step"]) == 2.0

    # one more identical step keeps them identical only if Adam's moments were restored too
    batch = build_train_batch(tensors, ADVANTAGES_N)
    for engine in (trained, restored):
        engine.forward_backward(batch, Loss("importance_sampling"))
        engine.optim_step(AdamParams(lr=1e-2))
    assert torch.equal(restored.logprobs(ids, attn), trained.logprobs(ids, attn))

    # the checkpoint dir is a standard PEFT adapter
    trained.save(ckpt)
    peft_model = PeftModel.from_pretrained(_fresh_base(tiny_model_dir), str(ckpt)).eval()
    want = trained.logprobs(ids, attn)
    assert torch.allclose(_manual_logprobs(peft_model, ids, attn), want, rtol=0, atol=_lp_atol(peft_model, ids, want))


def test_load_rejects_a_dir_without_adapter(tiny_model_dir: Path, tmp_path: Path) -> None:
    engine = _engine(tiny_model_dir)
    with pytest.raises(UserError, match="adapter_model.safetensors"):
        engine.load(tmp_path)


# ----- loading ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["/nonexistent/purplerl-model", "./no/such/model", "~/no-such-model"])
def test_missing_local_model_is_a_fast_user_error(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Fast means refused from the path alone, before any hub request (whose retries take minutes). Checked by
    # counting connection attempts, not by a clock that a loaded machine can push past any bound.
    attempts: list[object] = []

    def no_network(sock: socket.socket, address: object) -> None:
        attempts.append(address)
        raise OSError("network disabled in this test")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    expected = re.escape(f"cannot load model '{name}': no such path")
    with pytest.raises(UserError, match=expected):
        load_tokenizer(name)
    with pytest.raises(UserError, match=expected):
        LocalEngine(ModelConfig(name=name, device="cpu"))
    assert attempts == []


def test_dir_without_model_is_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=f"cannot load model '{tmp_path}'"):
        LocalEngine(ModelConfig(name=str(tmp_path), device="cpu"))


def test_unknown_embedded_model_is_a_user_error() -> None:
    with pytest.raises(UserError, match="unknown embedded model 'embedded:nope'.*smollm2-135m-instruct"):
        resolve_model_path("embedded:nope")


def test_plain_names_pass_through_resolution(tiny_model_dir: Path) -> None:
    assert resolve_model_path(str(tiny_model_dir)) == str(tiny_model_dir)
    assert resolve_model_path("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_embedded_gguf_is_found_in_the_installed_wheel() -> None:
    gguf = find_embedded_gguf("smollm2-135m-instruct")
    assert gguf.suffix == ".gguf" and gguf.is_file()
    assert gguf.stat().st_size > 10_000_000
