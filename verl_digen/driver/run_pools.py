"""The worker pools of one run and their lifetime: the checkpoint lock, the worker groups (colocated: one
hybrid group; disaggregated: generators and trainer ranks wired by weight sync), resuming from a checkpoint,
saving one, and shutting everything down. What runs on the pools is ``driver/steps.py``'s."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import ray
from ray.util.placement_group import remove_placement_group
from torch.distributed import DistNetworkError
from verl.single_controller.ray.base import RayClassWithInitArgs, RayWorkerGroup

from verl_digen.config import RunConfig, checks
from verl_digen.config.judge import placement as judge_placement
from verl_digen.config.memory import generation_copy_resident
from verl_digen.config.stop_plan import SAVE_BEGAN_KEY
from verl_digen.driver.faults import fault_policy
from verl_digen.driver.pools import (
    NODE_RESOURCE_PER_WORKER,
    PlacedResourcePool,
    check_cluster_fits,
    ensure_ray,
    stop_own_ray,
)
from verl_digen.reporting import run_log
from verl_digen.rewards.custom import served_specs, with_pool
from verl_digen.schedule.config import COLOCATED
from verl_digen.workers import checkpoint as ckpt
from verl_digen.workers.actor import HybridWorker, TSPActorWorker
from verl_digen.workers.generator import GeneratorWorker
from verl_digen.workers.sync import WeightSync, sync_backend

#: how many times the worker groups are started when a rendezvous port is lost to another process (below)
PORT_RACE_STARTS = 3


def lost_rendezvous_port(err: BaseException) -> int | None:
    """The port, where ``err`` is a worker's rendezvous failing to bind its port (``EADDRINUSE``); else None.
    verl picks the trainer group's ``MASTER_PORT`` (and the collective weight sync its group's port) by binding
    port 0 in one process and closing it; on a busy node another process can take that port (any new connection's
    local port) before the worker binds it. Starting the groups again picks another port."""
    text = str(getattr(err, "cause", err))  # through Ray: the worker's error is the cause (str is a traceback)
    if not isinstance(err, DistNetworkError) or "EADDRINUSE" not in text:
        return None
    port = re.search(r"port: (\d+)", text)
    return int(port[1]) if port else 0


class RunPools:
    """Pools, resume, save and shutdown of one run (``run_id``). ``hybrid``: the trainer ranks can
    generate (TAG) even when the policy never switches (the after-run probe's TAG cycle needs it)."""

    def __init__(self, cfg: RunConfig, log: Callable[[str], None], run_id: str, hybrid: bool = False) -> None:
        self.cfg, self.log, self.run_id, self.hybrid = cfg, log, run_id, hybrid
        self.worker_cfg = replace(cfg.worker_config(), keep_generation_copy=generation_copy_resident(cfg))
        self.use_gpu = cfg.trainer.device == "cuda"
        self.resume_path = checks.resolve_resume(cfg)
        self.start_step = 0
        self.data_offset = 0  # data position - step x batch (non-zero after a resume that changed the batch)
        self.last_checkpoint: str | None = None
        self.parent_run: str | None = None
        self.gen_wg: RayWorkerGroup | None = None
        self.trn_wg: RayWorkerGroup | None = None
        self.sync: WeightSync | None = None
        self._lock_root: str | None = None
        self._pools: list[PlacedResourcePool] = []
        self.judge = judge_placement(cfg)  # the served judge: apart (replicas the driver starts) or in-process
        self._judges: list[Any] = []
        if self.judge is not None and self.judge.pooled:
            self.worker_cfg = replace(self.worker_cfg, reward=with_pool(self.worker_cfg.reward,
                                                                        f"digen_judge_{run_id}_"))

    def _group(self, cls, workers: int, prefix: str, node_resource: str | None,
               threads: int = 1, restarts: int = 0) -> RayWorkerGroup:
        prefix = f"{prefix}_{uuid.uuid4().hex[:6]}_"  # several runs may share one Ray session
        pool = PlacedResourcePool(workers, self.use_gpu, prefix, node_resource)
        self._pools.append(pool)
        actor_cls = RayClassWithInitArgs(cls=ray.remote(cls), cfg=self.worker_cfg)
        # Ray task events only when asked (``ray.task_events``): the run keeps its own timeline, and the driver's
        # core worker grew by them every step (docs/benchmarks.md, "Soak")
        actor_cls.update_options({"enable_task_events": self.cfg.ray.task_events})
        if threads > 1:  # a second thread serves weight pickups while the first trains
            actor_cls.update_options({"max_concurrency": threads})
        if restarts:  # Ray restarts a dead actor; the backend restores and retries it (driver/faults.py)
            actor_cls.update_options({"max_restarts": restarts})
        return RayWorkerGroup(pool, actor_cls, name_prefix=prefix, device_name="cuda" if self.use_gpu else "cpu")

    @staticmethod
    def _init_models(*groups: RayWorkerGroup) -> None:
        """``init_model`` on every worker of ``groups`` at once, then wait for each group in turn: the actors
        start (each imports verl and builds its model, seconds of CPU) side by side instead of one group after
        the other, and the first group's error is still the one raised (its wait comes first)."""
        calls = [wg.execute_all_async("init_model") for wg in groups]
        for refs in calls:
            ray.get(refs)

    def workers(self) -> list[tuple[str, int, Any]]:
        """(role, rank, actor) of every worker of the run's pools."""
        trainer = "colocated" if self.cfg.trainer.mode == COLOCATED else "trainer"
        return [(role, rank, actor) for role, wg in ((trainer, self.trn_wg), ("generator", self.gen_wg))
                if wg is not None for rank, actor in enumerate(wg.workers)]

    def start(self) -> None:
        """Claim the checkpoint directory, create the worker groups (the expensive part), wire weight
        sync and resume."""
        self._lock()
        ensure_ray(self.cfg)
        res = self.cfg.resources
        if self.cfg.trainer.mode == COLOCATED:
            need = {"resources": (self.cfg.total_workers, res.trainer.node_resource)}
        else:
            need = {"resources.generator.workers": (res.generator.workers, res.generator.node_resource),
                    "resources.trainer.workers": (res.trainer.workers, res.trainer.node_resource)}
        if self.judge is not None and self.judge.own_pool and (self.use_gpu or res.reward.node_resource):
            need["resources.reward.workers"] = (res.reward.workers, res.reward.node_resource)
        check_cluster_fits(need, self.use_gpu)
        warning = checks.model_source(self.cfg, single_node=len(ray.nodes()) == 1)
        if warning:
            self.log(f"warning: {warning}")
        self._start_groups()
        if self.judge is not None and self.judge.pooled:
            self._start_judge()
        if self.resume_path:
            self._resume(self.resume_path)
        elif self.cfg.trainer.resume_from == "auto":
            self.log(f"trainer.resume_from=auto: no complete checkpoint in {self.cfg.trainer.default_local_dir}, "
                     "starting from step 0")

    def _start_groups(self) -> None:
        """The worker groups, built and wired; started again (``PORT_RACE_STARTS`` times in all) when a worker
        lost its rendezvous port to another process, with a warning naming the port."""
        for start in range(1, PORT_RACE_STARTS + 1):
            try:
                if self.cfg.trainer.mode == COLOCATED:
                    self.trn_wg = self._group(HybridWorker, self.cfg.total_workers, "colocated",
                                              self.cfg.resources.trainer.node_resource)
                    self._init_models(self.trn_wg)
                else:
                    self._disaggregated()
                return
            except DistNetworkError as err:
                port = lost_rendezvous_port(err)
                if port is None or start == PORT_RACE_STARTS:
                    raise
                self.log(f"warning: another process took rendezvous port {port} before a worker bound it; "
                         f"starting the worker groups again ({start + 1}/{PORT_RACE_STARTS})")
                self._stop_groups()

    def _lock(self) -> None:
        t = self.cfg.trainer
        if t.save_freq > 0 and self._lock_root is None:
            try:
                ckpt.acquire_lock(t.default_local_dir, self.run_id)
            except ckpt.CheckpointError as err:
                from verl_digen.config import ConfigError

                raise ConfigError("trainer.default_local_dir", t.default_local_dir, str(err)) from None
            self._lock_root = t.default_local_dir

    def _disaggregated(self) -> None:
        res = self.cfg.resources
        tag = self.cfg.schedule_config().policy != "never" or self.hybrid
        backend = sync_backend(self.cfg.digen.sync.backend)  # collective: a second thread serves pickups/relays
        self.gen_wg = self._group(GeneratorWorker, res.generator.workers, "generator",
                                  res.generator.node_resource, backend.generator_threads,
                                  restarts=fault_policy(self.cfg).max_restarts)
        self.trn_wg = self._group(HybridWorker if tag else TSPActorWorker, res.trainer.workers, "trainer",
                                  res.trainer.node_resource, backend.trainer_threads)
        self._init_models(self.gen_wg, self.trn_wg)  # both pools placed first, in the same order as before
        self.sync = WeightSync(self.cfg.digen.sync.backend)
        self.sync.setup(self.trn_wg, self.gen_wg, device=self.cfg.trainer.device)

    def _start_judge(self) -> None:
        """The served judge's replicas apart (rewards/served.py): on GPUs of their own (``resources.reward``), or on
        ``tensor_parallel_size`` consecutive generator ranks' GPUs each, in the first rank's placement bundle."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from verl_digen.rewards import served

        spec = served.spec_from(next(iter(served_specs(self.worker_cfg.reward))))
        tp, res = spec.tensor_parallel_size, self.cfg.resources.reward
        if self.judge.own_pool:
            opts: dict[str, Any] = {"num_gpus": tp} if self.use_gpu else {}
            if res.node_resource:
                opts["resources"] = {res.node_resource: tp * NODE_RESOURCE_PER_WORKER}
            placements = [(opts, None)] * self.judge.replicas
        else:
            wg = self.gen_wg if self.gen_wg is not None else self.trn_wg
            visible = ray.get([w.get_cuda_visible_devices.remote() for w in wg.workers])
            pg = wg.resource_pool.get_placement_groups()[0]  # one placement group per pool: rank r is bundle r
            placements = [({"num_gpus": 0, "scheduling_strategy": PlacementGroupSchedulingStrategy(pg, rank)}, devices)
                          for rank, devices in served.replica_devices(visible, tp)]
        self._judges = served.start_replicas(spec, placements)
        self.log(f"reward model served: {self.judge.describe()}")

    def _resume(self, path: str) -> None:
        extras = ray.get([w.load_checkpoint.remote(path) for w in self.trn_wg.workers])
        self.start_step = int(extras[0]["step"])
        self.last_checkpoint = path
        position = int(extras[0].get("data_position", self.start_step * self.cfg.data.train_batch_size))
        self.data_offset = position - self.start_step * self.cfg.data.train_batch_size
        self.parent_run = extras[0].get("run_id")
        if self.sync is not None:  # generators start from the restored weights
            self.sync.sync(self.start_step)
        self.log(f"resumed from {path} at step {self.start_step} (run {self.run_id}, continuing run "
                 f"{self.parent_run or '?'})")

    def should_save(self, step: int, last: bool) -> bool:
        f = self.cfg.trainer.save_freq
        return f > 0 and (step % f == 0 or last)

    def save(self, step: int, say: Callable[[str], None]) -> float:
        """An atomic, owned checkpoint of ``step`` (see workers/checkpoint.py); old ones beyond
        ``trainer.max_checkpoints`` are removed. Returns the seconds it took; ``say`` gets its line."""
        t = self.cfg.trainer
        path = str(ckpt.step_dir(t.default_local_dir, step))
        extra = {"step": step, "data_position": self.data_offset + step * self.cfg.data.train_batch_size,
                 "run_id": self.run_id, "parent_run": self.parent_run,
                 "config": checks.fingerprint(self.cfg),
                 ckpt.CONFIG_YAML_KEY: run_log.resolved_config_yaml(self.cfg),
                 SAVE_BEGAN_KEY: time.time()}  # the next dry run's measured save time (config/stop_plan.py)
        t0 = time.perf_counter()
        ray.get([w.save_checkpoint.remote(path, extra, t.max_checkpoints, t.export_on_save)
                 for w in self.trn_wg.workers])
        seconds = time.perf_counter() - t0
        self.last_checkpoint = path
        exported = f", export in {path}/export" if t.export_on_save else ""
        say(f"step {step}: saved checkpoint {path} ({time.perf_counter() - t0:.2f} s{exported})")
        return seconds

    def shutdown(self) -> None:
        """Kill the workers and release their placement groups; stop the Ray head the run started for
        itself (a cluster it joined, or one started before the run, stays up)."""
        if self._judges:
            from verl_digen.rewards.served import stop_replicas

            stop_replicas(self._judges)
            self._judges = []
        self._stop_groups()
        if self._lock_root is not None:
            ckpt.release_lock(self._lock_root, self.run_id)
            self._lock_root = None
        stop_own_ray()

    def _stop_groups(self) -> None:
        """Kill the workers and release their placement groups."""
        for wg in (self.gen_wg, self.trn_wg):
            if wg is not None:
                for w in wg.workers:
                    ray.kill(w)
        for pool in self._pools:
            for pg in pool.pgs or []:
                remove_placement_group(pg)
        self._pools.clear()
        self.gen_wg = self.trn_wg = None
        self.sync = None
