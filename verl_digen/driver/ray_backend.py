"""The Ray backend of the one executor loop (:func:`verl_digen.schedule.executor.run`).

``launch`` turns a scheduler action into verl worker calls; ``wait`` returns the completions of actions
whose calls all finished, stamped with wall-clock time since the backend started, each with its typed
result (``driver/completions.py``). The data plane stays off the driver: trajectories move generator
-> scorer -> trainer as Ray object references (a scorer returns the scored batch as one object and its
ids + rewards as another; only the second is fetched), and the driver handles rewards, advantages and
metadata only. Each result counts the bytes the driver fetched for it.

Digen/separate actions run on one generator actor (``genI``), on the trainer ranks as one unit
(``trainer``: verl's ``execute_all_async`` fan-out) or on one rank alone (TAG slot ``tagJ``). Colocated
phases occupy every rank; their data is split contiguously over the ranks.

Generator actions (generate, score, an object-store weight pickup) survive their actor's death: the
backend notices it from a small receipt (the driver never fetches the trajectories), restores the
restarted actor and re-issues the same action (``driver/faults.py``); an action running past its
per-action timeout gets its actor killed and restarted the same way. ``fault/retries`` and
``fault/restarts`` count them per step (each result carries its own).
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ray
from verl.single_controller.ray.base import RayWorkerGroup

from verl_digen.algo.tsp import TrainMetrics
from verl_digen.driver.completions import Generated, Receipt, Scored, Stepped, Updated
from verl_digen.driver.faults import FaultPolicy, GeneratorState, await_restarted, is_worker_death
from verl_digen.schedule import ledger
from verl_digen.schedule.actions import (
    GENERATE,
    OPTIMIZER_STEP,
    PUBLISH,
    SCORE,
    SWITCH_TO_GEN,
    SWITCH_TO_TRAIN,
    TAG_GENERATE,
    UPDATE,
    WEIGHT_SYNC,
    Action,
)
from verl_digen.schedule.executor import Completion
from verl_digen.schedule.timeline import gen_worker, tag_slot
from verl_digen.workers.actor import contiguous_share
from verl_digen.workers.sync import WeightSync

#: the longest the driver waits inside Ray at once (Python runs signal handlers only between such waits)
WAIT_SLICE_S = 0.5

#: the worker method each action kind runs (generator actions on one ``GeneratorWorker``, trainer ones
#: on every rank of the trainer pool or, for TAG, one rank). A colocated ``generate`` runs the hybrid
#: rank's ``tag_generate`` on every rank (its share of the batch); ``publish`` and ``weight_sync`` go
#: through the weight-sync backend (``workers/sync.py``), whose methods its class lists.
WORKER_METHODS: dict[str, str] = {
    GENERATE: "generate_receipt",
    TAG_GENERATE: "tag_generate",
    SCORE: "score_rows",
    UPDATE: "update",
    SWITCH_TO_GEN: "switch_to_gen",
    SWITCH_TO_TRAIN: "switch_to_train",
    OPTIMIZER_STEP: "optimizer_step",
}



@dataclass(frozen=True)
class Work:
    """What an action carries to the backend, attached by the driver before its launch (``driver/steps.py``):
    the global (prompt id, sample) rows of its samples and their prompt texts, and an update's advantages of
    its complete groups ((prompt id, sample) -> advantage). The backend never asks the driver for them."""

    rows: list[tuple[int, int]]
    texts: list[str]
    advantages: dict[tuple[int, int], float] | None = None


class Stalled(RuntimeError):
    """No action finished for the backend's ``stall_timeout_s``; ``str()`` names what it waited on."""


Submit = Callable[[], tuple[list[ray.ObjectRef], list[ray.ObjectRef], list[ray.ObjectRef]]]


class _Call:
    """The refs of one action; it completes when all of them are ready. ``keep``: refs to hold on to
    (scored trajectories) without fetching them. A retriable (generator) action also has ``check``:
    small refs fetched when it completes, so a dead actor shows before anything consumes its output;
    ``submit`` re-issues it (refs, keep, check) on the restarted actor; ``deadline``: when it is taken
    for hung (``time.monotonic()``; None: never). ``retries`` / ``restarts``: what bringing it to
    completion took."""

    def __init__(self, action: Action, refs: list[ray.ObjectRef], keep: list[ray.ObjectRef] | None = None,
                 check: list[ray.ObjectRef] | None = None, submit: Submit | None = None,
                 deadline: float | None = None) -> None:
        self.action, self.submit, self.incarnation = action, submit, 0
        self.retries = self.restarts = 0
        self.set(refs, keep, check, deadline)

    def set(self, refs: list[ray.ObjectRef], keep: list[ray.ObjectRef] | None, check: list[ray.ObjectRef] | None,
            deadline: float | None, after: list[ray.ObjectRef] | None = None) -> None:
        """(Re)arm the call; ``after``: refs that ran before it on the same actor (a restore), checked too."""
        self.refs, self.keep, self.check = refs, keep or [], check or []
        self.pending = set(refs) | set(self.check)
        self.after = after or []
        self.deadline = deadline


class RayBackend:
    """Executes actions on verl worker actors; see the module docstring.

    Every generation and update action arrives with its :class:`Work`; ``scale`` is the loss scale of
    every update. ``base`` is the first global step (actions carry local steps).
    ``faults``: how generator faults are handled; ``estimate(action)``: the scheduler's estimate of an
    action's seconds, from which its timeout is derived. ``stall_timeout_s``: ``wait`` raises
    :class:`Stalled` when no action finishes for that long (a hung or stopped worker would otherwise
    block the driver forever, silently); None: no bound.
    """

    def __init__(self, gen_wg: RayWorkerGroup | None, trn_wg: RayWorkerGroup, sync: WeightSync | None,
                 scale: float, base: int = 0, faults: FaultPolicy | None = None,
                 estimate: Callable[[Action], float] | None = None, stall_timeout_s: float | None = None) -> None:
        self.gen_wg, self.trn_wg, self.sync = gen_wg, trn_wg, sync
        self.gens = gen_wg.workers if gen_wg is not None else []
        self.colocated = gen_wg is None  # one pool generates and trains: a step has one scored batch
        self.trainers = trn_wg.workers
        # the scheduler's worker names -> index in their worker group, built with the constructors the
        # scheduler names them with: a name is looked up, never parsed
        self.gen_index = {gen_worker(i): i for i in range(len(self.gens))}
        self.slot_index = {tag_slot(j): j for j in range(len(self.trainers))}
        self.scale, self.base = scale, base
        self.stall_timeout_s = stall_timeout_s
        self.t0 = time.perf_counter()
        self._inflight: dict[ray.ObjectRef, _Call] = {}
        self._ready: list[_Call] = []
        # the data plane's routing: (step, mb) -> trajectory refs, from one action to the next
        self._generated: dict[tuple[int, int], list[ray.ObjectRef]] = {}
        self._scored: dict[tuple[int, int], list[ray.ObjectRef]] = {}
        self.faults = faults or FaultPolicy()
        self.estimate = estimate
        # generators start at the first global step's version (a resume installs it before the run)
        self.gen_state = GeneratorState(held=[base] * len(self.gens))
        self._restoring: dict[int, list[ray.ObjectRef]] = {}
        if self._keeps_weights() and sync.published is not None:
            self.gen_state.published(*sync.published)

    def _keeps_weights(self) -> bool:
        """Published weights are kept while a generator may need them back (the backend's publish returns
        the weights, e.g. object store, and restarts are on)."""
        return self.sync is not None and self.sync.publish_returns_weights and self.faults.max_restarts > 0

    # -- Backend protocol ------------------------------------------------------------------------
    def now(self) -> float:
        return time.perf_counter() - self.t0

    def launch(self, a: Action, work: Work | None = None) -> None:
        a.issued = self.now()  # before any Ray call: the record keeps the dispatch latency apart
        submit = self._generator_submit(a, work) if a.worker in self.gen_index else None
        if submit is not None:
            refs, keep, check = submit()
            call = _Call(a, refs, keep, check, submit, self._deadline(a))
            call.incarnation = self.gen_state.incarnation[self.gen_index[a.worker]]
        elif a.kind == SCORE:
            parts = self._generated.pop((a.step, a.mb))
            scorers = [self.gens[self.gen_index[a.worker]]] if a.worker in self.gen_index else self.trainers
            pairs = [s.score_rows.options(num_returns=2).remote(p) for s, p in zip(scorers, parts, strict=True)]
            call = _Call(a, [p[1] for p in pairs], [p[0] for p in pairs])  # colocated: each rank its own part
        else:
            call = _Call(a, self._trainer_refs(a, work))
        for ref in call.pending:
            self._inflight[ref] = call

    def _trainer_refs(self, a: Action, work: Work | None) -> list[ray.ObjectRef]:
        """Issue an action of the trainer pool (or of weight sync) and return its refs."""
        g, v = self.base + a.step, self.base + a.version
        if a.kind == GENERATE:  # colocated: every rank generates its contiguous share on its own
            n = len(self.trainers)
            shares = [contiguous_share(len(work.rows), r, n, "colocated generate") for r in range(n)]
            return self.trn_wg.execute_all_async(WORKER_METHODS[TAG_GENERATE], [g] * n, [v] * n,
                                                 [work.rows[sl] for sl in shares], [work.texts[sl] for sl in shares])
        if a.kind == TAG_GENERATE:
            return [self.trainers[self.slot_index[a.worker]].tag_generate.remote(g, v, work.rows, work.texts)]
        if a.kind == UPDATE:
            # colocated: each mini-batch's update reads the step's one scored batch (and trains its own rows)
            parts = (list(self._scored[(a.step, 0)]) if self.colocated
                     else [r for m in a.micro_batches for r in self._scored.pop((a.step, m))])
            # each ref its own argument, never inside a container: Ray resolves top-level refs itself (a result
            # small enough to have come back inline travels inline with the call). Refs nested in a tuple were
            # serialized into the argument with the small results Ray inlines into them, and an argument over
            # Ray's inline limit is written into the object store by the driver: new pages of the store's
            # memory in the driver every step (docs/benchmarks.md, "Soak")
            return self.trn_wg.execute_all_async(WORKER_METHODS[UPDATE], parts[0], self.scale, work.advantages,
                                                 self.colocated, *parts[1:])
        if a.kind == OPTIMIZER_STEP:
            if a.ends_step and self.colocated:  # the step's scored batch is trained
                self._scored.pop((a.step, 0), None)
            return self.trn_wg.execute_all_async(WORKER_METHODS[a.kind], a.ends_step)
        if a.kind in (SWITCH_TO_GEN, SWITCH_TO_TRAIN):
            return self.trn_wg.execute_all_async(WORKER_METHODS[a.kind])
        if a.kind == PUBLISH:
            refs = self.sync.publish(v)
            if self._keeps_weights():
                self.gen_state.published(v, refs[0])
            return refs
        if a.kind == WEIGHT_SYNC:
            return self.sync.pickup(self.gen_index[a.worker], v)
        raise RuntimeError(f"the Ray backend cannot execute action kind {a.kind!r}")

    def _generator_submit(self, a: Action, work: Work | None) -> Submit | None:
        """The re-issuable submission of a generator action (None: not retriable, e.g. a collective
        pickup, whose group a restarted actor cannot rejoin)."""
        g, i = self.base + a.step, self.gen_index[a.worker]
        gen = self.gens[i]
        if a.kind == GENERATE:
            rows, texts = work.rows, work.texts

            def submit():
                traj, receipt = gen.generate_receipt.options(num_returns=2).remote(g, self.base + a.version, rows,
                                                                                    texts)
                return [traj], [], [receipt]
            return submit
        if a.kind == SCORE:
            (part,) = self._generated.pop((a.step, a.mb))

            def submit():
                scored, ids = gen.score_rows.options(num_returns=2).remote(part)
                return [ids], [scored], [ids]
            return submit
        if a.kind == WEIGHT_SYNC and self.sync.restartable and self.sync.publish_returns_weights:
            v = self.base + a.version
            first = [True]

            def submit():
                if first[0]:
                    first[0] = False
                    refs = self.sync.pickup(i, v)
                else:
                    refs = [gen.load_weights.remote(v, self.gen_state.weights[v])]
                return refs, [], refs
            return submit
        return None

    def _deadline(self, a: Action) -> float | None:
        if self.estimate is None:
            return None
        limit = self.faults.timeout(self.estimate(a))
        return None if limit is None else time.monotonic() + limit

    def _pump(self, timeout: float | None) -> bool:
        """Wait until one in-flight ref is ready (False: none within ``timeout`` s; None: no bound) and
        handle it; kills the actor of a generator action past its deadline on the way."""
        if not self._inflight:
            raise RuntimeError("scheduler is waiting on nothing: no action in flight and not done")
        t_end = None if timeout is None else time.monotonic() + timeout
        while True:
            now = time.monotonic()
            limits = [] if t_end is None else [t_end - now]
            deadlines = [c.deadline for c in self._calls() if c.deadline is not None]
            if deadlines:
                limits.append(min(deadlines) - now)
            # in slices: a signal's handler runs between them (a SIGTERM must not wait for a long action)
            ready, _ = ray.wait(list(self._inflight), num_returns=1, timeout=max(0.0, min([*limits, WAIT_SLICE_S])))
            if ready:
                self._arrive(ready[0])
                return True
            self._expire(time.monotonic())
            if t_end is not None and time.monotonic() >= t_end:
                return False

    def _calls(self) -> list[_Call]:
        return list({id(c): c for c in self._inflight.values()}.values())

    def _arrive(self, ref: ray.ObjectRef) -> None:
        call = self._inflight.pop(ref)
        call.pending.discard(ref)
        if call.pending:
            return
        if call.submit is not None:
            try:
                ray.get(call.after + call.check)  # small: receipts, ids, versions
            except Exception as err:
                if not is_worker_death(err):
                    raise
                self._retry(call, err)
                return
        self._ready.append(call)

    def _expire(self, now: float) -> None:
        for call in self._calls():
            if call.deadline is not None and now >= call.deadline:
                call.deadline = None
                a = call.action
                self.faults.log(f"{a.kind} on {a.worker} (step {self.base + a.step + 1}"
                                f"{'' if a.mb is None else f', micro-batch {a.mb}'}) ran past its timeout "
                                f"(trainer.action_timeout_factor x the estimate, at least "
                                f"trainer.action_timeout_min_s): killing {a.worker} for a restart")
                ray.kill(self.gens[self.gen_index[a.worker]], no_restart=False)

    def _retry(self, call: _Call, err: BaseException) -> None:
        """Re-issue ``call`` on its generator's restarted actor; the first failure seen of an actor's
        life restores it first (model, then the weights of the version it held)."""
        a, st = call.action, self.gen_state
        i = self.gen_index[a.worker]
        if call.incarnation == st.incarnation[i]:
            if st.restarts[i] >= self.faults.max_restarts:
                self.faults.log(f"generator {a.worker} died ({type(err).__name__}) with no restart left "
                                f"({st.restarts[i]} of trainer.generator_max_restarts={self.faults.max_restarts})")
                raise err
            st.restarts[i] += 1
            st.incarnation[i] += 1
            call.restarts += 1
            await_restarted(self.gens[i], self.faults.restart_wait_s)  # the driver waits for the new process
            self._restoring[i] = st.restore(self.gens[i], i)
            self.faults.log(f"generator {a.worker} died ({type(err).__name__}) during {a.kind} of step "
                            f"{self.base + a.step + 1}: restarting it ({st.restarts[i]}/{self.faults.max_restarts}) "
                            f"with policy version {st.held[i]} and retrying its actions")
        call.retries += 1
        refs, keep, check = call.submit()
        # no per-action deadline for a retry: its restore loads the model first (minutes on a real one);
        # trainer.stall_timeout_s still bounds it
        call.set(refs, keep, check, None, after=self._restoring[i])
        call.incarnation = st.incarnation[i]
        for ref in call.pending:
            self._inflight[ref] = call

    def wait(self) -> tuple[list[Completion], float]:
        while not self._ready:
            if not self._pump(self.stall_timeout_s):
                raise Stalled(self._stall_message())
        t = self.now()
        done = [Completion(call.action, t, self._collect(call)) for call in self._ready]
        self._ready = []
        return done, t

    def _stall_message(self) -> str:
        what = ", ".join(sorted(f"{a.kind} on {a.worker} (step {self.base + a.step + 1}"
                                f"{'' if a.mb is None else f', micro-batch {a.mb}'})"
                                for a in (c.action for c in self._calls())))
        return (f"stalled: no action finished for {self.stall_timeout_s:g} s (trainer.stall_timeout_s) while "
                f"waiting on {what}: a worker is hung, stopped or too slow for the timeout")

    # -- results ---------------------------------------------------------------------------------
    def _collect(self, call: _Call) -> Receipt:
        """The typed result of a finished call (what the driver fetches is small: ids, rewards, metric
        sums, versions; fetching also surfaces a worker's error). Trajectory refs go on to the action
        that consumes them."""
        a = call.action
        fetched: list[Any] = []

        def fetch(refs: list[ray.ObjectRef]) -> list[Any]:
            out = ray.get(refs)
            fetched.extend(out)
            return out

        extra: dict[str, Any] = {}
        kind: type[Receipt] = Receipt
        if a.kind in (GENERATE, TAG_GENERATE):
            self._generated[(a.step, a.mb)] = list(call.refs)  # stays in the object store
            kind, extra = Generated, {"rows": len(a.samples)}
        elif a.kind == SCORE:
            self._scored[(a.step, a.mb)] = call.keep
            parts = fetch(call.refs)
            kind, extra = Scored, {
                "prompt_ids": tuple(p for rows in parts for p in rows["prompt_ids"]),
                "sample_ids": tuple(s for rows in parts for s in rows["sample_ids"]),
                "rewards": tuple(r for rows in parts for r in rows["rewards"])}
        elif a.kind == UPDATE:
            merged = TrainMetrics()
            for part in fetch(call.refs):
                merged.merge(TrainMetrics(**part))
            kind, extra = Updated, {"metrics": merged}
        elif a.kind == OPTIMIZER_STEP:
            out = fetch(call.refs)[0]  # the same on every rank (TSPActorWorker.optimizer_step)
            kind, extra = Stepped, {"grad_norm": out.get("grad_norm"), "skipped": bool(out.get("skipped")),
                                    "nonfinite": out.get("nonfinite")}
        elif a.kind == PUBLISH:
            # object store: rank 0's return value *is* the weights; the driver never fetches it (a
            # failure there surfaces at the first pickup)
            extra = {"moved": _moved(fetch(call.refs[1:] if self.sync.publish_returns_weights else call.refs))}
        elif a.kind == WEIGHT_SYNC:
            extra = {"moved": _moved(fetch(call.refs))}  # every call's version and ledger
            self.gen_state.picked_up(self.gen_index[a.worker], self.base + a.version)
        else:  # SWITCH_TO_GEN, SWITCH_TO_TRAIN: seconds and ledger per rank
            extra = {"moved": _moved(fetch(call.refs))}
        return kind(driver_bytes=sum(len(pickle.dumps(o)) for o in fetched), retries=call.retries,
                    restarts=call.restarts, **extra)


def _moved(results: list[Any]) -> tuple[tuple[str, int], ...]:
    """The ledgers of an action's calls (each a dict with "moved", or a bare value that moved nothing
    counted: a rank without a share, an older worker), as one timeline entry. A pickup's sender and
    receiver count the same transfer: only the receivers' side is kept (the pickup's ledger is the
    generator's), and a publish sums its ranks."""
    ledgers = [r["moved"] for r in results if isinstance(r, dict) and "moved" in r]
    receivers = [r["moved"] for r in results if isinstance(r, dict) and r.get("received")]
    return ledger.as_pairs(ledger.merge(receivers or ledgers))
