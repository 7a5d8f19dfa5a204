"""The fused LoRA forward computes PEFT's LoRA function and gradients, and steps aside where it does not apply."""

from __future__ import annotations

import copy

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM

from purplerl.engines.fused_lora import install_fused_lora
from tests.tolerances import decoder_reductions, gradient_atol, reduction_atol


def _peft_model(dropout: float = 0.0, dora: bool = False, dtype: torch.dtype = torch.float32):
    config = LlamaConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=48)
    torch.manual_seed(0)
    base = LlamaForCausalLM(config).to(dtype)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, lora_dropout=dropout, target_modules="all-linear",
                                            use_dora=dora))
    with torch.no_grad():  # PEFT starts B at zero; a nonzero B makes the adapter's path matter
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, dtype=param.dtype) * 0.3)
    return model


def _logits_atol(model, ids: torch.Tensor, logits: torch.Tensor) -> float:
    """Logits of the fused and PEFT's LoRA forward (or the merged weights): the same sums, in fp32 in other orders
    (addmm into the base output, other kernels on other CPUs), within the bound of the decoder's reductions and each
    adapted projection's rank terms (tests/tolerances.py)."""
    config, rank = model.config, 4
    n_terms = decoder_reductions(config, ids.shape[1]) + 5 * rank * config.num_hidden_layers
    return reduction_atol(torch.float32, n_terms, float(logits.abs().max()))


def _loss_and_grads(model, ids: torch.Tensor):
    model.zero_grad(set_to_none=True)
    logits = model(input_ids=ids).logits
    loss = (logits.float() ** 2).mean()
    loss.backward()
    grads = {n: p.grad.float().clone() for n, p in model.named_parameters() if p.requires_grad}
    return logits.detach().float(), grads


def test_fused_lora_gives_peft_values_and_gradients() -> None:
    peft_model = _peft_model()
    fused = copy.deepcopy(peft_model)
    # q k v o gate up down in 2 layers; the lm_head is not a LoRA target of all-linear
    assert install_fused_lora(fused) == 14
    assert install_fused_lora(fused) == 0  # installing twice changes nothing
    ids = torch.randint(0, 64, (3, 7), generator=torch.Generator().manual_seed(1))
    ref_logits, ref_grads = _loss_and_grads(peft_model, ids)
    got_logits, got_grads = _loss_and_grads(fused, ids)
    assert torch.allclose(got_logits, ref_logits, rtol=0, atol=_logits_atol(peft_model, ids, ref_logits))
    assert ref_grads.keys() == got_grads.keys() and len(ref_grads) == 28
    # one bound for every weight's gradient, from the largest: their terms are products of one back-propagated signal
    atol = gradient_atol(torch.float32, peft_model.config, ids.shape[1], ids.numel(),
                         max(float(g.abs().max()) for g in ref_grads.values()))
    for name, grad in ref_grads.items():
        assert float(grad.abs().max()) > 0, name
        assert torch.allclose(got_grads[name], grad, rtol=0, atol=atol), name
    # with the adapter disabled both are the base model, and the adapter's path did change the output
    with fused.disable_adapter(), peft_model.disable_adapter():
        base_fused, base_peft = fused(input_ids=ids).logits, peft_model(input_ids=ids).logits
    assert torch.allclose(base_fused, base_peft, atol=1e-6)
    assert not torch.allclose(base_fused, got_logits, atol=1e-3)


def test_fused_lora_in_bf16_stays_bf16_and_near_peft() -> None:
    peft_model = _peft_model(dtype=torch.bfloat16)
    fused = copy.deepcopy(peft_model)
    install_fused_lora(fused)
    ids = torch.randint(0, 64, (2, 5), generator=torch.Generator().manual_seed(2))
    ref_logits, _ = _loss_and_grads(peft_model, ids)
    with torch.no_grad():
        got = fused(input_ids=ids).logits
    assert got.dtype == torch.bfloat16
    assert float((got.float() - ref_logits).abs().max()) < 0.05


@pytest.mark.parametrize(("dropout", "dora"), [(0.1, False), (0.0, True)])
def test_dropout_and_dora_layers_keep_peft_forward(dropout: float, dora: bool) -> None:
    assert install_fused_lora(_peft_model(dropout=dropout, dora=dora)) == 0


def test_merged_adapter_falls_back_to_peft() -> None:
    model = _peft_model()
    install_fused_lora(model)
    ids = torch.randint(0, 64, (2, 5), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        before = model(input_ids=ids).logits
        model.merge_adapter()  # the LoRA delta now lives in the base weights: the fused path must not add it again
        merged = model(input_ids=ids).logits
        model.unmerge_adapter()
    assert torch.allclose(before, merged, rtol=0, atol=_logits_atol(model, ids, before))
