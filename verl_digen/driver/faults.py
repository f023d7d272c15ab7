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
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

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


#: a terminal colour / style code (Ray colours its log prefixes and the first line of a task's traceback)
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
#: how the driver marks, on the exception it re-raises, the workers found dead after a failure
DEAD_NOTE = "dead workers: "


def plain(text: str) -> str:
    """``text`` without terminal colour codes (for lines and files read by people and tools alike)."""
    return ANSI.sub("", text)


def plain_log(log: Callable[[str], None]) -> Callable[[str], None]:
    """``log`` that drops terminal colour codes from what it is given."""
    return lambda line: log(plain(line))


def _process(err: BaseException) -> str:
    """' (pid P on IP)' from Ray's actor-death message (its ``pid:`` and ``ip:`` lines), or ''."""
    text = str(err)
    pid, ip = re.search(r"\bpid: (\d+)", text), re.search(r"\bip: (\S+)", text)
    if not pid:
        return ""
    return f" (pid {pid[1]}" + (f" on {ip[1]}" if ip else "") + ")"


def dead_workers(workers: Iterable[tuple[str, int, Any]], wait_s: float = 5.0) -> list[str]:
    """``'<role> rank <r> (pid P on IP)'`` of each worker (role, rank, actor) whose actor is dead: after a
    failure the call that noticed it (often another pool's) names itself, not the process that died, so
    every worker is asked for its runtime info; a dead actor answers with Ray's death error. A worker
    that does not answer within ``wait_s`` is not counted (it may be busy, not dead)."""
    asked: dict[Any, tuple[str, int]] = {}
    for role, rank, actor in workers:
        try:
            asked[actor.runtime_info.remote()] = (role, rank)
        except Exception:  # noqa: BLE001 - a handle Ray already knows is gone
            continue
    if not asked:
        return []
    ray.wait(list(asked), num_returns=len(asked), timeout=wait_s)
    dead = []
    for ref, (role, rank) in asked.items():
        try:
            ray.get(ref, timeout=0)
        except ray.exceptions.RayActorError as err:
            dead.append(f"{role} rank {rank}{_process(err)}")
        except Exception:  # noqa: BLE001 - still running (a timeout), or an error of its own: not dead
            continue
    return dead


def note_dead_workers(err: BaseException, workers: Iterable[tuple[str, int, Any]]) -> list[str]:
    """Find the dead workers after ``err`` (a Ray failure) and attach them to it as a note that the failure
    line reads (``DEAD_NOTE``); returns them."""
    if not isinstance(err, ray.exceptions.RayError):
        return []
    dead = dead_workers(workers)
    if dead:
        err.__notes__ = [*getattr(err, "__notes__", []), DEAD_NOTE + ", ".join(dead)]
    return dead


def dead_note(err: BaseException) -> str | None:
    """The dead workers ``note_dead_workers`` attached to ``err`` (None: none found, or not looked for)."""
    found = [n for n in getattr(err, "__notes__", None) or [] if isinstance(n, str) and n.startswith(DEAD_NOTE)]
    return found[-1][len(DEAD_NOTE):] if found else None


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
