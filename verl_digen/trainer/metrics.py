"""Per-step metrics of a real run, derived from its timeline and the workers' results."""

from __future__ import annotations

from collections import defaultdict

from verl_digen.schedule.costs import (
    GENERATE,
    OPTIMIZER_STEP,
    SCORE,
    SWITCH_TO_GEN,
    SWITCH_TO_TRAIN,
    TAG_GENERATE,
    UPDATE,
    WEIGHT_SYNC,
)
from verl_digen.schedule.timeline import Record

TIME_KEYS = {
    GENERATE: "time/gen_s",
    TAG_GENERATE: "time/tag_gen_s",
    SCORE: "time/score_s",
    UPDATE: "time/update_s",
    OPTIMIZER_STEP: "time/optimizer_step_s",
    WEIGHT_SYNC: "time/sync_s",
    SWITCH_TO_GEN: "time/switch_s",
    SWITCH_TO_TRAIN: "time/switch_s",
}


def window_metrics(records: list[Record], start: float, end: float, gen_workers: list[str],
                   trainer_workers: list[str]) -> dict[str, float]:
    """Busy/bubble fraction of each pool within [start, end] and summed stage times."""
    span = max(end - start, 1e-12)
    busy: dict[str, float] = defaultdict(float)
    times: dict[str, float] = defaultdict(float)
    for r in records:
        overlap = max(0.0, min(r.end, end) - max(r.start, start))
        busy[r.worker] += overlap
        if r.kind in TIME_KEYS and start - 1e-9 <= r.start < end:
            times[TIME_KEYS[r.kind]] += r.duration
    gen_busy = sum(busy[w] for w in gen_workers) / (len(gen_workers) * span) if gen_workers else 0.0
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
