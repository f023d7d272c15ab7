"""Diffusion model adapters (FLUX, SD3/SD3.5, Qwen-Image, Wan2.1, Wan2.2 TI2V-5B, HunyuanVideo) behind one
interface; each architecture is one adapter file pointing to its torch-free facts (``verl_digen/archs.py``).
The names below are imported on first use, so ``verl_digen.models.base`` alone loads no adapter.

Public API:
- ``DiffusionModel`` / ``Conditioning`` (base.py): the contract the algorithm layer uses.
- ``build_model`` / ``build_tiny_model`` / ``load_pretrained`` / ``MODEL_REGISTRY`` / ``known_archs``.
- LoRA: ``apply_lora``, ``lora_state_dict``, ``load_lora_state_dict``, ``disable_adapters``,
  ``lora_parameters``, ``has_lora``.
"""

import importlib
from typing import Any

from verl_digen.archs import ARCHS

#: public name -> the submodule that defines it. Imported on first use (PEP 562): ``import verl_digen.models.base``
#: (the DiffusionModel contract that algo/ and rollout/ type against) must not load every adapter and diffusers
_HOMES = {name: f"{__name__}.{module}" for module, names in (
    ("adapter", ("DiffusersAdapter", "cfg_combine")),
    ("arch", ("MODEL_REGISTRY", "canonical_arch")),
    ("base", ("Conditioning", "DiffusionModel")),
    ("loading", ("WeightsNotFoundError", "load_pipeline", "load_pretrained", "load_transformer")),
    ("lora", ("apply_lora", "disable_adapters", "has_lora", "load_lora_state_dict", "lora_parameters",
              "lora_state_dict")),
    ("registry", ("build_model", "build_tiny_model", "known_archs", "parse_dtype")),
) for name in names}
#: the adapter classes, found from each architecture's facts (``ArchFacts.adapter``)
_HOMES.update({path.rpartition(".")[2]: path.rpartition(".")[0] for path in (f.adapter for f in ARCHS.values())})


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})


__all__ = [
    "MODEL_REGISTRY",
    "Conditioning",
    "DiffusersAdapter",
    "DiffusionModel",
    "FluxModel",
    "HunyuanVideoModel",
    "QwenImageModel",
    "SD3Model",
    "Wan22Model",
    "WanModel",
    "WeightsNotFoundError",
    "apply_lora",
    "build_model",
    "build_tiny_model",
    "canonical_arch",
    "cfg_combine",
    "disable_adapters",
    "has_lora",
    "known_archs",
    "load_lora_state_dict",
    "load_pipeline",
    "load_pretrained",
    "load_transformer",
    "lora_parameters",
    "lora_state_dict",
    "parse_dtype",
]
