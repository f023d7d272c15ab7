"""The trainer pool's data parallelism: torch FSDP2 over the policy transformer, and the few
operations that must see full (gathered) tensors: weight export, exact-state snapshots, checkpoints.
Sharding, the update's gradient clipping and the process group need torch alone (no verl, no Ray), so
bench/gpu_check.py runs the trainer's own code on a bare CUDA machine.

With one rank the module stays a plain module and every helper degrades to a local copy, so the same
trainer code runs in both cases.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.utils._pytree import tree_map


def init_distributed(device: torch.device, timeout_s: float = 600.0, force: bool = False) -> tuple[int, int]:
    """Join the trainer pool's default process group from the env verl's worker group sets
    (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT); backend from verl's platform (gloo on CPU).
    ``force``: a one-rank pool gets a one-rank group too (in-process store, no port), so FSDP2's
    mixed-precision and offload policies apply to it (``ActorMemoryConfig.needs_fsdp``)."""
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    if (world > 1 or force) and not dist.is_initialized():
        backend = "gloo" if device.type == "cpu" else "nccl"  # the two devices a run validates for
        kwargs = {"store": dist.HashStore()} if world == 1 else {}
        dist.init_process_group(backend=backend, rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s),
                                **kwargs)
    return rank, world


def _clone_views(module: nn.Module, args: Any, output: Any) -> Any:
    """Forward hook: outputs that are views become their own tensors (see ``shard_transformer``)."""
    if not torch.is_grad_enabled():
        return None
    return tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) and t._base is not None and t.requires_grad
                    else t, output)


def enable_activation_checkpointing(transformer: nn.Module) -> None:
    """Recompute every transformer block's forward in the backward (diffusers' per-block
    ``torch.utils.checkpoint``, non-reentrant): a block keeps only its inputs for the backward. Runs
    before ``fully_shard``, so FSDP2's hooks sit inside the checkpointed call and a recompute
    re-gathers the block's parameters; generation (no grad) is unaffected."""
    if not getattr(transformer, "_supports_gradient_checkpointing", False):
        raise ValueError(f"{type(transformer).__name__} does not support per-block activation checkpointing; "
                         "set actor.activation_checkpointing=false")
    transformer.enable_gradient_checkpointing()


def shard_transformer(transformer: nn.Module, world: int, device: torch.device, *,
                      param_dtype: torch.dtype | None = None, reduce_dtype: torch.dtype | None = None,
                      offload: bool = False) -> None:
    """FSDP2 ``fully_shard`` across the trainer pool: one unit per transformer block (the classes diffusers
    lists in ``_no_split_modules``), then the root, as verl's ``apply_fsdp2`` wraps a model without token
    embeddings (none of the diffusion transformers has one), with gradients *summed* over ranks: the
    loss is already scaled by 1 / (rows of the global step), so averaging would divide the step's
    gradient by the pool size.

    ``param_dtype`` / ``reduce_dtype``: FSDP2's ``MixedPrecisionPolicy`` (the module keeps its own,
    master, dtype; the gathered parameters are cast for compute; gradients reduced in
    ``reduce_dtype`` and kept in the master dtype). ``offload``: FSDP2's ``CPUOffloadPolicy``.

    Blocks whose outputs are views of one tensor (diffusers' ``FluxSingleTransformerBlock`` returns
    two slices of its concatenated stream; the root returns ``proj_out``'s 3-D Linear output, a view
    of the 2-D matmul) get a forward hook, registered before FSDP2's, that clones
    such outputs: FSDP2 hangs its pre-backward hook (the all-gather of the block's parameters for the
    backward) on the outputs, and an in-place op on a view would drop it (docs/architecture.md)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(device.type, (world,), mesh_dim_names=("fsdp",))
    kwargs: dict[str, Any] = {"mesh": mesh, "reshard_after_forward": True}
    if param_dtype is not None or reduce_dtype is not None:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    if offload:
        kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=device.type == "cuda")
    blocks = set(getattr(transformer, "_no_split_modules", None) or ())
    for module in transformer.modules():
        if type(module).__name__ in blocks or module is transformer:  # the root's output is a Linear's view
            module.register_forward_hook(_clone_views)
    for module in [m for m in transformer.modules() if type(m).__name__ in blocks]:
        fully_shard(module, **kwargs)  # one FSDP unit per block, then the root holds the rest
    fully_shard(transformer, **kwargs)
    for module in transformer.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            # plain SUM collectives: a custom divide factor otherwise selects PREMUL_SUM for float32 /
            # bf16 gradients, which gloo (CPU pools) does not implement
            module.set_force_sum_reduction_for_comms(True)


def sharded_calls(transformer: nn.Module) -> dict[str, int]:
    """The collectives sharding ``transformer`` as :func:`shard_transformer` does adds per call, counted on the
    module (sharded or not), for the cost model's ``costs.Sharded``: a training pass all-gathers each unit's
    parameters forward and (but the root's, which FSDP2 keeps after forward) backward and reduce-scatters its
    gradients; the switch to generation gathers each tensor of the state once (``copy_full_state``); the
    optimizer step reduces the gradient norm once (``clip_grad_norm``) and the ranks' skip verdict once
    (``actor._agree``)."""
    blocks = set(getattr(transformer, "_no_split_modules", None) or ())
    units = 1 + sum(1 for m in transformer.modules() if type(m).__name__ in blocks)
    params = list(transformer.parameters())
    full = sum(p.numel() * p.element_size() for p in params)
    trained = sum(p.numel() * p.element_size() for p in params if p.requires_grad)
    state = transformer.state_dict()
    return {"pass_calls": 3 * units - 1, "pass_bytes": 2 * full + trained, "switch_calls": len(state),
            "switch_bytes": sum(t.numel() * t.element_size() for t in state.values()), "step_calls": 2}


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """A detached full CPU copy (an all-gather for a sharded DTensor: every rank must call it)."""
    if isinstance(t, DTensor):
        if t.device.type != t.device_mesh.device_type:  # an offloaded shard: gather on the mesh's device
            t = t.to(t.device_mesh.device_type)
        t = t.full_tensor()
    return t.detach().to("cpu", copy=True)


def full_on_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A detached full tensor on ``device`` (an all-gather for a sharded DTensor: every rank must call it),
    with no host round trip on a GPU rank: what a collective weight publish packs into its buckets."""
    if isinstance(t, DTensor):
        if t.device.type != t.device_mesh.device_type:  # an offloaded shard: gather on the mesh's device
            t = t.to(t.device_mesh.device_type)
        t = t.full_tensor()
    return t.detach().to(device)


@torch.no_grad()
def like(full: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """``full`` laid out like ``ref``: this rank's shard when ``ref`` is sharded (no communication:
    every rank holds the full tensor), else a copy on ``ref``'s device."""
    full = full.to(device=ref.device, dtype=ref.dtype)
    if isinstance(ref, DTensor):
        out = distribute_tensor(full, ref.device_mesh, ref.placements, src_data_rank=None)
        return out if out.device == ref.device else out.to(ref.device)  # offloaded params stay on the host
    return full.clone()


@torch.no_grad()
def copy_full_into(param: torch.Tensor, full: torch.Tensor) -> None:
    """Overwrite a (possibly sharded) parameter in place with a full tensor."""
    src = like(full, param)
    if isinstance(param, DTensor):
        param.to_local().copy_(src.to_local())
    else:
        param.copy_(src)


def gather_state_dict(transformer: nn.Module, sharded: bool) -> dict[str, torch.Tensor]:
    """The full transformer state dict on CPU: on rank 0 of a sharded pool (others get {}), or a
    local copy when unsharded."""
    if not sharded:
        return {k: v.detach().to("cpu", copy=True) for k, v in transformer.state_dict().items()}
    from verl.utils.fsdp_utils import get_fsdp_full_state_dict

    state = get_fsdp_full_state_dict(transformer, offload_to_cpu=True, rank0_only=True)
    return state if dist.get_rank() == 0 else {}


@torch.no_grad()
def copy_full_state(src: nn.Module, dst: nn.Module) -> None:
    """Copy the (possibly sharded) state of ``src`` into the unsharded ``dst`` on every rank, one
    tensor at a time (an all-gather per sharded tensor, so the peak is one full tensor, not a second
    full model; every rank must call it): the TAG switch's generation weights."""
    target = dst.state_dict()
    if target.keys() != src.state_dict().keys():
        raise ValueError("generation copy and trainer model have different parameters")
    for k, v in src.state_dict().items():
        target[k].copy_(v.full_tensor() if isinstance(v, DTensor) else v)


def gathered_bytes(module: nn.Module) -> int:
    """Bytes a rank receives from the others to materialize ``module``'s full state: the full tensors'
    bytes less this rank's own shards (0 for an unsharded module)."""
    total = 0
    for v in module.state_dict().values():
        if isinstance(v, DTensor):
            total += v.numel() * v.element_size() - local_bytes([v])
    return total


def clip_grad_norm(params: list[torch.Tensor], max_norm: float, device: torch.device) -> float:
    """Clip the global gradient norm (over all shards) and return it. The norm of sharded (DTensor)
    gradients is reduced over the mesh on the pool's device: offloaded (host) gradients of a GPU pool have
    their norm moved there first, which torch's ``clip_grad_norm_`` does not do (verl's
    ``fsdp2_clip_grad_norm_`` does the same for its actor)."""
    max_norm = float(max_norm) if max_norm and max_norm > 0 else float("inf")
    total = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
    if device.type != "cpu":
        total = total.to(device, non_blocking=True)
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    if isinstance(total, DTensor):
        total = total.full_tensor()
    return float(total)


def barrier(sharded: bool) -> None:
    if sharded:
        dist.barrier()


def local_bytes(tensors) -> int:
    """Bytes this rank holds of ``tensors`` (a DTensor counts its local shard only)."""
    total = 0
    for t in tensors:
        if t is None:
            continue
        local = t.to_local() if isinstance(t, DTensor) else t
        total += local.numel() * local.element_size()
    return total
