"""Rewards: offline rewards, a seeded random-CNN stand-in, real reward-model loaders, registry, combiner.

Every reward is called as ``reward(images, prompts, latents=None, rows=None)`` with decoded pixels in [0, 1] of
shape (B, 3, H, W) or (B, 3, F, H, W) and returns float64 scores of shape (B,).

The names below load their module (and so torch) on first use: ``verl_digen.rewards.names`` (the registered
names, which a config check reads) is importable without torch.
"""

from __future__ import annotations

import importlib
from typing import Any

#: public name -> the submodule that defines it (loaded on first access: PEP 562)
_HOMES = {
    **dict.fromkeys(("REWARD_DTYPE", "MissingRewardDependencyError", "MissingRewardWeightsError", "Reward", "Rows",
                     "check_inputs", "to_pil", "to_uint8_hwc"), "base"),
    **dict.fromkeys(("MultiReward", "build_reward"), "combine"),
    **dict.fromkeys(("HPSv2", "ImageRewardScore", "PickScore"), "external"),
    "RandomCNN": "neural",
    **dict.fromkeys(("OcrReward", "extract_quoted_text", "levenshtein", "normalize_ocr_text", "ocr_similarity"),
                    "ocr"),
    **dict.fromkeys(("Brightness", "Colorfulness", "JpegCompressibility", "JpegIncompressibility", "LatentMean",
                     "LatentTarget", "jpeg_size_kb"), "offline"),
    **dict.fromkeys(("DEFAULT_LEARNABLE_REWARD", "REWARDS", "register_reward"), "registry"),
}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    """A public name from its submodule (imported now: torch for all but ``names``)."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value  # later reads skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})
