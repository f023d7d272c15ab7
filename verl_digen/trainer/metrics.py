"""Per-step metrics of a real run, derived from its timeline and the workers' results."""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING

from verl_digen.schedule.config import COLOCATED
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
    CostModel,
    Hardware,
    Pool,
    StageCosts,
)
from verl_digen.schedule.profile_io import Workload, fit_samples
from verl_digen.schedule.timeline import TRAINER, Record, Timeline, is_tag_slot

if TYPE_CHECKING:
    from verl_digen.trainer.config import RunConfig


TIME_KEYS = {
    GENERATE: "time/gen_s",
    TAG_GENERATE: "time/tag_gen_s",
    SCORE: "time/score_s",
    UPDATE: "time/update_s",
    OPTIMIZER_STEP: "time/optimizer_step_s",
    WEIGHT_SYNC: "time/sync_s",
    PUBLISH: "time/publish_s",
    SWITCH_TO_GEN: "time/switch_s",
    SWITCH_TO_TRAIN: "time/switch_s",
}


def window_metrics(records: list[Record], start: float, end: float, gen_workers: list[str],
                   trainer_workers: list[str], colocated: bool = False) -> dict[str, float]:
    """Busy/bubble fraction of each pool within [start, end] and summed stage times.

    Trainer pool busy = GPU-seconds busy / GPU-seconds held: a ``trainer`` (unit) record holds every
    rank, a TAG slot record one. Stage times sum each action once (a colocated phase is recorded on
    every worker: counted on the first); a generator's weight pickup is its own action."""
    span = max(end - start, 1e-12)
    busy: dict[str, float] = defaultdict(float)
    times: dict[str, float] = defaultdict(float)
    for r in records:
        overlap = max(0.0, min(r.end, end) - max(r.start, start))
        busy[r.worker] += overlap
        counted_once = not colocated or r.worker == trainer_workers[0]
        if r.kind in TIME_KEYS and counted_once and start - 1e-9 <= r.start < end:
            times[TIME_KEYS[r.kind]] += r.duration
    gen_busy = sum(busy[w] for w in gen_workers) / (len(gen_workers) * span) if gen_workers else 0.0
    slots = [w for w in trainer_workers if is_tag_slot(w)]
    if TRAINER in trainer_workers and slots:
        ranks = len(slots)
        trn_busy = (busy[TRAINER] * ranks + sum(busy[w] for w in slots)) / (ranks * span)
    else:
        trn_busy = sum(busy[w] for w in trainer_workers) / (len(trainer_workers) * span)
    out = {
        "pool/generator_busy": gen_busy,
        "pool/generator_bubble": 1.0 - gen_busy if gen_workers else 0.0,
        "pool/trainer_busy": trn_busy,
        "pool/trainer_bubble": 1.0 - trn_busy,
    }
    for key in set(TIME_KEYS.values()):
        out[key] = times.get(key, 0.0)
    return out


def step_stage_costs(records: list[Record], fallback: StageCosts) -> StageCosts:
    """Mean measured duration of each action kind among ``records`` (one step's), the fallback for
    kinds that did not run."""
    seen: dict[str, list[float]] = defaultdict(list)
    for r in records:
        seen[r.kind].append(r.duration)
    base = fallback.as_dict()
    return StageCosts(**{k: (sum(seen[k]) / len(seen[k]) if seen.get(k) else v) for k, v in base.items()})


def measured_profile(cfg: RunConfig, timeline: Timeline) -> tuple[CostModel, Workload]:
    """The run's stage costs as a simulator profile, fitted from its measured records, so
    ``digen simulate --profile`` can replay (and re-plan) the same cluster.

    A colocated run measures every worker doing every stage: its phases become samples of both pools'
    hardware (generation of batch / N samples per worker, training passes of batch / N x degree rows)."""
    mb = cfg.rollout.micro_batch_size
    k = cfg.trained_steps()
    degree = cfg.digen.tsp.degree or k
    res = cfg.resources
    samples = []
    records = timeline.records
    steps = {r.step for r in records}
    if len(steps) > 1:  # the first step is warm-up (allocator, caches, first BTS solves): not a cost
        records = [r for r in records if r.step != min(steps)]
    if timeline.mode == COLOCATED:
        n = cfg.total_workers
        per_worker = cfg.batch // n
        passes = -(-k // degree)
        for r in records:
            if r.worker != timeline.workers[0]:
                continue
            if r.kind in (GENERATE, SCORE):
                for pool in ("generator", "trainer"):
                    samples.append({"pool": pool, "kind": r.kind, "size": per_worker, "seconds": r.duration})
            elif r.kind == UPDATE:
                samples.append({"pool": "trainer", "kind": "train_pass", "size": per_worker * degree,
                                "seconds": r.duration / passes})
            else:
                samples.append({"kind": r.kind, "seconds": r.duration})
    else:
        for r in records:
            if r.kind in (GENERATE, SCORE):
                samples.append({"pool": "generator", "kind": r.kind, "size": mb, "seconds": r.duration})
            elif r.kind == TAG_GENERATE:
                samples.append({"kind": r.kind, "size": mb, "seconds": r.duration})
            elif r.kind == UPDATE:
                samples.append({"kind": r.kind, "size": mb * r.count, "tsp_degree": degree, "seconds": r.duration})
            elif r.kind == WEIGHT_SYNC or r.worker == TRAINER:  # pickups; switches, optimizer step, publish
                samples.append({"kind": r.kind, "seconds": r.duration})
    base = CostModel(Pool(Hardware(res.generator.node_resource or "generator"), res.generator.workers),
                     Pool(Hardware(res.trainer.node_resource or "trainer"), res.trainer.workers),
                     steps_trained=k)
    d = cfg.digen
    workload = Workload(prompts=cfg.data.train_batch_size, group_size=cfg.rollout.n, mb_size=mb,
                        tsp_degree=degree, staleness=d.tcss.staleness, steps=cfg.trainer.total_steps,
                        policy=d.tag.policy)
    return fit_samples(base, samples), workload
