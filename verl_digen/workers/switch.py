"""A trainer rank's training state moved out of the way and back: TAG's context switch and the optimizer
offload. Torch alone (no verl, no Ray), so bench/gpu_check.py times the round trip on a bare CUDA machine.

On a GPU the AdamW state goes to host memory and the gradients to host copies, freeing the GPU for the
generation weights; on a CPU rank (nothing to free) the state is moved into a stash of detached copies
and the live tensors are released. Either way ``restore`` puts back exactly what ``stash`` took.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch


@torch.no_grad()
def move_optimizer_state(optimizer: torch.optim.Optimizer, device: torch.device | str) -> None:
    """Every tensor of the optimizer's state to ``device`` (the AdamW moments, not the step counts'
    Python numbers)."""
    for state in optimizer.state.values():
        for key, value in state.items():
            if torch.is_tensor(value):
                state[key] = value.to(device, non_blocking=True)


@dataclass
class TrainingStash:
    """What ``stash`` moved out: gradients by parameter name, and (CPU ranks) optimizer state by name."""

    grads: dict[str, torch.Tensor] = field(default_factory=dict)
    optim: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.grads or self.optim)


def stash(named_params: Iterable[tuple[str, torch.Tensor]], optimizer: torch.optim.Optimizer,
          device: torch.device, into: TrainingStash) -> None:
    """Move the gradients and the optimizer state off ``device`` into ``into`` (see the module doc)."""
    on_gpu = device.type != "cpu"
    if on_gpu:
        move_optimizer_state(optimizer, "cpu")
    for name, p in named_params:
        if p.grad is not None:
            into.grads[name] = p.grad.detach().to("cpu", copy=True)
            p.grad = None
        if not on_gpu and p in optimizer.state:
            state = optimizer.state.pop(p)
            into.optim[name] = {k: v.detach().clone() if torch.is_tensor(v) else v for k, v in state.items()}
            del state
    if on_gpu:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def restore(named_params: Iterable[tuple[str, torch.Tensor]], optimizer: torch.optim.Optimizer,
            device: torch.device, stashed: TrainingStash, optimizer_on_host: bool = False) -> None:
    """Put back what :func:`stash` took, bit-identical. ``optimizer_on_host``: a GPU rank with
    ``actor.optimizer_offload`` keeps the AdamW state on the host until its optimizer step."""
    on_gpu = device.type != "cpu"
    for name, p in named_params:
        if name in stashed.grads:
            g = stashed.grads.pop(name)
            p.grad = g.to(device) if on_gpu else g
        if name in stashed.optim:
            optimizer.state[p] = stashed.optim.pop(name)
    if on_gpu and not optimizer_on_host:
        move_optimizer_state(optimizer, device)
        torch.cuda.synchronize()
