"""A micro-batch as vLLM-Omni requests: one prompt dict per sample, one set of sampling settings per batch.

vllm-omni batches requests whose batch-wide sampling fields agree and does not key batches on
``extra_args``; the synchronous ``Omni.generate`` also hands every prompt the same sampling-params object.
So everything that differs per sample (its ids, which steps it trains) travels in its prompt dict under
``additional_information["digen"]``, and the batch-wide settings (verl-digen's sigmas verbatim, SDE kind,
noise level, SDE mask) in ``extra_args["digen"]``. The same ``extra_args`` also carry the keys verl-omni's RL
pipelines read (``sde_type`` in their spelling, ``noise_level``, the SDE window), and ``sigmas`` holds the
*unshifted* schedule: a pipeline that hands it to ``scheduler.set_timesteps`` shifts it once, into ours.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from verl_digen.archs import ARCHS, arch_facts

if TYPE_CHECKING:  # torch is imported where a batch is built: the config reads this module's names without it
    import torch

    from verl_digen.rollout.sampler import SamplerConfig

#: the key of verl-digen's per-row data (prompt dict) and batch settings (``extra_args``)
DIGEN_KEY = "digen"
#: verl-digen's SDE kinds in verl-omni's spelling (its FlowMatchSDEDiscreteScheduler asserts these)
VERL_OMNI_SDE_TYPES = {"flow_grpo": "sde", "dance_grpo": "dance_sde", "cps": "cps"}


def pipeline_class(arch: str, override: str | None = None) -> str:
    """The pipeline the engine installs (``custom_pipeline_args={"pipeline_class": ...}``): ``override``
    (``rollout.vllm_pipeline``) or verl-digen's own for the architecture (``ArchFacts.rl_pipeline``)."""
    return override or arch_facts(arch).rl_pipeline


def is_digen_pipeline(qualname: str) -> bool:
    """Whether ``qualname`` is one of verl-digen's pipelines (its output layout: ``output.DIGEN``)."""
    return any(qualname == f.rl_pipeline for f in ARCHS.values())


@dataclass(frozen=True)
class RowRequest:
    """One sample's identity: its random streams are (seed, step, prompt_id, noise_sample / sample_id)."""

    seed: int
    step: int
    prompt_id: int
    sample_id: int
    init_sample: int  # the sample index x_T is drawn for: 0 for every sample under shared group noise
    train_steps: tuple[int, ...]  # the steps recorded for the trainer, sorted

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "train_steps": list(self.train_steps)}

    @classmethod
    def from_prompt(cls, prompt: Any) -> RowRequest:
        """The row a request's prompt dict carries; a clear error for a prompt built elsewhere."""
        info = prompt.get("additional_information") if isinstance(prompt, dict) else None
        row = info.get(DIGEN_KEY) if isinstance(info, dict) else None
        if not isinstance(row, dict):
            raise ValueError("a verl-digen RL pipeline needs each prompt as a dict with additional_information"
                             f"['{DIGEN_KEY}'] (built by verl_digen.rollout.omni.request.build_requests); got "
                             f"{type(prompt).__name__}")
        return cls(**{**row, "train_steps": tuple(int(i) for i in row["train_steps"])})


@dataclass(frozen=True)
class StepSettings:
    """Batch-wide stepping: sigmas used verbatim (float64 values), SDE kind, noise level, per-step mask."""

    sigmas: tuple[float, ...]
    sde: str
    eta: float
    log_prob: str
    sde_mask: tuple[bool, ...]
    guidance_scale: float
    latent_shape: tuple[int, ...]  # unpacked, per sample

    def to_dict(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(self).items()}

    @classmethod
    def from_extra_args(cls, extra_args: dict[str, Any] | None) -> StepSettings:
        d = (extra_args or {}).get(DIGEN_KEY)
        if not isinstance(d, dict):
            raise ValueError(f"a verl-digen RL pipeline needs extra_args['{DIGEN_KEY}'] (build_requests)")
        return cls(sigmas=tuple(float(s) for s in d["sigmas"]), sde=d["sde"], eta=float(d["eta"]),
                   log_prob=d["log_prob"], sde_mask=tuple(bool(m) for m in d["sde_mask"]),
                   guidance_scale=float(d["guidance_scale"]), latent_shape=tuple(int(s) for s in d["latent_shape"]))

    def sigma_tensor(self, dtype: torch.dtype, device: torch.device | str = "cpu") -> torch.Tensor:
        """The schedule as the diffusers sampler builds it: float64 values cast to ``dtype``."""
        import torch

        return torch.tensor(self.sigmas, dtype=torch.float64).to(dtype=dtype, device=device)


@dataclass
class EngineRequests:
    """What ``Omni.generate`` takes for one micro-batch: prompt dicts and one sampling-params kwargs."""

    prompts: list[dict[str, Any]]
    params: dict[str, Any]  # OmniDiffusionSamplingParams(**params)
    rows: list[RowRequest]


def pixel_size(latent_shape: tuple[int, ...], spatial: int, temporal: int) -> tuple[int, int, int]:
    """(height, width, frames) in pixels of an unpacked latent shape; frames 1 for images (causal video VAEs:
    F latent frames are (F - 1) * temporal + 1 pixel frames)."""
    h, w = latent_shape[-2] * spatial, latent_shape[-1] * spatial
    frames = (latent_shape[1] - 1) * temporal + 1 if len(latent_shape) == 4 else 1
    return h, w, frames


def verl_omni_window(sampler: SamplerConfig, seed: int, step: int) -> tuple[int, list[int]]:
    """(sde_window_size, sde_window_range) that make verl-omni's pipelines inject noise where verl-digen does:
    the step's own window (a range that admits one start), or every step."""
    t = sampler.num_steps
    if sampler.selection.kind == "window":
        start, end = sampler.selection.window(t, seed, step)
        return end - start, [start, end]
    return t, [0, t]


def build_requests(
    sampler: SamplerConfig,
    seed: int,
    step: int,
    prompt_ids: list[int],
    sample_ids: list[int],
    prompts: list[str],
    *,
    latent_shape: tuple[int, ...],
    pixels: tuple[int, int, int],
    negative_prompt: str = "",
    lora_request: Any = None,
) -> EngineRequests:
    """Prompt dicts and sampling-params kwargs for one micro-batch (``pixels``: height, width, frames)."""
    import torch

    from verl_digen.algo.sigmas import flow_sigmas

    sampler.validate()
    if not (len(prompt_ids) == len(sample_ids) == len(prompts)):
        raise ValueError(f"one row per sample: {len(prompt_ids)} prompt ids, {len(sample_ids)} sample ids, "
                         f"{len(prompts)} prompts")
    if sampler.sde not in VERL_OMNI_SDE_TYPES:
        raise ValueError(f"sde={sampler.sde!r} has no vLLM-Omni rollout; use one of {', '.join(VERL_OMNI_SDE_TYPES)}")
    selected = sampler.selection.select(sampler.num_steps, seed, step, prompt_ids, sample_ids)
    rows = [RowRequest(seed, step, int(p), int(s), 0 if sampler.shared_group_noise else int(s),
                       tuple(int(i) for i in selected[r].tolist()))
            for r, (p, s) in enumerate(zip(prompt_ids, sample_ids, strict=True))]
    settings = StepSettings(
        sigmas=tuple(sampler.sigmas(torch.float64).tolist()), sde=sampler.sde, eta=float(sampler.eta),
        log_prob=sampler.log_prob, sde_mask=tuple(bool(m) for m in sampler.sde_mask(seed, step).tolist()),
        guidance_scale=float(sampler.guidance_scale), latent_shape=tuple(int(d) for d in latent_shape),
    )
    window, window_range = verl_omni_window(sampler, seed, step)
    height, width, frames = pixels
    params = dict(
        num_inference_steps=sampler.num_steps, guidance_scale=float(sampler.guidance_scale),
        guidance_scale_provided=True, height=height, width=width, num_frames=frames,
        sigmas=flow_sigmas(sampler.num_steps, 1.0, torch.float64)[:-1].tolist(),
        return_trajectory_latents=True, lora_request=lora_request,
        extra_args={DIGEN_KEY: settings.to_dict(), "sde_type": VERL_OMNI_SDE_TYPES[sampler.sde],
                    "noise_level": float(sampler.eta), "logprobs": True, "sde_window_size": window,
                    "sde_window_range": window_range},
    )
    dicts = [{"prompt": text, "negative_prompt": negative_prompt,
              "additional_information": {DIGEN_KEY: row.to_dict()}} for text, row in zip(prompts, rows)]
    return EngineRequests(dicts, params, rows)
