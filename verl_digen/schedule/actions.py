"""Actions the scheduler emits; the executor runs each and reports its completion.

An :class:`Action` names its kind, the workers it occupies, the global step and policy version it
belongs to, and (for per-micro-batch work) the micro-batch index and its (prompt, sample) pairs.
``start`` is stamped by the scheduler with the ``now`` it was emitted at, ``issued`` by the backend when
it launched the action (the runtime's driver, before its Ray call): ``issued - start`` is the driver's
dispatch latency, which a record keeps apart from the work. Kinds (:class:`ActionKind`;
the worker method each one runs on Ray is stated in ``driver/ray_backend.py``, ``WORKER_METHODS``):

- ``generate``: sample the micro-batch on generator worker ``genI`` with weights ``version``
  (``stale`` when ``version == step - 1``, TCSS).
- ``tag_generate``: one trainer rank (TAG slot ``tagJ``) samples the micro-batch alone with the
  trainer's current weights.
- ``score``: reward the micro-batch on a generator worker.
- ``update``: forward/backward + gradient accumulation of the micro-batch(es) on the trainer unit (no step).
- ``switch_to_gen`` / ``switch_to_train``: trainer context switch around TAG (full weights onto every
  rank / training state back).
- ``optimizer_step``: apply the accumulated gradient; closes the step's training. With several
  mini-batches each has one: ``mini_batch`` holds its index, and the last one (``mini_batch`` None) closes
  the step (:func:`ends_step`).
- ``publish``: the trainer publishes weights ``version`` once, after the optimizer step.
- ``weight_sync``: one generator worker picks up the published ``version`` between its trajectories.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class ActionKind(str, Enum):
    """What an action does (listed above). A ``str``: kinds compare equal to, hash like and print as
    their names, so timelines, profiles and traces store plain strings."""

    GENERATE = "generate"
    TAG_GENERATE = "tag_generate"
    SCORE = "score"
    UPDATE = "update"
    SWITCH_TO_GEN = "switch_to_gen"
    SWITCH_TO_TRAIN = "switch_to_train"
    OPTIMIZER_STEP = "optimizer_step"
    PUBLISH = "publish"
    WEIGHT_SYNC = "weight_sync"

    __str__ = str.__str__  # "generate", not "ActionKind.GENERATE" (also in f-strings)
    __format__ = str.__format__

    def __repr__(self) -> str:  # error messages quote a kind as they quote a string: 'publish'
        return repr(self.value)


# The members under their short names, shared by the scheduler, the timeline, the profiler, the cost model
# and the driver (import them from here, their home).
GENERATE = ActionKind.GENERATE
TAG_GENERATE = ActionKind.TAG_GENERATE
SCORE = ActionKind.SCORE
UPDATE = ActionKind.UPDATE
SWITCH_TO_GEN = ActionKind.SWITCH_TO_GEN
SWITCH_TO_TRAIN = ActionKind.SWITCH_TO_TRAIN
OPTIMIZER_STEP = ActionKind.OPTIMIZER_STEP
PUBLISH = ActionKind.PUBLISH
WEIGHT_SYNC = ActionKind.WEIGHT_SYNC
KINDS = tuple(ActionKind)


@dataclass(eq=False)
class Action:
    kind: ActionKind
    workers: tuple[str, ...]
    step: int
    version: int
    mb: int | None = None  # the micro-batch (generate, tag_generate, score, update); None for the rest
    samples: tuple[tuple[int, int], ...] = ()
    stale: bool = False
    start: float = 0.0
    count: int = 1  # update actions: micro-batches mb .. mb + count - 1 (one release unit)
    mini_batch: int | None = None  # an optimizer step of a mini-batch before the step's last: its index
    issued: float | None = None  # when the backend launched it (None: not launched yet)

    @property
    def micro_batches(self) -> range:
        return range(self.mb, self.mb + self.count) if self.mb is not None else range(0)

    @property
    def ends_step(self) -> bool:
        return ends_step(self.kind, self.mini_batch)

    @property
    def worker(self) -> str:
        return self.workers[0]

    def __repr__(self) -> str:
        mb = f" mb={self.mb}" if self.mb is not None else ""
        mini = f" mini_batch={self.mini_batch}" if self.mini_batch is not None else ""
        stale = " stale" if self.stale else ""
        where = ",".join(self.workers)
        return f"Action({self.kind} {where} step={self.step} v={self.version}{mb}{mini}{stale} @{self.start:.6g})"


def ends_step(kind: str, mini_batch: int | None) -> bool:
    """Whether an action (or its record) is its step's last optimizer step: a mini-batch's carries the
    mini-batch's index in ``mini_batch``, the step's last none."""
    return kind == ActionKind.OPTIMIZER_STEP and mini_batch is None
