"""The Ray backend of the one executor loop (:func:`verl_digen.schedule.executor.run`).

``launch`` turns a scheduler action into verl worker calls; ``wait`` returns actions whose calls all
finished, stamped with wall-clock time since the backend started. The data plane stays off the
driver: trajectories move generator -> scorer -> trainer as Ray object references (a scorer returns
the scored batch as one object and its ids + rewards as another; only the second is fetched), and the
driver handles rewards, advantages and metadata only. ``driver_bytes`` counts what it fetched per step.

Digen/separate actions run on one generator actor (``genI``), on the trainer ranks as one unit
(``trainer``: verl's ``execute_all_async`` fan-out) or on one rank alone (TAG slot ``tagJ``). Colocated
phases occupy every rank; their data is split contiguously over the ranks.
"""

from __future__ import annotations

import pickle
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import ray
from verl.single_controller.ray.base import RayWorkerGroup

from verl_digen.algo.tsp import TrainMetrics
from verl_digen.schedule.actions import Action
from verl_digen.schedule.costs import (
    GENERATE,
    OPTIMIZER_STEP,
    PUBLISH,
    SCORE,
    SWITCH_TO_GEN,
    SWITCH_TO_TRAIN,
    TAG_GENERATE,
    UPDATE,
    WEIGHT_SYNC,
)
from verl_digen.schedule.timeline import worker_index
from verl_digen.workers.actor import contiguous_share
from verl_digen.workers.sync import WeightSync

Rows = Callable[[int, tuple], tuple[list[tuple[int, int]], list[str]]]
Advantages = Callable[[dict, int, list[int]], dict[tuple[int, int], float]]


class _Call:
    """The refs of one action; it completes when all of them are ready. ``keep``: refs to hold on to
    (scored trajectories) without fetching them."""

    def __init__(self, action: Action, refs: list[ray.ObjectRef], keep: list[ray.ObjectRef] | None = None) -> None:
        self.action, self.refs, self.keep = action, refs, keep or []
        self.pending = set(refs)


class RayBackend:
    """Executes actions on verl worker actors; see the module docstring.

    ``rows(step, samples)`` maps the scheduler's (prompt-in-step, sample) pairs of global step
    ``step`` to (prompt id, sample) rows and their texts; ``advantages(rewards, step, prompt_ids)``
    computes the rows' advantages from complete groups. ``base`` is the first global step.
    """

    def __init__(self, gen_wg: RayWorkerGroup | None, trn_wg: RayWorkerGroup, sync: WeightSync | None, rows: Rows,
                 advantages: Advantages, scale: float, base: int = 0) -> None:
        self.gen_wg, self.trn_wg, self.sync = gen_wg, trn_wg, sync
        self.gens = gen_wg.workers if gen_wg is not None else []
        self.trainers = trn_wg.workers
        self.rows, self.advantages, self.scale, self.base = rows, advantages, scale, base
        self.t0 = time.perf_counter()
        self._inflight: dict[ray.ObjectRef, _Call] = {}
        self._ready: list[_Call] = []
        self.generated: dict[tuple[int, int], list[ray.ObjectRef]] = {}  # (step, mb) -> trajectory parts
        self.scored: dict[tuple[int, int], list[ray.ObjectRef]] = {}
        self.rewards: dict[tuple[int, int, int], float] = {}  # (global step, prompt id, sample) -> reward
        self.step_rewards: dict[int, list[float]] = defaultdict(list)
        self.train_metrics: dict[int, TrainMetrics] = defaultdict(TrainMetrics)
        self.driver_bytes: dict[int, int] = defaultdict(int)

    # -- Backend protocol ------------------------------------------------------------------------
    def now(self) -> float:
        return time.perf_counter() - self.t0

    def launch(self, a: Action) -> None:
        g = self.base + a.step
        w = a.worker
        keep: list[ray.ObjectRef] = []
        if a.kind == GENERATE and w.startswith("gen"):
            rows, texts = self.rows(g, a.samples)
            refs = [self.gens[worker_index(w)].generate.remote(g, self.base + a.version, rows, texts)]
        elif a.kind == GENERATE:  # colocated: every rank generates its contiguous share on its own
            rows, texts = self.rows(g, a.samples)
            n = len(self.trainers)
            shares = [contiguous_share(len(rows), r, n, "colocated generate") for r in range(n)]
            refs = self.trn_wg.execute_all_async("tag_generate", [g] * n, [self.base + a.version] * n,
                                                 [rows[sl] for sl in shares], [texts[sl] for sl in shares])
        elif a.kind == TAG_GENERATE:
            rows, texts = self.rows(g, a.samples)
            refs = [self.trainers[worker_index(w)].tag_generate.remote(g, self.base + a.version, rows, texts)]
        elif a.kind == SCORE:
            parts = self.generated.pop((a.step, a.mb))
            scorers = [self.gens[worker_index(w)]] if w.startswith("gen") else self.trainers  # colocated: own part
            pairs = [s.score_rows.options(num_returns=2).remote(p) for s, p in zip(scorers, parts, strict=True)]
            keep = [p[0] for p in pairs]
            refs = [p[1] for p in pairs]
        elif a.kind == UPDATE:
            parts = [r for m in a.micro_batches for r in self.scored.pop((a.step, m))]
            prompt_ids = sorted({pid for pid, _ in self.rows(g, a.samples)[0]})
            adv = self.advantages(self.rewards, g, prompt_ids)
            # a tuple, not a list: verl's fan-out would split a list as long as the pool over the ranks
            refs = self.trn_wg.execute_all_async("update", tuple(parts), self.scale, adv)
        elif a.kind in (SWITCH_TO_GEN, SWITCH_TO_TRAIN, OPTIMIZER_STEP):
            refs = self.trn_wg.execute_all_async(a.kind)
        elif a.kind == PUBLISH:
            refs = self.sync.publish(self.base + a.version)
        elif a.kind == WEIGHT_SYNC:
            refs = self.sync.pickup(worker_index(w), self.base + a.version)
        else:
            raise RuntimeError(f"the Ray backend cannot execute action kind {a.kind!r}")
        call = _Call(a, refs, keep)
        for ref in refs:
            self._inflight[ref] = call

    def wait(self) -> tuple[list[tuple[Action, float]], float]:
        while not self._ready:
            if not self._inflight:
                raise RuntimeError("scheduler is waiting on nothing: no action in flight and not done")
            ready, _ = ray.wait(list(self._inflight), num_returns=1)
            call = self._inflight.pop(ready[0])
            call.pending.discard(ready[0])
            if not call.pending:
                self._ready.append(call)
        t = self.now()
        done = []
        for call in self._ready:
            self._collect(call)
            done.append((call.action, t))
        self._ready = []
        return done, t

    # -- results ---------------------------------------------------------------------------------
    def _fetch(self, step: int, refs: list[ray.ObjectRef]) -> list[Any]:
        out = ray.get(refs)
        self.driver_bytes[step] += sum(len(pickle.dumps(o)) for o in out)
        return out

    def _collect(self, call: _Call) -> None:
        a = call.action
        if a.kind in (GENERATE, TAG_GENERATE):
            self.generated[(a.step, a.mb)] = list(call.refs)  # stays in the object store
        elif a.kind == SCORE:
            self.scored[(a.step, a.mb)] = call.keep
            for rows in self._fetch(a.step, call.refs):
                for p, s, r in zip(rows["prompt_ids"], rows["sample_ids"], rows["rewards"], strict=True):
                    self.rewards[(self.base + a.step, p, s)] = r
                    self.step_rewards[a.step].append(r)
        elif a.kind == UPDATE:
            for part in self._fetch(a.step, call.refs):
                self.train_metrics[a.step].merge(TrainMetrics(**part))
        elif a.kind == PUBLISH:
            # object store: rank 0's return value *is* the weights; the driver never fetches it (a
            # failure there surfaces at the first pickup). Bytes count toward the step that uses them.
            refs = call.refs[1:] if self.sync.backend == "object_store" else call.refs
            self._fetch(a.version, refs)
        elif a.kind == WEIGHT_SYNC:
            self._fetch(a.version, call.refs)  # versions; surfaces worker errors
        elif a.kind in (OPTIMIZER_STEP, SWITCH_TO_GEN, SWITCH_TO_TRAIN):
            self._fetch(a.step, call.refs)  # small (seconds, versions); surfaces worker errors

