"""TAG policies: at a trainer bubble, how many free TAG slots (trainer ranks) generate a micro-batch each.

One interface, ``decide(ctx) -> int``, called once per bubble (the trainer idle while micro-batches
of its step still wait to be generated): the number of slots to use now, 0 = wait for the Update
Queue. The scheduler clamps it to ``[0, min(ctx.free_slots, ctx.undispatched)]``.

- ``never``: the disaggregated baseline.
- ``static:K``: up to K TAG micro-batches per step, as early as slots are free.
- ``adaptive:R``: lend every free slot while the not-yet-generated work is at least R x the batch
  (the threshold rule upstream verl / verl-omni use to lend idle trainer GPUs to rollout).
- ``bts``: bubble-triggered TAG search (:mod:`.bts`), re-solved at every bubble with the profiler's
  current costs.

Specs parse from strings: ``never``, ``static:2`` / ``static(2)``, ``adaptive`` / ``adaptive:0.3``, ``bts``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from .costs import StageCosts

POLICY_NAMES = ("never", "static", "adaptive", "bts")
DEFAULT_ADAPTIVE_RATIO = 0.3


@dataclass
class BubbleContext:
    """What a policy may look at. ``snapshot()`` builds the BTS model state (costly, so lazy)."""

    step: int
    now: float
    micro_batches: int
    undispatched: int
    tags: int  # TAG micro-batches already inserted in this step
    bubble: int  # 1-based index of this bubble in the step
    costs: StageCosts
    costs_version: int
    unit_size: int
    update_size: int
    gen_workers: int
    snapshot: Callable[[], Any]
    free_slots: int = 1  # TAG slots free now (all ranks in training mode)
    trainer_ranks: int = 1
    predicted_end: float | None = None  # filled by BTS (absolute time of the optimizer step's end)

    @property
    def most(self) -> int:
        """The most TAG micro-batches this decision may start."""
        return max(0, min(self.free_slots, self.undispatched))


class TagPolicy(Protocol):
    name: str

    def decide(self, ctx: BubbleContext) -> int: ...


@dataclass
class Never:
    name: str = "never"

    def decide(self, ctx: BubbleContext) -> int:
        return 0

    def __str__(self) -> str:
        return "never"


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


_SPEC = re.compile(r"^\s*([a-z_]+)\s*(?:[:(=]\s*([0-9.eE+-]+)\s*\)?)?\s*$")


def parse_policy(spec: str | TagPolicy) -> TagPolicy:
    """Build a policy from its spec string; ValueError names the valid policies on a typo."""
    if not isinstance(spec, str):
        return spec
    m = _SPEC.match(spec.lower())
    if not m or m.group(1) not in POLICY_NAMES:
        raise ValueError(f"unknown TAG policy {spec!r}; expected one of never, static:K, adaptive[:R], bts")
    name, arg = m.group(1), m.group(2)
    try:
        if name == "never":
            return Never()
        if name == "static":
            if arg is None:
                raise ValueError("static needs a count, e.g. static:2")
            return Static(int(arg))
        if name == "adaptive":
            return Adaptive(float(arg) if arg is not None else DEFAULT_ADAPTIVE_RATIO)
    except ValueError as e:
        raise ValueError(f"bad TAG policy {spec!r}: {e}") from None
    from .bts import BtsPolicy

    return BtsPolicy()
