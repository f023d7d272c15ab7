"""Diffusion model adapters (FLUX, SD3/SD3.5, Qwen-Image, Wan2.1, Wan2.2 TI2V-5B, HunyuanVideo) behind one
interface; each architecture is one adapter file that declares everything about it (``spec.py``).

Public API:
- ``DiffusionModel`` / ``Conditioning`` (base.py): the contract the algorithm layer uses.
- ``build_model`` / ``build_tiny_model`` / ``load_pretrained`` / ``MODEL_REGISTRY`` / ``known_archs``.
- LoRA: ``apply_lora``, ``lora_state_dict``, ``load_lora_state_dict``, ``disable_adapters``,
  ``lora_parameters``, ``has_lora``.
"""

from verl_digen.models.adapter import DiffusersAdapter, cfg_combine
from verl_digen.models.arch import MODEL_REGISTRY, canonical_arch
from verl_digen.models.base import Conditioning, DiffusionModel
from verl_digen.models.flux import FluxModel
from verl_digen.models.hunyuan_video import HunyuanVideoModel
from verl_digen.models.loading import (
    WeightsNotFoundError,
    load_pipeline,
    load_pretrained,
    load_transformer,
)
from verl_digen.models.lora import (
    apply_lora,
    disable_adapters,
    has_lora,
    load_lora_state_dict,
    lora_parameters,
    lora_state_dict,
)
from verl_digen.models.qwen_image import QwenImageModel
from verl_digen.models.registry import build_model, build_tiny_model, known_archs, parse_dtype
from verl_digen.models.sd3 import SD3Model
from verl_digen.models.wan import WanModel
from verl_digen.models.wan2_2 import Wan22Model

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
