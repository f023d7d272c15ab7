"""Ray start-up, and resource pools for the generator and the trainer, placed on the nodes their config names.

verl's ``RayResourcePool`` ties a pool to a hardware type only through GPU bundles
(``accelerator_type``), and its ``ResourcePoolManager`` insists on GPUs. Disaggregation needs each pool
placed independently, on CPU too: ``PlacedResourcePool`` adds the pool's node resource (a Ray custom
resource its nodes advertise, e.g. ``H20`` / ``H100``, or on a laptop a stand-in name) to every bundle,
so Ray can only put the pool's workers on matching nodes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading

import ray
from ray.util.placement_group import placement_group
from verl.single_controller.ray.base import RayResourcePool, sort_placement_group_by_node_ip

from verl_digen.config.schema import RunConfig
from verl_digen.driver import native_memory
from verl_digen.driver.cluster import OwnHead

#: the share of a node resource one bundle claims (nodes advertise e.g. {"H100": 8})
NODE_RESOURCE_PER_WORKER = 1.0


class PlacedResourcePool(RayResourcePool):
    """A ``RayResourcePool`` whose bundles also require ``node_resource`` (when set)."""

    def __init__(self, workers: int, use_gpu: bool, name_prefix: str, node_resource: str | None = None) -> None:
        super().__init__([workers], use_gpu=use_gpu, name_prefix=name_prefix, max_colocate_count=1)
        self.node_resource = node_resource

    def get_placement_groups(self, strategy: str = "STRICT_PACK", name: str | None = None, device_name: str = "cuda"):
        if self.pgs is not None:
            return self.pgs
        bundle: dict[str, float] = {"CPU": self.max_colocate_count}
        if self.use_gpu:
            bundle["GPU"] = 1
        if self.node_resource:
            bundle[self.node_resource] = NODE_RESOURCE_PER_WORKER
        prefix = name or f"{self.name_prefix}digen_pool:"
        pgs = [
            placement_group(bundles=[dict(bundle) for _ in range(count)], strategy=strategy, name=f"{prefix}{i}")
            for i, count in enumerate(self._store)
        ]
        ray.get([pg.ready() for pg in pgs])
        self.pgs = sort_placement_group_by_node_ip(pgs)
        return self.pgs


#: resources Ray itself advertises (not a node_resource a user gave a node)
RAY_BUILTIN = frozenset({"CPU", "GPU", "memory", "object_store_memory"})


def check_cluster_fits(pools: dict[str, tuple[int, str | None]], use_gpu: bool) -> None:
    """Raise ``ConfigError`` naming the pool when the running Ray cluster cannot place it, instead of
    waiting forever for its placement group. ``pools``: config key -> (workers, node resource)."""
    from verl_digen.config import ConfigError

    total = ray.cluster_resources()
    demand: dict[str, int] = {}
    for key, (workers, node_resource) in pools.items():
        if node_resource and node_resource not in total:  # no node advertises it: name the key that asked
            where = key.removesuffix(".workers") if key.endswith(".workers") else "resources.trainer"
            custom = sorted(r for r in total
                            if r not in RAY_BUILTIN and not r.startswith(("node:", "accelerator_type:")))
            raise ConfigError(f"{where}.node_resource", node_resource,
                              f"a resource some node of the Ray cluster advertises (custom resources: "
                              f"{', '.join(custom) or 'none'}; start nodes with `ray start --resources`)")
        resource = node_resource or ("GPU" if use_gpu else "CPU")
        demand[resource] = demand.get(resource, 0) + workers
        have = int(total.get(resource, 0) // (NODE_RESOURCE_PER_WORKER if node_resource else 1))
        if demand[resource] > have:
            raise ConfigError(key, workers, f"at most {have} worker(s) in all on '{resource}', what the Ray "
                                            f"cluster advertises ({sorted(total)})")


#: environment every worker process gets on a CPU run
CPU_WORKER_ENV = {"VERL_PLATFORM": "cpu", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


#: the head this process started for its run (None: none, or the run joined a cluster it was given)
_own_head: OwnHead | None = None


def ensure_ray(cfg: RunConfig) -> None:
    """Join the cluster ``ray.address`` or ``RAY_ADDRESS`` names, or start a head of the run's own
    (driver/cluster.py; never a cluster found on the machine); either way say which in one line. CPU workers
    get the verl CPU platform through the runtime env."""
    global _own_head
    if ray.is_initialized():
        return
    env = dict(CPU_WORKER_ENV) if cfg.trainer.device == "cpu" else {"TOKENIZERS_PARALLELISM": "false"}
    if cfg.trainer.device == "cpu":
        os.environ.setdefault("VERL_PLATFORM", "cpu")
    os.environ.setdefault("RAY_COLOR_PREFIX", "0")  # the workers' lines Ray prints here: no colour codes
    given, source = cfg.ray_address()
    native_memory.limit_arenas()  # before Ray's threads start: they share the capped arenas
    if given:
        address = given
    else:
        cpus = max(os.cpu_count() or 1, cfg.total_workers + 1) if cfg.trainer.device == "cpu" else None
        _own_head = OwnHead.start(cpus)
        address = _own_head.address
    with deferred_stop_signals():  # ray.init puts in a SIGTERM handler of its own (exit 15, no line)
        ray.init(address=address, runtime_env={"env_vars": env}, include_dashboard=False, log_to_driver=True)
    if given:
        joined = ray.get_runtime_context().gcs_address
        print(f"joined the Ray cluster at {joined} ({len(ray.nodes())} node(s)), from {source}", flush=True)
    else:
        print(f"started a Ray cluster of its own at {address} (head pid {_own_head.pid}, stopped with the run; "
              f"set ray.address or RAY_ADDRESS to join a running cluster instead)", flush=True)


def stop_own_ray() -> None:
    """Disconnect, and stop the head ``ensure_ray`` started (no-op when the run joined a given cluster)."""
    global _own_head
    if _own_head is None:
        return
    ray.shutdown()
    _own_head.stop()
    _own_head = None


@contextlib.contextmanager
def deferred_stop_signals():
    """SIGINT / SIGTERM / SIGUSR1 held back while Ray connects, then delivered to the handlers that were in place
    before (the run's ``StopSignals``: a stop during start-up gets its line and exit code).

    A signal mask would not do: it holds the signal for this thread only, and another thread (Ray's, pytest's)
    takes it, after which Python runs whatever handler is installed, Ray's ``sys.exit(15)`` included. So a
    recorder stands in for the handlers, the handler ``ray.init`` installs is not let in, and what was recorded
    is raised again once the run's own handlers are back."""
    if threading.current_thread() is not threading.main_thread():
        yield  # handlers belong to the main thread; ray.init installs none elsewhere
        return
    held = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)
    before = {s: signal.getsignal(s) for s in held}
    caught: list[int] = []
    real_signal = signal.signal

    def keep_the_recorder(signum, handler):
        if signum in held:
            return before[signum]  # ray.init's handler stays out; the run's comes back below
        return real_signal(signum, handler)

    for s in held:
        real_signal(s, lambda signum, _frame: caught.append(signum))
    signal.signal = keep_the_recorder
    try:
        yield
    finally:
        signal.signal = real_signal
        for s, handler in before.items():
            real_signal(s, handler if handler is not None else signal.SIG_DFL)
        for s in dict.fromkeys(caught):
            signal.raise_signal(s)
