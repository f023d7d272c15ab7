"""vLLM-Omni's per-request outputs back into verl-digen ``Trajectories``.

Each output is one request's ``OmniRequestOutput`` (vllm-omni 0.30.0, ``vllm_omni/outputs/__init__.py``):
``images`` a list (PIL images from the stock post-processors, or tensors / arrays), and the
``trajectory_latents`` / ``trajectory_log_probs`` / ``trajectory_timesteps`` tensors, each with a leading
batch dimension of one (the request's slice of its batch). Two layouts are read:

- ``DIGEN`` (verl-digen's pipelines): latents (1, 2K + 1, *latent) unpacked, the K trained steps'
  (state, next state) pairs interleaved then the final latents; log-probs (1, K); timesteps (1, K) the
  sigma of each trained step in float64, exactly the request's.
- ``VERL_OMNI`` (verl-omni's RL pipelines): the SDE window only, latents (1, W + 1, *latent) (packed tokens
  for FLUX / Qwen-Image), log-probs (1, W), timesteps (1, W) in scheduler units (1000 sigma). Final latents
  are known only when the window reaches the last step; otherwise they are NaN.

Either way the step of every recorded latent is found by matching its timestep against verl-digen's own
schedule, and a mismatch (an engine that shifted the sigmas a second time) is refused, not trained on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from verl_digen.models.packing import unpack_2x2

DIGEN = "digen"
VERL_OMNI = "verl_omni"
LAYOUTS = (DIGEN, VERL_OMNI)
#: how far a recorded timestep may sit from the schedule's sigma (verl-omni records float32 1000 sigma)
SIGMA_ATOL = 5e-4


@dataclass
class ParsedRow:
    """One request's trained steps and what was decoded."""

    steps: torch.Tensor  # (K,) step indices
    states: torch.Tensor  # (K, *latent)
    next_states: torch.Tensor  # (K, *latent)
    log_probs: torch.Tensor  # (K,)
    final: torch.Tensor  # (*latent)
    image: torch.Tensor | None  # (3, H, W) or (3, F, H, W) in [0, 1]


def _one(value: Any, name: str) -> torch.Tensor:
    """A request's tensor without its batch dimension of one."""
    if value is None:
        raise RuntimeError(f"vLLM-Omni returned no {name}: serve the model with an RL pipeline that records "
                           f"trajectories (rollout.vllm_pipeline; verl-digen's own by default)")
    t = torch.as_tensor(np.asarray(value)) if not isinstance(value, torch.Tensor) else value
    if t.dim() == 0 or t.shape[0] != 1:
        raise RuntimeError(f"{name} of one request must have a leading batch dimension of 1, got {tuple(t.shape)}")
    return t[0].detach().cpu()


def match_steps(sigmas: torch.Tensor, schedule: torch.Tensor, atol: float = SIGMA_ATOL) -> torch.Tensor:
    """Step index of each recorded sigma in ``schedule`` (T + 1 descending values); refuses a sigma that is
    on no step of it."""
    sched = schedule[:-1].to(torch.float64)
    diff = (sigmas.to(torch.float64).reshape(-1, 1) - sched.reshape(1, -1)).abs()
    best = diff.min(dim=1)
    if bool((best.values > atol).any()):
        raise RuntimeError(
            f"the engine stepped on sigmas {sigmas.tolist()} that are not on verl-digen's schedule "
            f"{sched.tolist()} (was the schedule shifted a second time by scheduler.set_timesteps?); refusing "
            "trajectories the trainer would recompute on other sigmas")
    return best.indices


def to_pixels(image: Any) -> torch.Tensor:
    """One request's decoded output in [0, 1], channels first: (3, H, W), or (3, F, H, W) for video. Takes a
    PIL image, a list of frames, or a tensor / array (uint8 or float in [0, 1]; HWC, CHW, FHWC or CFHW, each with
    or without a leading batch axis of 1)."""
    if isinstance(image, (list, tuple)):
        frames = [to_pixels(f) for f in image]
        return frames[0] if len(frames) == 1 else torch.stack(frames, dim=1)
    if hasattr(image, "convert") and not isinstance(image, (torch.Tensor, np.ndarray)):  # PIL
        image = np.array(image.convert("RGB"))
    t = torch.as_tensor(np.array(image)) if not isinstance(image, torch.Tensor) else image.detach().cpu()
    t = t.float() / 255.0 if t.dtype == torch.uint8 else t.float()
    # one request's video with its batch axis: the stock Wan post-processor returns (1, F, H, W, C)
    # (vllm_omni/diffusion/models/wan2_2/pipeline_wan2_2.py:264-297)
    if t.dim() == 5 and t.shape[0] == 1:
        t = t[0]
    if t.dim() == 4 and t.shape[0] == 1:
        t = t[0]
    if t.dim() == 3:
        return t if t.shape[0] in (1, 3) else t.permute(2, 0, 1)
    if t.dim() == 4:  # video: (F, H, W, C), (F, C, H, W) or (C, F, H, W)
        if t.shape[-1] in (1, 3):
            return t.permute(3, 0, 1, 2)
        return t if t.shape[0] in (1, 3) else t.permute(1, 0, 2, 3)
    raise ValueError(f"cannot read a decoded output of shape {tuple(t.shape)}")


def _latents(t: torch.Tensor, latent_shape: tuple[int, ...], packed: bool) -> torch.Tensor:
    if packed and t.dim() == 3:  # (N, tokens, 4C)
        t = unpack_2x2(t, latent_shape[-2], latent_shape[-1])
    if tuple(t.shape[1:]) != tuple(latent_shape):
        raise RuntimeError(f"trajectory latents of shape {tuple(t.shape)} do not hold latents {latent_shape}")
    return t


def parse_output(
    out: Any, layout: str, schedule: torch.Tensor, train_steps: torch.Tensor, latent_shape: tuple[int, ...],
    *, packed: bool = False,
) -> ParsedRow:
    """The trained steps ``train_steps`` (K,) of one request's output ``out`` in ``layout``."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown vLLM-Omni output layout {layout!r}; expected one of {', '.join(LAYOUTS)}")
    req = getattr(out, "request_output", None) or out
    if getattr(req, "error", None):
        raise RuntimeError(f"vLLM-Omni request failed: {req.error}")
    lat = _one(getattr(req, "trajectory_latents", None), "trajectory_latents")
    lp = _one(getattr(req, "trajectory_log_probs", None), "trajectory_log_probs").reshape(-1)
    ts = _one(getattr(req, "trajectory_timesteps", None), "trajectory_timesteps").reshape(-1)
    if layout == VERL_OMNI:
        ts = ts.to(torch.float64) / 1000.0
    recorded = match_steps(ts, schedule)
    want = train_steps.reshape(-1).to(torch.long)
    if layout == DIGEN:
        if lat.shape[0] != 2 * lp.shape[0] + 1 or not torch.equal(recorded, want):
            raise RuntimeError(f"verl-digen layout: {lat.shape[0]} latents, {lp.shape[0]} log-probs, steps "
                               f"{recorded.tolist()}; expected 2K + 1 latents for steps {want.tolist()}")
        lat = _latents(lat, latent_shape, packed)
        states, nexts, final = lat[0:-1:2], lat[1:-1:2], lat[-1]
        log_probs = lp
    else:
        if lat.shape[0] != lp.shape[0] + 1 or bool((recorded[1:] != recorded[:-1] + 1).any()):
            raise RuntimeError(f"verl-omni layout: {lat.shape[0]} latents for {lp.shape[0]} log-probs at steps "
                               f"{recorded.tolist()}; expected W + 1 latents of one contiguous window")
        pos = want - recorded[0]
        if bool(((pos < 0) | (pos >= lp.shape[0])).any()):
            raise RuntimeError(f"trained steps {want.tolist()} lie outside the recorded SDE window "
                               f"{recorded.tolist()}")
        lat = _latents(lat, latent_shape, packed)
        states, nexts, log_probs = lat[pos], lat[pos + 1], lp[pos]
        ends_last = int(recorded[-1]) == schedule.shape[0] - 2
        final = lat[-1] if ends_last else torch.full_like(lat[-1], float("nan"))
    images = getattr(req, "images", None)
    image = to_pixels(images[0] if isinstance(images, list) else images) if images is not None and len(images) else None
    return ParsedRow(want, states, nexts, log_probs, final, image)
