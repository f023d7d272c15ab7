"""Deterministic per-prompt embeddings for tiny models: no tokenizer, no download, no state.

The embedding of a prompt depends only on (salt, prompt text), so every process (generator, trainer,
TAG) that sees the same prompt produces bit-identical conditioning without shipping tensors around.
"""

from __future__ import annotations

import hashlib

import torch


def prompt_seed(text: str, salt: str = "") -> int:
    """A 63-bit seed from the prompt text (sha256, stable across processes and Python versions)."""
    digest = hashlib.sha256(f"{salt}\x00{text}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


class HashedPromptEncoder:
    """Maps each prompt to fixed random token embeddings, a pooled vector and a padding mask.

    The number of valid tokens is ``min(seq_len, words + 1)`` (a BOS-like first token is always
    valid), so masking code paths are exercised; padded positions are zero, as in the diffusers
    pipelines that zero-pad (Wan). Values are drawn in float64 and cast, so float32 and float64
    models see the same embedding up to rounding.
    """

    def __init__(self, seq_len: int, dim: int, pooled_dim: int | None = None, *, salt: str = "") -> None:
        if seq_len <= 0 or dim <= 0:
            raise ValueError(f"seq_len and dim must be positive, got {seq_len}, {dim}")
        self.seq_len, self.dim, self.pooled_dim, self.salt = seq_len, dim, pooled_dim, salt

    def encode_one(self, text: str) -> dict[str, torch.Tensor]:
        gen = torch.Generator().manual_seed(prompt_seed(text, self.salt))
        tokens = torch.randn(self.seq_len, self.dim, generator=gen, dtype=torch.float64)
        n_valid = min(self.seq_len, len(text.split()) + 1)
        mask = torch.zeros(self.seq_len, dtype=torch.long)
        mask[:n_valid] = 1
        out = {"prompt_embeds": tokens * mask[:, None], "prompt_mask": mask}
        if self.pooled_dim:
            out["pooled_prompt_embeds"] = torch.randn(self.pooled_dim, generator=gen, dtype=torch.float64)
        return out

    def __call__(
        self, prompts: list[str], *, device: torch.device | str | None = None, dtype: torch.dtype | None = None
    ) -> dict[str, torch.Tensor]:
        """Batched embeddings for ``prompts``; floating tensors in ``dtype``, the mask stays long."""
        if isinstance(prompts, str):
            raise TypeError("encode a list of prompts, not a single string")
        rows = [self.encode_one(p) for p in prompts]
        out = {}
        for key in rows[0]:
            t = torch.stack([r[key] for r in rows])
            out[key] = t.to(device=device, dtype=dtype if t.is_floating_point() else None)
        return out
