"""The simple TAG policies: ``never``, ``static:K``, ``adaptive[:R]`` (``bts`` lives in :mod:`.bts`).

Each is a class with ``decide(ctx) -> int`` registered with :func:`.tag_policy.register_tag_policy`;
the interface, the registry and ``parse_policy`` live in :mod:`.tag_policy` (re-exported here).

- ``never``: the disaggregated baseline.
- ``static:K``: up to K TAG micro-batches per step, as early as slots are free.
- ``adaptive:R``: lend every free slot while the not-yet-generated work is at least R x the batch
  (the threshold rule upstream verl / verl-omni use to lend idle trainer GPUs to rollout).

Specs parse from strings: ``never``, ``static:2`` / ``static(2)``, ``adaptive`` / ``adaptive:0.3``.
"""

from __future__ import annotations

from dataclasses import dataclass

from .tag_policy import BubbleContext, TagPolicy, parse_policy, register_tag_policy

__all__ = ["Adaptive", "BubbleContext", "DEFAULT_ADAPTIVE_RATIO", "Never", "Static", "TagPolicy", "parse_policy"]

DEFAULT_ADAPTIVE_RATIO = 0.3


@register_tag_policy("never")
@dataclass
class Never:
    name: str = "never"

    def decide(self, ctx: BubbleContext) -> int:
        return 0

    def __str__(self) -> str:
        return "never"


@register_tag_policy("static", arg=int, arg_required=True, usage="static:K")
@dataclass
class Static:
    k: int
    name: str = "static"

    def __post_init__(self) -> None:
        if self.k < 0:
            raise ValueError(f"static TAG count must be >= 0, got {self.k}")

    def decide(self, ctx: BubbleContext) -> int:
        return max(0, min(ctx.most, self.k - ctx.tags))

    def __str__(self) -> str:
        return f"static:{self.k}"


@register_tag_policy("adaptive", arg=float, usage="adaptive[:R]")
@dataclass
class Adaptive:
    ratio: float = DEFAULT_ADAPTIVE_RATIO
    name: str = "adaptive"

    def __post_init__(self) -> None:
        if not 0 <= self.ratio <= 1:
            raise ValueError(f"adaptive ratio must be in [0, 1], got {self.ratio}")

    def decide(self, ctx: BubbleContext) -> int:
        return ctx.most if ctx.undispatched >= self.ratio * ctx.micro_batches - 1e-9 else 0

    def __str__(self) -> str:
        return f"adaptive:{self.ratio:g}"
