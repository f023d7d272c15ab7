"""Every metric name a run logs, in one place (docs/metrics.md describes each; its test reads these).

The code that computes a metric names it with the constant from here, never a string of its own, so a
renamed or added metric shows up in the docs check. ``actor/*`` names come from ``TrainMetrics.summary``
(:func:`actor_names`); ``val/<reward>_mean`` adds one per reward component of a multi-reward run.
"""

from __future__ import annotations

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
)

STEP_S = "timing/step_s"
SAMPLES_PER_WORKER_S = "perf/samples_per_worker_s"
FRACTION_OF_IDEAL = "perf/fraction_of_ideal"
IDEAL_STEP_S = "perf/ideal_step_s"
DRIVER_BYTES = "perf/driver_bytes"

REWARD_MEAN = "reward/mean"
REWARD_STD = "reward/std"
GRAD_NORM = "actor/grad_norm"

GENERATOR_BUSY = "pool/generator_busy"
GENERATOR_BUBBLE = "pool/generator_bubble"
TRAINER_BUSY = "pool/trainer_busy"
TRAINER_BUBBLE = "pool/trainer_bubble"

STALE_FRACTION = "digen/stale_fraction"
TAG_MICRO_BATCHES = "digen/tag_micro_batches"
BTS_PREDICTED_STEP_S = "digen/bts_predicted_step_s"

RETRIES = "fault/retries"
RESTARTS = "fault/restarts"

#: summed seconds of each action kind in a step (both context switches add to one)
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

VAL_REWARD_MEAN = "val/reward_mean"
VAL_REWARD_STD = "val/reward_std"
VAL_SAMPLES = "val/samples"
VAL_SECONDS = "val/seconds"
VAL_IMAGES = "val/generations"  # the image tag of the validation grid


def val_component_mean(reward: str) -> str:
    """The validation mean of one reward component of a multi-reward run."""
    return f"val/{reward}_mean"


def actor_names() -> set[str]:
    """The ``actor/*`` names of a step report: ``TrainMetrics.summary`` keys (the stale / fresh split
    only in steps with such rows, the rollout log-prob gap only with the recompute) and the gradient norm."""
    from verl_digen.algo.tsp import TrainMetrics  # torch: the config reads these names without it

    summary = TrainMetrics(stale_rows=1, fresh_rows=1, rollout_diff_rows=1).summary()
    return {actor(k) for k in summary if k != "rows"} | {GRAD_NORM}


def actor(key: str) -> str:
    """The step-report name of a ``TrainMetrics.summary`` key."""
    return f"actor/{key}"


def step_names() -> set[str]:
    """Every name a step report may hold."""
    return {STEP_S, SAMPLES_PER_WORKER_S, FRACTION_OF_IDEAL, IDEAL_STEP_S, DRIVER_BYTES, REWARD_MEAN, REWARD_STD,
            GENERATOR_BUSY, GENERATOR_BUBBLE, TRAINER_BUSY, TRAINER_BUBBLE, STALE_FRACTION, TAG_MICRO_BATCHES,
            BTS_PREDICTED_STEP_S, RETRIES, RESTARTS, *TIME_KEYS.values(), *actor_names()}
