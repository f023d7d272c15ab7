"""Real text-encoder conditioning: delegates to the loaded diffusers pipeline's own ``encode_prompt``,
called by each adapter class's ``encode_with_pipeline``.

Calling the pipeline's method (rather than re-implementing tokenization) keeps prompt templates,
dropped system-prompt tokens (Qwen-Image, HunyuanVideo), CLIP+T5 concatenation (SD3) and padding
exactly as upstream does them. Outputs are renamed to the adapter keys and padded to a fixed length
so that conditionings of different micro-batches can be concatenated.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
import torch.nn.functional as F


class PromptEncoder(Protocol):
    """Anything that turns prompts into the adapter's conditioning tensors."""

    def __call__(
        self, prompts: list[str], *, device: torch.device | str | None = None, dtype: torch.dtype | None = None
    ) -> dict[str, torch.Tensor]: ...


def pad_tokens(t: torch.Tensor, length: int) -> torch.Tensor:
    """Zero-pad (or truncate) dim 1 to ``length``."""
    if t.shape[1] >= length:
        return t[:, :length]
    pad = [0, 0] * (t.dim() - 2) + [0, length - t.shape[1]]
    return F.pad(t, pad)


class PipelinePromptEncoder:
    """Prompt conditioning through a loaded pipeline's text encoders (no gradients). The call to the
    pipeline is the adapter class's ``encode_with_pipeline``; the text length defaults to its
    ``pretrained.max_sequence_length``."""

    def __init__(self, pipeline: Any, adapter: type, max_sequence_length: int | None = None) -> None:
        self.adapter = adapter  # the architecture's adapter class (models.arch.MODEL_REGISTRY)
        self.pipeline, self.arch = pipeline, adapter.arch
        self.max_sequence_length = max_sequence_length or self.adapter.pretrained.max_sequence_length

    @torch.no_grad()
    def __call__(
        self, prompts: list[str], *, device: torch.device | str | None = None, dtype: torch.dtype | None = None
    ) -> dict[str, torch.Tensor]:
        """Encode ``prompts`` with the pipeline; floating outputs are cast to ``dtype``."""
        n = len(prompts)
        out = self.adapter.encode_with_pipeline(
            self.pipeline, list(prompts), device=device, dtype=dtype, max_sequence_length=self.max_sequence_length
        )
        if any(t.shape[0] != n for t in out.values()):
            raise RuntimeError(f"{self.arch} encode_prompt returned a batch that is not {n} rows")
        return {k: v.to(device=device, dtype=dtype if v.is_floating_point() else None) for k, v in out.items()}
