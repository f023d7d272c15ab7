"""The algorithms ``algorithm.name`` selects: which SDE the rollout samples with and which per-row surrogate
the trainer takes (``loss.LOSS_MODES``). Names are verl-omni's (``model.algorithm`` / ``diffusion_loss.loss_mode``).

``flow_grpo``, ``dance_grpo`` and ``cps`` are FlowGRPO's clipped loss with that SDE (the name sets
``rollout.sde_type``); ``grpo_guard`` and ``flow_dppo`` change the loss and keep ``rollout.sde_type``'s SDE.
``mix_grpo`` is FlowGRPO's loss and ``rollout.sde_type``'s SDE inside MixGRPO's sliding window
(``mix_grpo.py``): the window's steps are SDE steps and trained, the rest ODE steps.
``diffusion_nft`` is DiffusionNFT (``diffusion_nft.py``): an ODE rollout that keeps only clean samples and
the forward-process loss on K noised rows per sample; ``rollout.sde_type`` is not read.
``null`` is today's behaviour: FlowGRPO's loss with ``rollout.sde_type``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Algorithm:
    sde: str | None  # the SDE the name fixes; None: rollout.sde_type's
    loss: str  # loss.LOSS_MODES


ALGORITHMS: dict[str, Algorithm] = {
    "flow_grpo": Algorithm("flow_grpo", "flow_grpo"),
    "dance_grpo": Algorithm("dance_grpo", "flow_grpo"),
    "cps": Algorithm("cps", "flow_grpo"),
    "grpo_guard": Algorithm(None, "grpo_guard"),
    "flow_dppo": Algorithm(None, "flow_dppo"),
    "mix_grpo": Algorithm(None, "flow_grpo"),
    "diffusion_nft": Algorithm(None, "diffusion_nft"),
}

#: DiffusionNFT's options (diffusion_nft.py), here so that the config checks them without torch
ADV_MODES = ("continuous", "positive_only", "negative_only", "one_only", "binary")

#: old_policy_decay_schedule -> (warm-up steps at d = 0, d's rise per step, d's cap); verl-omni's schedules
OLD_POLICY_SCHEDULES: dict[str, tuple[int, float, float]] = {
    "copy": (0, 0.0, 0.0),
    "linear_to_0_5": (0, 0.001, 0.5),
    "delayed_linear_to_0_999": (75, 0.0075, 0.999),
}

def loss_mode(name: str | None) -> str:
    """The loss mode of ``algorithm.name`` (FlowGRPO's for null)."""
    return "flow_grpo" if name is None else ALGORITHMS[name].loss
