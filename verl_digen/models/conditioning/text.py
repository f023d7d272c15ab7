"""Real text-encoder conditioning: delegates to the loaded diffusers pipeline's own ``encode_prompt``.

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


#: default text lengths, as the diffusers pipelines use them (Qwen-Image is padded to a fixed length)
DEFAULT_MAX_SEQUENCE_LENGTH = {"flux": 512, "sd3": 256, "qwen_image": 512, "wan": 512, "hunyuan_video": 256}


def _pad_to(t: torch.Tensor, length: int) -> torch.Tensor:
    """Zero-pad (or truncate) dim 1 to ``length``."""
    if t.shape[1] >= length:
        return t[:, :length]
    pad = [0, 0] * (t.dim() - 2) + [0, length - t.shape[1]]
    return F.pad(t, pad)


class PipelinePromptEncoder:
    """Prompt conditioning through a loaded pipeline's text encoders (no gradients)."""

    def __init__(self, pipeline: Any, arch: str, max_sequence_length: int | None = None) -> None:
        if arch not in DEFAULT_MAX_SEQUENCE_LENGTH:
            raise ValueError(f"no text-encoder path for arch {arch!r}")
        self.pipeline, self.arch = pipeline, arch
        self.max_sequence_length = max_sequence_length or DEFAULT_MAX_SEQUENCE_LENGTH[arch]

    @torch.no_grad()
    def __call__(
        self, prompts: list[str], *, device: torch.device | str | None = None, dtype: torch.dtype | None = None
    ) -> dict[str, torch.Tensor]:
        """Encode ``prompts`` with the pipeline; floating outputs are cast to ``dtype``."""
        pipe, n, msl = self.pipeline, len(prompts), self.max_sequence_length
        out: dict[str, torch.Tensor]
        if self.arch == "flux":
            pe, pooled, _ = pipe.encode_prompt(prompt=prompts, prompt_2=None, device=device, max_sequence_length=msl)
            out = {"prompt_embeds": pe, "pooled_prompt_embeds": pooled}
        elif self.arch == "sd3":
            pe, _, pooled, _ = pipe.encode_prompt(
                prompt=prompts,
                prompt_2=None,
                prompt_3=None,
                device=device,
                do_classifier_free_guidance=False,
                max_sequence_length=msl,
            )
            out = {"prompt_embeds": pe, "pooled_prompt_embeds": pooled}
        elif self.arch == "qwen_image":
            pe, mask = pipe.encode_prompt(prompt=prompts, device=device, max_sequence_length=msl)
            if mask is None:
                mask = torch.ones(pe.shape[:2], dtype=torch.long, device=pe.device)
            out = {"prompt_embeds": _pad_to(pe, msl), "prompt_mask": _pad_to(mask.long(), msl)}
        elif self.arch == "wan":
            pe, _ = pipe.encode_prompt(
                prompt=prompts,
                negative_prompt=None,
                do_classifier_free_guidance=False,
                max_sequence_length=msl,
                device=device,
                dtype=dtype,
            )
            out = {"prompt_embeds": pe}
        else:  # hunyuan_video
            pe, pooled, mask = pipe.encode_prompt(
                prompt=prompts, prompt_2=None, device=device, dtype=dtype, max_sequence_length=msl
            )
            out = {"prompt_embeds": pe, "pooled_prompt_embeds": pooled, "prompt_mask": mask.long()}
        if any(t.shape[0] != n for t in out.values()):
            raise RuntimeError(f"{self.arch} encode_prompt returned a batch that is not {n} rows")
        return {k: v.to(device=device, dtype=dtype if v.is_floating_point() else None) for k, v in out.items()}
