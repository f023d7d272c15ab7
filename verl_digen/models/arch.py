"""Architecture names: the canonical ones used in configs, their aliases, and the adapter class of each."""

from __future__ import annotations

from verl_digen.models.adapter import DiffusersAdapter
from verl_digen.models.flux import FluxModel
from verl_digen.models.hunyuan_video import HunyuanVideoModel
from verl_digen.models.qwen_image import QwenImageModel
from verl_digen.models.sd3 import SD3Model
from verl_digen.models.wan import WanModel

#: canonical arch name -> adapter class
MODEL_REGISTRY: dict[str, type[DiffusersAdapter]] = {
    "flux": FluxModel,
    "sd3": SD3Model,
    "qwen_image": QwenImageModel,
    "wan": WanModel,
    "hunyuan_video": HunyuanVideoModel,
}

ARCH_ALIASES: dict[str, str] = {
    "flux.1": "flux",
    "flux1": "flux",
    "sd3.5": "sd3",
    "sd35": "sd3",
    "stable_diffusion_3": "sd3",
    "qwen-image": "qwen_image",
    "qwenimage": "qwen_image",
    "qwen": "qwen_image",
    "wan2.1": "wan",
    "wan21": "wan",
    "hunyuan": "hunyuan_video",
    "hunyuanvideo": "hunyuan_video",
    "hunyuan-video": "hunyuan_video",
}


def canonical_arch(arch: str) -> str:
    """The canonical name of ``arch`` (case-insensitive, aliases allowed); ValueError lists known ones."""
    key = str(arch).strip().lower()
    key = ARCH_ALIASES.get(key, key)
    if key not in MODEL_REGISTRY:
        raise ValueError(
            f"unknown model arch {arch!r}; known: {sorted(MODEL_REGISTRY)} (aliases: {sorted(ARCH_ALIASES)})"
        )
    return key
