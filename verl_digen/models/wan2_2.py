"""Wan2.2 TI2V-5B, text-to-video (``WanPipeline`` with ``expand_timesteps``): Wan2.1's transformer class and
text path, with the Wan2.2 VAE (residual blocks, 2x2 pixel patchify, 16x spatial / 4x temporal, 48
latent channels) and a 704 x 1280 default size.

The two-expert Wan2.2 A14B (``transformer`` for high noise, ``transformer_2`` for low noise, switched at
``boundary_ratio``) is refused when loaded (``loading.load_pretrained``): training it means two policies.
"""

from __future__ import annotations

from torch import nn

from verl_digen.models.spec import PretrainedSpec, TinySpec, tiny_wan22_vae
from verl_digen.models.wan import WanModel


class Wan22Model(WanModel):
    """Timestep convention: as Wan2.1 (``t = sigma * 1000``). The TI2V pipeline passes that timestep
    once per latent token (``expand_timesteps``) so that an image-conditioned first frame can sit at
    t = 0; in text-to-video every token of a row has the row's t, which the transformer computes
    identically from one timestep per row (tests/test_models.py checks the two agree), so the adapter
    passes one per row and saves the per-token time embeddings."""

    arch = "wan2_2"
    aliases = ("wan2.2", "wan22", "wan2.2-ti2v", "wan2.2-ti2v-5b")
    pretrained = PretrainedSpec(
        "WanPipeline", "WanTransformer3DModel", "AutoencoderKLWan", ("text_encoder",), 704, 1280, 33
    )
    tiny = TinySpec(dict(WanModel.tiny.transformer_kwargs), tiny_wan22_vae)

    @classmethod
    def vae_factors(cls, vae: nn.Module | None) -> tuple[int, int]:
        if vae is None:
            return 16, 4
        return vae.config.scale_factor_spatial or 16, vae.config.scale_factor_temporal or 4
