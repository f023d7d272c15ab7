"""Ulysses sequence parallelism for the video transformers (``actor.ulysses_sequence_parallel_size``).

A Wan2.1 sample at 720p x 81 frames is ~75k tokens: its training activations do not fit one GPU. With
sequence parallel size P, the P ranks of one group train the same rows and each holds 1/P of every row's
video tokens through the whole transformer. Only attention needs all tokens: before it, an all-to-all
turns (tokens/P, all heads) into (all tokens, heads/P); after it, the inverse all-to-all turns the result
back (verl's ``verl.utils.ulysses`` helpers, which are autograd-aware). Per-token layers (norms, MLPs,
projections) need nothing. The velocity is gathered after the final projection, so the loss, and with it
every rank's log-probs, sees all tokens on every rank.

How the transformer is cut is declared per architecture (its facts' ``sequence_plan``, an
``archs.SequencePlan``): the rotary embedding's output and the first block's image tokens are sliced to this
rank's part, the attention calls that attend over all image tokens go through ``UlyssesAttention``, and the
final projection's output is all-gathered. Text tokens stay whole
on every rank: cross-attention (Wan's ``attn2``) needs no communication, and joint attention
(HunyuanVideo) takes this rank's heads of the text tokens and all-gathers the text output over heads.

Gradients: every rank computes the same loss from the gathered velocity; the gather's backward keeps this
rank's slice (no scaling), so each rank's parameter gradient is its tokens' part and the trainer's FSDP2
sum over ranks (``workers/fsdp.shard_transformer``) adds the P parts into the full gradient. A tensor all
ranks hold whole (text, timestep embeddings) gets this rank's part of its gradient too; the text output's
all-gather over heads therefore sums its gradient over the group in the backward.

The attention calls are routed without copying diffusers' processors: each processor's ``parallel_config``
slot (diffusers' own hook for context-parallel attention) holds a ``UlyssesAttention``, and the
processor module's ``dispatch_attention_fn`` is wrapped once to hand such calls to it (every other call
goes through unchanged). See docs/architecture.md ("Sequence parallelism").
"""

from __future__ import annotations

import fnmatch
import sys
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

# the checks live torch-free beside the facts (the config runs them without torch); re-exported here
from verl_digen.archs import ARCHS, SequencePlan, video_tokens
from verl_digen.archs import sequence_parallel_archs as supported_archs
from verl_digen.archs import sequence_parallel_problem as size_problem

__all__ = ["UlyssesAttention", "enable_sequence_parallel", "plan_for", "sequence_groups", "size_problem",
           "supported_archs", "video_tokens"]


def plan_for(arch: str) -> SequencePlan | None:
    """The architecture's ``sequence_plan`` (declared in its facts), None when it cannot be cut."""
    return ARCHS[arch].sequence_plan if arch in ARCHS else None




class _GatherHeads(torch.autograd.Function):
    """All-gather along the heads (dim 2); the backward sums the gradient over the group and keeps this
    rank's heads, because every rank's downstream computes only its own part of that gradient."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group, ctx.rank, ctx.heads = group, dist.get_rank(group), x.shape[2]
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=2)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad.narrow(2, ctx.rank * ctx.heads, ctx.heads).contiguous(), None


class UlyssesAttention:
    """Attention over all image tokens for a rank holding ``local_tokens`` of them; anything after them
    in the call (joint attention's text tokens) is held whole by every rank."""

    def __init__(self, group: dist.ProcessGroup) -> None:
        self.group = group
        self.size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.local_tokens: int | None = None  # set when the first block's input is sliced

    def shard(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        """This rank's contiguous 1/P of ``x`` along ``dim``."""
        n = x.shape[dim]
        if n % self.size:
            raise ValueError(f"sequence parallel: {n} tokens cannot be split evenly over {self.size} ranks")
        return x.narrow(dim, self.rank * (n // self.size), n // self.size)

    def __call__(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0, is_causal: bool = False,
                 scale: float | None = None) -> torch.Tensor:
        """(B, tokens, H, D) in and out, like diffusers' attention dispatch; the mask covers the full
        sequence (all image tokens, then the text), as the transformer built it."""
        from verl.utils.ulysses import gather_heads_scatter_seq, gather_seq_scatter_heads

        if self.local_tokens is None:
            raise RuntimeError("UlyssesAttention called before the transformer's first block sliced its input")
        n, heads = self.local_tokens, query.shape[2]  # heads: a multiple of the size (enable_sequence_parallel)
        mine = slice(self.rank * (heads // self.size), (self.rank + 1) * (heads // self.size))

        def whole(t: torch.Tensor) -> torch.Tensor:  # all image tokens, this rank's heads, then its text heads
            video = gather_seq_scatter_heads(t[:, :n], seq_dim=1, head_dim=2, group=self.group)
            return torch.cat([video, t[:, n:, mine]], dim=1) if t.shape[1] > n else video

        q, k, v = (whole(t).transpose(1, 2) for t in (query, key, value))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                                             scale=scale).transpose(1, 2)
        video_tokens = n * self.size
        video = gather_heads_scatter_seq(out[:, :video_tokens], head_dim=2, seq_dim=1, group=self.group)
        if out.shape[1] == video_tokens:
            return video
        return torch.cat([video, _GatherHeads.apply(out[:, video_tokens:], self.group)], dim=1)


def _route_attention(processor: Any) -> None:
    """Wrap ``dispatch_attention_fn`` in the processor's module (once) so that a call whose
    ``parallel_config`` is a ``UlyssesAttention`` goes to it."""
    module = sys.modules[type(processor).__module__]
    original = getattr(module, "dispatch_attention_fn", None)
    if original is None:
        raise TypeError(f"{type(processor).__name__} does not call diffusers' dispatch_attention_fn; "
                        "sequence parallelism cannot route its attention")
    if getattr(original, "routes_ulysses", False):
        return

    def dispatch(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False,
                 attention_kwargs=None, *, backend=None, parallel_config=None):
        if isinstance(parallel_config, UlyssesAttention):
            return parallel_config(query, key, value, attn_mask, dropout_p, is_causal, scale)
        return original(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, attention_kwargs,
                        backend=backend, parallel_config=parallel_config)

    dispatch.routes_ulysses = True
    module.dispatch_attention_fn = dispatch


def sequence_groups(size: int) -> tuple[dist.ProcessGroup, int, int]:
    """This rank's Ulysses group of ``size`` consecutive ranks of the default group (the inner axis of verl's
    (dp, sp) device mesh), and this rank's data-parallel rank and width (the number of groups). Every rank
    creates every group, as ``new_group`` requires."""
    rank, world = dist.get_rank(), dist.get_world_size()
    if size < 1 or world % size:
        raise ValueError(f"actor.ulysses_sequence_parallel_size={size} must divide the {world} trainer ranks")
    mine = None
    for start in range(0, world, size):
        group = dist.new_group(list(range(start, start + size)))
        if start <= rank < start + size:
            mine = group
    return mine, rank // size, world // size


def enable_sequence_parallel(model: Any, group: dist.ProcessGroup) -> UlyssesAttention:
    """Cut ``model``'s transformer (a ``DiffusionModel``; plain or FSDP2-sharded, LoRA adapters are per-token
    layers) for the ranks of ``group``, after checking that its heads and video tokens split evenly; every rank
    of the group must then run the same forwards on the same rows."""
    arch, transformer = model.arch, model.transformer
    _check_cuttable(model, dist.get_world_size(group))
    plan, attention = plan_for(arch), UlyssesAttention(group)
    if getattr(transformer.config, "image_condition_type", None) == "token_replace":
        raise ValueError("sequence parallelism does not support HunyuanVideo's token-replace (image-to-video) "
                         "blocks: they index the first frame's tokens globally")
    modules = dict(transformer.named_modules())
    first = next((modules[name] for name in plan.first_blocks if name in modules), None)
    if first is None or plan.rope not in modules or plan.output not in modules:
        raise ValueError(f"{type(transformer).__name__} does not have the modules the {arch} sequence plan cuts")
    _hook_token_cut(modules, first, plan, attention)
    routed = 0
    for name, module in modules.items():
        if any(fnmatch.fnmatchcase(name, pattern) for pattern in plan.attention):
            _route_attention(module.processor)
            module.processor._parallel_config = attention
            routed += 1
    if not routed:
        raise ValueError(f"no attention module of {type(transformer).__name__} matches {plan.attention}")
    transformer._digen_ulysses = attention
    return attention


def _check_cuttable(model: Any, size: int) -> None:
    """Refuse a transformer whose heads or video tokens do not split over ``size`` ranks, or one already cut:
    a second cut would shard the already-sharded tokens."""
    transformer = model.transformer
    c = transformer.config
    if isinstance(c.patch_size, (tuple, list)):  # Wan: (t, h, w)
        temporal, spatial = c.patch_size[0], c.patch_size[1]
    else:  # HunyuanVideo: spatial, and patch_size_t
        spatial, temporal = c.patch_size, c.get("patch_size_t", 1)
    problem = size_problem(model.arch, c.num_attention_heads,
                           video_tokens(tuple(model.latent_shape), spatial, temporal), size)
    if problem:
        raise ValueError(f"actor.ulysses_sequence_parallel_size={size}: expected {problem}")
    if getattr(transformer, "_digen_ulysses", None) is not None:
        raise RuntimeError("sequence parallelism is already enabled on this transformer")


def _hook_token_cut(modules: dict[str, nn.Module], first: nn.Module, plan: SequencePlan,
                    attention: UlyssesAttention) -> None:
    """Each rank keeps its share of the tokens from the first block on (and of the rotary embedding that goes
    with them); the output is gathered whole again, so the loss sees every token."""
    group = attention.group

    def slice_rope(module: nn.Module, args: Any, out: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        return tuple(attention.shard(t, plan.rope_token_dim) for t in out)

    def slice_tokens(module: nn.Module, args: tuple) -> tuple:
        hidden = attention.shard(args[0], 1)
        attention.local_tokens = hidden.shape[1]
        return (hidden, *args[1:])

    def gather_output(module: nn.Module, args: Any, out: torch.Tensor) -> torch.Tensor:
        from verl.utils.ulysses import gather_outputs_and_unpad

        return gather_outputs_and_unpad(out, gather_dim=1, grad_scaler=False, group=group)

    modules[plan.rope].register_forward_hook(slice_rope)
    first.register_forward_pre_hook(slice_tokens)
    modules[plan.output].register_forward_hook(gather_output)
