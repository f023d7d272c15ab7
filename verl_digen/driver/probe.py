"""The runtime's after-run probe: what a run's own actions never sized, measured so its profile can
predict other modes and TAG policies (``DigenRuntime(probe=True)``, see its docstring). Its actions run
through the one executor loop on the Ray backend, as the run's do, one at a time or, where the probe measures
two processes at once, two together (:class:`OneAtATime`), each carrying its rows as the run's actions do; it
gets the run's pools and row mapping as arguments."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ray

from verl_digen.config import RunConfig
from verl_digen.driver.ray_backend import RayBackend, Work
from verl_digen.schedule.actions import GENERATE, SCORE, SWITCH_TO_GEN, SWITCH_TO_TRAIN, TAG_GENERATE, UPDATE, Action
from verl_digen.schedule.costs import ALL_GATHER, PAIRED, SHARDED_CALLS, SHARDED_WORK
from verl_digen.schedule.executor import events
from verl_digen.schedule.timeline import TRAINER, Timeline, gen_worker, tag_slot

Rows = Callable[[int, tuple], tuple[list[tuple[int, int]], list[str]]]
#: one action of the probe: the action, what it carries, its profile sample less the seconds
Item = tuple[Action, "Work | None", dict[str, Any]]


class OneAtATime:
    """A scheduler of a fixed list of action groups (most of one action), each group launched at once when the one
    before completed; ``seconds``: per action (by ``id``), from its launch to its completion. Nothing enters a
    timeline."""

    def __init__(self, groups: list[list[Action]]) -> None:
        self.todo, self.seconds = list(reversed(groups)), {}
        self.timeline = Timeline([], micro_batches=1, steps=1, mode="probe")
        self._running = 0

    @property
    def done(self) -> bool:
        return not self.todo and not self._running

    def start(self, now: float = 0.0) -> list[Action]:
        return self.next_actions(now)

    def next_actions(self, now: float) -> list[Action]:
        if self._running or not self.todo:
            return []
        group = self.todo.pop()
        self._running = len(group)
        return list(group)

    def on_complete(self, action: Action, end: float, moved: tuple[tuple[str, int], ...] = ()) -> None:
        self.seconds[id(action)] = end - action.issued
        self._running -= 1


def probe_costs(cfg: RunConfig, pools: Any, rows_of: Rows, step: int, reps: int = 3) -> list[dict[str, Any]]:
    """Profile samples (``profile_io`` format) of the probe described in the class docstring.

    Runs after the last optimizer step, on the prompts of the next (untrained) global step
    ``step``, one action at a time: generation, scoring and a training pass at the run's micro-batch
    size and at a second size (up to 4 micro-batches), then a switch to generation, one micro-batch
    generated on trainer rank 0, at the micro-batch size a generation on generator 0 and one on trainer rank 0 at
    once and the two scored at once (each by its own pool: ``costs.PAIRED``), and the switch back;
    ``reps`` times after one cold repetition (new sizes are cold starts, as the run's first step is).
    The training pass has loss scale 0: the full forward + backward, adding zero to the gradients, and no optimizer
    step follows. Nothing here enters the timeline or the step reports. Run alone, these calls do not contend with
    the other pool for the host as the run's do, so the profile takes from them the cost's shape and the level from
    the run (``measured_profile``). With one CPU trainer rank, last: the trainer's collective counts, an all-gather
    between it and generator 0 at two sizes, and a training pass (a micro-batch's rows and the largest update's at
    the TSP degree, per rank), an optimizer step and the switch (stash and gather) run sharded over the two against
    unsharded (``costs.Sharded``: what sharding the trainer adds). ``pools``: the run's
    ``RunPools``; ``rows_of`` maps (prompt-in-step, sample) pairs to rows as the run did (``Prompts.rows``)."""
    gen_wg, trn_wg = pools.gen_wg, pools.trn_wg
    held = (ray.get(gen_wg.workers[0].weights_version.remote()) - step,
            ray.get(trn_wg.workers[0].weights_version.remote()) - step)  # as versions relative to ``step``
    plan = [_repetition(cfg, rows_of, step, held) for _ in range(reps + 1)]
    sched = OneAtATime([[a for a, _, _ in group] for rep in plan for group in rep])
    works = {id(a): work for rep in plan for group in rep for a, work, _ in group}
    # loss scale 0: the update adds zero to the gradients
    backend = RayBackend(gen_wg, trn_wg, pools.sync, scale=0.0, base=step)
    for _ in events(sched, backend, lambda a: works[id(a)]):
        pass
    out = [_sample(sample, sched.seconds) | {"seconds": sched.seconds[id(a)]}
           for rep in plan[1:] for group in rep for a, _, sample in group]
    # what sharding the trainer would add, which this run's unsharded rank never did (CPU ranks gather over
    # gloo, as timed here; a GPU pool's NCCL is not)
    if len(trn_wg.workers) == 1 and cfg.trainer.device == "cpu":
        # rows per rank: one micro-batch's timestep, and the probe's largest update (up to 4 micro-batches) at the
        # run's TSP degree split over the two (a colocated TSP pass is that big)
        mb, degree = cfg.rollout.micro_batch_size, cfg.digen.tsp.degree or cfg.trained_steps()
        out += _sharded_samples(trn_wg.workers[0], gen_wg.workers[0],
                                sorted({mb, max(mb + 1, min(cfg.batch, 4 * mb) * degree // 2)}))
    return out


def _repetition(cfg: RunConfig, rows_of: Rows, step: int, held: tuple[int, int]) -> list[list[Item]]:
    """One repetition of the probe, as groups of actions launched together (each its action, what it carries and
    its profile sample less the seconds): every action alone (a group of one), then, with the trainer switched to
    generation, a generation on generator 0 and one on trainer rank 0 at once, and the two scored at once, at the
    micro-batch size (``costs.PAIRED``: what a colocated phase runs on both processes, and TAG beside a generator,
    which a ``never`` run's overlaps of a generation with an update do not measure)."""
    mb, batch = cfg.rollout.micro_batch_size, cfg.batch
    # a wide lever arm (up to the whole batch, which separate trains in one update) keeps the
    # fitted per-sample / per-row slope stable against host noise
    second = min(batch, 4 * mb) if batch > mb else max(1, mb // 2)
    pairs = tuple((p, s) for p in range(cfg.data.train_batch_size) for s in range(cfg.rollout.n))
    degree = cfg.digen.tsp.degree or cfg.trained_steps()
    gen, (gen_v, trn_v) = gen_worker(0), held
    sizes = sorted({mb, second})
    out: list[Item] = []
    for m, size in enumerate(sizes):
        rows, texts = rows_of(step, pairs[:size])
        zero_adv = {(pid, s): 0.0 for pid, s in rows}  # any size: the ranks split its rows (schedule.rows)
        out += [(Action(GENERATE, (gen,), 0, gen_v, mb=m, samples=pairs[:size]), Work(rows, texts),
                 {"pool": "generator", "kind": GENERATE, "size": size}),
                (Action(SCORE, (gen,), 0, gen_v, mb=m), None, {"pool": "generator", "kind": SCORE, "size": size}),
                (Action(UPDATE, (TRAINER,), 0, trn_v, mb=m), Work(rows, texts, zero_adv),
                 {"kind": UPDATE, "size": size, "tsp_degree": degree})]
    rows, texts = rows_of(step, pairs[:mb])
    out += [(Action(SWITCH_TO_GEN, (TRAINER,), 0, trn_v), None, {"kind": SWITCH_TO_GEN}),
            (Action(TAG_GENERATE, (tag_slot(0),), 0, trn_v, mb=0, samples=pairs[:mb]), Work(rows, texts),
             {"kind": TAG_GENERATE, "size": mb})]
    groups = [[item] for item in out]
    # at the micro-batch size (TAG's): each pair with its generations alone adds a second or two to every probe, and
    # the profile uses the pairs only for a kind the run never overlapped (``measured_profile``)
    size, g_mb, t_mb = mb, len(sizes), len(sizes) + 1  # ids of their own: each generation is scored by its own pool

    def gen_on(kind: str, mb_id: int) -> Action:
        worker, version = (gen, gen_v) if kind == GENERATE else (tag_slot(0), trn_v)
        return Action(kind, (worker,), 0, version, mb=mb_id, samples=pairs[:size])

    # each generation alone right before the two at once: a load that moves over seconds (other jobs on the
    # host) moves both alike, so their ratio is the contention, not the drift
    g_alone, t_alone = gen_on(GENERATE, g_mb), gen_on(TAG_GENERATE, t_mb)
    groups += [[(g_alone, Work(rows, texts), {"pool": "generator", "kind": GENERATE, "size": size})],
               [(t_alone, Work(rows, texts), {"kind": TAG_GENERATE, "size": size})],
               [(gen_on(GENERATE, g_mb), Work(rows, texts), _paired(GENERATE, TAG_GENERATE, size, g_alone)),
                (gen_on(TAG_GENERATE, t_mb), Work(rows, texts), _paired(TAG_GENERATE, GENERATE, size, t_alone))],
               [(Action(SCORE, (gen,), 0, gen_v, mb=g_mb), None, _paired(SCORE, SCORE, size)),
                (Action(SCORE, (TRAINER,), 0, trn_v, mb=t_mb), None, _paired(SCORE, SCORE, size))]]
    return groups + [[(Action(SWITCH_TO_TRAIN, (TRAINER,), 0, trn_v), None, {"kind": SWITCH_TO_TRAIN})]]


def _paired(kind: str, beside: str, size: int, alone: Action | None = None) -> dict[str, Any]:
    """The profile sample (less the seconds) of an action of ``kind`` run at once with one of ``beside``; ``alone``:
    the same action run alone just before, whose seconds the sample carries (``_sample``)."""
    return {"kind": PAIRED, "action": kind, "beside": beside, "size": size, **({"alone": alone} if alone else {})}


def _sample(sample: dict[str, Any], seconds: dict[int, float]) -> dict[str, Any]:
    """A planned sample as the profile keeps it: an ``alone`` action replaced by its measured seconds."""
    if isinstance(sample.get("alone"), Action):
        return {**sample, "alone": seconds[id(sample["alone"])]}
    return dict(sample)


def _sharded_samples(trainer: Any, gen: Any, rows: list[int]) -> list[dict[str, Any]]:
    """The trainer's collective counts, an all-gather between it and a generator (two processes of the run on
    their hosts) of one element and of the whole model (half per rank), and the trainer's own work (a training
    pass at ``rows`` rows per rank, the switch's gather, the optimizer step) sharded over the two against
    unsharded (``collective_probe.time_sharded``), as profile samples."""
    counts = ray.get(trainer.sharded_calls.remote())
    pair = (trainer, gen)
    host, port = ray.get(trainer.get_available_master_addr_port.remote())
    numels = [1, max(2, counts["switch_bytes"] // 8)]
    timed = ray.get([w.time_all_gather.remote(host, int(port), r, 2, numels) for r, w in enumerate(pair)])
    host, port = ray.get(trainer.get_available_master_addr_port.remote())
    work = ray.get([w.time_sharded.remote(host, int(port), r, 2, rows) for r, w in enumerate(pair)])[0]
    return [*({"kind": ALL_GATHER, "size": b, "seconds": t} for b, t in timed[0]), {"kind": SHARDED_CALLS, **counts},
            *({"kind": SHARDED_WORK, **w} for w in work)]
