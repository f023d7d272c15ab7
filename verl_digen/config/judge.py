"""Where the served judge (``reward.served``) runs and what it costs, read from the config alone (no torch, no
Ray): the checks before Ray, the dry run's resource plan and the planner's cost model all take it from here.

The judge is ``replicas`` copies of the model, each ``reward.served.tensor_parallel_size`` GPUs (verl's rule:
replicas = the judge's GPUs // TP; here the GPUs must divide evenly, so no GPU is silently idle). Its GPUs are
the generator pool's by default (DigenRL places reward models there; verl-omni's default too, where the judge
shares the actor's GPUs), or ``resources.reward.workers`` GPUs of a pool of its own (verl-omni's
``reward.reward_model.enable_resource_pool``), which generation never uses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from verl_digen.config.errors import ConfigError

#: the judge pool's sanity bound (the other pools': checks.MAX_POOL_WORKERS)
MAX_JUDGE_GPUS = 4096


@dataclass(frozen=True)
class JudgePlacement:
    """The served judge's GPUs: ``gpus`` in all, ``tensor_parallel_size`` per replica, on a pool of its own
    (``own_pool``) or on the pool that generates (the generator pool; with ``trainer=colocated`` every worker)."""

    gpus: int
    tensor_parallel_size: int
    own_pool: bool
    seconds_per_image: float | None = None
    startup_s: float | None = None

    @property
    def replicas(self) -> int:
        return self.gpus // self.tensor_parallel_size

    @property
    def pooled(self) -> bool:
        """Whether the replicas run apart from the scoring processes (Ray actors the driver starts): a pool of
        its own, or replicas across several generator GPUs. Otherwise each scoring process serves its own
        one-GPU replica (``rewards/served.py``)."""
        return self.own_pool or self.tensor_parallel_size > 1

    def startup_gpu_s(self, gpus: int, restarts: int = 0) -> float:
        """GPU-seconds of the judge's starts on ``gpus`` GPUs (its replicas start together, each holding its GPUs
        for ``startup_s``): once per run, again per restart. 0 when the start-up is not measured."""
        if gpus < 0 or restarts < 0:
            raise ValueError(f"gpus ({gpus}) and restarts ({restarts}) must be >= 0")
        return (self.startup_s or 0.0) * gpus * (1 + restarts)

    def describe(self) -> str:
        where = "a pool of its own (not used by generation)" if self.own_pool else "the generator pool's GPUs"
        return (f"{self.replicas} replica(s) x {self.tensor_parallel_size} GPU(s) = {self.gpus} GPU(s) on {where}")


def placement(cfg: Any) -> JudgePlacement | None:
    """The judge's placement, None when no model is served (call after ``check``, or on a validated config)."""
    s = cfg.reward.served
    if not s.model_path:
        return None
    own = int(cfg.resources.reward.workers or 0)
    if own:
        gpus = own
    elif cfg.trainer.mode == "colocated":
        gpus = cfg.total_workers
    else:
        gpus = cfg.resources.generator.workers
    return JudgePlacement(gpus=gpus, tensor_parallel_size=int(s.tensor_parallel_size), own_pool=bool(own),
                          seconds_per_image=s.seconds_per_image, startup_s=s.startup_s)


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _seconds(value: Any) -> bool:
    """None, or a finite positive number of seconds."""
    return value is None or (not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
                             and value > 0)


def check(cfg: Any) -> None:
    """``resources.reward`` and the judge's size (``reward.served.tensor_parallel_size``,
    ``reward.served.seconds_per_image``): replicas x TP = the judge's GPUs, before Ray."""
    s, pool = cfg.reward.served, cfg.resources.reward
    if not _int(pool.workers) or not 0 <= pool.workers <= MAX_JUDGE_GPUS:
        raise ConfigError("resources.reward.workers", pool.workers,
                          f"an integer in [0, {MAX_JUDGE_GPUS}]: GPUs of the judge's own pool (0: the generator pool)")
    if pool.workers and not s.model_path:
        raise ConfigError("resources.reward.workers", pool.workers, "0 unless reward.served.model_path is set (the "
                          "pool serves that judge; nothing else runs there)")
    if pool.node_resource is not None and not pool.workers:
        raise ConfigError("resources.reward.node_resource", pool.node_resource,
                          "null unless resources.reward.workers > 0 (the judge on the generator pool is placed "
                          "with it)")
    if pool.node_resource is not None and not (isinstance(pool.node_resource, str) and pool.node_resource.strip()):
        raise ConfigError("resources.reward.node_resource", pool.node_resource, "null or a Ray resource name")
    tp = s.tensor_parallel_size
    if not _int(tp) or tp < 1:
        raise ConfigError("reward.served.tensor_parallel_size", tp, "a positive integer (GPUs of one replica)")
    spi = s.seconds_per_image
    if not _seconds(spi):
        raise ConfigError("reward.served.seconds_per_image", spi, "null or a finite number of seconds > 0 (one "
                          "replica's time per image scored, measured)")
    if not _seconds(s.startup_s):
        raise ConfigError("reward.served.startup_s", s.startup_s, "null or a finite number of seconds > 0 (one "
                          "start of the judge, measured: the log's 'started in N s')")
    place = placement(cfg)
    if place is None or place.gpus % tp == 0:
        return
    if place.own_pool:
        raise ConfigError("resources.reward.workers", pool.workers,
                          f"a multiple of reward.served.tensor_parallel_size={tp} (the judge's pool is replicas x "
                          f"{tp} GPUs)")
    which = "all colocated workers'" if cfg.trainer.mode == "colocated" else "the generator pool's"
    raise ConfigError("reward.served.tensor_parallel_size", tp,
                      f"a divisor of {which} {place.gpus} GPU(s), where the judge is served (replicas x {tp} GPUs), "
                      "or give the judge a pool of its own: resources.reward.workers")


def cost(cfg: Any) -> Any:
    """The judge as the cost model's ``JudgeCost`` (schedule/costs.py), None when no judge is served, its time
    per image is not given (``reward.served.seconds_per_image``: then the plans leave it out, and say so), or the
    costs are a measured profile's (its scoring already holds the judge: the run's score actions took it)."""
    place = placement(cfg)
    if place is None or place.seconds_per_image is None or _measured_profile(cfg):
        return None
    from verl_digen.schedule.costs import JudgeCost

    return JudgeCost(float(place.seconds_per_image), place.tensor_parallel_size,
                     place.gpus if place.own_pool else None)


def plan_line(cfg: Any) -> str | None:
    """The resource plan's line on the judge (None without one): its placement, its price per image and its
    start-up, both sides."""
    place = placement(cfg)
    if place is None:
        return None
    return _per_image(cfg, place) + "; " + startup_text(cfg, place)


def _per_image(cfg: Any, place: JudgePlacement) -> str:
    both = ("; the baselines serve it on the same GPUs" if place.own_pool else
            "; the colocated baselines serve it on all their GPUs, as verl-omni shares the actor's")
    if place.seconds_per_image is not None and _measured_profile(cfg):
        return (f"{place.describe()}{both}; priced as the measured profile's scoring (its score actions held the "
                "judge; reward.served.seconds_per_image prices presets only)")
    if place.seconds_per_image is None:
        return (f"{place.describe()}{both}; not priced (set reward.served.seconds_per_image, one replica's "
                "measured time per image, to count it in the predictions)")
    return f"{place.describe()}{both}; priced at {place.seconds_per_image:g} s per image per replica, both sides"


def baseline_gpus(cfg: Any, place: JudgePlacement) -> int:
    """The GPUs a colocated baseline serves the judge on: the same pool of its own, or all its GPUs (verl-omni's
    judge shares the actor's)."""
    return place.gpus if place.own_pool else int(cfg.total_workers)


def startup_text(cfg: Any, place: JudgePlacement) -> str:
    """The judge's start-up price: paid once per run and again per restart, by this run and by every colocated
    baseline alike (verl-omni starts its judge too), each on the GPUs it serves the judge on. One-off, so not in
    the per-step predictions (as a generator engine's start-up, config/memory.py)."""
    if place.startup_s is None:
        return ("start-up not priced (set reward.served.startup_s, the log's 'reward model ... served ... "
                "(started in N s)')")
    base = baseline_gpus(cfg, place)
    return (f"start-up {place.startup_s:g} s (measured), paid once per run and again per restart, both sides: "
            f"{place.startup_gpu_s(place.gpus):.0f} GPU-s here ({place.gpus} GPU(s)), "
            f"{place.startup_gpu_s(base):.0f} GPU-s for a colocated baseline ({base} GPU(s))")


def _measured_profile(cfg: Any) -> bool:
    """Whether ``digen.profile`` is a measured profile file rather than a preset (priced from its sizes)."""
    from verl_digen.schedule.presets import PRESETS

    profile = cfg.digen.profile
    return bool(profile) and profile not in PRESETS
