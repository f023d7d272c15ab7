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


def _nbytes(t: torch.Tensor) -> int:
    t = t.to_local() if hasattr(t, "to_local") else t  # a DTensor moves its local shard only
    return t.numel() * t.element_size()


def state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of this rank's optimizer state tensors (what a GPU switch moves to the host and back)."""
    return sum(_nbytes(v) for state in optimizer.state.values() for v in state.values() if torch.is_tensor(v))


def stash(named_params: Iterable[tuple[str, torch.Tensor]], optimizer: torch.optim.Optimizer,
          device: torch.device, into: TrainingStash) -> int:
    """Move the gradients and the optimizer state off ``device`` into ``into`` (see the module doc);
    returns the bytes copied (across PCIe on a GPU, into host copies on a CPU rank)."""
    on_gpu = device.type != "cpu"
    moved = 0
    if on_gpu:
        moved += state_bytes(optimizer)
        move_optimizer_state(optimizer, "cpu")
    for name, p in named_params:
        if p.grad is not None:
            moved += _nbytes(p.grad)
            into.grads[name] = p.grad.detach().to("cpu", copy=True)
            p.grad = None
        if not on_gpu and p in optimizer.state:
            state = optimizer.state.pop(p)
            into.optim[name] = {k: v.detach().clone() if torch.is_tensor(v) else v for k, v in state.items()}
            moved += sum(_nbytes(v) for v in state.values() if torch.is_tensor(v))
            del state
    if on_gpu:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    return moved


def restore(named_params: Iterable[tuple[str, torch.Tensor]], optimizer: torch.optim.Optimizer,
            device: torch.device, stashed: TrainingStash, optimizer_on_host: bool = False) -> int:
    """Put back what :func:`stash` took, bit-identical. ``optimizer_on_host``: a GPU rank with
    ``actor.optimizer_offload`` keeps the AdamW state on the host until its optimizer step. Returns the
    bytes moved back onto the device (none on a CPU rank, whose stash is handed back as it is)."""
    on_gpu = device.type != "cpu"
    moved = 0
    for name, p in named_params:
        if name in stashed.grads:
            g = stashed.grads.pop(name)
            p.grad = g.to(device) if on_gpu else g
            moved += _nbytes(g) if on_gpu else 0
        if name in stashed.optim:
            optimizer.state[p] = stashed.optim.pop(name)
    if on_gpu and not optimizer_on_host:
        moved += state_bytes(optimizer)
        move_optimizer_state(optimizer, device)
        torch.cuda.synchronize()
    return moved
