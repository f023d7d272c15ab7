"""Generator fault tolerance: what the Ray backend needs to retry a dead or hung generator's action.

A generator actor is created with Ray ``max_restarts`` (``trainer.generator_max_restarts``). When one of
its actions fails because the actor died, or runs past its per-action timeout (then the backend kills the
actor so Ray restarts it), the backend restores the restarted actor (``init_model``, then the weights of
the policy version it held, from the object store) and re-issues the same action on it: same micro-batch,
same rows, same version, so nothing is lost or duplicated (sampling noise is seeded per sample). The
scheduler never sees the failure: the action completes later than planned, once. See the fault model in
docs/user-guide.md and docs/architecture.md ("Runtime").
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import ray


@dataclass
class FaultPolicy:
    """How generator faults are handled. ``max_restarts``: restarts per generator actor (0: a dead
    generator ends the run). ``timeout_factor`` x the scheduler's estimate of an action's duration, but at
    least ``timeout_min_s``, is how long a generator action may run before its actor is taken for hung
    (``timeout_factor=None``: no per-action timeout)."""

    max_restarts: int = 0
    timeout_factor: float | None = None
    timeout_min_s: float = 300.0
    log: Callable[[str], None] = print
    restart_wait_s: float = 600.0  # how long a restarting actor may take to answer again

    def timeout(self, estimate_s: float) -> float | None:
        """Seconds an action estimated at ``estimate_s`` may run (None: unbounded)."""
        if self.timeout_factor is None:
            return None
        est = estimate_s if math.isfinite(estimate_s) and estimate_s > 0 else 0.0
        return max(self.timeout_min_s, self.timeout_factor * est)


@dataclass
class GeneratorState:
    """What the driver must know to bring a restarted generator back to where it was: the policy
    version each one holds, the published weights of the versions still held or about to be picked up
    (object-store refs; older ones are dropped), and how often each actor was restarted."""

    held: list[int]
    weights: dict[int, ray.ObjectRef] = field(default_factory=dict)
    incarnation: list[int] = field(default_factory=list)
    restarts: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        n = len(self.held)
        self.incarnation = self.incarnation or [0] * n
        self.restarts = self.restarts or [0] * n

    def published(self, version: int, ref: ray.ObjectRef) -> None:
        self.weights[version] = ref

    def picked_up(self, index: int, version: int) -> None:
        """Generator ``index`` now holds ``version``; versions no generator can need again are dropped."""
        self.held[index] = version
        oldest = min(self.held)
        for v in [v for v in self.weights if v < oldest]:
            del self.weights[v]

    def restore(self, gen, index: int) -> list[ray.ObjectRef]:
        """Submit (in actor order, before anything else sent to it) what brings restarted generator
        ``index`` back: its model, then the weights of the version it held."""
        refs = [gen.init_model.remote()]
        v = self.held[index]
        if v in self.weights:
            refs.append(gen.load_weights.remote(v, self.weights[v]))
        elif v != 0:  # version 0 is what init_model builds (the trainer's initial weights)
            raise RuntimeError(f"cannot restore generator {index}: the weights of version {v} it held are gone")
        return refs


def await_restarted(actor, limit_s: float, poll_s: float = 0.2) -> None:
    """Block until a restarting actor answers a trivial call (its ``__init__`` ran): a task submitted
    while Ray restarts it fails at once (``ActorUnavailableError``). Raises the actor's error when it
    is gone for good, ``TimeoutError`` after ``limit_s``."""
    deadline = time.monotonic() + limit_s
    while True:
        try:
            ray.get(actor.weights_version.remote(), timeout=max(0.1, deadline - time.monotonic()))
            return
        except ray.exceptions.ActorUnavailableError:
            if time.monotonic() >= deadline:
                raise TimeoutError(f"a restarted generator did not come back within {limit_s:g} s") from None
            time.sleep(poll_s)
        except ray.exceptions.GetTimeoutError:
            raise TimeoutError(f"a restarted generator did not come back within {limit_s:g} s") from None


def is_worker_death(err: BaseException) -> bool:
    """A failure of the actor itself (died, killed, unreachable), as opposed to an error its code raised."""
    return isinstance(err, ray.exceptions.RayActorError)


def fault_policy(cfg, log: Callable[[str], None] = print) -> FaultPolicy:
    """The run's ``FaultPolicy`` (``trainer.generator_max_restarts``, ``trainer.action_timeout_factor``,
    ``trainer.action_timeout_min_s``). Restarts need the object-store weight sync: a restarted actor
    cannot rejoin a collective sync group, so with ``digen.sync.backend=collective`` a dead generator
    ends the run (the timeout still names the hung action). Which backends allow restarts is on the
    backend class (``SyncBackend.restartable``)."""
    from verl_digen.workers.sync import sync_backend

    t = cfg.trainer
    restarts = t.generator_max_restarts if sync_backend(cfg.digen.sync.backend).restartable else 0
    return FaultPolicy(restarts, t.action_timeout_factor, t.action_timeout_min_s, log)
