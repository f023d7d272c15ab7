"""float64 fidelity for diffusers modules that hard-code float32 math.

Some diffusers layers compute in float32 whatever the model dtype (``FP32LayerNorm`` in Wan's
cross-attention norm). In a float64 model their *parameter gradients* are then reduced over the batch
in float32, so a batch of rows and the same rows one by one disagree at ~1e-6: enough to break exact
(float64) gradient-equivalence checks such as TSP == sequential. For float64 models we let those
layers compute in float64; float32/bf16 models are left exactly as upstream.
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F
from diffusers.models.normalization import FP32LayerNorm
from torch import nn


def _promoted_layer_norm(self: FP32LayerNorm, inputs: torch.Tensor) -> torch.Tensor:
    dtype = torch.promote_types(inputs.dtype, torch.float32)
    if self.weight is not None:
        dtype = torch.promote_types(dtype, self.weight.dtype)
    weight = None if self.weight is None else self.weight.to(dtype)
    bias = None if self.bias is None else self.bias.to(dtype)
    out = F.layer_norm(inputs.to(dtype), self.normalized_shape, weight, bias, self.eps)
    return out.to(inputs.dtype)


def promote_fp32_layers(module: nn.Module) -> int:
    """Make float32-pinned layers of ``module`` compute in at least their parameters' dtype (float64
    models). Returns how many layers were changed."""
    n = 0
    for sub in module.modules():
        if isinstance(sub, FP32LayerNorm) and "forward" not in sub.__dict__:
            sub.forward = types.MethodType(_promoted_layer_norm, sub)
            n += 1
    return n
