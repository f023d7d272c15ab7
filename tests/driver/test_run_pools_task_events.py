"""The run's actors are created without Ray task events unless ``ray.task_events`` asks for them: the driver's core
worker buffered them for every call, and the driver grew by them each step (docs/benchmarks.md, "Soak"). No Ray
session needed."""

from __future__ import annotations

import pytest

from verl_digen.config import compose
from verl_digen.driver import run_pools


class _Pool:
    def __init__(self, *args) -> None:
        pass


class _Group:
    made: list = []

    def __init__(self, pool, actor_cls, name_prefix: str, device_name: str) -> None:
        self.actor_cls = actor_cls
        _Group.made.append(self)

    def init_model(self) -> None:
        pass


class _Worker:
    def ping(self) -> int:
        return 1


@pytest.mark.parametrize("asked", [False, True])
def test_worker_groups_have_task_events_only_when_asked(monkeypatch, asked):
    monkeypatch.setattr(run_pools, "PlacedResourcePool", _Pool)
    monkeypatch.setattr(run_pools, "RayWorkerGroup", _Group)
    pools = run_pools.RunPools.__new__(run_pools.RunPools)
    pools.worker_cfg, pools.use_gpu, pools._pools = None, False, []
    pools.cfg = compose([f"ray.task_events={asked}"])
    for threads, restarts in ((1, 0), (2, 3)):
        wg = pools._group(_Worker, 1, "gen", None, threads=threads, restarts=restarts)
        assert wg.actor_cls._options["enable_task_events"] is asked
    assert _Group.made[-1].actor_cls._options["max_restarts"] == 3


def test_both_pools_start_their_models_before_either_is_waited_on(monkeypatch):
    """The generator and trainer actors start side by side (each imports verl and builds its model), and the
    waits go in group order, so the generator pool's start-up error is still the one raised first."""
    events: list[tuple[str, str]] = []

    class Group:
        def __init__(self, name: str) -> None:
            self.name = name

        def execute_all_async(self, method: str) -> list[str]:
            events.append(("call", f"{self.name}.{method}"))
            return [self.name]

    def get(refs):
        events.append(("wait", refs[0]))
        if refs[0] == "gen":
            raise RuntimeError("generator failed to start")

    monkeypatch.setattr(run_pools.ray, "get", get)
    with pytest.raises(RuntimeError, match="generator failed"):
        run_pools.RunPools._init_models(Group("gen"), Group("trn"))
    assert events == [("call", "gen.init_model"), ("call", "trn.init_model"), ("wait", "gen")]
