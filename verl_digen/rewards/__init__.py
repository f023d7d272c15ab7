"""Rewards: offline rewards, a seeded random-CNN stand-in, real reward-model loaders, registry, combiner.

Every reward is called as ``reward(images, prompts, latents=None, rows=None)`` with decoded pixels in [0, 1] of
shape (B, 3, H, W) or (B, 3, F, H, W) and returns float64 scores of shape (B,).
"""

from .base import (
    REWARD_DTYPE,
    MissingRewardDependencyError,
    MissingRewardWeightsError,
    Reward,
    Rows,
    check_inputs,
    to_pil,
    to_uint8_hwc,
)
from .combine import MultiReward, build_reward
from .external import HPSv2, ImageRewardScore, PickScore
from .neural import RandomCNN
from .ocr import OcrReward, extract_quoted_text, levenshtein, normalize_ocr_text, ocr_similarity
from .offline import (
    Brightness,
    Colorfulness,
    JpegCompressibility,
    JpegIncompressibility,
    LatentMean,
    LatentTarget,
    jpeg_size_kb,
)
from .registry import DEFAULT_LEARNABLE_REWARD, REWARDS, register_reward

__all__ = [
    "DEFAULT_LEARNABLE_REWARD",
    "REWARDS",
    "REWARD_DTYPE",
    "Brightness",
    "Colorfulness",
    "HPSv2",
    "ImageRewardScore",
    "JpegCompressibility",
    "JpegIncompressibility",
    "LatentMean",
    "LatentTarget",
    "MissingRewardDependencyError",
    "MissingRewardWeightsError",
    "MultiReward",
    "OcrReward",
    "PickScore",
    "RandomCNN",
    "Reward",
    "Rows",
    "build_reward",
    "check_inputs",
    "extract_quoted_text",
    "jpeg_size_kb",
    "levenshtein",
    "normalize_ocr_text",
    "ocr_similarity",
    "register_reward",
    "to_pil",
    "to_uint8_hwc",
]
