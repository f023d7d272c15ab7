"""The TAG-policy interface, the neutral view of the scheduler it may look at, and the policy registry.

A TAG policy answers one question at each decision point of a trainer bubble (the trainer idle while
micro-batches of its step still wait to be generated; the scheduler asks at every event of the bubble,
once per event): how many free TAG slots (trainer ranks) generate one micro-batch each now, 0 = wait
for the Update Queue (docs/architecture.md, "The scheduling core"). The scheduler clamps the answer to
``[0, min(ctx.free_slots, ctx.undispatched)]``.

Policies register under a name with :func:`register_tag_policy` (as verl's ``core_algos`` registers
advantage estimators), and specs such as ``static:2`` are parsed against the registry, so a new policy
is one file: a class with ``decide`` under the decorator. Its name is accepted (``digen.tag.policy``,
``digen simulate --policy``, ``ScheduleConfig.policy``) once that file has been imported.

This module depends on no policy: ``policies.py`` (never / static / adaptive) and ``bts.py`` import
it, not each other, and the scheduler hands them a :class:`SchedulerView` (plain counts and clocks)
instead of any policy's own state. Only the standard library is imported (and
``verl_digen.registry``, which imports nothing else).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from verl_digen.registry import Registry, qualname

from .costs import StageCosts


@dataclass(frozen=True)
class GeneratorView:
    """One generator worker at a bubble. ``task`` is None (idle) or the action kind it runs
    (``generate``, ``score``, ``weight_sync``); clocks are relative to the bubble."""

    task: str | None
    remaining: float = 0.0  # seconds until its task ends
    next_step: bool = False  # the task belongs to the step after the trainer's (TCSS work)
    micro_batch: int | None = None  # the trainer's-step micro-batch it generates or scores
    lagging: bool = False  # holds an older version than the published one (picks it up when idle)


@dataclass(frozen=True)
class SchedulerView:
    """The rest of the trainer's current step at a bubble, in the scheduler's own terms.

    Neutral on purpose: a policy builds whatever model it searches from these fields (BTS:
    ``bts.ModelState.from_view``), so the scheduler never imports a policy's internals.
    """

    dispatched: int  # micro-batches of the step handed to a worker so far (the next index)
    generators: tuple[GeneratorView, ...]
    scoring_queue: tuple[int, ...]  # the step's generated micro-batches waiting to be scored
    next_step_scoring: int  # next-step (TCSS) micro-batches waiting to be scored
    scored_per_unit: dict[int, int]  # release unit -> micro-batches scored, for units not yet complete
    update_queue: int  # micro-batches in the Update Queue
    not_updated: int  # micro-batches of the step not yet updated
    trainer_generating: bool  # the trainer is in generation mode (TAG slots may be busy)
    stale_budget_left: int = 0  # next-step micro-batches TCSS may still generate
    next_step_undispatched: int = 0  # next-step micro-batches not handed out yet
    tag_slots: int = 1  # trainer ranks = TAG slots
    busy_slots: tuple[tuple[float, int], ...] = ()  # (seconds left, micro-batch) per busy TAG slot
    #: released micro-batches of each later mini-batch (1, 2, ...), waiting for the first one's optimizer step
    #: (a decision is only taken before it); empty with one mini-batch
    later_ready: tuple[int, ...] = ()


@dataclass
class BubbleContext:
    """What a policy may look at. ``snapshot()`` builds the :class:`SchedulerView` (lazy: only
    policies that search need it)."""

    step: int
    now: float
    micro_batches: int
    undispatched: int
    tags: int  # TAG micro-batches already inserted in this step
    bubble: int  # 1-based index of this decision in the step (the scheduler asks at every event of a bubble)
    costs: StageCosts
    costs_version: int
    unit_size: int
    update_size: int
    gen_workers: int
    snapshot: Callable[[], SchedulerView | None]
    free_slots: int = 1  # TAG slots free now (all ranks in training mode)
    trainer_ranks: int = 1
    mini_batches: int = 1  # optimizer steps in the step (decisions come only before the first)
    predicted_end: float | None = None  # filled by BTS (absolute time of the optimizer step's end)

    @property
    def most(self) -> int:
        """The most TAG micro-batches this decision may start."""
        return max(0, min(self.free_slots, self.undispatched))


class TagPolicy(Protocol):
    name: str

    def decide(self, ctx: BubbleContext) -> int: ...


@dataclass(frozen=True)
class PolicyEntry:
    """A registered policy: ``factory()`` or ``factory(arg(text))`` for the spec ``name:text``."""

    name: str
    factory: Callable[..., TagPolicy]
    arg: Callable[[str], Any] | None
    arg_required: bool
    usage: str


class UnknownTagPolicy(ValueError):
    """A spec naming no registered policy (the message lists the registered ones)."""


#: spec name -> entry (a :class:`verl_digen.registry.Registry`; two entries are the same when their
#: factories are)
TAG_POLICIES: Registry[PolicyEntry] = Registry("TAG policy", identity=lambda e: qualname(e.factory))
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
_SPEC = re.compile(r"^\s*([a-z][a-z0-9_]*)\s*(?:[:(=]\s*([0-9.eE+-]+)\s*\)?)?\s*$")


def register_tag_policy(name: str, *, arg: Callable[[str], Any] | None = None, arg_required: bool = False,
                        usage: str | None = None) -> Callable[[Any], Any]:
    """Class (or factory) decorator: make ``name`` a TAG policy spec.

    ``arg`` converts the number after ``name:`` (``int``, ``float``); without it the policy takes no
    argument. ``usage`` is how error messages and ``--help`` spell it (default ``name``,
    ``name:X`` or ``name[:X]``). Registering a second, different factory under a taken name raises.
    """
    if not _NAME.match(name):
        raise ValueError(f"TAG policy name {name!r} must be lower-case letters, digits and '_'")
    if arg_required and arg is None:
        raise ValueError(f"TAG policy {name!r}: arg_required needs an arg converter")

    def deco(factory: Any) -> Any:
        spelled = usage or (name if arg is None else f"{name}:X" if arg_required else f"{name}[:X]")
        TAG_POLICIES.register(name, PolicyEntry(name, factory, arg, arg_required, spelled))
        return factory

    return deco


def unregister_tag_policy(name: str) -> None:
    """Remove ``name`` from the registry (tests, plugins that replace a policy)."""
    TAG_POLICIES.unregister(name)


def tag_policy_names() -> tuple[str, ...]:
    """The registered policy names, sorted."""
    return tuple(sorted(TAG_POLICIES))


def tag_policy_usage() -> str:
    """The registered specs as users write them, sorted: ``adaptive[:R], bts, never, static:K``."""
    return ", ".join(TAG_POLICIES[n].usage for n in sorted(TAG_POLICIES))


def parse_policy(spec: str | TagPolicy) -> TagPolicy:
    """Build a policy from its spec (``name``, ``name:X``, ``name(X)``); a ValueError names the spec and
    lists the registered policies. A policy object passes through unchanged."""
    if not isinstance(spec, str):
        return spec
    m = _SPEC.match(spec.lower())
    entry = TAG_POLICIES.get(m.group(1)) if m else None
    if entry is None:
        raise UnknownTagPolicy(f"unknown TAG policy {spec!r}; registered: {tag_policy_usage()}")
    text = m.group(2)
    try:
        if entry.arg is None:
            if text is not None:
                raise ValueError(f"{entry.name} takes no argument")
            return entry.factory()
        if text is None:
            if entry.arg_required:
                raise ValueError(f"{entry.name} needs an argument, e.g. {entry.usage}")
            return entry.factory()
        return entry.factory(entry.arg(text))
    except ValueError as e:
        raise ValueError(f"bad TAG policy {spec!r}: {e}") from None
