"""A leaner forward for PEFT's LoRA linear layers: the adapter's update is accumulated inside one matmul.

PEFT computes `base(x) + B(A(dropout(x))) * scaling`: besides the two small matmuls, a multiply and an add over
the whole [tokens, out] output, and in backward another multiply of that size. On a small model those
elementwise passes cost about as much as the adapter's matmuls (~0.5 s of a 6 s SmolLM2 training step on a 2-core
CPU). Here the scaling goes into B, an [out, r] matrix, and the add into the matmul:

    y = addmm(base(x), A x, (scaling · B)ᵀ)

which is the same function with the same gradients for A, B and x. Only plain LoRA on `nn.Linear` with no
dropout is rewritten; anything else (dropout > 0, DoRA and other variants, merged or disabled adapters, mixed
adapter batches) runs PEFT's own forward.
"""

from __future__ import annotations

import types
from typing import Any

import torch

_PEFT_FORWARD = "_purplerl_peft_forward"


def _fusable(module: Any) -> bool:
    from peft.tuners.lora.layer import Linear

    if type(module) is not Linear or not isinstance(module.get_base_layer(), torch.nn.Linear):
        return False
    plain = all(isinstance(d, torch.nn.Identity) for d in module.lora_dropout.values())
    variants = getattr(module, "lora_variant", {}) or any(getattr(module, "use_dora", {}).values())
    return plain and not variants and not getattr(module, "fan_in_fan_out", False)


def _fused_forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    adapters = [a for a in self.active_adapters if a in self.lora_A]
    if args or kwargs or self.disable_adapters or self.merged or not adapters or getattr(self, "lora_variant", {}):
        return getattr(self, _PEFT_FORWARD)(x, *args, **kwargs)
    result = self.base_layer(x)
    flat_x, out_RO = x.reshape(-1, x.shape[-1]), result.reshape(-1, result.shape[-1])
    for name in adapters:
        a_rI, b_Or = self.lora_A[name].weight, self.lora_B[name].weight
        xa_Rr = torch.nn.functional.linear(flat_x.to(a_rI.dtype), a_rI)
        scaled_Or = b_Or * self.scaling[name]  # [out, r]: the scaling costs r·out multiplies, not tokens·out
        out_RO = torch.addmm(out_RO, xa_Rr.to(out_RO.dtype), scaled_Or.t().to(out_RO.dtype))
    return out_RO.view(result.shape)


def install_fused_lora(model: torch.nn.Module) -> int:
    """Give every plain LoRA linear layer of a PEFT model the fused forward; returns how many got it."""
    count = 0
    for module in model.modules():
        if _fusable(module) and not hasattr(module, _PEFT_FORWARD):
            setattr(module, _PEFT_FORWARD, module.forward)
            module.forward = types.MethodType(_fused_forward, module)
            count += 1
    return count
