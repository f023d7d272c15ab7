"""What a rollout samples, as plain numbers: steps, schedule shift, SDE kind and noise level, CFG and which
steps are trained. No torch: the config's checks and plans (``RunConfig.trained_steps``) read K from here, so a
dry run never imports torch; ``rollout/sampler.py``'s ``SamplerConfig`` adds the tensors on top.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from verl_digen.algo.selection import StepSelection
from verl_digen.defaults import LOG_PROB_KINDS, NUM_STEPS, SDE_KINDS, TRAIN_STEPS


def check_sde(kind: str, eta: float, log_prob: str = "gaussian") -> None:
    """Raise a clear error for an unknown SDE kind or log-prob form, or a negative noise level."""
    if kind not in SDE_KINDS:
        raise ValueError(f"unknown SDE kind {kind!r}; expected one of {', '.join(SDE_KINDS)}")
    if log_prob not in LOG_PROB_KINDS:
        raise ValueError(f"unknown log-prob form {log_prob!r}; expected one of {', '.join(LOG_PROB_KINDS)}")
    if log_prob == "squared_error" and kind != "cps":
        raise ValueError(f"log_prob='squared_error' is the CPS convention of flow_grpo / verl-omni; "
                         f"sde kind {kind!r} uses the Gaussian log-density there too")
    if not (eta >= 0.0 and math.isfinite(eta)):
        raise ValueError(f"noise level eta must be a finite number >= 0, got {eta!r}")
    if kind == "cps" and eta > 1.0:
        raise ValueError(f"cps noise level eta must lie in [0, 1], got {eta!r}")


@dataclass(frozen=True)
class SamplerSpec:
    """How trajectories are sampled: steps, schedule shift, SDE kind and noise level, CFG, selection."""

    num_steps: int = NUM_STEPS
    shift: float = 1.0
    sde: str = "flow_grpo"
    eta: float = 0.7
    guidance_scale: float = 1.0
    selection: StepSelection = field(default_factory=lambda: StepSelection("first_k", k=TRAIN_STEPS))
    shared_group_noise: bool = False  # DanceGRPO: one initial noise per prompt group
    decode: bool = True
    log_prob: str = "gaussian"  # or "squared_error": flow_grpo / verl-omni's CPS log-prob (sde="cps" only)
    #: DiffusionNFT: a plain ODE rollout (no noise, no log-prob) that keeps only the clean samples; the
    #: trained steps give the trainer's rows their t (``algo.diffusion_nft.noised_rows``)
    clean_only: bool = False

    def validate(self) -> int:
        """Check the settings; return the number of trained steps K."""
        check_sde(self.sde, self.eta, self.log_prob)
        if self.clean_only:
            if self.selection.kind == "window":
                raise ValueError("a clean-only (DiffusionNFT) rollout has no SDE window: select first_k or random_k")
        elif self.sde == "ode" or self.eta == 0:
            raise ValueError(
                f"sde={self.sde!r} with eta={self.eta} samples deterministically: there is no log-prob "
                "to train on; use an SDE kind (flow_grpo, dance_grpo, cps) with eta > 0"
            )
        if self.guidance_scale < 1.0:
            raise ValueError(f"guidance_scale must be >= 1, got {self.guidance_scale}")
        return self.selection.num_trained(self.num_steps)
