"""What an adapter class declares about its architecture, and the tiny building blocks it declares with.

Every per-architecture fact lives on the adapter class (``flux.py``, ``wan.py``, ...): the diffusers
classes and default size of the released pipeline (``PretrainedSpec``), the tiny random-weight config
(``TinySpec``), packing, the text widths, the VAE compression and the call to the pipeline's own
``encode_prompt``. ``loading.py``, ``tiny.py`` and ``conditioning/text.py`` read those attributes and
never switch on an architecture name, so adding a model is one adapter file plus one line in ``arch.py``
(see docs/architecture.md, "Adding a model"). This module imports no adapter, so adapter files can
import it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import diffusers
from torch import nn


@dataclass(frozen=True)
class SequencePlan:
    """Where Ulysses sequence parallelism cuts the transformer (``models/ulysses.py``; module names as in
    ``named_modules``). Video architectures declare one; the others cannot be cut."""

    rope: str  # its output (cos, sin) is sliced along the tokens
    rope_token_dim: int
    first_blocks: tuple[str, ...]  # the first of these that exists gets its image tokens sliced
    attention: tuple[str, ...]  # attention modules (glob) whose processor attends over all image tokens
    output: str  # its output (B, tokens, C) is all-gathered along the tokens
    #: parameter-name prefixes whose gradient diffusers sums over the tokens in float32 whatever the model dtype:
    #: with the tokens split over ranks the halves round apart, so a float64 model agrees with one rank to ~1e-8
    #: relative there, not to float64
    float32_reduced: tuple[str, ...] = ()


@dataclass(frozen=True)
class PretrainedSpec:
    """Diffusers class names, text encoders and default generation size of one released pipeline."""

    pipeline_class: str
    transformer_class: str
    vae_class: str
    #: the pipeline's text-encoder attributes, in order (their tokenizers are named alike)
    text_encoders: tuple[str, ...]
    height: int
    width: int
    num_frames: int | None = None  # pixel frames, video only
    #: text length the pipeline pads/truncates prompts to (what diffusers' pipeline uses by default)
    max_sequence_length: int = 512
    #: guidance enters as an embedding (FLUX.1-dev, HunyuanVideo): one transformer pass, no CFG branch
    guidance_distilled: bool = False
    #: channels of the VAE's latent (16 for FLUX, SD3.5, Qwen-Image, Wan2.1, HunyuanVideo; Wan2.2's is 48)
    latent_channels: int = 16


@dataclass(frozen=True)
class TinySpec:
    """A tiny random-weight model: keyword arguments of the real transformer class
    (``PretrainedSpec.transformer_class``) and a factory for a tiny VAE of the architecture's family."""

    transformer_kwargs: dict[str, Any]
    vae: Callable[[], nn.Module]


TINY_TEXT_LEN = 8  # tokens per prompt for hashed embeddings
TINY_TEXT_DIM = 32
TINY_POOLED_DIM = 32
TINY_LATENT_CHANNELS = 4
#: per-channel latent statistics of the tiny Wan-family VAEs (non-trivial, so decoding tests see them)
TINY_LATENTS_MEAN = [0.1, -0.1, 0.0, 0.2]
TINY_LATENTS_STD = [1.0, 0.8, 1.2, 1.1]


def tiny_image_vae(scaling: float, shift: float) -> nn.Module:
    """A 2x ``AutoencoderKL`` (FLUX / SD3 family) with the released model's scaling and shift."""
    return diffusers.AutoencoderKL(
        in_channels=3,
        out_channels=3,
        latent_channels=TINY_LATENT_CHANNELS,
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2,
        block_out_channels=(8, 16),
        layers_per_block=1,
        norm_num_groups=4,
        sample_size=64,
        scaling_factor=scaling,
        shift_factor=shift,
    )


def tiny_wan_family_vae(cls_name: str) -> nn.Module:
    """A 2x spatial, no temporal compression Wan2.1-style VAE (``AutoencoderKLWan`` / ``...QwenImage``)."""
    cls = getattr(diffusers, cls_name)
    return cls(
        base_dim=8,
        z_dim=TINY_LATENT_CHANNELS,
        dim_mult=[1, 2],
        num_res_blocks=1,
        attn_scales=[],
        temperal_downsample=[False],
        latents_mean=TINY_LATENTS_MEAN,
        latents_std=TINY_LATENTS_STD,
    )
