"""Loading real weights from a local directory or an already-cached hub id, the way a cluster job does.

Everything goes through diffusers' own ``from_pretrained`` with ``local_files_only=True`` by default:
verl-digen never downloads at run time (workers on a cluster usually cannot), so missing weights fail
fast with a message naming the path instead of hanging on the network.
"""

from __future__ import annotations

import os
from typing import Any

import diffusers
import torch
from torch import nn

from verl_digen.models.adapter import DiffusersAdapter
from verl_digen.models.arch import MODEL_REGISTRY, canonical_arch
from verl_digen.models.conditioning.hashed import HashedPromptEncoder
from verl_digen.models.conditioning.text import PipelinePromptEncoder


class WeightsNotFoundError(FileNotFoundError):
    """Raised when weights are not present locally (nothing is downloaded at run time)."""


def _dtype_kwarg(dtype: torch.dtype) -> dict[str, torch.dtype]:
    """diffusers >= 0.36 spells it ``dtype`` (``torch_dtype`` is deprecated); older ones ``torch_dtype``."""
    try:
        from diffusers.utils.deprecation_utils import _resolve_dtype  # noqa: F401
    except ImportError:
        return {"torch_dtype": dtype}
    return {"dtype": dtype}


def _missing(path_or_id: str, what: str, err: BaseException) -> WeightsNotFoundError:
    where = "local directory" if os.path.isdir(path_or_id) else "path or hub id"
    return WeightsNotFoundError(
        f"cannot load {what} from {where} {path_or_id!r}: the weights must be present locally "
        f"(a diffusers directory with model_index.json, or a hub id already in the Hugging Face cache; "
        f"verl-digen does not download at run time; fetch them first, e.g. "
        f"`huggingface-cli download {path_or_id} --local-dir DIR`). Underlying error: {type(err).__name__}: {err}"
    )


def latent_shape_for(
    arch: str,
    transformer: nn.Module,
    vae: nn.Module | None,
    height: int | None = None,
    width: int | None = None,
    num_frames: int | None = None,
) -> tuple[int, ...]:
    """Unpacked latent shape for a pixel size (the adapter's ``pretrained`` defaults when omitted)."""
    cls = MODEL_REGISTRY[canonical_arch(arch)]
    spec = cls.pretrained
    height, width = height or spec.height, width or spec.width
    in_ch = transformer.config.in_channels
    channels = in_ch // 4 if cls.packed else in_ch
    spatial, temporal = cls.vae_factors(vae)
    h, w = height // spatial, width // spatial
    if cls.packed:  # packing needs even latent sides
        h, w = 2 * (h // 2), 2 * (w // 2)
    if cls.latent_ndim == 4:
        return (channels, h, w)
    frames = num_frames or spec.num_frames
    return (channels, (frames - 1) // temporal + 1, h, w)


def hashed_encoder_for(arch: str, transformer: nn.Module, seq_len: int = 8) -> HashedPromptEncoder:
    """Hashed prompt embeddings shaped for ``transformer`` (used when no text encoder is loaded)."""
    cls = MODEL_REGISTRY[canonical_arch(arch)]
    text_dim, pooled_dim = cls.prompt_dims(transformer.config)
    return HashedPromptEncoder(seq_len, text_dim, pooled_dim, salt=f"hashed-{cls.arch}")


def load_pipeline(
    arch: str,
    path_or_id: str,
    dtype: torch.dtype = torch.bfloat16,
    *,
    text_encoders: bool = True,
    local_files_only: bool = True,
    **kwargs: Any,
) -> Any:
    """The diffusers pipeline of ``arch`` from ``path_or_id``; ``text_encoders=False`` skips loading them
    (trainer processes that get precomputed embeddings)."""
    arch = canonical_arch(arch)
    spec = MODEL_REGISTRY[arch].pretrained
    if not text_encoders:
        for name in spec.text_encoders:
            kwargs.setdefault(name, None)
            kwargs.setdefault(name.replace("text_encoder", "tokenizer"), None)
    cls = getattr(diffusers, spec.pipeline_class)
    try:
        return cls.from_pretrained(path_or_id, local_files_only=local_files_only, **_dtype_kwarg(dtype), **kwargs)
    except (OSError, ValueError) as err:  # huggingface_hub's "not in cache" errors are OSErrors
        if os.path.isfile(os.path.join(path_or_id, "model_index.json")) and not isinstance(err, OSError):
            raise ValueError(
                f"{arch} pipeline at {path_or_id!r} is incomplete or of another class ({err}); if it was saved "
                f"without text encoders, load it with text_encoders=False"
            ) from err
        raise _missing(path_or_id, f"{arch} pipeline ({spec.pipeline_class})", err) from err


def load_transformer(
    arch: str,
    path_or_id: str,
    dtype: torch.dtype = torch.bfloat16,
    device: torch.device | str = "cpu",
    *,
    subfolder: str | None = "transformer",
    local_files_only: bool = True,
) -> nn.Module:
    """Only the transformer (the trained policy) from the ``transformer`` subfolder of a pipeline."""
    arch = canonical_arch(arch)
    cls = getattr(diffusers, MODEL_REGISTRY[arch].pretrained.transformer_class)
    try:
        model = cls.from_pretrained(
            path_or_id, subfolder=subfolder, local_files_only=local_files_only, **_dtype_kwarg(dtype)
        )
    except (OSError, ValueError) as err:
        raise _missing(path_or_id, f"{arch} transformer ({cls.__name__}, subfolder={subfolder!r})", err) from err
    return model.to(device)


def load_pretrained(
    arch: str,
    path_or_id: str,
    dtype: torch.dtype = torch.bfloat16,
    device: torch.device | str = "cpu",
    *,
    height: int | None = None,
    width: int | None = None,
    num_frames: int | None = None,
    latent_size: int | None = None,
    latent_width: int | None = None,
    text_encoders: bool = True,
    negative_prompt: str = "",
    local_files_only: bool = True,
) -> DiffusersAdapter:
    """A ``DiffusionModel`` from a saved diffusers pipeline. Prompts go through the pipeline's text
    encoders; if the pipeline has none (``text_encoders=False`` or saved without them), through hashed
    embeddings shaped for the transformer. A pipeline missing only some text encoders is an error.
    ``latent_size`` (the latent height) and ``latent_width`` (None: square) set height and width, in
    latents x the VAE's spatial compression, when neither is given."""
    arch = canonical_arch(arch)
    cls = MODEL_REGISTRY[arch]
    spec = cls.pretrained
    pipe = load_pipeline(arch, path_or_id, dtype, text_encoders=text_encoders, local_files_only=local_files_only)
    has_encoders = _check_pipeline(pipe, spec.text_encoders, path_or_id)
    pipe.to(device)
    transformer = pipe.transformer
    if latent_size is not None and height is None and width is None:
        factor = cls.vae_factors(pipe.vae)[0]
        height, width = latent_size * factor, (latent_width or latent_size) * factor
    encoder = PipelinePromptEncoder(pipe, cls) if has_encoders else hashed_encoder_for(arch, transformer)
    shape = latent_shape_for(arch, transformer, pipe.vae, height, width, num_frames)
    scheduler = getattr(pipe, "scheduler", None)
    model = cls(
        transformer,
        pipe.vae,
        encoder,
        shape,
        negative_prompt=negative_prompt,
        scheduler_config=dict(scheduler.config) if scheduler is not None else None,
        **cls.pretrained_init,
    )
    model.pipeline = pipe  # the full pipeline, for users who want its other parts
    return model


def _check_pipeline(pipe: Any, text_encoders: tuple[str, ...], path_or_id: str) -> bool:
    """Refuse a pipeline with two transformers (one is trained) or with only some of its text encoders
    (prompts would be encoded half-way); True when it has all of them, False when it has none."""
    if getattr(pipe, "transformer_2", None) is not None:
        raise ValueError(
            f"{path_or_id!r} is a two-expert pipeline (transformer + transformer_2, switched at "
            f"boundary_ratio={getattr(pipe.config, 'boundary_ratio', None)}, e.g. Wan2.2 A14B); verl-digen trains "
            f"one transformer: use a single-transformer checkpoint (e.g. Wan2.2 TI2V-5B with model.arch=wan2_2)"
        )
    present = [getattr(pipe, n, None) is not None for n in text_encoders]
    if any(present) and not all(present):
        missing = [n for n, p in zip(text_encoders, present) if not p]
        raise ValueError(f"{path_or_id!r} lacks text encoder(s) {missing}; load it with text_encoders=False")
    return all(present)
