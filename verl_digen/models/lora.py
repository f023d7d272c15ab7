"""LoRA on the adapter's transformer through peft (diffusers' ``add_adapter``), adapter-only weight
export/import for cheap weight sync, and a context manager that turns adapters off for the KL
reference policy (with LoRA, the reference is the frozen base model)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Sequence

import torch

from verl_digen.models.base import DiffusionModel

ADAPTER_NAME = "default"


def default_lora_targets(model: DiffusionModel) -> list[str]:
    """The architecture's default LoRA target-module suffixes (attention projections)."""
    return list(getattr(model, "default_lora_targets", ("to_q", "to_k", "to_v", "to_out.0")))


def apply_lora(
    model: DiffusionModel,
    rank: int,
    alpha: float | None = None,
    target_modules: Sequence[str] | None = None,
    dropout: float = 0.0,
    init_lora_weights: bool | str = True,
) -> DiffusionModel:
    """Inject LoRA adapters into ``model.transformer`` in place and freeze everything else.

    ``alpha`` defaults to ``rank`` (scale 1). With the default ``init_lora_weights=True`` the B
    matrices start at zero, so the LoRA model initially equals the base model (what RL fine-tuning
    wants); pass ``"gaussian"``-style peft options only for tests that need a non-trivial adapter.
    """
    if rank <= 0:
        raise ValueError(f"LoRA rank must be a positive integer, got {rank}")
    if has_lora(model):
        raise ValueError("model already has LoRA adapters")
    from peft import LoraConfig  # peft on first use: about a second per process that never trains LoRA

    targets = list(target_modules) if target_modules else default_lora_targets(model)
    config = LoraConfig(
        r=int(rank),
        lora_alpha=float(alpha if alpha is not None else rank),
        target_modules=targets,
        lora_dropout=dropout,
        init_lora_weights=init_lora_weights,
    )
    model.transformer.requires_grad_(False)
    model.transformer.add_adapter(config, adapter_name=ADAPTER_NAME)
    # adapters follow the base weights' dtype/device (peft may create them in float32)
    dtype, device = model.dtype, model.device
    for name, p in model.transformer.named_parameters():
        is_lora = "lora_" in name
        if is_lora and (p.dtype != dtype or p.device != device):
            p.data = p.data.to(device=device, dtype=dtype)
        p.requires_grad_(is_lora)
    return model


def has_lora(model: DiffusionModel) -> bool:
    """Whether LoRA adapters are injected into ``model.transformer``."""
    return bool(_tuner_layers(model))


def _tuner_layers(model: DiffusionModel) -> list[torch.nn.Module]:
    """The model's peft adapter layers (none can exist before peft is imported, so it is not imported here)."""
    if "peft" not in sys.modules:
        return []
    from peft.tuners.tuners_utils import BaseTunerLayer

    return [m for m in model.transformer.modules() if isinstance(m, BaseTunerLayer)]


def lora_parameters(model: DiffusionModel) -> list[torch.nn.Parameter]:
    """The adapter parameters (what the optimizer should hold)."""
    return [p for n, p in model.transformer.named_parameters() if "lora_" in n]


def lora_state_dict(model: DiffusionModel) -> dict[str, torch.Tensor]:
    """Only the adapter weights (detached copies), keyed as peft saves them (``...lora_A.weight``)."""
    if not has_lora(model):
        raise ValueError("model has no LoRA adapters")
    from peft import get_peft_model_state_dict

    sd = get_peft_model_state_dict(model.transformer, adapter_name=ADAPTER_NAME)
    return {k: v.detach().clone() for k, v in sd.items()}


def load_lora_state_dict(model: DiffusionModel, state_dict: dict[str, torch.Tensor]) -> None:
    """Load adapter weights exported by ``lora_state_dict``; any key mismatch is an error (a silent
    partial load would desynchronize generator and trainer policies)."""
    if not has_lora(model):
        raise ValueError("model has no LoRA adapters; call apply_lora first")
    from peft import get_peft_model_state_dict, set_peft_model_state_dict

    expected = set(get_peft_model_state_dict(model.transformer, adapter_name=ADAPTER_NAME))
    given = set(state_dict)
    if expected != given:
        missing, extra = sorted(expected - given)[:5], sorted(given - expected)[:5]
        raise ValueError(f"LoRA state dict does not match the model: missing {missing}, unexpected {extra}")
    dtype = model.dtype
    sd = {k: v.to(dtype=dtype) for k, v in state_dict.items()}
    with torch.no_grad():
        set_peft_model_state_dict(model.transformer, sd, adapter_name=ADAPTER_NAME)


@contextlib.contextmanager
def disable_adapters(model: DiffusionModel) -> Iterator[DiffusionModel]:
    """Run ``model`` as its base (reference) policy inside the block; adapter state and every
    parameter's ``requires_grad`` are restored afterwards (peft toggles them when disabling)."""
    layers = _tuner_layers(model)
    if not layers:
        raise ValueError("model has no LoRA adapters to disable")
    grads = {n: p.requires_grad for n, p in model.transformer.named_parameters()}
    were_disabled = [m.disable_adapters for m in layers]
    for m in layers:
        m.enable_adapters(False)
    try:
        yield model
    finally:
        for m, was in zip(layers, were_disabled):
            m.enable_adapters(not was)
        for n, p in model.transformer.named_parameters():
            p.requires_grad_(grads[n])
